"""The answer runs: the schedule CSV `ctrlmem plan --emit` writes is loaded by torch's own
`_PipelineScheduleRuntime._load_csv` (what torchtitan's `pipeline_parallel_schedule_csv` does),
with the stages placed on the ranks the way torchtitan places them for the emitted TOML's
`pipeline_parallel_schedule`, and one training step on CPU over gloo gives the gradients of a
non-pipelined step on the whole batch (float64: equal to 1e-12). A wrong schedule name in the TOML
would place the stages differently and fail here (torch rejects the CSV or the run hangs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import ctrlmem as cm
from ctrlmem.planner.emit import emit

torch = pytest.importorskip("torch")

WIDTH = 8

WORKER = textwrap.dedent('''
    import datetime, os, pathlib, sys, tomllib
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (PipelineScheduleSingle, ScheduleDualPipeV,
        ScheduleZBVZeroBubble, _PipelineScheduleRuntime, get_schedule_class)

    rank, world, WIDTH = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)

    def run_one(toml_path, out_dir):
        cfg = tomllib.loads(open(toml_path).read())["parallelism"]
        train = tomllib.loads(open(toml_path).read())["training"]
        # the store's file inside this run's folder, named absolutely: "file://out/store" would be
        # the file /store (a URL's host is "out"), shared by every run and stale after a crash
        store = pathlib.Path(out_dir, "store").resolve()
        dist.init_process_group("gloo", init_method=store.as_uri(), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        pp = cfg["pipeline_parallel_degree"]
        assert pp == world
        mb = cfg["pipeline_parallel_microbatch_size"]
        m = train["local_batch_size"] // mb
        # torchtitan's pipeline_module_split: which stages this rank builds, from the schedule's name
        cls = get_schedule_class(cfg["pipeline_parallel_schedule"])
        per_rank = 1 if issubclass(cls, PipelineScheduleSingle) else 2
        S = pp * per_rank
        if cls in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
            mine = [rank, S - 1 - rank]
        else:
            mine = [rank + k * pp for k in range(per_rank)]

        def stage_module(s):
            torch.manual_seed(1000 + s)
            return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()

        def example(grad):  # shapes given up front; activations (not the model's input) carry gradients
            return torch.zeros(mb, WIDTH, dtype=torch.float64, requires_grad=grad)

        stages = [PipelineStage(stage_module(s), s, S, torch.device("cpu"), input_args=(example(s > 0),),
                                output_args=example(True)) for s in sorted(mine)]
        sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
        sched._load_csv(cfg["pipeline_parallel_schedule_csv"])  # torchtitan's call
        g = torch.Generator().manual_seed(7)
        x = torch.randn(m * mb, WIDTH, generator=g, dtype=torch.float64)
        y = torch.randn(m * mb, WIDTH, generator=g, dtype=torch.float64)
        first = any(st.is_first for st in stages)
        last = any(st.is_last for st in stages)
        losses = []
        sched.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None)
        grads = {st.stage_index: [p.grad.clone() for p in st.submod.parameters()] for st in stages}
        torch.save({"grads": grads, "losses": [loss.detach() for loss in losses]}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()

    # one process per rank for every schedule of this p (each on its own process group): the
    # start-up (torch's import) is most of a schedule's time here
    for i in range(4, len(sys.argv), 2):
        print(f"rank {rank}: {sys.argv[i]}", flush=True)
        run_one(sys.argv[i], sys.argv[i + 1])
''')


def _reference(S: int, m: int, mb: int):
    """Loss and per-stage gradients of the whole model on the whole batch (mean of the
    per-microbatch losses, as torch's runtime averages them)."""
    mods = []
    for s in range(S):
        torch.manual_seed(1000 + s)
        mods.append(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double())
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m * mb, WIDTH, generator=g, dtype=torch.float64)
    y = torch.randn(m * mb, WIDTH, generator=g, dtype=torch.float64)
    losses = []
    for k in range(m):
        h = x[k * mb:(k + 1) * mb]
        for mod in mods:
            h = mod(h)
        losses.append(((h - y[k * mb:(k + 1) * mb]) ** 2).mean())
    total = torch.stack(losses).mean()
    total.backward()
    return [loss.detach() for loss in losses], {s: [p.grad for p in mods[s].parameters()] for s in range(S)}


def wait_ranks(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait for every rank's process; raises with each rank's last output if one failed or one did
    not end within ``timeout_s`` (then every rank is killed first: nothing is left running)."""
    try:
        outs = [proc.communicate(timeout=timeout_s)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outs = [proc.communicate()[0] for proc in procs]
        raise AssertionError(f"a rank did not end within {timeout_s} s:\n" + "\n".join(
            f"rank {r}: {out[-2000:]}" for r, out in enumerate(outs))) from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(
        f"rank {r} (exit {proc.returncode}): {out[-2000:]}" for r, (proc, out) in enumerate(zip(procs, outs)))


P2_SCHEDULES = ["zb-h1", "v-half"]
P4_SCHEDULES = ["zb-h1", "v-zb", "interleaved-1f1b"]


def _launch(schedules: list[str], p: int, base: Path) -> dict[str, tuple[dict, Path]]:
    """Plan and emit each schedule (into ``base/<name>/emitted``), then one step of each on the
    same ``p`` worker processes, one after the other (each on a process group of its own).
    ``{name: (emitted paths, folder of its rank*.pt)}``; raises with the workers' output if any
    failed."""
    runs = {}
    with contextlib.chdir(base):  # the TOML names the CSV relative to where torchtitan starts
        for schedule in schedules:
            df = cm.plan("custom", p, 80.0, 4 * p, layers=2 * p, hidden=256, heads=4, seq_len=64, vocab=512,
                         schedules=[schedule], tp=[1], pp=[p], microbatch_sizes=[2], progress=False)
            assert df.iloc[0]["status"] == "ok" and df.iloc[0]["schedule"] == schedule
            (base / schedule).mkdir()
            runs[schedule] = (emit(df, os.path.join(schedule, "emitted"), torchtitan="0.2"), base / schedule)
    (base / "worker.py").write_text(WORKER)
    jobs = [arg for paths, out in runs.values() for arg in (paths["toml"], str(out))]
    procs = [subprocess.Popen([sys.executable, "worker.py", str(r), str(p), str(WIDTH), *jobs], cwd=base,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(p)]
    wait_ranks(procs, 240 * len(schedules))
    return runs


@pytest.fixture(scope="module")
def emitted_runs(tmp_path_factory):
    """``emitted_runs(p)``: every schedule of this file at ``p``, launched once (torch's start-up
    in every process is most of a run's time here); the workers' output names the schedule each
    was on when one failed."""
    launches = {}

    def get(p: int) -> dict[str, tuple[dict, Path]]:
        if p not in launches:
            try:
                launches[p] = _launch(P2_SCHEDULES if p == 2 else P4_SCHEDULES, p,
                                      tmp_path_factory.mktemp(f"emit-p{p}"))
            except Exception as exc:  # noqa: BLE001 - a failed launch fails each test of this p, without launching again
                launches[p] = exc
        if isinstance(launches[p], Exception):
            raise launches[p]
        return launches[p]

    return get


def _check(schedule: str, p: int, paths: dict, out: Path) -> None:
    """The step's gradients (and the last stage's losses) equal the non-pipelined reference's,
    and every stage was built on some rank."""
    cfg = tomllib.loads((out.parent / paths["toml"]).read_text())  # paths relative to the launch's folder
    par, train = cfg["parallelism"], cfg["training"]
    mb = par["pipeline_parallel_microbatch_size"]
    m = train["local_batch_size"] // mb
    S = cm.Schedule.load(out.parent / paths["csv"]).num_stages
    ref_losses, ref_grads = _reference(S, m, mb)
    seen = set()
    for r in range(p):
        got = torch.load(out / f"rank{r}.pt")
        for s, grads in got["grads"].items():
            seen.add(s)
            for a, b in zip(grads, ref_grads[s]):
                assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), (schedule, p, s, (a - b).abs().max())
        if got["losses"]:
            assert torch.allclose(torch.stack(got["losses"]), torch.stack(ref_losses), rtol=1e-12, atol=0)
    assert seen == set(range(S))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", P2_SCHEDULES)
def test_emitted_csv_runs_in_torch_runtime_with_exact_gradients_p2(schedule, emitted_runs):
    _check(schedule, 2, *emitted_runs(2)[schedule])


@pytest.mark.slow
@pytest.mark.parametrize("schedule", P4_SCHEDULES)
def test_emitted_csv_runs_in_torch_runtime_with_exact_gradients_p4(schedule, emitted_runs):
    _check(schedule, 4, *emitted_runs(4)[schedule])


@pytest.mark.slow
def test_ctrlmem_run_runs_the_emitted_csv(tmp_path, monkeypatch):
    """The `ctrlmem run --schedule DIR/schedule.csv` line of run.sh (here with the tiny model on CPU
    over gloo) runs the emitted schedule and matches the non-pipelined step; in the same launch, a
    ZB-H1 row with full recomputation runs its run.sh schedule, DIR/schedule.txt (the simulated
    schedule with an R before every B), exactly too, each checkpointed region recomputed once."""
    import json
    import shlex

    monkeypatch.chdir(tmp_path)
    plan = dict(layers=8, hidden=256, heads=4, seq_len=64, vocab=512, tp=[1], pp=[2], microbatch_sizes=[2],
                progress=False)
    df = cm.plan("custom", 2, 80.0, 8, schedules=["v-half"], **plan)
    paths = emit(df, "em")
    rc = cm.plan("custom", 2, 80.0, 8, schedules=["zb-h1"], recompute="full", **plan)
    assert rc.iloc[0]["status"] == "ok" and rc.iloc[0]["recompute"] == "full"
    rc_paths = emit(rc, "em-rc")
    line = next(ln for ln in open(rc_paths["run"]).read().splitlines() if ln.startswith("ctrlmem run"))
    argv = shlex.split(line)
    rc_schedule = argv[argv.index("--schedule") + 1]
    assert rc_schedule == rc_paths["text"] and "--recompute" not in argv
    m = int(df.iloc[0]["m"])
    assert int(rc.iloc[0]["m"]) == m
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "run", "--schedule", paths["csv"], "--schedule",
                           rc_schedule, "-p", "2", "-m", str(m), "--model", "tiny", "--microbatch-size", "2",
                           "--steps", "1", "--out", "run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "schedule.csv" / "result.json").read_text())
    assert result["status"] == "ok" and result["grad_rel_diff"] < 1e-5 and result["loss_abs_diff"] < 1e-6
    result = json.loads((tmp_path / "run" / "schedule.txt" / "result.json").read_text())
    assert result["status"] == "ok" and result["grad_rel_diff"] < 1e-5 and result["loss_abs_diff"] < 1e-6
    assert result["recompute"]["per_region"] == [1.0, 1.0], result["recompute"]
