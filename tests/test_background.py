"""The background builds of the explorer: one worker process, one build at a time; a newer
submission stops a build it no longer needs and keeps one it still needs; nothing outlives its
owner (close, or the owner killed)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import ctrlmem as cm
from ctrlmem.explorer.background import BackgroundBuilds, Job
from ctrlmem.explorer.views import Settings, StageCosts


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


@pytest.fixture
def builds():
    b = BackgroundBuilds()
    yield b
    b.close()


def test_a_background_build_is_the_build(builds):
    """The worker's schedule is cm.build's for the same arguments; errors come back as one line."""
    costs = cm.Costs(2, 1, 1, 0.1)
    builds.submit([Job("v-half", 4, 8, costs), Job("v-shape", 4, 8, costs, 0.01)])
    results = builds.wait(120)
    assert [r.job.name for r in results] == ["v-half", "v-shape"]
    ok, bad = results
    assert ok.error is None and ok.costs == costs
    assert ok.schedule.device_passes == cm.build("v-half", 4, 8, costs=costs).device_passes
    assert bad.schedule is None and "smallest feasible limit" in bad.error and "\n" not in bad.error
    assert builds.idle and builds.started_workers == 1


def test_stage_costs_are_learned_from_the_first_build(builds):
    """With per-stage weights and no stage count known, the worker builds once to learn it and
    again with the costs of that many stages."""
    settings = Settings(num_devices=4, num_microbatches=8, f=2, stage_weights=(2, 1, 1, 2))
    builds.submit([Job("v-half", 4, 8, settings.costs(), None, StageCosts(settings))])
    (res,) = builds.wait(120)
    assert res.costs == settings.costs(8) and isinstance(res.costs.f, tuple) and len(res.costs.f) == 8
    assert res.schedule.device_passes == cm.build("v-half", 4, 8, costs=settings.costs(8)).device_passes


def test_a_newer_submission_stops_what_it_no_longer_needs(builds):
    """A running build missing from the new list is stopped at once (its process killed); one
    still in it keeps running in the same process."""
    slow = Job("v-min", 16, 64, cm.Costs(2, 1, 1, 0))
    builds.submit([slow])
    first = builds._worker.process.pid
    assert builds.progress().job == slow
    builds.submit([Job("v-half", 4, 8, cm.Costs(2, 1, 1, 0))])
    assert not alive(first), "the unwanted build's process still runs"
    (res,) = builds.wait(120)
    assert res.job.name == "v-half" and builds.started_workers == 2
    # kept: the running job is in the new list too
    keep = Job("v-half", 8, 32, cm.Costs(3, 1, 1, 0))
    builds.submit([keep])
    pid = builds._worker.process.pid
    builds.submit([Job("1f1b-v", 4, 8, cm.Costs(3, 1, 1, 0)), keep])
    assert builds._worker.process.pid == pid and builds.progress().job == keep
    assert [r.job.name for r in builds.wait(120)] == ["v-half", "1f1b-v"]


def test_close_ends_the_worker(builds):
    builds.submit([Job("v-min", 16, 64, cm.Costs(2, 1, 1, 0))])
    pid = builds._worker.process.pid
    builds.close()
    assert not alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        builds.submit([])


def test_the_worker_dies_with_its_owner():
    """A kernel killed with SIGKILL takes its background build along (the worker asks Linux
    for PR_SET_PDEATHSIG and watches its parent)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        import ctrlmem as cm
        from ctrlmem.explorer.background import BackgroundBuilds, Job
        b = BackgroundBuilds()
        b.submit([Job("v-min", 32, 256, cm.Costs(2, 1, 1, 0))])
        print(b._worker.process.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(owner.stdout.readline())
        assert alive(worker)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the build process outlived its owner"
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_sweep_runs_ahead_of_the_polls(builds):
    """The worker's answer pipe holds several of a sweep's schedules (each pickled whole, tens
    of kB at p = 16, m = 64): while nobody polls, the worker goes on building, and the pipe fills
    past the default 64 kB, where the worker's send used to wait for the explorer's next poll."""
    fcntl = pytest.importorskip("fcntl")
    termios = pytest.importorskip("termios")
    import array

    try:
        with open("/proc/sys/fs/pipe-max-size") as fh:
            if int(fh.read()) < 4 * 65536:
                pytest.skip("this system caps pipe buffers below 256 kB")
    except OSError:
        pytest.skip("no /proc/sys/fs/pipe-max-size: not Linux")
    limits = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    builds.submit([Job("zb", 16, 64, cm.Costs(), None, limits=limits)])
    worker = builds._box[0]
    waiting = array.array("i", [0])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and waiting[0] <= 2 * 65536:
        time.sleep(0.2)
        fcntl.ioctl(worker.conn.fileno(), termios.FIONREAD, waiting)  # bytes sent, not read yet
    assert waiting[0] > 2 * 65536, f"only {waiting[0]} bytes waited in the pipe"
    results = builds.wait(120)
    assert [r.job.memory_limit for r in results] == list(limits)
    assert all(r.schedule is not None and r.schedule.num_microbatches == 64 for r in results)
