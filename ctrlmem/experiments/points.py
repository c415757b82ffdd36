"""What the experiment notebooks call for one point: the simulation path (:func:`simulate_point`)
and the real-run path (:func:`real_run_point`, through ``ctrlmem run``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from ctrlmem.runtime.launch import schedule_folder
from ctrlmem.util import proctree
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import Op
from ctrlmem.model.levers import lever_mode, offload_choice
from ctrlmem.model import paper
from ctrlmem.schedules import build
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules import SCHEDULES
import importlib
import importlib.util
from ctrlmem.util.userfile import read_json



def resolve_costs(costs: str, model: str | None, p: int, microbatch_size: int, seq_len: int,
                  tp: int = 1, flash_attention: bool = False) -> tuple[Costs, str]:
    """``costs`` as given to the notebook -> ``(Costs, description)``.

    ``"F,B,W[,COMM]"`` are full device-stage times; ``"paper"`` uses the A100 cost model of
    :mod:`ctrlmem.model.paper` for ``model``; ``"result:PATH"`` uses the pass costs a real run measured
    (:func:`measured_costs`); ``"measure"`` needs a real run (not this function)."""

    if costs == "paper":
        if not model or model not in paper.MODELS:
            raise ValueError(f"costs='paper' needs a model preset ({', '.join(paper.MODELS)}), got model={model!r}")
        c = paper.paper_costs(model, p, microbatch_size, seq_len, tp=tp, flash_attention=flash_attention)
        return c, (f"A100 cost model (ctrlmem.model.paper: {paper.tp_efficiency(tp):.1%} of peak, seq {seq_len}, "
                   f"mb {microbatch_size}, tp {tp}; ms)")
    if costs.startswith("result:"):
        return measured_costs(costs[len("result:"):], p)
    if costs == "measure":
        raise ValueError("costs='measure' needs a real run (backend 'gloo' or 'nccl'); the simulation backend "
                         "takes 'F,B,W[,COMM]' or 'paper'")
    return Costs.parse(costs), f"given costs {costs}"


def measured_costs(path: str | Path, num_devices: int) -> tuple[Costs, str]:
    """Full device-stage ``Costs`` from a ``ctrlmem run`` ``result.json`` (its ``measured_costs``):
    the measured per-stage times summed over stages and divided by ``num_devices``, so a
    measurement of one schedule prices another placement of the same model."""

    path = Path(path)
    if not os.path.lexists(path):
        raise ValueError(f"costs='result:{path}': no such file; give the result.json a `ctrlmem run` wrote")
    data = read_json(path, "result file", fix="give the result.json a `ctrlmem run` wrote")
    c = data.get("measured_costs") if isinstance(data, dict) else None
    if not isinstance(c, dict) or any(k not in c for k in ("f", "b", "w")):
        raise ValueError(f"{path} has no measured_costs; rerun `ctrlmem run` with --steps 1 or more")
    total = {k: sum(c[k]) if isinstance(c[k], list) else float(c[k]) for k in ("f", "b", "w")}
    if total["w"] == 0:
        raise ValueError(f"{path} was measured with a fused backward (w = 0); measure a split-backward "
                         f"schedule (e.g. --schedule zb-h1) to price B and W separately")
    costs = Costs(f=total["f"] / num_devices, b=total["b"] / num_devices, w=total["w"] / num_devices,
                  comm=float(c.get("comm", 0.0)))
    return costs, f"measured pass costs from {path} (thread CPU time, s)"


@functools.lru_cache(maxsize=64)
def _reference_1f1b(p: int, m: int, costs: Costs):
    """1F1B simulated under ``costs`` (the baseline of every point; cached across points)."""

    return simulate(build("1f1b", p, m), costs, MemoryModel())


def simulate_point(
    schedule: str,
    p: int,
    m: int,
    costs: str = "1,1,1,0",
    model: str | None = None,
    microbatch_size: int = 1,
    seq_len: int = 1024,
    memory_limit: float | None = None,
    tp: int = 1,
    dp: int = 1,
    global_batch: int = 0,
    flash_attention: bool = False,
    recompute: str = "none",
    offload: object = "none",
    offload_cost: float | None = None,
) -> dict[str, Any]:
    """Build and simulate one point; the result dict the notebook writes.

    A schedule not registered in ``cm.SCHEDULES`` gives ``{"status": "skipped", "reason": ...}``.
    ``global_batch > 0`` sets ``m = global_batch / (dp · microbatch_size)``. With a model preset
    the result also carries paper-scale numbers: activation GB (34·h + 5·heads·s bytes per layer
    and token, docs/theory.md §10), total GB with weights and optimizer state, whether it fits an
    A100 80 GB (the paper's models only, not the CPU-scale stand-ins), and the predicted MFU
    (model FLOPs / (makespan · GPUs · peak)).

    The memory levers are :func:`ctrlmem.build`'s (docs/theory.md §13): ``recompute`` none,
    selective, full or auto, ``offload`` none, auto or a fraction; ``offload_cost`` sets
    ``Costs.offload`` (the copy time per ``a``, one direction). The baseline stays plain 1F1B, so
    ``memory_vs_1f1b`` and ``throughput_vs_1f1b`` say what the levers bought and cost."""
    if global_batch:
        if global_batch % (dp * microbatch_size):
            raise ValueError(f"global_batch={global_batch} is not divisible by dp·microbatch_size="
                             f"{dp * microbatch_size}; pick sizes that divide it")
        m = global_batch // (dp * microbatch_size)
    recompute, offload = lever_mode(recompute), offload_choice(offload)
    base = {"schedule": schedule, "p": p, "m": m, "model": model, "memory_limit": memory_limit,
            "tp": tp, "dp": dp, "microbatch_size": microbatch_size, "flash_attention": flash_attention,
            "recompute": recompute, "offload": offload}
    if schedule not in SCHEDULES:
        return {**base, "status": "skipped",
                "reason": f"schedule {schedule!r} is not registered in cm.SCHEDULES yet "
                          f"(registered: {', '.join(SCHEDULES)})"}
    cost_obj, cost_desc = resolve_costs(costs, model, p, microbatch_size, seq_len, tp=tp,
                                        flash_attention=flash_attention)
    if offload_cost is not None:
        cost_obj = dataclasses.replace(cost_obj, offload=offload_cost)
        cost_desc += f"; offload cost {offload_cost:g} per a"
    sched = build(schedule, p, m, costs=cost_obj, memory_limit=memory_limit, recompute=recompute, offload=offload)
    memory = MemoryModel()
    res = simulate(sched, cost_obj, memory)
    ref = _reference_1f1b(p, m, cost_obj)
    out: dict[str, Any] = {
        **base,
        "status": "ok",
        "how": f"simulated ({cost_desc})",
        "costs": cost_obj.to_dict(),
        "num_stages": sched.num_stages,
        "makespan": res.makespan,
        "bubble_rate": res.bubble_rate,
        "max_device_bubble": max(res.device_bubbles),
        "peak_memory_a": max(res.peak_memory),
        "peak_memory": res.peak_memory,
        "device_spans": res.device_spans,
        "memory_vs_1f1b": max(res.peak_memory) / max(ref.peak_memory),
        "throughput_vs_1f1b": ref.makespan / res.makespan,
        "bubble_rate_1f1b": ref.bubble_rate,
        "recomputed_forwards": sum(1 for row in sched.device_passes for ps in row if ps.op is Op.R),
        "offloaded_forwards": sum(1 for row in sched.copies for c in row if c.kind == "O"),
    }
    if model and model in paper.MODELS:
        preset = paper.model(model)
        a_bytes = paper.activation_bytes(preset, preset.num_layers / p, microbatch_size, seq_len, tp=tp,
                                         flash_attention=flash_attention)
        states = paper.model_state_bytes(preset, p, tp, dp)
        out["bytes_per_a"] = a_bytes
        out["activation_gb"] = max(res.peak_memory) * a_bytes / 1e9
        out["activation_gb_1f1b"] = max(ref.peak_memory) * a_bytes / 1e9
        out["total_memory_gb"] = out["activation_gb"] + states / 1e9
        if preset.source.startswith("Table 2"):  # an A100 fit only means something for the paper's models
            out["fits_a100_80gb"] = out["total_memory_gb"] * 1e9 <= paper.A100_MEMORY_BYTES
        if costs == "paper":
            flops = m * paper.model_flops(preset, microbatch_size, seq_len)
            out["mfu_predicted"] = flops / (res.makespan * 1e-3 * p * tp * paper.A100_PEAK_FLOPS)
            out["samples_per_s_per_gpu"] = m * microbatch_size / (res.makespan * 1e-3 * p * tp)
    return out


def real_run_available() -> tuple[bool, str]:
    """Whether ``ctrlmem run`` (real execution) can run here: its module imports and torch is
    installed; ``(ok, why)``."""

    try:
        importlib.import_module("ctrlmem.cli.run")
    except ImportError as exc:
        return False, f"`ctrlmem run` is not available: ctrlmem.cli.run does not import ({exc})"
    if importlib.util.find_spec("torch") is None:
        return False, "`ctrlmem run` needs torch; install the pinned requirements (bash scripts/setup.sh)"
    return True, "ctrlmem run is available"


def runtime_model_name(model: str | None) -> str | None:
    """Our preset name -> ``ctrlmem run --model``'s (``cpu-tiny`` -> ``tiny``, ``9.6B`` -> ``9.6b``)."""
    if not model:
        return None
    name = model.lower()
    return name[4:] if name.startswith("cpu-") else name


SLURM_MARKER = "slurm_job.json"
"""Written into a run folder by the sweep's Slurm launcher when the job that ran it has ended:
``{"job_id", "state"}``; :func:`real_run_point` then collects that job's ``result.json``."""


def schedule_names(schedules: str | Sequence[str]) -> list[str]:
    """``"a, b,c"`` or ``["a", "b"]`` -> ``["a", "b", "c"]``: the schedules of one launch, in
    order; ``ValueError`` for an empty name or one given twice."""
    names = [x.strip() for x in schedules.split(",")] if isinstance(schedules, str) else [str(x) for x in schedules]
    if not names or any(not x for x in names):
        raise ValueError(f"schedules: give names separated by commas, e.g. '1f1b,v-min'; got {schedules!r}")
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise ValueError(f"schedules: {', '.join(dup)} given twice; give each schedule once")
    return names


def run_command(schedule: str | Sequence[str], p: int, m: int, backend: str, run_dir: str | Path,
                model: str | None = None, memory_limit: float | None = None, quick: bool = False,
                timeout_s: float = 1800, dp: int = 1, *, recompute: str = "none",
                offload: object = "none") -> list[str]:
    """The ``ctrlmem run`` command line for one point (without ``--json`` / ``--emit-sbatch``);
    several schedules (a list) run one after the other in the same launch. ``recompute``
    (none, selective, full) and ``offload`` (none or a fraction) become ``--recompute`` /
    ``--offload``; ``"auto"`` is a search over simulated schedules and is refused here."""
    recompute, offload = real_levers(recompute, offload)
    names = [schedule] if isinstance(schedule, str) else list(schedule)
    cmd = [sys.executable, "-m", "ctrlmem.cli", "run"]
    for name in names:
        cmd += ["--schedule", name]
    cmd += ["-p", str(p), "-m", str(m), "--backend", backend, "--out", str(run_dir), "--timeout", str(int(timeout_s))]
    if dp != 1:
        cmd += ["--dp", str(dp)]
    if model:
        cmd += ["--model", runtime_model_name(model)]
    if memory_limit is not None:
        cmd += ["--param", f"memory_limit={memory_limit}"]
    if quick:
        cmd += ["--steps", "1"]
    if recompute != "none":
        cmd += ["--recompute", recompute]
    if offload != "none":
        cmd += ["--offload", repr(float(offload))]
    return cmd


def real_levers(recompute: object, offload: object) -> tuple[str, object]:
    """The levers of a real run checked: ``recompute`` none, selective or full; ``offload`` none
    or a fraction in (0, 1], not both. ``"auto"`` (or anything else) is a ``ValueError`` saying
    what to give."""
    recompute, offload = lever_mode(recompute), offload_choice(offload)
    if recompute == "auto" or offload == "auto":
        raise ValueError("recompute/offload 'auto' chooses levers inside a simulated search (backend='simulate'); "
                         "a real run takes fixed levers: recompute none, selective or full, offload none or a "
                         "fraction in (0, 1]")
    if recompute != "none" and offload != "none":
        raise ValueError(f"recompute {recompute!r} and offload {offload} together: a forward is recomputed or "
                         "offloaded, not both (docs/theory.md §13), and recompute takes every forward, so a real run "
                         "refuses the pair; give one of them")
    return recompute, offload


def real_run_point(schedule: str | Sequence[str], p: int, m: int, backend: str, launcher: str, quick: bool,
                   out_dir: str | Path, model: str | None = None, memory_limit: float | None = None,
                   timeout_s: float = 1800, dp: int = 1, *, recompute: str = "none",
                   offload: object = "none") -> dict[str, Any]:
    """Run one point for real through ``ctrlmem run --json`` in a subprocess and return its
    result JSON; ``RuntimeError`` with a clear reason when that command or the launcher is
    missing. ``launcher="slurm"`` writes a Slurm script with ``--emit-sbatch`` and submits it
    with ``sbatch --wait``. When the sweep's Slurm launcher (``ctrlmem sweep --launcher slurm``)
    has already run the point as a job, its result is collected instead (``out_dir/run`` holds
    the job's ``result.json`` and a :data:`SLURM_MARKER`). ``dp`` replicates the pipeline
    (``ctrlmem run --dp``); ``recompute`` and ``offload`` are ``ctrlmem run``'s levers
    (:func:`real_levers`).

    ``schedule`` a list of several names (local launcher only): they run one after the other in
    one launch (every process starts once); the result is ``{"schedules", "runs": {name: the
    result one schedule would give}, "status"}``, ``ok`` when every run is."""

    names = [schedule] if isinstance(schedule, str) else schedule_names(schedule)
    recompute, offload = real_levers(recompute, offload)
    ok, why = real_run_available()
    if not ok:
        raise RuntimeError(f"real run not available: {why}; use backend='simulate'")
    if launcher not in ("local", "slurm"):
        raise ValueError(f"launcher must be 'local' or 'slurm', got {launcher!r}")
    many = not isinstance(schedule, str)
    if many and launcher != "local":
        raise ValueError("several schedules run in one local launch; with launcher='slurm' give one schedule per "
                         "point (a grid over 'schedule')")
    missing = [n for n in names if n not in SCHEDULES]
    if missing and not many:
        return {"schedule": schedule, "p": p, "m": m, "status": "skipped",
                "reason": f"schedule {schedule!r} is not registered in cm.SCHEDULES yet "
                          f"(registered: {', '.join(SCHEDULES)})"}
    if missing:
        raise ValueError(f"schedules {', '.join(map(repr, missing))} are not registered "
                         f"(registered: {', '.join(SCHEDULES)})")
    run_dir = Path(out_dir) / "run"
    marker = run_dir / SLURM_MARKER
    stderr = ""
    if marker.is_file() and (run_dir / "result.json").is_file():
        job = json.loads(marker.read_text())
        launcher = f"slurm, job {job.get('job_id')}"
    else:
        cmd = run_command(names if many else schedule, p, m, backend, run_dir, model, memory_limit, quick,
                          timeout_s, dp, recompute=recompute, offload=offload)
        if launcher == "slurm":
            script = Path(out_dir) / "run.sbatch"
            cmd += ["--emit-sbatch", str(script)]
        else:
            cmd.append("--json")
        # `ctrlmem run` in its own session, tagged: if this kernel is stopped (the sweep's timeout,
        # Ctrl-C, SIGTERM) or the run overruns, it and its torchrun tree are ended, never left behind
        tag = proctree.new_tag("ctrlmem-point")
        proc = proctree.start(cmd, tag, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = proc.communicate(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`ctrlmem {' '.join(cmd[3:])}` overran its timeout of {timeout_s + 60:g} s and was "
                               f"stopped") from None
        finally:
            with proctree.no_interrupts():
                proctree.kill_tree(proc, tag)
        if proc.returncode != 0 and not many:
            err = (stderr or "").strip().splitlines()
            raise RuntimeError(f"`ctrlmem {' '.join(cmd[3:])}` failed (status {proc.returncode}): "
                               f"{err[-1] if err else 'no message'}")
        if launcher == "slurm":
            if shutil.which("sbatch") is None:
                raise RuntimeError(f"launcher='slurm': wrote {script}; `sbatch` is not on PATH here, submit it on "
                                   f"the cluster (its result lands in {run_dir}/result.json)")
            sub = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True)
            if sub.returncode != 0:
                raise RuntimeError(f"sbatch --wait {script} failed: {sub.stderr.strip()[-300:]}")
    if many:
        runs = {}
        for name in names:
            path = run_dir / schedule_folder(name) / "result.json"
            if not path.is_file():
                err = (stderr or "").strip().splitlines()
                raise RuntimeError(f"`ctrlmem run` wrote no {path}" + (f": {err[-1]}" if err else ""))
            runs[name] = _run_summary(json.loads(path.read_text()), backend, launcher)
        return {"schedules": names, "runs": runs, "p": p, "m": m,
                "status": "ok" if all(r["status"] == "ok" for r in runs.values()) else "failed",
                "reason": "; ".join(f"{n}: {r.get('failure')}" for n, r in runs.items() if r["status"] != "ok") or None,
                "how": runs[names[0]]["how"]}
    result_path = run_dir / "result.json"
    if not result_path.is_file():
        raise RuntimeError(f"`ctrlmem run` finished but wrote no {result_path}")
    return _run_summary(json.loads(result_path.read_text()), backend, launcher)


def _run_summary(result: dict[str, Any], backend: str, launcher: str) -> dict[str, Any]:
    """A run's ``result.json`` with the per-rank lists' maxima added (``peak_saved_bytes_max`` ...)."""
    summary = {k: (max(v) if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) else v)
               for k, v in result.items() if k in ("peak_saved_bytes", "peak_alloc_bytes", "theory_peak_bytes",
                                                   "grad_rel_diff", "loss_abs_diff", "predicted_step_s",
                                                   "measured_step_s", "tokens_per_s")}
    return {**result, **{f"{k}_max" if isinstance(result[k], list) else k: v for k, v in summary.items()},
            "status": "ok" if result.get("status", "ok") == "ok" else "failed",
            "how": f"measured ({'CPU, gloo' if backend == 'gloo' else 'GPU, nccl'}; launcher {launcher})"}
