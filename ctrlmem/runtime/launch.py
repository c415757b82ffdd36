"""Launch real runs: validate the config, start ``torch.distributed.run``, collect ``result.json``.

:func:`run` is what ``ctrlmem run`` calls. It checks everything that can be checked before
launching (schedule name and size, model preset, layers divisible among the stages, ``m ≥ p``),
then runs ``python -m torch.distributed.run --nproc-per-node P -m ctrlmem.runtime.worker``
with a wall-clock timeout. Rank 0 writes ``result.json`` (:func:`assemble`); if the run fails,
times out or is stopped (SIGTERM, Ctrl-C), the launcher ends torchrun and every worker (the whole
process tree, :mod:`ctrlmem.util.proctree`), waits until all of them exited, and only then writes a
``result.json`` with ``status: "failed"`` naming the culprit rank (a rank killed by a signal, from
torchrun's own failure summary; else the rank that failed inside a pass, and where). A success
record rank 0 wrote before a launch that did not end cleanly is moved to
``result.unconfirmed.json``: ``result.json`` never says ``ok`` for a failed run. :func:`emit_sbatch` writes the same run as a Slurm script
(``srun`` + torchrun with c10d rendezvous across nodes); see ``docs/cluster.md``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ctrlmem.util import proctree
from ctrlmem.util.fileio import atomic_write, describe_os_error, make_output_folder
from ctrlmem.model.ir import Schedule
from ctrlmem.schedules import build
from ctrlmem.schedules.registry import is_schedule_file
from ctrlmem.model.simulate import simulate
from ctrlmem.model.validate import validate
from ctrlmem.util import checks
import shutil
from ctrlmem.model.levers import lever_mode
from ctrlmem.runtime.presets import get_preset, layers_per_stage
from ctrlmem.runtime.versions import UnsupportedTorch, check_torch_version
from ctrlmem.schedules.registry import apply_levers

__all__ = ["RunConfig", "RunError", "prepare", "run", "run_many", "schedule_folder", "assemble", "measured_trace", "emit_sbatch", "check_config",
           "cpu_memory_estimate", "available_memory"]

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")


class RunError(ValueError):
    """An invalid run configuration, found before launching."""


@dataclass(frozen=True)
class RunConfig:
    """One real run.

    Attributes:
        schedule: registered schedule name (``ctrlmem list``).
        num_devices: ``p``, the number of ranks.
        num_microbatches: ``m`` (at least ``p``).
        model: model preset (:data:`ctrlmem.runtime.models.PRESETS`).
        steps: timed steps after the checking and memory steps.
        backend: ``gloo`` (CPU) or ``nccl`` (GPU).
        out: output folder; ``result.json`` goes there.
        model_overrides: preset fields to change, e.g. ``{"num_layers": 4}``.
        schedule_params: extra generator parameters (``{"num_chunks": 2}``).
        seed: weights and data seed.
        threads_per_rank: intra-op threads per rank on CPU.
        pin_cores: pin each rank to its own cores (CPU timing runs).
        timeout_s: wall-clock limit for the whole launch.
        comm_timeout_s: ``init_process_group`` timeout (a missing message fails after this).
        hang_timeout_s: a rank that starts no pass for this long reports where it is and exits.
        memory_fidelity: free activations at the pass the schedule says (``dw_builder`` with
            deferred linear weights, sent buffers dropped when sent); ``False`` keeps torch's
            own behaviour, for comparison.
        fault: test-only fault injection ``(rank, pass, "crash" | "hang")``.
        dp: data-parallel degree: the pipeline is replicated ``dp`` times (``dp · p`` ranks on a
            ``(dp, pp)`` device mesh), each replica runs ``m`` microbatches of a ``dp · m``
            microbatch batch, gradients are averaged over replicas after each step.
        audit_p2p: count every point-to-point operation on every rank (``p2p_audit`` in the
            result: operations, self-addressed ones, metadata exchanges); a check, off by default.
        allow_large: launch on CPU even when the memory preflight (:func:`cpu_memory_estimate`)
            finds that the run needs more memory than this machine has available.
        recompute: ``"none"``, ``"selective"`` or ``"full"``: an ``R`` of every forward in the
            schedule (docs/theory.md §13), run as ``torch.utils.checkpoint`` around each stage's
            layers (full) or each layer's attention core (selective), non-reentrant
            (:mod:`ctrlmem.runtime.recompute`); fused and split backward alike.
        offload: a fraction in (0, 1]: that share of what every forward stores is copied to host
            memory (pinned on CUDA) by saved-tensor hooks and back at its backward
            (:mod:`ctrlmem.runtime.offload`); the schedule gets an offload and a reload of each
            forward (as ``build(..., offload=...)``; a device whose forwards go straight into their
            backward offloads nothing). 0 (default): none. Not with ``recompute`` (a forward is
            recomputed or offloaded, not both); a schedule file may recompute some forwards and
            offload others, and the run levers each forward as its schedule says.
    """

    schedule: str
    num_devices: int
    num_microbatches: int
    model: str = "tiny"
    steps: int = 3
    backend: str = "gloo"
    out: str = "build/runs/latest"
    model_overrides: dict = field(default_factory=dict)
    schedule_params: dict = field(default_factory=dict)
    seed: int = 0
    threads_per_rank: int = 1
    pin_cores: bool = False
    timeout_s: float = 600.0
    comm_timeout_s: float = 120.0
    hang_timeout_s: float = 60.0
    memory_fidelity: bool = True
    fault: tuple | None = None
    dp: int = 1
    audit_p2p: bool = False
    allow_large: bool = False
    recompute: str = "none"
    offload: float = 0.0

    @property
    def world_size(self) -> int:
        """Ranks of the run: ``dp · p``."""
        return self.dp * self.num_devices


def visible_gpus() -> int:
    """GPUs this process can use (``torch.cuda.device_count()``; 0 without CUDA)."""
    import torch  # noqa: PLC0415 - torch takes seconds to import; only real runs need it

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def prepare(config: RunConfig, local: bool = True) -> tuple[Schedule, dict]:
    """Validate ``config`` and return the schedule and the workers' JSON config.

    ``local=True`` (a launch on this machine) also checks that an NCCL run has one GPU per rank
    here; a Slurm script (``local=False``) leaves that to the worker on each node.
    Raises :class:`RunError` naming what is wrong and how to fix it.
    """
    check_config(config)  # plain numbers first: nothing is launched for a bad one
    try:  # the installed torch's version, read without importing torch (the ranks import it)
        torch_version = check_torch_version()
    except UnsupportedTorch as exc:
        raise RunError(str(exc)) from None
    if config.backend not in BACKENDS:
        raise RunError(f"backend must be one of {BACKENDS}, got {config.backend!r}")
    if isinstance(config.dp, bool) or not isinstance(config.dp, int) or config.dp < 1:
        raise RunError(f"dp must be a positive integer (data-parallel replicas), got {config.dp!r}")
    if local and config.backend == "nccl":
        gpus = visible_gpus()
        if config.world_size > gpus:
            raise RunError(
                f"--backend nccl runs one rank per GPU: this run needs {config.world_size} ranks "
                f"(p={config.num_devices} x dp={config.dp}) on this node but {gpus} GPU(s) are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use p x dp <= {gpus}, "
                f"run the same schedule on CPU with --backend gloo, or spread the ranks over nodes with "
                f"--emit-sbatch FILE --nodes N --gpus-per-node G")
    if config.steps < 0:
        raise RunError(f"steps must be >= 0, got {config.steps}")
    try:
        model = get_preset(config.model, **config.model_overrides)
    except (ValueError, TypeError) as exc:
        raise RunError(str(exc)) from None
    try:
        schedule = _schedule_of(config)
        validate(schedule)
    except RunError:
        raise
    except Exception as exc:  # noqa: BLE001 - ValueError, KeyError, ScheduleError: all user errors here
        raise RunError(f"schedule {config.schedule!r}: {getattr(exc, 'reason', None) or exc}") from None
    if schedule.recomputes and schedule.split_backward and not config.memory_fidelity:
        log.warning(
            "%s with %s recompute and torch's own split backward (memory_fidelity off, --torch-memory): torch "
            "runs W as one autograd.grad per parameter group and the checkpoint recomputes the stage's layers for "
            "each (25 times per forward on a 4-layer stage of the tiny model, measured), keeping what each does not "
            "use until the graph is freed: expect W an order of magnitude slower and saved-tensor peaks several "
            "times the theory (docs/theory.md §13); ctrlmem's default recomputes once, in B",
            config.schedule, schedule.recompute_mode)
    if config.num_microbatches < config.num_devices:
        raise RunError(
            f"m={config.num_microbatches} is too small for p={config.num_devices}: ctrlmem run needs "
            f"m >= p (every schedule here is defined for m >= p); use -m {config.num_devices} or more"
        )
    try:
        layers_per_stage(model.num_layers, schedule.num_stages)
    except ValueError as exc:
        raise RunError(f"model {model.name!r} on {config.schedule} ({schedule.num_stages} stages): {exc}") from None
    if local and config.backend == "gloo" and not config.allow_large:
        _memory_preflight(config, model, schedule)
    worker = {
        "schedule_text": schedule.to_text(),
        "model": model.to_dict(),
        "steps": config.steps,
        "backend": config.backend,
        "out": str(Path(config.out).resolve()),
        "seed": config.seed,
        "threads_per_rank": config.threads_per_rank,
        "pin_cores": config.pin_cores,
        "comm_timeout_s": config.comm_timeout_s,
        "hang_timeout_s": config.hang_timeout_s,
        "fault": list(config.fault) if config.fault else None,
        "memory_fidelity": config.memory_fidelity,
        "dp": config.dp,
        "audit_p2p": config.audit_p2p,
        "torch_version": torch_version,
        "run_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
    }
    return schedule, worker


def _schedule_of(config: RunConfig) -> Schedule:
    """The registered schedule ``config.schedule`` built at p and m, or the schedule file it
    names (a torch / torchtitan CSV, e.g. one ``ctrlmem plan --emit`` wrote, or ctrlmem's text
    form), which must have ``p`` ranks."""

    mode = lever_mode(config.recompute)
    if mode == "auto":
        raise RunError("recompute='auto' is a search under a memory budget; a run takes none, selective or full")
    if not is_schedule_file(config.schedule):
        schedule = build(config.schedule, config.num_devices, config.num_microbatches, recompute=mode,
                         offload=config.offload or "none", **config.schedule_params)
        if schedule.model_copies != 1:
            raise RunError(f"{config.schedule} holds {schedule.model_copies} model copies; ctrlmem run (like torch's runtime) "
                           "runs one: run dualpipe-v, its one-copy V-shape form")
        return schedule
    path = config.schedule
    if not os.path.isfile(path):
        raise RunError(f"{path}: no such file, and not a registered schedule (see `ctrlmem list`)")
    if config.schedule_params:
        raise RunError(f"--param applies to schedule generators; {path} is a schedule file")
    schedule = Schedule.load(path, num_microbatches=config.num_microbatches)
    if schedule.num_devices != config.num_devices:
        raise RunError(f"-p {config.num_devices} does not match {path}, which has {schedule.num_devices} ranks")
    return apply_levers(schedule, mode, config.offload or "none")


MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""Largest ``timeout_s`` / ``comm_timeout_s`` / ``hang_timeout_s`` accepted (30 days)."""


def check_config(config: RunConfig) -> None:
    """:class:`RunError` naming the field, what it must be and the value, for every field of
    ``config`` that is not a sensible value (checked before torch is imported or anything is
    launched)."""

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a ctrlmem.runtime.launch.RunConfig, got {type(config).__name__}")
    try:
        if not isinstance(config.schedule, str) or not config.schedule:
            raise ValueError(f"schedule must be a schedule name (see `ctrlmem list`), got {config.schedule!r}")
        checks.integer("num_devices", config.num_devices)
        if config.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, got {config.recompute!r}")
        checks.number("offload", config.offload, minimum=0.0, maximum=1.0, what="fraction of each forward's activation "
                      "copied to host memory (0: none)")
        if config.recompute != "none" and config.offload:
            raise ValueError(
                f"recompute={config.recompute!r} and offload={config.offload:g} together: recompute puts an R on every "
                "forward, and a forward is recomputed or offloaded, not both (docs/theory.md §13), so nothing would be "
                "offloaded; give one of them, or a schedule that chooses per forward (e.g. ctrlmem export v-shape "
                "-p P -m M --memory-limit L --recompute auto --offload auto --text FILE, then --schedule FILE)")
        checks.integer("num_microbatches", config.num_microbatches)
        checks.integer("dp", config.dp, what="data-parallel replicas")
        checks.integer("steps", config.steps, minimum=0, what="timed steps")
        checks.integer("seed", config.seed, minimum=0, maximum=2**63 - 1)
        checks.integer("threads_per_rank", config.threads_per_rank, maximum=1024, what="intra-op threads per rank")
        for name in ("timeout_s", "comm_timeout_s", "hang_timeout_s"):
            checks.number(name, getattr(config, name), positive=True, maximum=MAX_TIMEOUT_S, what="seconds")
        for name in ("pin_cores", "memory_fidelity", "audit_p2p", "allow_large"):
            checks.flag(name, getattr(config, name))
        if not isinstance(config.out, (str, os.PathLike)) or not str(config.out).strip():
            raise ValueError(f"out must be an output folder, got {config.out!r}")
        for name in ("model_overrides", "schedule_params"):
            if not isinstance(getattr(config, name), dict):
                raise TypeError(f"{name} must be a dict, got {type(getattr(config, name)).__name__}")
        if config.world_size > MAX_RANKS:
            raise ValueError(f"p x dp = {config.world_size} ranks, more than {MAX_RANKS} (ctrlmem.runtime.launch."
                             f"MAX_RANKS); use fewer devices or replicas")
    except (TypeError, ValueError) as exc:
        raise RunError(str(exc)) from None


MAX_RANKS = 4096
"""Most ranks (``p · dp``) of one run."""

RANK_BASE_BYTES = 350 * 2**20
"""Memory of one worker process before the model (Python, torch, gloo): about 350 MiB here."""


def cpu_memory_estimate(config: RunConfig, model, schedule: Schedule) -> dict:
    """What a CPU run of ``model`` on ``schedule`` needs in memory, from the model's sizes and the
    schedule's theory (bytes). Every rank holds the whole non-pipelined reference model with its
    gradients and the activations of the whole batch (the exactness check), its own stages'
    weights, gradients and a copy of those gradients, the activations its schedule keeps at its
    peak, and the process itself. Returns ``{"per_rank", "total", "ranks", "parts"}``."""
    width = 4 if model.dtype in ("float32", "fp32") else 2
    params = model.num_parameters()
    tokens = model.microbatch_size * model.seq_len
    # activation bytes per token and layer: the paper's 34·h at 16 bits (docs/theory.md §10), at this
    # dtype's width; torch's fused attention keeps no s x s scores (the tiny preset measures 4.1 KiB
    # per token and layer in fp32, this gives 4.25 KiB)
    per_token_layer = 34 * model.hidden * width / 2
    logits = tokens * model.vocab * width * 3  # logits, softmax and their gradient, per microbatch
    m = schedule.num_microbatches
    layers = max(1, model.num_layers)
    reference = params * width * 2 + m * (tokens * layers * per_token_layer + logits)
    p = max(1, schedule.num_devices)
    own = params / p * width * 3
    # the schedule's peak, in units of a: one microbatch's activation over one full device-stage
    peak_a = max(simulate(schedule).peak_memory)
    pipeline = peak_a * tokens * per_token_layer * layers / p + logits
    per_rank = RANK_BASE_BYTES + own + reference + pipeline
    return {"per_rank": per_rank, "total": per_rank * config.world_size, "ranks": config.world_size,
            "parts": {"reference model (weights + gradients)": params * width * 2,
                      "reference activations (whole batch)": reference - params * width * 2,
                      "own stages (weights, gradients, copy)": own, "pipeline activations at the peak": pipeline,
                      "process": RANK_BASE_BYTES}}


def available_memory() -> int:
    """Bytes of memory this process can still use: the system's available memory, or less when a
    cgroup (a container's limit) allows less."""
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    free = psutil.virtual_memory().available
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, int(free))


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB" if x >= 2**30 else f"{x / 2**20:.0f} MiB"


def _memory_preflight(config: RunConfig, model, schedule: Schedule) -> None:
    """:class:`RunError` when a CPU run would need more memory than is available here (the
    kernel's OOM killer would end it with SIGKILL, naming no cause)."""
    est = cpu_memory_estimate(config, model, schedule)
    free = available_memory()
    if est["total"] <= 0.9 * free:
        return
    biggest = max(est["parts"].items(), key=lambda kv: kv[1])
    raise RunError(
        f"model {model.name!r} on CPU needs about {_gib(est['total'])} of memory ({est['ranks']} rank(s) x "
        f"{_gib(est['per_rank'])}, most of it the {biggest[0]}: {_gib(biggest[1])}), but {_gib(free)} is available "
        f"here; use a smaller model (--model tiny, small or medium, or --layers N), run on GPUs (--backend nccl, or "
        f"--emit-sbatch for a cluster), or pass --allow-large to launch it anyway")


def _disk_full(folder: Path) -> str | None:
    """A note when ``folder``'s file system has (almost) no space left (under 1 MiB), else ``None``."""

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < 1 << 20:
        return (f"the file system of {folder} is full or nearly full ({free} bytes free), so the ranks may have been "
                f"unable to write their records; free some space or give another --out")
    return None


def _torchrun_args(config: RunConfig, config_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(config.world_size),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--max-restarts", "0",
        "-m", "ctrlmem.runtime.worker", str(config_path),
    ]


def run(config: RunConfig) -> dict:
    """Launch ``config`` locally and return the result (also written to ``out/result.json``)."""
    return run_many([config])[0]


def schedule_folder(schedule: str) -> str:
    """The sub-folder of ``--out`` that one of several ``--schedule`` s writes to: its name (a
    schedule file: the file's name), with anything but letters, digits, ``.``, ``-``, ``_`` as ``-``."""
    name = Path(schedule).name if any(sep in schedule for sep in ("/", "\\")) else schedule
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".") or "schedule"


def run_many(configs: list[RunConfig]) -> list[dict]:
    """Launch several runs with the same ``p`` and backend in one ``torchrun`` (one after the
    other on the same process group, saving every process's start-up); one result per config.

    The launch's timeout is the largest ``timeout_s``; launcher files go to the first ``out``.
    """
    if not configs:
        return []
    prepared = [prepare(c) for c in configs]
    base = configs[0]
    for c in configs[1:]:
        if (c.num_devices, c.backend) != (base.num_devices, base.backend):
            raise RunError("run_many needs the same number of devices and backend for every run")
    workers = [w for _, w in prepared]
    outs = [Path(w["out"]) for w in workers]
    if len(set(outs)) != len(outs):
        raise RunError("every run needs its own output folder")
    for out in outs:
        make_output_folder(out)  # a folder it creates is git-ignored (.gitignore: *)
        for stale in list(out.glob("rank*.json")) + [out / "result.json", out / "result.unconfirmed.json"]:
            stale.unlink(missing_ok=True)
    home = outs[0]
    config_path = home / "worker_config.json"
    atomic_write(config_path, json.dumps(workers if len(workers) > 1 else workers[0], indent=2))
    env = dict(os.environ)
    if base.backend == "gloo":
        env.update(OMP_NUM_THREADS=str(base.threads_per_rank), MKL_NUM_THREADS=str(base.threads_per_rank))
    timeout = max(c.timeout_s for c in configs)
    cmd = _torchrun_args(base, config_path)
    log.info("launching: %s", shlex.join(cmd))
    t0 = time.monotonic()
    timed_out = False
    interrupted: BaseException | None = None
    tag = proctree.new_tag("ctrlmem-run")
    rc: int | None = None
    with open(home / "launch.log", "w") as logf:
        # torchrun in its own session, tagged: on a timeout, SIGTERM or Ctrl-C the whole tree
        # (torchrun and every worker, which torchrun starts in sessions of their own) is ended,
        # and the result is reported only once every process has exited.
        proc = proctree.start(cmd, tag, env=env, stdout=logf, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, or SIGTERM turned into an exception
            interrupted = exc
        finally:
            with proctree.no_interrupts():
                proctree.kill_tree(proc, tag)
            if rc is None:
                rc = proc.returncode
    elapsed = time.monotonic() - t0
    errors = []
    for out in outs:
        for p in sorted(out.glob("rank*.error.json")):
            try:
                errors.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                pass
    failures = torchrun_failures((home / "launch.log").read_text(errors="replace"))
    launch_ok = rc == 0 and not timed_out and interrupted is None
    results = []
    for i, (out, worker) in enumerate(zip(outs, workers)):
        result_path = out / "result.json"
        result = None
        if result_path.exists():
            try:
                result = json.loads(result_path.read_text())
            except (OSError, ValueError):
                result = None
        # rank 0 writes result.json before the final barrier: it is confirmed only when every rank
        # got past that barrier (the launch ended cleanly, or a later job of this launch started)
        later_started = any(any(o.glob("rank*.json")) for o in outs[i + 1:])
        if isinstance(result, dict) and result.get("status") == "ok" and (launch_ok or later_started):
            results.append(result)
            continue
        unconfirmed = None
        if isinstance(result, dict) and result.get("status") == "ok":
            unconfirmed = out / "result.unconfirmed.json"
            os.replace(result_path, unconfirmed)
        reason = culprit(errors, failures)
        if interrupted is not None:
            what = "SIGTERM" if getattr(interrupted, "signum", None) == 15 else "an interrupt (SIGINT)"
            reason = f"stopped by {what}" + (f"; {reason}" if reason else "")
        if timed_out:
            reason = (reason + "; " if reason else "") + f"the launch exceeded its timeout of {timeout:g} s"
        full = _disk_full(out) if not errors else None  # a rank that could write its error wrote it
        if full is not None:
            reason = full + (f"; {reason}" if reason else "")
        if reason is None:
            reason = f"torchrun exited with status {rc} and no rank reported an error; see {home / 'launch.log'}"
        result = {"status": "failed", "failure": reason, "rank_errors": errors, "rank_exits": failures,
                  "elapsed_s": elapsed, "config": worker["run_config"], "log": str(home / "launch.log")}
        if unconfirmed is not None:
            result["unconfirmed_result"] = str(unconfirmed)
        try:
            atomic_write(result_path, json.dumps(result, indent=2))
        except OSError as exc:
            if interrupted is not None:
                log.error("could not record the failed run: %s", exc)
            else:
                raise RunError(f"the run failed and its record could not be written: {describe_os_error(exc)} "
                               f"(the failure: {reason})") from None
        results.append(result)
    if interrupted is not None:
        raise interrupted
    return results


_FAILURE_FIELD = re.compile(r"^\s*(rank|exitcode|traceback)\s*:\s*(.*)$")


def torchrun_failures(log_text: str) -> list[dict]:
    """The failed ranks torchrun lists in its error summary (``Failures:`` and ``Root Cause``):
    ``[{"rank": 1, "exitcode": -9, "signal": "SIGKILL", "root_cause": True}, ...]``."""
    out: list[dict] = []
    current: dict | None = None
    root = False
    for line in log_text.splitlines():
        if "Root Cause" in line:
            root = True
        elif line.strip().startswith("Failures:"):
            root = False
        m = _FAILURE_FIELD.match(line)
        if not m:
            continue
        key, value = m.groups()
        if key == "rank":
            rank = re.match(r"(\d+)", value)
            if rank is None:
                continue
            current = {"rank": int(rank.group(1)), "exitcode": None, "signal": None, "root_cause": root}
            if not any(f["rank"] == current["rank"] and f["root_cause"] == root for f in out):
                out.append(current)
        elif current is not None and key == "exitcode":
            code = re.match(r"(-?\d+)", value)
            if code:
                current["exitcode"] = int(code.group(1))
                if current["exitcode"] < 0:
                    try:
                        current["signal"] = signal.Signals(-current["exitcode"]).name
                    except ValueError:
                        current["signal"] = f"signal {-current['exitcode']}"
        elif current is not None and key == "traceback":
            sig = re.search(r"\((SIG[A-Z0-9]+)\)", value)
            if sig and current["signal"] is None:
                current["signal"] = sig.group(1)
    return out


def culprit(errors: list[dict], failures: list[dict]) -> str | None:
    """Name the rank that caused a failed launch.

    A rank killed by a signal (other than the SIGTERM torchrun sends to stop the others) could
    write no error of its own: the other ranks' errors ("Connection reset by peer") are its
    consequences, so it comes first. Otherwise the rank that failed or hung inside a pass comes
    before one that was waiting for communication; then the earliest."""
    reporting = {e.get("rank") for e in errors}
    killed = sorted((f for f in failures if f["signal"] and f["signal"] != "SIGTERM" and f["rank"] not in reporting),
                    key=lambda f: (not f["root_cause"], f["rank"]))
    # torchrun's root cause first; a rank it killed late (SIGKILL after SIGTERM) does not hide a
    # rank that failed inside a pass
    if killed and (killed[0]["root_cause"] or not any(e.get("in_pass") for e in errors)):
        first = killed[0]
        return f"rank {first['rank']} was killed by {first['signal']} (exit code {first['exitcode']})"
    if errors:
        first = min(errors, key=lambda e: (not e.get("in_pass"), e.get("time", 0.0), e.get("rank", 0)))
        return f"rank {first['rank']} failed in {first['where']}: {first['reason']}"
    if failures:
        first = sorted(failures, key=lambda f: (not f["root_cause"], f["rank"]))[0]
        how = f"was killed by {first['signal']}" if first["signal"] else f"exited with status {first['exitcode']}"
        return f"rank {first['rank']} {how} without reporting an error"
    return None


def assemble(worker: dict, schedule: Schedule, ranks: list[dict]) -> dict:
    """``result.json`` from every rank's measurements (called on rank 0)."""
    from ctrlmem.runtime.measure import costs_from_records, sample_stats, theory_host_peak_bytes, theory_peak_bytes  # noqa: PLC0415 - imports torch (seconds); only real runs need it

    ranks = sorted(ranks, key=lambda r: r["rank"])
    model = worker["model"]
    dp = int(worker.get("dp", 1))
    S, m = schedule.num_stages, schedule.num_microbatches
    act, kept, rec = [0.0] * S, [0.0] * S, [0.0] * S
    for r in ranks:
        for s, pr in r["probe"].items():
            act[int(s)], kept[int(s)] = pr["activation_bytes"], pr["kept_for_w_bytes"]
            rec[int(s)] = pr.get("recomputed_bytes", pr["activation_bytes"])
    # an offloaded forward keeps what its stage's offload probe left on the device
    probed = {(o["stage"], o["fraction"]): o for r in ranks for o in r.get("offload_probe", [])}
    resident, on_host = {}, {}
    for row in schedule.copies:
        for c in row:
            if c.kind == "O" and (c.stage, c.fraction) in probed:
                o = probed[(c.stage, c.fraction)]
                resident[(c.stage, c.microbatch)] = (o["resident_bytes"], o["resident_kept_for_w_bytes"], o["host_bytes"])
                on_host[(c.stage, c.microbatch)] = (o["host_bytes"], o["host_kept_for_w_bytes"])
    # per global rank (rank d·p + i is pipeline rank i of replica d): its pipeline rank's theory
    theory = [theory_peak_bytes(schedule, act, kept, rec, resident)[r.get("pp_rank", r["rank"])] for r in ranks]
    host_theory = [theory_host_peak_bytes(schedule, on_host)[r.get("pp_rank", r["rank"])] for r in ranks]
    records = [rec for r in ranks for rec in r["records"]]
    step_times = [max(ts) for ts in zip(*(r["step_times_s"] for r in ranks))] if ranks[0]["step_times_s"] else []
    steps = sample_stats(step_times)
    costs = costs_from_records(records, S) if records else None
    # a checkpointed stage recomputes inside its measured backward: time the compute order without R passes
    timed = schedule.compute_only()
    predicted = simulate(timed, costs).makespan if costs is not None else None
    wall_records = [dict(rec, cpu_s=rec["wall_s"]) for rec in records]
    wall_costs = costs_from_records(wall_records, S) if records else None
    predicted_wall = simulate(timed, wall_costs).makespan if records else None
    per_stage: dict[str, dict] = {}
    for s in range(S):
        kinds = {}
        for op in ("F", "B", "W", "BW"):
            xs = [rec["cpu_s"] for rec in records if rec["stage"] == s and rec["op"] == op]
            if xs:
                kinds[op] = sample_stats(xs)
        per_stage[str(s)] = kinds
    grad_scale = max(r["grad_scale"] for r in ranks)
    grad_diff = max(r["grad_max_abs_diff"] for r in ranks)
    lasts = [r for r in ranks if S - 1 in r["stages"]]  # one per replica
    last = lasts[0]
    loss = sum(r["loss"] for r in lasts) / len(lasts)  # the whole batch's mean: replicas hold equal shares
    tokens = dp * m * model["microbatch_size"] * model["seq_len"]
    return {
        "status": "ok",
        "config": worker["run_config"],
        "model": model,
        "schedule": {"name": schedule.name, "num_devices": schedule.num_devices, "num_microbatches": m,
                     "num_stages": S, "placement": schedule.placement.kind},
        "dp": dp,
        "world_size": len(ranks),
        "rank_layout": [{"rank": r["rank"], "dp_rank": r.get("dp_rank", 0), "pp_rank": r.get("pp_rank", r["rank"]),
                         "stages": r["stages"]} for r in ranks],
        "torch_version": worker.get("torch_version"),
        "loss": loss,
        "ref_loss": last["ref_loss"],
        "loss_abs_diff": abs(loss - last["ref_loss"]),
        "grad_max_abs_diff": grad_diff,
        "grad_scale": grad_scale,
        "grad_rel_diff": grad_diff / grad_scale if grad_scale else 0.0,
        "step_time_s": steps,
        "step_times_s": step_times,
        "tokens_per_s": tokens / steps["median"] if steps["median"] else None,
        "pass_time_s": per_stage,
        "pass_time_kind": "cuda events" if worker["backend"] == "nccl" else "thread CPU time",
        "measured_costs": costs.to_dict() if costs is not None else None,
        "measured_wall_costs": wall_costs.to_dict() if wall_costs is not None else None,
        "predicted_step_s": predicted,
        "measured_step_s": steps["median"] if step_times else None,
        "prediction_rel_error": (predicted - steps["median"]) / steps["median"] if step_times else None,
        "predicted_step_from_wall_pass_times_s": predicted_wall,
        "peak_saved_bytes": [r["peak_saved_bytes"] for r in ranks],
        "peak_alloc_bytes": [r["peak_alloc_bytes"] for r in ranks],
        "peak_inflight_grad_bytes": [r.get("peak_inflight_grad_bytes", 0) for r in ranks],
        "theory_peak_bytes": theory,
        "offload": {"copies": sum(c.kind == "O" for row in schedule.copies for c in row),
                    "offloaded_bytes": [r.get("offloaded_bytes", 0) for r in ranks],
                    "peak_host_bytes": [r.get("peak_host_bytes", 0) for r in ranks],
                    "theory_host_peak_bytes": host_theory,
                    "how": "measured on the saved-tensor hooks of each offloaded forward; on CPU the host copy is a "
                           "memcpy into another CPU buffer (no host link, no overlap; the allocator peak does not "
                           "fall): docs/theory.md §13"} if schedule.offloads else None,
        "recompute": _recompute_summary(schedule, ranks) if schedule.recomputes else None,
        "saved_over_theory": [r["peak_saved_bytes"] / t if t else None for r, t in zip(ranks, theory)],
        "alloc_over_theory": [r["peak_alloc_bytes"] / t if t else None for r, t in zip(ranks, theory)],
        "stage_activation_bytes": act,
        "stage_kept_for_w_bytes": kept,
        "p2p_audit": [r.get("p2p_audit") for r in ranks] if any(r.get("p2p_audit") for r in ranks) else None,
        "records": records,
        "schedule_text": timed.to_text(),
        "measured_trace": measured_trace(ranks),
    }


def _recompute_summary(schedule: Schedule, ranks: list[dict]) -> dict:
    """How often the checkpointed regions were recomputed in the measured step, per rank
    (:mod:`ctrlmem.runtime.recompute`): the schedule's ``R`` model is one recomputation of each
    region per forward (``per_region`` 1)."""
    regions = [r.get("recompute_regions", 0) for r in ranks]
    recomputes = [r.get("recomputes", 0) for r in ranks]
    return {"mode": schedule.recompute_mode, "regions": regions, "recomputes": recomputes,
            "per_region": [n / k if k else None for n, k in zip(recomputes, regions)],
            "how": "counted in the measured step: regions checkpointed by the forwards, recomputations by the "
                   "backward (non-reentrant torch.utils.checkpoint): docs/theory.md §13"}


def measured_trace(ranks: list[dict]) -> dict | None:
    """Every rank's pass intervals of the last timed step (``None`` without timed steps), in seconds
    from the step's start.

    Each rank counts from its own exit of the barrier that opens the step. When all ranks ran on
    one host they share its monotonic clock, so each rank's intervals are shifted by how much later
    than the first rank it left the barrier (``alignment: "host clock"``, exact); across hosts no
    shared clock exists and the barrier exits are taken as simultaneous (``alignment: "barrier"``,
    off by the barrier's exit skew, not measured). ``start_skew_s``: that skew on one host."""
    traces = [r.get("trace") for r in ranks]
    if not all(traces):
        return None
    one_host = len({t["host"] for t in traces}) == 1
    first = min(t["start_clock"] for t in traces)
    shifts = [t["start_clock"] - first if one_host else 0.0 for t in traces]
    return {"step": traces[0]["step"], "alignment": "host clock" if one_host else "barrier",
            "start_skew_s": max(shifts) if one_host else None,
            "ranks": [{"rank": r["rank"], "pp_rank": r.get("pp_rank", r["rank"]), "dp_rank": r.get("dp_rank", 0),
                       "step_end_s": t["step_s"] + shift,
                       "passes": [dict(ps, start_s=ps["start_s"] + shift, end_s=ps["end_s"] + shift)
                                  for ps in t["passes"]]}
                      for r, t, shift in zip(ranks, traces, shifts)]}


_CONTROL = {chr(c) for c in range(32)} | {chr(127)}


def _clean(name: str, value: object) -> str:
    """``value`` as a string for the batch script; :class:`RunError` if it holds a control
    character (a newline would start a new script line or ``#SBATCH`` directive)."""
    text = str(value)
    bad = sorted({repr(c) for c in text if c in _CONTROL})
    if bad:
        raise RunError(f"{name} {text!r} contains control character(s) {', '.join(bad)}; "
                       f"give it without newlines, tabs or other control characters")
    return text


def emit_sbatch(config: RunConfig, nodes: int, gpus_per_node: int, path: str | os.PathLike,
                partition: str | None = None, time_limit: str = "00:30:00", account: str | None = None,
                python: str | None = None) -> str:
    """Write a Slurm batch script for ``config`` across ``nodes`` nodes and return its text.

    One ``srun`` task per node starts ``torchrun`` with ``nproc_per_node = gpus_per_node`` and a
    c10d rendezvous on the first node; ``dp · p`` (the ranks) must equal ``nodes × gpus_per_node``.
    ``python`` is the interpreter the nodes run (default: this one, ``sys.executable``; the
    output folder and the interpreter must be on a file system every node sees). Every value
    written into the script is shell-quoted, and a value with a control character is refused, so
    an output folder like ``$(...)`` or a partition with a newline cannot run anything.
    """

    try:
        nodes = checks.integer("nodes", nodes, maximum=100_000)
        gpus_per_node = checks.integer("gpus_per_node", gpus_per_node, maximum=1024, what="ranks per node")
        if not isinstance(time_limit, str) or not _SLURM_TIME.match(_clean("time_limit", time_limit).strip()):
            raise ValueError(f"time_limit {time_limit!r} is not a Slurm time: give MINUTES, HH:MM:SS or D-HH:MM:SS")
    except (TypeError, ValueError) as exc:
        raise RunError(str(exc)) from None
    if nodes * gpus_per_node != config.world_size:
        raise RunError(
            f"{nodes} nodes x {gpus_per_node} GPUs = {nodes * gpus_per_node} ranks, but the run has "
            f"p={config.num_devices} x dp={config.dp} = {config.world_size}; choose nodes and GPUs per node "
            f"whose product is p x dp"
        )
    _, worker = prepare(config, local=False)
    q = shlex.quote
    out = _clean("--out", worker["out"])
    make_output_folder(out)  # Slurm opens --output before the script runs
    cfg_path = str(Path(out) / "worker_config.json")
    python = _clean("python", python or sys.executable)
    directives = {"--job-name": f"ctrlmem-{Path(config.schedule).stem}-p{config.num_devices}"
                                + (f"-dp{config.dp}" if config.dp > 1 else ""),
                  "--nodes": nodes, "--ntasks-per-node": 1}
    if config.backend == "nccl":
        directives["--gpus-per-node"] = gpus_per_node
    directives["--time"] = time_limit
    directives["--output"] = f"{out}/slurm-%j.out"
    if partition:
        directives["--partition"] = partition
    if account:
        directives["--account"] = account
    lines = ["#!/bin/bash"]
    for key, value in directives.items():
        lines.append(f"#SBATCH {key}={q(_clean(key, value))}")
    if config.backend != "nccl":
        lines.append("#SBATCH --exclusive")
    command = (f"ctrlmem run --schedule {config.schedule} -p {config.num_devices} -m {config.num_microbatches} "
               f"--model {config.model} --backend {config.backend}" + (f" --dp {config.dp}" if config.dp > 1 else ""))
    lines += [
        "set -euo pipefail",
        "# " + _clean("schedule/model", command),
        f"mkdir -p {q(out)}",
        f"cat > {q(cfg_path)} <<'CTRLMEM_CONFIG'",
        json.dumps(worker, indent=2),
        "CTRLMEM_CONFIG",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}",
        f"export OMP_NUM_THREADS={int(config.threads_per_rank)} MKL_NUM_THREADS={int(config.threads_per_rank)}",
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {q(python)} -m torch.distributed.run \\",
        f"    --nnodes={int(nodes)} --nproc-per-node={int(gpus_per_node)} \\",
        '    --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$head_node:$MASTER_PORT" \\',
        "    --max-restarts=0 \\",
        f"    -m ctrlmem.runtime.worker {q(cfg_path)}",
        f"echo {q('result: ' + out + '/result.json')}",
    ]
    text = "\n".join(lines) + "\n"
    atomic_write(path, text)
    return text


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
