"""The sweep's Slurm launcher.

Fast tests check the launcher's logic against stand-in Slurm commands (shell scripts on PATH).
The slow tests use a real one-node Slurm (scripts/slurm-local.sh: Debian's slurm-wlm and munge,
daemons as root, state in a temporary folder): each runs real gloo jobs through sbatch + srun +
torchrun and executes the notebook with papermill. They are skipped unless root (the local
slurmd runs jobs as their user) and Slurm is installed or installable; the module's fixture
stops the daemons whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("papermill")

import ctrlmem as cm
from ctrlmem.experiments import ConfigError, config_from_dict, read_records, run_sweep
from ctrlmem.experiments import slurm as slurm_launcher

slow = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
NAMES = [n for n in ("1f1b", "v-half") if n in cm.SCHEDULES]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _daemon_pids(state_dir: Path) -> dict[str, int]:
    return {f.stem: int(f.read_text()) for f in state_dir.glob("*.pid") if f.read_text().strip().isdigit()}


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead daemon not yet reaped by its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root (slurmd runs jobs as their user)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and cannot be installed here")
    state = tmp_path_factory.mktemp("slurm-state")
    ports = _free_ports(2)
    env = {**os.environ, "CTRLMEM_SLURM_DIR": str(state), "CTRLMEM_SLURM_PORTS": f"{ports[0]},{ports[1]}"}
    info = {"dir": state, "env": env, "conf": str(state / "slurm.conf"), "pids": {}}
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"export SLURM_CONF={info['conf']}"
        info["pids"] = _daemon_pids(state)
        yield info
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def slurm_env(local_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", local_slurm["conf"])
    return local_slurm


def _config(tmp_path: Path, name: str, names: list[str] = NAMES):
    return config_from_dict({
        "name": name, "description": "real gloo runs through the Slurm launcher", "scale": "cpu",
        "notebook": str(REPO / "notebooks" / "10_experiment.ipynb"), "timeout_s": 300,
        "params": {"backend": "gloo", "launcher": "local", "model": "cpu-tiny", "costs": "measure",
                   "p": 2, "m": 4, "quick": True},
        "grid": {"schedule": names},
    }, tmp_path / f"{name}.yaml")


def _by_id(results: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in read_records(results)}


@slow
def test_slurm_sweep_records_equal_the_local_launchers(slurm_env, tmp_path):
    """The same config through the local launcher and through Slurm (one sbatch job per point):
    the same run ids and points, all ok and exact; saved-tensor peaks equal, allocator peaks
    within 15 %; the Slurm records name their COMPLETED job; a rerun submits nothing. One point
    (V-Half, the schedule whose peaks differ per rank; each point costs two real runs here, the
    tests below submit several)."""
    names = NAMES[-1:]
    config = _config(tmp_path, "slurm-vs-local", names)
    local = run_sweep(config, results_dir=tmp_path / "local", build_dir=tmp_path / "build-local", launcher="local")
    slurm = run_sweep(config, results_dir=tmp_path / "slurm", build_dir=tmp_path / "build-slurm", launcher="slurm",
                      poll_s=1)
    assert local.count("ok") == slurm.count("ok") == len(names)
    a, b = _by_id(tmp_path / "local"), _by_id(tmp_path / "slurm")
    assert set(a) == set(b) and len(a) == len(names)
    for run_id in a:
        ra, rb = a[run_id]["result"], b[run_id]["result"]
        assert a[run_id]["params"] == b[run_id]["params"]
        assert ra["schedule"] == rb["schedule"] and ra["config"]["num_devices"] == rb["config"]["num_devices"] == 2
        assert rb["grad_rel_diff"] <= 1e-5 and ra["grad_rel_diff"] <= 1e-5
        for x, y in zip(ra["peak_saved_bytes"], rb["peak_saved_bytes"]):
            assert abs(x / y - 1) <= 0.01, (run_id, ra["peak_saved_bytes"], rb["peak_saved_bytes"])
        for x, y in zip(ra["peak_alloc_bytes"], rb["peak_alloc_bytes"]):
            assert abs(x / y - 1) <= 0.15, (run_id, ra["peak_alloc_bytes"], rb["peak_alloc_bytes"])
        assert b[run_id]["launcher"] == "slurm" and b[run_id]["slurm"]["state"] == "COMPLETED"
        assert "launcher slurm, job " + b[run_id]["slurm"]["job_id"] in rb["how"]
    again = run_sweep(config, results_dir=tmp_path / "slurm", build_dir=tmp_path / "build-slurm", launcher="slurm",
                      poll_s=1)
    assert sorted(again.reused) == sorted(a) and not again.executed
    assert {k: v["slurm"]["job_id"] for k, v in _by_id(tmp_path / "slurm").items()} == \
           {k: v["slurm"]["job_id"] for k, v in b.items()}


@slow
def test_cancelled_job_is_recorded_failed_and_rerun(slurm_env, tmp_path):
    """Submit without waiting, scancel one job: the next sweep collects the other job without
    resubmitting it and records the cancelled point as failed with Slurm's CANCELLED state; the
    sweep after that resubmits only the failed point (a new job) and it ends ok."""
    config = _config(tmp_path, "slurm-cancel")
    kw = dict(results_dir=tmp_path / "res", build_dir=tmp_path / "build", launcher="slurm", poll_s=1)
    # the node drained while submitting: no job can start (and end) before one of them is cancelled,
    # however fast the machine (a fast first job was otherwise collected by the non-waiting sweep)
    nodes = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True,
                           timeout=60).stdout.split()
    for node in nodes:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=ctrlmem-test"],
                       check=True, timeout=60)
    try:
        first = run_sweep(config, wait=False, **kw)
        recs = _by_id(tmp_path / "res")
        assert first.count("submitted") == len(NAMES), {k: (r["status"], r.get("error")) for k, r in recs.items()}
        assert all(r["status"] == "submitted" and r["slurm"]["job_id"] for r in recs.values())
        victim = sorted(recs.values(), key=lambda r: int(r["slurm"]["job_id"]))[-1]
        subprocess.run(["scancel", victim["slurm"]["job_id"]], check=True, timeout=60)
    finally:
        for node in nodes:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True, timeout=60)

    second = run_sweep(config, **kw)
    after = _by_id(tmp_path / "res")
    failed = after[victim["run_id"]]
    assert failed["status"] == "failed" and failed["slurm"]["state"] == "CANCELLED"
    assert f"Slurm job {victim['slurm']['job_id']} ended CANCELLED" in failed["error"]
    for run_id, rec in after.items():
        if run_id != victim["run_id"]:
            assert rec["status"] == "ok" and rec["slurm"]["job_id"] == recs[run_id]["slurm"]["job_id"]
    assert second.count("failed") == 1

    third = run_sweep(config, **kw)
    final = _by_id(tmp_path / "res")
    assert third.executed == [victim["run_id"]]
    assert final[victim["run_id"]]["status"] == "ok"
    assert int(final[victim["run_id"]]["slurm"]["job_id"]) > int(victim["slurm"]["job_id"])
    history = list((tmp_path / "res" / "runs" / "history").glob(f"{victim['run_id']}.*.json"))
    assert any(json.loads(h.read_text())["status"] == "failed" for h in history)


@slow
def test_stop_leaves_no_slurm_daemon(local_slurm):
    """`slurm-local.sh stop` ends munged, slurmctld and slurmd (the pids `start` recorded, and any
    process naming the state folder), and `status` then reports the cluster down."""
    pids = local_slurm["pids"]
    assert set(pids) == {"munged", "slurmctld", "slurmd"}
    proc = subprocess.run(["bash", str(SCRIPT), "stop"], env=local_slurm["env"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, p in pids.items() if _alive(p)]
    left = subprocess.run(["pgrep", "-f", str(local_slurm["dir"])], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    status = subprocess.run(["bash", str(SCRIPT), "status"], env=local_slurm["env"], capture_output=True, text=True)
    assert status.returncode == 3 and "slurmctld: not running" in status.stdout


def _fake_slurm(tmp_path: Path, monkeypatch, squeue: str = "", scontrol: str = "") -> Path:
    """Stand-ins for sbatch (job ids 101, 102, ...; each call logged), squeue and scontrol (they
    print tmp_path/squeue.txt and tmp_path/scontrol.txt, which a test may rewrite)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    counter = tmp_path / "counter"
    counter.write_text("100")
    (tmp_path / "squeue.txt").write_text(squeue)
    (tmp_path / "scontrol.txt").write_text(scontrol)
    scripts = {
        "sbatch": f'#!/bin/sh\nn=$(($(cat {counter}) + 1)); echo $n > {counter}; echo "$@" >> {log}; echo "$n"\n',
        "squeue": f"#!/bin/sh\ncat {tmp_path / 'squeue.txt'}\n",
        "scontrol": f"#!/bin/sh\ncat {tmp_path / 'scontrol.txt'}\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_job_states_read_squeue_then_scontrol(tmp_path, monkeypatch):
    """Queued jobs take squeue's state; a job that left the queue takes scontrol's JobState."""
    _fake_slurm(tmp_path, monkeypatch, squeue="7|RUNNING\n8|PENDING",
                scontrol="JobId=9 JobName=x JobState=CANCELLED Reason=None")
    assert slurm_launcher.job_states(["7", "8", "9"]) == {"7": "RUNNING", "8": "PENDING", "9": "CANCELLED"}


def test_controller_that_does_not_answer_is_not_taken_for_ended_jobs(tmp_path, monkeypatch):
    """squeue failing for another reason than unknown job ids raises, instead of the jobs
    being declared gone (and their points failed)."""
    _fake_slurm(tmp_path, monkeypatch)
    (tmp_path / "fakebin" / "squeue").write_text(
        "#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    with pytest.raises(slurm_launcher.SlurmError, match="Unable to contact slurm controller"):
        slurm_launcher.job_states(["5"])


@pytest.mark.slow
def test_submitted_job_still_running_is_not_resubmitted(tmp_path, monkeypatch):
    """A sweep submits every real-run point once (records say submitted, with the job id); a
    second sweep while Slurm still runs them submits nothing and leaves the records alone."""
    log = _fake_slurm(tmp_path, monkeypatch, squeue="101|RUNNING\n102|PENDING")
    config = _config(tmp_path, "fake-slurm")
    kw = dict(results_dir=tmp_path / "res", build_dir=tmp_path / "build", launcher="slurm", wait=False)
    first = run_sweep(config, **kw)
    assert first.count("submitted") == len(NAMES)
    recs = _by_id(tmp_path / "res")
    assert sorted(r["slurm"]["job_id"] for r in recs.values()) == [str(101 + i) for i in range(len(NAMES))]
    for r in recs.values():
        script = Path(r["slurm"]["script"]).read_text()
        assert "srun" in script and "-m torch.distributed.run" in script and "--nproc-per-node=2" in script
    submitted = log.read_text().splitlines()
    second = run_sweep(config, **kw)
    assert log.read_text().splitlines() == submitted  # nothing resubmitted
    assert second.count("submitted") == len(NAMES) and not second.executed
    assert _by_id(tmp_path / "res") == recs


@pytest.mark.slow
def test_job_that_ended_without_result_is_failed_with_its_state(tmp_path, monkeypatch):
    """A job Slurm reports FAILED, with a rank's error file in its run folder, is recorded failed
    with the state and the rank's message; the next sweep resubmits it."""
    log = _fake_slurm(tmp_path, monkeypatch, squeue="101|RUNNING")
    config = _config(tmp_path, "fake-fail")
    config = config_from_dict({**_raw(config), "grid": {"schedule": NAMES[:1]}}, tmp_path / "f.yaml")
    kw = dict(results_dir=tmp_path / "res", build_dir=tmp_path / "build", launcher="slurm", poll_s=0.01)
    run_sweep(config, wait=False, **kw)
    rec = next(iter(_by_id(tmp_path / "res").values()))
    assert rec["status"] == "submitted"
    (tmp_path / "squeue.txt").write_text("")  # the job left the queue...
    (tmp_path / "scontrol.txt").write_text("JobId=101 JobState=FAILED Reason=NonZeroExitCode")
    run_dir = Path(rec["slurm"]["out"])
    (run_dir / "rank1.error.json").write_text(json.dumps(
        {"rank": 1, "in_pass": True, "time": 1.0, "where": "step 1, in pass 1F0", "reason": "RuntimeError: boom"}))
    summary = run_sweep(config, **kw)
    rec = next(iter(_by_id(tmp_path / "res").values()))
    assert summary.count("failed") == 1 and rec["status"] == "failed" and rec["slurm"]["state"] == "FAILED"
    assert "Slurm job 101 ended FAILED: rank 1 failed in step 1, in pass 1F0: RuntimeError: boom" in rec["error"]
    run_sweep(config, wait=False, **kw)
    assert len(log.read_text().splitlines()) == 2  # resubmitted once


def _raw(config) -> dict:
    return {"name": config.name, "description": config.description, "scale": config.scale,
            "notebook": str(config.notebook), "timeout_s": config.timeout_s, "params": dict(config.params)}


def test_no_slurm_on_path_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    """`ctrlmem sweep --launcher slurm` without sbatch on PATH exits 2 naming the fix."""
    from ctrlmem.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))
    path = tmp_path / "c.yaml"
    import yaml

    raw = _raw(_config(tmp_path, "no-slurm"))
    path.write_text(yaml.safe_dump({**raw, "grid": {"schedule": NAMES}}))
    assert main(["sweep", str(path), "--launcher", "slurm", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not on PATH" in err[0] and "slurm-local.sh start" in err[0]


@pytest.mark.parametrize("extra,needle", [({"launcher": "pbs"}, "key 'launcher' must be one of"),
                                          ({"slurm": {"queue": "x"}}, "unknown key 'slurm.queue'"),
                                          ({"slurm": {"nodes": "2"}}, "'slurm.nodes' has the wrong type")])
def test_launcher_config_keys_are_validated(tmp_path, extra, needle):
    """`launcher:` takes local or slurm; `slurm:` takes known options of the right type."""
    raw = {**_raw(_config(tmp_path, "keys")), "grid": {"schedule": NAMES}, **extra}
    with pytest.raises(ConfigError, match=needle):
        config_from_dict(raw, tmp_path / "k.yaml")
    ok = config_from_dict({**raw, "launcher": "slurm", "slurm": {"partition": "gpu", "nodes": 2, "poll_s": 1}},
                          tmp_path / "k.yaml")
    assert ok.launcher == "slurm" and ok.slurm == {"partition": "gpu", "nodes": 2, "poll_s": 1}
