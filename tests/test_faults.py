"""Fault injection: timeouts, signals and kills of `ctrlmem run` and `ctrlmem sweep`.

Every scenario checks the same contract: the command ends within a bounded time, nothing it
started is left running (every process carrying the test's environment token is checked, so
re-parented orphans and processes in their own sessions count too), a failed run never leaves a
success record, the culprit rank is named, and finished records are never lost.

The real multi-process scenarios are marked slow (tiny model, gloo, p = 2; each ends in well
under a minute); the lock, record and stale-run logic is also tested fast, in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ctrlmem import experiments as ex
from ctrlmem.util import proctree
from ctrlmem.runtime.launch import culprit, torchrun_failures

PY = sys.executable
TOKEN_ENV = "CTRLMEM_TEST_TOKEN"


# ---------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _in_tmp_cwd(tmp_path, monkeypatch):
    """Every test runs from a temporary working directory: relative paths mean it."""
    monkeypatch.chdir(tmp_path)


def token_env(token: str) -> dict:
    env = dict(os.environ, **{TOKEN_ENV: token})
    env.pop(proctree.TAG_ENV, None)
    return env


def alive_with(token: str, **env_match: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries ``token`` (and ``env_match``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get(TOKEN_ENV) != token or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        if all(env.get(k) == v for k, v in env_match.items()):
            found.append(proc)
    return found


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def assert_nothing_left(token: str, grace: float = 5.0) -> None:
    """Nothing carrying ``token`` is alive (after ``grace`` s for processes already exiting);
    kills leftovers so a failing test does not leak them."""
    deadline = time.monotonic() + grace
    left = alive_with(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = alive_with(token)
    desc = []
    for p in left:
        try:
            desc.append(f"{p.pid} {' '.join(p.cmdline()[:5])}")
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"processes of the run left running: {desc}"


def _interruptible() -> None:
    """In the child: SIGINT back to its default, so Python turns it into KeyboardInterrupt even
    when the test runner was started in the background (a shell's background job ignores SIGINT,
    and its children inherit that), as a user's Ctrl-C would reach a foreground ctrlmem."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ctrlmem(*args: str, cwd: Path, token: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "ctrlmem.cli", *args], cwd=cwd, env=token_env(token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interruptible)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the command did not end within {timeout:g} s: {err[-500:]}") from None
    return proc.returncode, out, err, time.monotonic() - t0


# ---------------------------------------------------------------- torchrun's failure summary (fast)

TORCHRUN_LOG = """\
E1201 00:29:12.515000 25088 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ctrlmem.runtime.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_00:29:12
  host      : host
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 25246)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 25246
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_00:29:12
  host      : host
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 25247)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 25247
============================================================
"""


def test_culprit_is_the_rank_killed_by_a_signal_not_the_one_reporting_the_broken_connection():
    """A rank killed by SIGKILL writes no error; the peer's "Connection reset" is the consequence."""
    failures = torchrun_failures(TORCHRUN_LOG)
    assert {(f["rank"], f["signal"], f["root_cause"]) for f in failures} == {(0, "SIGTERM", False),
                                                                              (1, "SIGKILL", True)}
    errors = [{"rank": 0, "where": "timed step 3, after pass 0BW1 (waiting for communication)", "in_pass": False,
               "time": 1.0, "reason": "RuntimeError: Connection reset by peer"}]
    assert culprit(errors, failures) == "rank 1 was killed by SIGKILL (exit code -9)"
    # without a signal, the rank that failed inside a pass comes before the one waiting for it
    errors.append({"rank": 1, "where": "step 0, in pass 1F0", "in_pass": True, "time": 2.0,
                   "reason": "RuntimeError: boom"})
    assert culprit(errors, []).startswith("rank 1 failed in step 0, in pass 1F0")


# ---------------------------------------------------------------- sweep lock and stale runs (fast)


NOTEBOOK_SRC = {
    "cells": [
        {"cell_type": "code", "execution_count": None, "id": "p", "metadata": {"tags": ["parameters"]},
         "outputs": [], "source": ["x = 0\n", "hang_file = ''\n", "out_dir = ''\n"]},
        {"cell_type": "code", "execution_count": None, "id": "w", "metadata": {}, "outputs": [],
         "source": ["import json, os, time\n",
                    "os.makedirs(out_dir, exist_ok=True)\n",
                    "while x == 1 and hang_file and os.path.exists(hang_file):\n",
                    "    time.sleep(0.2)\n",
                    "json.dump({'status': 'ok', 'x': x}, open(os.path.join(out_dir, 'result.json'), 'w'))\n"]},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def sweep_dir(tmp_path: Path, timeout_s: float = 120) -> Path:
    """A working folder with a two-point sweep: x=0 finishes at once, x=1 waits while ``hang``
    exists."""
    (tmp_path / "nb.ipynb").write_text(json.dumps(NOTEBOOK_SRC))
    (tmp_path / "cfg.yaml").write_text(
        f"name: faults\ndescription: d\nscale: cpu\nnotebook: nb.ipynb\ntimeout_s: {timeout_s}\n"
        f"params: {{hang_file: {json.dumps(str(tmp_path / 'hang'))}}}\ngrid: {{x: [0, 1]}}\n")
    return tmp_path


@pytest.mark.slow  # two sweep processes: the full tier runs it, --fast does not
def test_second_sweep_on_a_locked_results_folder_is_refused_naming_the_holder(tmp_path):
    """Two sweeps never share a results folder: the second exits 2 in one line naming the holder."""
    cwd = sweep_dir(tmp_path)
    results = cwd / "experiments" / "results" / "faults"
    with ex.SweepLock(results) as lock:
        lock.acquire()
        p = subprocess.run([PY, "-m", "ctrlmem.cli", "sweep", "cfg.yaml", "--no-progress"], cwd=cwd,
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use by another sweep" in lines[0] and f"pid {os.getpid()}" in lines[0], p.stderr
    assert not (results / "runs").exists()


def test_sweep_waits_for_the_lock_with_wait(tmp_path):
    """``wait=`` seconds: a sweep queues behind the holder and runs once the lock is free."""
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"
    lock = ex.SweepLock(results)
    lock.acquire()
    messages = []
    import threading

    threading.Timer(1.0, lock.release).start()
    t0 = time.monotonic()
    summary = ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False, lock_wait=30,
                           executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}), on_message=messages.append)
    assert time.monotonic() - t0 >= 0.9
    assert summary.count("ok") == 2 and any("waiting for the sweep" in m for m in messages)


def _dead_owner() -> tuple[int, float]:
    """The pid and start time of a process that has exited (a sweep killed with SIGKILL)."""
    proc = subprocess.Popen([PY, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait(timeout=30)
    return proc.pid, started


def _marker(folder: Path, run_id: str, tag: str, pid: int, started: float, **over) -> Path:
    """An in-flight marker as a sweep writes it (owner: ``pid`` started at ``started``, this host,
    this results folder), with ``over`` replacing fields."""
    import socket

    from ctrlmem.experiments.store import folder_identity

    folder.mkdir(parents=True, exist_ok=True)
    info = {"run_id": run_id, "tag": tag, "sweep_pid": pid, "sweep_started": started,
            "host": socket.gethostname(), "results": folder_identity(folder), **over}
    path = folder / ".inflight" / f"{run_id}.json"
    ex.write_json_atomic(path, info)
    return path


def test_a_stale_in_flight_run_is_stopped_before_the_point_runs_again(tmp_path):
    """What a SIGKILLed sweep left running (found by its tag) is ended by the next sweep, when the
    marker's owner is provably dead and the marker was written for this folder."""
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"
    tag = proctree.new_tag("test-stale")
    orphan = proctree.start([PY, "-c", "import time; time.sleep(600)"], tag)
    run_id = cfg.runs()[1].run_id
    _marker(results, run_id, tag, *_dead_owner())
    messages = []
    summary = ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False,
                           executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}), on_message=messages.append)
    assert orphan.wait(timeout=10) is not None
    assert any(run_id in m and str(orphan.pid) in m for m in messages), messages
    assert summary.count("ok") == 2 and not list((results / ".inflight").glob("*.json"))


@pytest.mark.parametrize("owner", ["copied folder", "live owner", "pid reused", "other host", "old marker"])
def test_a_marker_whose_owner_is_not_provably_dead_leaves_the_processes_alone(tmp_path, owner):
    """A marker from another results folder (a copy: another inode), whose owner is alive, whose
    owner ran on another host, or that does not say which folder it belongs to: the tagged
    processes keep running; a pid now used by a process started later counts as dead."""
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"
    tag = proctree.new_tag("test-foreign")
    other = proctree.start([PY, "-c", "import time; time.sleep(600)"], tag)
    try:
        run_id = cfg.runs()[1].run_id
        me = psutil.Process(os.getpid())
        live = (other.pid, psutil.Process(other.pid).create_time())
        if owner == "copied folder":  # written by a live sweep for the original folder, then copied
            original = tmp_path / "original"
            original.mkdir()
            marker = _marker(original, run_id, tag, *live)
            (results / ".inflight").mkdir(parents=True)
            (results / ".inflight" / marker.name).write_bytes(marker.read_bytes())
        elif owner == "live owner":
            _marker(results, run_id, tag, *live)
        elif owner == "pid reused":  # the pid is alive, but started after the marker's owner
            _marker(results, run_id, tag, other.pid, live[1] - 3600)
        elif owner == "other host":
            _marker(results, run_id, tag, *_dead_owner(), host="elsewhere.example")
        else:
            _marker(results, run_id, tag, me.pid, me.create_time(), results=None)
        messages = []
        ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False,
                     executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}), on_message=messages.append)
        if owner == "pid reused":
            assert other.wait(timeout=10) is not None, "a marker whose pid was reused is a dead owner's"
        else:
            time.sleep(0.5)
            assert other.poll() is None, f"{owner}: the tagged process was stopped; {messages}"
            assert any(run_id in m and ("left alone" in m or "no process was touched" in m) for m in messages), messages
    finally:
        proctree.kill_tree(other, tag)


def test_slurm_launcher_refuses_a_locked_results_folder(tmp_path, monkeypatch):
    """`--launcher slurm` takes the same lock as the local launcher: a folder another sweep holds
    is refused naming the holder, before anything is submitted."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.log"
    for cmd in ("sbatch", "squeue", "scontrol"):
        (fake / cmd).write_text(f"#!/bin/sh\necho {cmd} \"$@\" >> {calls}\nexit 1\n")
        (fake / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"
    holder = ex.SweepLock(results)
    holder.acquire()
    try:
        with pytest.raises(ex.SweepLocked, match=f"pid {os.getpid()}"):
            ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False, launcher="slurm")
    finally:
        holder.release()
    assert not calls.exists(), calls.read_text()
    assert not (results / "runs").exists()


@pytest.mark.parametrize("content", ['{"status": "ok"}', "[]", "null", '{"status": "ok", "run_id": "x', "",
                                     '{"run_id": "R", "status": "ok", "params": {}}'])
def test_an_invalid_record_is_reported_by_name_and_not_counted_done(tmp_path, content):
    """A record that is not valid is named in a message, run again, and kept in history."""
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"
    run_id = cfg.runs()[0].run_id
    bad = results / "runs" / f"{run_id}.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(content.replace('"R"', json.dumps(run_id)))
    problems: list[str] = []
    assert ex.read_records(results, problems) == [] and len(problems) == 1 and str(bad) in problems[0]
    messages, calls = [], []

    def executor(nb, executed, params, out_dir, timeout):
        calls.append(params["x"])
        return ex.RunOutcome("ok", result={"v": params["x"]})

    ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False, executor=executor,
                 on_message=messages.append)
    assert calls == [0, 1]
    assert any(str(bad) in m for m in messages)
    assert ex.read_record(bad)[1] is None
    assert len(list((results / "runs" / "history").glob(f"{run_id}.*.json"))) == 1


def test_interrupted_sweep_keeps_finished_records(tmp_path):
    """Ctrl-C during a point: the finished points' records and the table survive; no marker left."""
    cfg = ex.load_config(sweep_dir(tmp_path) / "cfg.yaml")
    results = tmp_path / "res"

    def executor(nb, executed, params, out_dir, timeout):
        if params["x"] == 1:
            raise KeyboardInterrupt
        return ex.RunOutcome("ok", result={"v": 0})

    with pytest.raises(KeyboardInterrupt):
        ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False, executor=executor)
    records = ex.read_records(results)
    assert [r["params"]["x"] for r in records] == [0]
    assert (results / "results.csv").is_file() and not list((results / ".inflight").glob("*.json"))
    # and the lock was released: a second sweep runs
    ex.run_sweep(cfg, results_dir=results, build_dir=tmp_path / "b", check=False,
                 executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}))


# ---------------------------------------------------------------- ctrlmem run (slow, real processes)


RUN_ARGS = ("run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "100000", "--out", "o")


def _result(cwd: Path) -> dict:
    return json.loads((cwd / "o" / "result.json").read_text())


@pytest.mark.slow
def test_run_timeout_stops_every_process_and_records_failure(tmp_path):
    token = f"run-timeout-{os.getpid()}"
    proc = ctrlmem(*RUN_ARGS, "--timeout", "8", cwd=tmp_path, token=token)
    rc, out, err, elapsed = finish(proc, 90)
    assert rc == 1, err
    assert_nothing_left(token, grace=1.0)
    res = _result(tmp_path)
    assert res["status"] == "failed" and "timeout of 8 s" in res["failure"]
    time.sleep(3)  # no late success record from a worker that survived
    assert _result(tmp_path)["status"] == "failed"


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_run_signal_ends_cleanly_and_stops_every_process(tmp_path, sig, code, word):
    token = f"run-{word}-{os.getpid()}"
    proc = ctrlmem(*RUN_ARGS, cwd=tmp_path, token=token)
    wait_for(lambda: alive_with(token, RANK="1"), 90, "rank 1 to start")
    time.sleep(2)
    proc.send_signal(sig)
    rc, out, err, elapsed = finish(proc, 30)
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in err, err
    assert_nothing_left(token, grace=1.0)
    res = _result(tmp_path)
    assert res["status"] == "failed" and word in res["failure"]


@pytest.mark.slow
def test_sigkill_of_one_rank_names_that_rank(tmp_path):
    token = f"run-kill-{os.getpid()}"
    proc = ctrlmem(*RUN_ARGS, "--timeout", "120", cwd=tmp_path, token=token)
    victim = wait_for(lambda: alive_with(token, RANK="1"), 90, "rank 1 to start")[0]
    time.sleep(3)
    victim.send_signal(signal.SIGKILL)
    rc, out, err, elapsed = finish(proc, 60)
    assert rc == 1 and elapsed < 60
    assert "rank 1 was killed by SIGKILL" in out, out
    assert_nothing_left(token, grace=1.0)
    res = _result(tmp_path)
    assert res["status"] == "failed" and res["failure"].startswith("rank 1 was killed by SIGKILL")


@pytest.mark.slow
def test_sigkill_of_ctrlmem_run_takes_torchrun_and_workers_down(tmp_path):
    """`kill -9` of the launcher: torchrun gets SIGTERM from the kernel and stops its workers."""
    token = f"run-launcher-kill-{os.getpid()}"
    proc = ctrlmem(*RUN_ARGS, cwd=tmp_path, token=token)
    wait_for(lambda: alive_with(token, RANK="1"), 90, "rank 1 to start")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert_nothing_left(token, grace=30.0)
    assert not (tmp_path / "o" / "result.json").exists() or _result(tmp_path)["status"] != "ok"


# ---------------------------------------------------------------- ctrlmem sweep (slow, papermill)


def _records(cwd: Path) -> dict:
    return {r["params"]["x"]: r for r in ex.read_records(cwd / "experiments" / "results" / "faults")}


def _hanging_sweep(cwd: Path, token: str, *extra: str) -> subprocess.Popen:
    (cwd / "hang").write_text("")
    proc = ctrlmem("sweep", "cfg.yaml", "--no-progress", *extra, cwd=cwd, token=token)
    wait_for(lambda: 0 in _records(cwd), 120, "point x=0 to finish")
    wait_for(lambda: [p for p in alive_with(token) if "ipykernel" in " ".join(p.cmdline())], 60,
             "the kernel of point x=1")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_sweep_signal_ends_cleanly_keeps_finished_records(tmp_path, sig, code, word):
    cwd = sweep_dir(tmp_path)
    token = f"sweep-{word}-{os.getpid()}"
    proc = _hanging_sweep(cwd, token)
    proc.send_signal(sig)
    rc, out, err, elapsed = finish(proc, 30)
    assert rc == code, err
    lines = err.strip().splitlines()
    want = "ctrlmem sweep: terminated (SIGTERM)" if word == "SIGTERM" else "ctrlmem sweep: interrupted (SIGINT)"
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(want), err
    assert_nothing_left(token, grace=1.0)
    records = _records(cwd)
    assert set(records) == {0} and records[0]["status"] == "ok"


@pytest.mark.slow
def test_sweep_timeout_stops_the_kernel_and_records_failure(tmp_path):
    cwd = sweep_dir(tmp_path, timeout_s=15)
    token = f"sweep-timeout-{os.getpid()}"
    (cwd / "hang").write_text("")
    rc, out, err, elapsed = finish(ctrlmem("sweep", "cfg.yaml", "--no-progress", cwd=cwd, token=token), 120)
    assert rc == 1, err
    assert_nothing_left(token, grace=1.0)
    records = _records(cwd)
    assert records[0]["status"] == "ok" and records[1]["status"] == "failed" and "timeout" in records[1]["error"]


@pytest.mark.slow
def test_sweep_killed_then_rerun_stops_the_orphans_and_loses_nothing(tmp_path):
    cwd = sweep_dir(tmp_path)
    token = f"sweep-kill-{os.getpid()}"
    proc = _hanging_sweep(cwd, token)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    # papermill gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and its kernel follows it
    assert_nothing_left(token, grace=20.0)
    # the rerun (another token) finds what the dead sweep left, stops it, and redoes only x=1
    (cwd / "hang").unlink()
    token2 = token + "-rerun"
    rc, out, err, elapsed = finish(ctrlmem("sweep", "cfg.yaml", "--no-progress", cwd=cwd, token=token2), 120)
    assert rc == 0, err
    assert "1 executed, 1 already done" in out, out
    assert_nothing_left(token, grace=1.0)
    assert_nothing_left(token2, grace=1.0)
    records = _records(cwd)
    assert records[0]["status"] == "ok" and records[1]["status"] == "ok"


@pytest.mark.slow
def test_a_second_sweep_on_a_copied_results_folder_leaves_the_first_ones_processes_alone(tmp_path):
    """The results folder is copied while a sweep runs a point (its in-flight marker included); a
    sweep on the copy finds the marker, leaves the live sweep's papermill and kernel running and
    says why; the first sweep then finishes its point normally."""
    cwd = sweep_dir(tmp_path)
    token = f"sweep-copy-{os.getpid()}"
    first = _hanging_sweep(cwd, token)
    original = cwd / "experiments" / "results" / "faults"
    copy = tmp_path / "copied-results"
    shutil.copytree(original, copy, symlinks=True)
    assert list((copy / ".inflight").glob("*.json")), "the copy holds the running point's marker"
    kernels = [p.pid for p in alive_with(token) if "ipykernel" in " ".join(p.cmdline())]
    messages = []
    cfg = ex.load_config(cwd / "cfg.yaml")
    summary = ex.run_sweep(cfg, results_dir=copy, build_dir=tmp_path / "b2", check=False, root=cwd,
                           executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}), on_message=messages.append)
    assert summary.count("ok") == 2
    assert any("another results folder" in m and "no process was touched" in m for m in messages), messages
    assert all(psutil.pid_exists(pid) for pid in kernels), "the first sweep's kernel was stopped"
    (cwd / "hang").unlink()
    rc, out, err, _ = finish(first, 120)
    assert rc == 0, err
    assert _records(cwd)[1]["status"] == "ok"
    assert_nothing_left(token, grace=5.0)


@pytest.mark.slow
def test_two_concurrent_sweeps_one_refused_one_waits(tmp_path):
    cwd = sweep_dir(tmp_path)
    token = f"sweep-two-{os.getpid()}"
    first = _hanging_sweep(cwd, token)
    second = subprocess.run([PY, "-m", "ctrlmem.cli", "sweep", "cfg.yaml", "--no-progress"], cwd=cwd,
                            env=token_env(token + "-b"), capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
    waiting = ctrlmem("sweep", "cfg.yaml", "--no-progress", "--wait-for-lock", cwd=cwd, token=token + "-c")
    time.sleep(3)
    assert waiting.poll() is None  # queued behind the first
    (cwd / "hang").unlink()
    rc1, out1, err1, _ = finish(first, 60)
    rc3, out3, err3, _ = finish(waiting, 60)
    assert rc1 == 0 and rc3 == 0, (err1, err3)
    assert "0 executed, 2 already done" in out3, out3
    for t in (token, token + "-c"):
        assert_nothing_left(t, grace=1.0)
