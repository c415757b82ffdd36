"""Experiment configs, the sweep runner and the result store (ctrlmem.experiments)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctrlmem import experiments as ex
import ctrlmem.experiments.points  # noqa: F401  (monkeypatched below)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10_experiment.ipynb"


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASIC = """
name: basic
description: four points
scale: cpu
params: {p: 4, model: cpu-tiny}
grid:
  schedule: [1f1b, zb-v]
  m: [4, 8]
"""


# ---------------------------------------------------------------- configs


def test_plan_is_cases_times_grid_over_params(tmp_path):
    """Points are params merged with each case and each grid combination, in a stable order."""
    cfg = ex.load_config(write(tmp_path, """
name: plan
description: d
scale: cpu
params: {p: 4, costs: "1,1,1,0"}
cases:
  - {schedule: 1f1b}
  - {schedule: zb-v, p: 8}
grid:
  m_per_p: [1, 2]
"""))
    runs = cfg.runs()
    assert [(r.params["schedule"], r.params["p"], r.params["m"]) for r in runs] == [
        ("1f1b", 4, 4), ("1f1b", 4, 8), ("zb-v", 8, 8), ("zb-v", 8, 16)]
    assert all("m_per_p" not in r.params for r in runs)
    assert [r.run_id for r in runs] == [r.run_id for r in ex.load_config(cfg.path).runs()]
    assert len({r.run_id for r in runs}) == 4


@pytest.mark.parametrize("text, needle", [
    ("description: d\nscale: cpu\n", "missing required key 'name'"),
    ("name: x\ndescription: d\nscale: cpu\ngrdi: {p: [1]}\n", "unknown key(s) ['grdi']"),
    ("name: x\ndescription: d\nscale: gpu\nparams: {p: 1}\n", "key 'scale' must be one of"),
    ("name: x\ndescription: d\nscale: cpu\ngrid: {p: 4}\n", "key 'grid.p' must be a non-empty list"),
    ("name: x\ndescription: d\nscale: cpu\nparams: {p: [1, 2]}\n", "key 'params.p' holds a list"),
    ("name: x\ndescription: d\nscale: cpu\nnotebook: nope.ipynb\nparams: {p: 1}\n", "key 'notebook'"),
    ("name: x\ndescription: d\nscale: cpu\ntimeout_s: -1\nparams: {p: 1}\n", "key 'timeout_s'"),
    ("name: x\ndescription: d\nscale: cpu\nparams: {out_dir: a}\n", "params.out_dir"),
    ("name: x\ndescription: d\nscale: cpu\ncases: [{p: 1}, {p: 1}]\n", "same parameters"),
    ("name: Bad Name\ndescription: d\nscale: cpu\nparams: {p: 1}\n", "key 'name'"),
    ("- a\n- b\n", "must hold a YAML mapping"),
])
def test_bad_config_names_file_and_key(tmp_path, text, needle):
    """A bad config raises ConfigError naming the file and the offending key."""
    path = write(tmp_path, text)
    with pytest.raises(ex.ConfigError) as err:
        ex.load_config(path)
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_unregistered_schedule_is_accepted_on_load(tmp_path):
    """Configs may name schedules that are not registered yet; only the run skips them."""
    cfg = ex.load_config(write(tmp_path, BASIC.replace("[1f1b, zb-v]", "[1f1b, not-yet-registered]")))
    assert len(cfg.runs()) == 4


def test_unknown_parameter_rejected_before_any_run(tmp_path):
    """A parameter the notebook does not declare stops the sweep before anything executes."""
    cfg = ex.load_config(write(tmp_path, BASIC.replace("model: cpu-tiny", "modle: cpu-tiny")))
    calls = []
    with pytest.raises(ex.ConfigError, match=r"\['modle'\].*valid names: schedule"):
        ex.run_sweep(cfg, results_dir=tmp_path / "r", build_dir=tmp_path / "b",
                     executor=lambda *a: calls.append(a))
    assert calls == []
    assert not (tmp_path / "r").exists()


def test_committed_configs_load():
    """Every experiments/*.yaml validates and uses only the experiment notebook's parameters."""
    configs = sorted((ROOT / "experiments").glob("*.yaml"))
    assert configs, "experiments/ holds no configs"
    names = set()
    for path in configs:
        cfg = ex.load_config(path)
        assert cfg.name not in names, f"{path}: duplicate name {cfg.name}"
        names.add(cfg.name)
        keys = set().union(*(r.params for r in cfg.runs()))
        ex.check_parameters(cfg.notebook, keys)
    scales = {ex.load_config(p).scale for p in configs}
    assert scales == {"cpu", "paper"}


# ---------------------------------------------------------------- the runner (injected executor)


class FakeExecutor:
    """Writes a result like the notebook would; fails or interrupts on chosen calls."""

    def __init__(self, interrupt_at: int | None = None, fail: set[int] = frozenset()):
        self.calls: list[dict] = []
        self.interrupt_at = interrupt_at
        self.fail = fail

    def __call__(self, notebook, executed, params, out_dir, timeout_s):
        self.calls.append(dict(params))
        n = len(self.calls)
        if n == self.interrupt_at:
            raise KeyboardInterrupt
        if n in self.fail:
            return ex.RunOutcome("failed", error="ValueError: boom")
        return ex.RunOutcome("ok", result={"value": params["m"] * 10, "schedule": params["schedule"]})


def digest(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_interrupted_sweep_resumes_without_touching_finished_runs(tmp_path):
    """Interrupt after two runs; the rerun executes only the two missing ones and leaves the
    finished records byte-for-byte and mtime-for-mtime unchanged."""
    cfg = ex.load_config(write(tmp_path, BASIC))
    res = tmp_path / "results"
    first = FakeExecutor(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=first)
    done = sorted((res / "runs").glob("*.json"))
    assert len(done) == 2
    before = {p.name: digest(p) for p in done}
    assert (res / "results.csv").is_file()  # the table is written even on interrupt
    time.sleep(0.01)

    second = FakeExecutor()
    summary = ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=second)
    ids = [r.run_id for r in cfg.runs()]
    assert summary.executed == ids[2:]
    assert summary.reused == ids[:2]
    assert [c["m"] for c in second.calls] == [cfg.runs()[2].params["m"], cfg.runs()[3].params["m"]]
    assert {p.name: digest(p) for p in done} == before
    assert len(list((res / "runs").glob("*.json"))) == 4
    assert not list((res / "runs").glob(".*tmp"))  # no temporary files left behind

    third = FakeExecutor()
    ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=third)
    assert third.calls == []


def test_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    """A failing run gets a record with its error; later runs still execute; a rerun retries
    only the failed one; --force reruns everything."""
    import pandas as pd

    cfg = ex.load_config(write(tmp_path, BASIC))
    res = tmp_path / "results"
    summary = ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=FakeExecutor(fail={2}))
    assert summary.count("ok") == 3 and summary.count("failed") == 1
    failed_id = cfg.runs()[1].run_id
    record = json.loads((res / "runs" / f"{failed_id}.json").read_text())
    assert record["status"] == "failed" and record["error"] == "ValueError: boom"
    table = pd.read_csv(res / "results.csv")
    assert len(table) == 4 and sorted(table["status"]) == ["failed", "ok", "ok", "ok"]
    assert sorted(table.loc[table.status == "ok", "value"]) == sorted(
        r.params["m"] * 10 for i, r in enumerate(cfg.runs()) if i != 1)
    assert len(pd.read_parquet(res / "results.parquet")) == 4

    retry = FakeExecutor()
    ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=retry)
    assert len(retry.calls) == 1 and retry.calls[0] == dict(cfg.runs()[1].params)

    forced = FakeExecutor()
    ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", executor=forced, force=True)
    assert len(forced.calls) == 4
    # every replaced record (1 failed retry + 4 forced) is kept under runs/history
    assert len(list((res / "runs" / "history").glob("*.json"))) == 5
    assert len(ex.read_records(res)) == 4


def test_executor_exception_does_not_stop_the_sweep(tmp_path):
    """An executor that raises is recorded as a failed run with the exception's text."""
    cfg = ex.load_config(write(tmp_path, BASIC))

    def broken(*args):
        raise OSError("disk on fire")

    summary = ex.run_sweep(cfg, results_dir=tmp_path / "r", build_dir=tmp_path / "b", executor=broken)
    assert summary.count("failed") == 4
    rec = ex.read_records(tmp_path / "r")[0]
    assert rec["error"] == "OSError: disk on fire"


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    """write_json_atomic never leaves a half-written file: an unserialisable value keeps the old one."""
    path = tmp_path / "x.json"
    ex.write_json_atomic(path, {"a": 1})
    before = path.read_bytes()

    class Boom:
        def __str__(self):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        ex.write_json_atomic(path, {"a": Boom()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


# ---------------------------------------------------------------- simulation path


def test_simulate_point_matches_1f1b_closed_form():
    """1F1B with F=B=W: bubble rate (p-1)/(m+p-1), peak p·a, ratios 1 against itself."""
    r = ex.simulate_point("1f1b", 8, 24)
    assert r["status"] == "ok"
    assert r["bubble_rate"] == pytest.approx(7 / 31)
    assert r["peak_memory_a"] == 8
    assert r["throughput_vs_1f1b"] == 1 and r["memory_vs_1f1b"] == 1


def test_simulate_point_paper_costs_give_activation_gb():
    """With the 9.6B preset and paper costs, 1F1B's activation is p·a = 16 × 1.875 layers × 1.55 GB."""
    r = ex.simulate_point("1f1b", 16, 32, costs="paper", model="9.6B", microbatch_size=4)
    assert r["activation_gb"] == pytest.approx(16 * 30 / 16 * 4 * 1024 * (34 * 5120 + 5 * 40 * 1024) / 1e9)
    assert "A100 cost model" in r["how"]


def test_simulate_point_skips_unregistered_schedule():
    r = ex.simulate_point("no-such-schedule", 4, 8)
    assert r["status"] == "skipped" and "not registered" in r["reason"]


def test_measure_costs_need_a_real_backend():
    with pytest.raises(ValueError, match="needs a real run"):
        ex.simulate_point("1f1b", 4, 8, costs="measure")


def test_real_run_reports_unavailable_clearly(monkeypatch):
    """Without `ctrlmem run`, the real path raises a RuntimeError saying so."""
    monkeypatch.setattr(ex.points, "real_run_available", lambda: (False, "no run command"))
    with pytest.raises(RuntimeError, match="real run not available: no run command"):
        ex.real_run_point("1f1b", 2, 4, backend="gloo", launcher="local", quick=True, out_dir="unused")


# ---------------------------------------------------------------- real papermill


@pytest.mark.slow
def test_papermill_sweep_end_to_end(tmp_path):
    """Two real papermill runs: one simulated result, one skipped unregistered schedule; the
    executed notebooks land in the build folder."""
    cfg = ex.load_config(write(tmp_path, """
name: e2e
description: real papermill
scale: cpu
timeout_s: 300
params: {p: 4, m: 8, model: cpu-tiny, quick: true}
grid:
  schedule: [zb-h1, no-such-schedule-yet]
"""))
    summary = ex.run_sweep(cfg, results_dir=tmp_path / "r", build_dir=tmp_path / "b")
    assert summary.statuses == {cfg.runs()[0].run_id: "ok", cfg.runs()[1].run_id: "skipped"}
    ok = json.loads((tmp_path / "r" / "runs" / f"{cfg.runs()[0].run_id}.json").read_text())
    # ZB-H1, F=B=W: per-device bubble (p-1)(F+B-W) = 3 full-stage units; span 3m + 3 = 27.
    assert ok["result"]["bubble_rate"] == pytest.approx(1 - 24 / 27)
    assert ok["result"]["peak_memory_a"] == 4
    assert (tmp_path / "b" / f"{cfg.runs()[0].run_id}.ipynb").is_file()
    skipped = ex.read_records(tmp_path / "r")
    assert any("not registered" in (r["error"] or "") for r in skipped)


TIMEOUT_NB = {
    "cells": [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]}, "execution_count": None, "outputs": [],
         "source": "seconds = 0\nout_dir = 'x'\nraise_error = False"},
        {"cell_type": "code", "id": "body", "metadata": {}, "execution_count": None, "outputs": [],
         "source": "import json, pathlib, time\nif raise_error:\n    raise ValueError('bad point')\n"
                   "time.sleep(seconds)\npathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)\n"
                   "(pathlib.Path(out_dir) / 'result.json').write_text(json.dumps({'slept': seconds}))"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


@pytest.mark.slow
def test_timeout_and_notebook_error_are_recorded(tmp_path):
    """A run over its timeout is killed and recorded; a raising cell is recorded with ename: evalue."""
    nb = tmp_path / "sleep.ipynb"
    nb.write_text(json.dumps(TIMEOUT_NB))
    cfg = ex.load_config(write(tmp_path, f"""
name: timeouts
description: d
scale: cpu
notebook: {nb}
timeout_s: 20
cases: [{{seconds: 0}}, {{seconds: 120}}, {{raise_error: true}}]
"""))
    t0 = time.time()
    summary = ex.run_sweep(cfg, results_dir=tmp_path / "r", build_dir=tmp_path / "b")
    assert time.time() - t0 < 100
    records = {r["params"].get("seconds", "err"): r for r in ex.read_records(tmp_path / "r")}
    assert records[0]["status"] == "ok" and records[0]["result"] == {"slept": 0}
    assert records[120]["status"] == "failed" and records[120]["error"].startswith("timeout")
    assert records["err"]["status"] == "failed" and records["err"]["error"] == "ValueError: bad point"
    assert summary.count("failed") == 2


@pytest.mark.slow
def test_killed_sweep_process_resumes(tmp_path):
    """SIGKILL the `ctrlmem sweep` process after two runs; the rerun executes only the rest and
    the finished records keep their bytes and mtimes."""
    cfg_path = write(tmp_path, BASIC)
    res, build = tmp_path / "r", tmp_path / "b"
    cmd = [sys.executable, "-m", "ctrlmem.cli", "sweep", str(cfg_path), "--results", str(res),
           "--build", str(build), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(list((res / "runs").glob("*.json"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = sorted((res / "runs").glob("*.json"))
    assert 2 <= len(done) < 4
    before = {p.name: digest(p) for p in done}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"{4 - len(done)} executed, {len(done)} already done" in out.stdout
    assert {p.name: digest(p) for p in done} == before
    assert len(list((res / "runs").glob("*.json"))) == 4


PID_NB = {
    "cells": [
        {"cell_type": "code", "id": "params", "metadata": {"tags": ["parameters"]}, "execution_count": None,
         "outputs": [], "source": "seconds = 0\nhold = ''\nout_dir = 'x'\ntag = 0"},
        {"cell_type": "code", "id": "body", "metadata": {}, "execution_count": None, "outputs": [],
         "source": "import json, os, pathlib, time\nout = pathlib.Path(out_dir)\nout.mkdir(parents=True, exist_ok=True)\n"
                   "(out / 'kernel.pid').write_text(str(os.getpid()))\nt0 = time.time()\n"
                   "while hold and os.path.exists(hold) and time.time() - t0 < seconds:\n    time.sleep(0.1)\n"
                   "(out / 'result.json').write_text(json.dumps({'tag': tag}))"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_stops_the_sweep_like_ctrl_c(tmp_path):
    """SIGTERM to `ctrlmem sweep` while its third run sleeps: the sweep stops at once (not after
    the run), the run in flight is killed and leaves no record, the finished records keep their
    bytes and mtimes, and the rerun executes exactly the interrupted and the remaining runs."""
    nb = tmp_path / "sleep.ipynb"
    nb.write_text(json.dumps(PID_NB))
    hold = tmp_path / "hold"  # the third run waits while this file exists (at most 120 s)
    hold.write_text("")
    cfg_path = write(tmp_path, f"""
name: sigterm
description: d
scale: cpu
notebook: {nb}
timeout_s: 200
cases: [{{tag: 1}}, {{tag: 2}}, {{tag: 3, seconds: 120, hold: {hold}}}, {{tag: 4}}]
""")
    cfg = ex.load_config(cfg_path)
    ids = [r.run_id for r in cfg.runs()]
    res, build = tmp_path / "r", tmp_path / "b"
    cmd = [sys.executable, "-m", "ctrlmem.cli", "sweep", str(cfg_path), "--results", str(res),
           "--build", str(build), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid_file = build / ids[2] / "kernel.pid"
    kernel_pid = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (pid_file.is_file() and pid_file.read_text().strip()):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        kernel_pid = int(pid_file.read_text())
        done = sorted((res / "runs").glob("*.json"))
        assert [p.stem for p in done] == sorted(ids[:2])
        before = {p.name: digest(p) for p in done}
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)  # the sweep process only, as `kill PID` would
        _out, err = proc.communicate(timeout=60)
        assert time.time() - t0 < 30, "the sweep waited for the run in flight"
        assert proc.returncode != 0
        deadline = time.time() + 20
        while time.time() < deadline and _alive(kernel_pid):
            time.sleep(0.2)
        assert not _alive(kernel_pid), "the in-flight run's kernel outlived the sweep"
        assert not (build / ids[2] / "result.json").exists()
        assert sorted(p.stem for p in (res / "runs").glob("*.json")) == sorted(ids[:2])
        assert {p.name: digest(p) for p in done} == before

        hold.unlink()
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "2 executed, 2 already done" in out.stdout
        assert {p.name: digest(p) for p in done} == before
        records = {r["run_id"]: r for r in ex.read_records(res)}
        assert records[ids[2]]["status"] == "ok" and records[ids[2]]["result"] == {"tag": 3}
        assert len(records) == 4
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if kernel_pid is not None and _alive(kernel_pid):
            os.kill(kernel_pid, signal.SIGKILL)


def test_measured_costs_from_a_run_result(tmp_path):
    """costs='result:PATH' prices a schedule from a real run's measured per-stage costs (summed
    over stages, divided by p); a fused-backward measurement (w = 0) is refused with the fix."""
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"measured_costs": {"f": [1.0, 3.0], "b": [2.0, 2.0], "w": [1.0, 1.0], "comm": 0.5}}))
    costs, how = ex.resolve_costs(f"result:{split}", None, 2, 1, 1024)
    assert (costs.f, costs.b, costs.w, costs.comm) == (2.0, 2.0, 1.0, 0.5)
    assert "measured" in how
    r = ex.simulate_point("zb-v", 2, 4, costs=f"result:{split}")
    assert r["status"] == "ok" and r["costs"]["f"] == 2.0
    fused = tmp_path / "fused.json"
    fused.write_text(json.dumps({"measured_costs": {"f": [1.0], "b": [2.0], "w": [0.0], "comm": 0.0}}))
    with pytest.raises(ValueError, match="fused backward.*zb-h1"):
        ex.resolve_costs(f"result:{fused}", None, 2, 1, 1024)
    with pytest.raises(ValueError, match="no such file"):
        ex.resolve_costs(f"result:{tmp_path / 'missing.json'}", None, 2, 1, 1024)


def test_records_are_ordinary_readable_files(tmp_path):
    """Atomic writes keep the usual permissions (not mkstemp's 0600)."""
    path = tmp_path / "r.json"
    ex.write_json_atomic(path, {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_cli_sweep_list_and_bad_config(tmp_path, capsys):
    """`ctrlmem sweep --list` prints one line per run; a bad config exits 2 naming file and key."""
    from ctrlmem import cli

    cfg = write(tmp_path, BASIC)
    assert cli.main(["sweep", str(cfg), "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [r.run_id for r in ex.load_config(cfg).runs()]
    bad = write(tmp_path, "name: x\ndescription: d\nscale: cpu\ngrid: {p: 4}\n", "bad.yaml")
    assert cli.main(["sweep", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "grid.p" in err and len(err.strip().splitlines()) == 1
