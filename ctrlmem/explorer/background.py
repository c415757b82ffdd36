"""Cost-adapted builds in the background: one worker process, one build at a time, newest first.

The explorer answers every edit at once by re-simulating the schedules it already has, and asks
this module for the builds that fit the new costs (``cm.build(name, p, m, costs=...)``: the V
schedules' and budgeted schedules' searches, seconds to a minute at p = 32, m = 256):

    builds = BackgroundBuilds()
    builds.submit([Job("v-min", 32, 256, costs, None)])   # replaces whatever was asked before
    builds.poll()          # -> finished Results (non-blocking), in the order they finished
    builds.progress()      # -> WorkerStatus: the job running, for how long, how many wait
    builds.close()         # ends the worker

Why a process and not a thread. A thread cannot be stopped: a search that a newer edit made
useless would run to its end and hold a core the new answer needs, where a process is killed at
once and a fresh one takes the next job. And whatever part of a search runs as Python holds the
GIL, which the kernel's own thread needs for every widget message and every update: the search
engine's compiled kernels release it (numba, ``nogil``), the Python around them does not, and
without numba (or with ``CTRLMEM_JIT=0``) all of the search is Python.
``benchmarks/bench_explorer.py --gil`` measured an edit at p = 32, m = 256 (1F1B + ZB-V) next to
``v-min`` searches for new costs, interleaved rounds, 2 cores shared with other work (load
average about 4): with compiled kernels 191 ms alone, 266 ms (x1.4) next to a thread, 255 ms
(x1.3) next to the worker process; with the search as Python 225 ms alone, 602 ms (x2.7) next to
a thread, 249 ms (x1.1) next to the worker process.

The worker is a plain ``python -m ctrlmem.explorer.background`` subprocess (see :class:`_Worker`), started
once and reused while no job is cancelled.

Nothing keeps running after its owner ends: :meth:`BackgroundBuilds.close` (and the owner's
garbage collection, and interpreter exit) kills the worker; on Linux the worker also asks the
kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``, so a killed Jupyter kernel takes it
along), and a watchdog thread in the worker exits when its parent is gone.
"""

from __future__ import annotations

import logging
import subprocess
import os
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Sequence

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Schedule
from ctrlmem.solver.improve import improve
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules import SCHEDULES, build
import ctypes
from multiprocessing.connection import Connection

try:
    import fcntl
except ImportError:  # pragma: no cover  (not on Windows)
    fcntl = None

__all__ = ["Job", "Result", "WorkerStatus", "BackgroundBuilds", "improved_name", "improve_built"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One build: ``cm.build(name, num_devices, num_microbatches, costs=costs,
    memory_limit=memory_limit)``. ``stage_costs`` (optional): a function of the schedule's
    number of stages giving the costs to build for, when the per-stage costs depend on it and
    the number of stages is not known yet (the worker then builds once with ``costs`` to learn
    it, and again with ``stage_costs(num_stages)`` when those differ).

    ``optimize`` (seconds, 0: off): then improve the built schedule with
    :func:`ctrlmem.improve` for that long under ``costs`` (for a generator that takes no costs,
    it is built without them and improved under ``costs``), within ``improve_limit`` (a fraction
    of 1F1B's peak) when it fits that, else within its own peak.

    ``limits`` (a sweep; ``memory_limit`` unused): build for each of these memory limits in
    turn in the worker, without waiting for the explorer between two; each finished limit comes
    back at once as its own :class:`Result`, whose ``job`` is this one with that
    ``memory_limit`` and no ``limits``."""

    name: str
    num_devices: int
    num_microbatches: int
    costs: Costs
    memory_limit: float | None = None
    stage_costs: object = None
    optimize: float = 0.0
    improve_limit: float | None = None
    limits: tuple[float, ...] = ()
    levers: tuple = ()

    def parts(self) -> list["Job"]:
        """The single builds this job is: itself, or one per limit of a sweep."""
        if not self.limits:
            return [self]
        return [replace(self, memory_limit=x, limits=()) for x in self.limits]

    @property
    def cache_name(self) -> str:
        """The name the explorer keeps the result under: ``name``, or for an optimize job
        ``NAME+improved@SECONDSs`` (one entry per time limit), or with ``levers``
        :func:`levered_name`'s."""
        if self.optimize:
            return levered_name(improved_name(self.name, self.optimize), self.levers)
        return levered_name(self.name, self.levers)


def levered_name(name: str, levers: tuple) -> str:
    """The cache name of ``name`` built with ``levers`` ``(recompute, offload)`` on every forward
    (``cm.build(..., recompute=, offload=)``: a budgeted search then orders for what the levers
    free); ``name`` itself without levers."""
    return f"{name}+levers({levers[0]},{levers[1]})" if levers else name


def lever_kwargs(levers: tuple) -> dict:
    """``levers`` ``(recompute, offload)`` as ``cm.build``'s keyword arguments (none without)."""
    return dict(zip(("recompute", "offload"), levers))


def improved_name(name: str, seconds: float) -> str:
    """The cache name of ``name`` improved by :func:`ctrlmem.improve` for ``seconds``."""
    return f"{name}+improved@{seconds:g}s"



@dataclass(frozen=True)
class Result:
    """A finished job: its ``schedule`` and the ``costs`` it was built for, or ``error`` (one
    readable line) when the generator refused; ``seconds`` of work in the worker; ``note``: an
    optimize job's one-line summary (makespan before and after, lower bound, gap)."""

    job: Job
    schedule: Schedule | None
    costs: Costs | None
    error: str | None
    seconds: float
    note: str | None = None


@dataclass(frozen=True)
class WorkerStatus:
    """What the worker does now: ``job`` (None when idle), running for ``seconds``; ``waiting``
    jobs queued after it; ``done`` finished since the last :meth:`BackgroundBuilds.submit`."""

    job: Job | None
    seconds: float
    waiting: tuple[Job, ...]
    done: int


def _reason(exc: BaseException) -> str:
    msg = getattr(exc, "reason", None) or (exc.args[0] if exc.args else "") or type(exc).__name__
    return str(msg).splitlines()[0]


def _die_with_parent(parent: int) -> None:
    """In the worker: be killed by the kernel when the parent dies (Linux), and exit from a
    watchdog thread when the parent is gone anyway (re-parented)."""
    if sys.platform.startswith("linux"):
        try:

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, name="ctrlmem-parent-watch", daemon=True).start()


def improve_built(schedule: Schedule, costs: Costs, limit: float | None, seconds: float) -> tuple[Schedule, str]:
    """``schedule`` improved by :func:`ctrlmem.improve` for ``seconds`` under ``costs``, within
    ``limit`` (fraction of 1F1B's peak) when the schedule fits it, else within its own peak;
    with a one-line summary."""

    p = schedule.num_devices
    if limit is not None and max(simulate(schedule, costs).peak_memory) > limit * p + 1e-9:
        limit = None
    res = improve(schedule, costs, limit, time_limit=seconds)
    note = (f"cm.improve {seconds:g} s: makespan {res.seed[1]:.6g} -> {res.makespan:.6g}, lower bound "
            f"{res.lower_bound:.6g}, gap {100 * res.gap:.2f} % ({res.status})")
    return res.schedule, note


def _worker_main(conn_in, conn_out, parent: int) -> None:  # pragma: no cover  (runs in the worker)
    """The worker: receive ``(number, Job)``, build each of its parts, send back ``(number,
    schedule, costs, error, seconds, note, part, last)`` per part (``part``: the sweep's single
    build, else None; ``last``: the job is done); ``None`` ends it."""
    _die_with_parent(parent)
    try:
        os.nice(5)  # the explorer's own answers come first on a busy machine
    except OSError:
        pass

    while True:
        try:
            message = conn_in.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        number, job = message
        parts = job.parts()
        for k, part in enumerate(parts):
            answer = _build_part(part, SCHEDULES, build)
            try:
                conn_out.send((number, *answer, part if job.limits else None, k == len(parts) - 1))
            except (BrokenPipeError, OSError):
                return


def _build_part(job: Job, schedules, build) -> tuple:  # pragma: no cover  (runs in the worker)
    """``(schedule, costs, error, seconds, note)`` of one single build."""
    t0 = time.perf_counter()
    schedule = costs = error = note = None
    try:
        costs = job.costs
        takes = job.name not in schedules or schedules[job.name].uses_costs or not job.optimize
        levers = lever_kwargs(job.levers)
        schedule = build(job.name, job.num_devices, job.num_microbatches, costs=costs if takes else None,
                         memory_limit=job.memory_limit, **levers)
        if job.stage_costs is not None:
            staged = job.stage_costs(schedule.num_stages)
            if staged != costs:
                costs = staged
                schedule = build(job.name, job.num_devices, job.num_microbatches, costs=costs,
                                 memory_limit=job.memory_limit, **levers)
        if job.optimize:
            schedule, note = improve_built(schedule, costs, job.improve_limit, job.optimize)
    except Exception as exc:  # noqa: BLE001  (a generator's refusal is a result, not a crash)
        schedule, error = None, _reason(exc)
    return schedule, costs, error, time.perf_counter() - t0, note


class _Worker:
    """One worker process (``python -m ctrlmem.explorer.background FD_IN FD_OUT``) and the parent's ends
    of its two pipes. A plain subprocess rather than ``multiprocessing``: ``spawn`` would re-run
    the user's script in the worker (a script without ``if __name__ == "__main__"`` then starts
    workers without end), and ``fork`` copies a kernel that runs threads."""

    def __init__(self) -> None:

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        _widen_pipe(from_child_w)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ctrlmem.explorer.background", str(to_child_r), str(from_child_w), str(os.getpid())],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)  # Ctrl-C / "interrupt kernel" is for the kernel, not the worker
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)

    def send(self, obj) -> None:
        self.send_conn.send(obj)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            log.warning("background build process %d did not end", self.process.pid)
        for conn in (self.send_conn, self.conn):
            try:
                conn.close()
            except OSError:
                pass


PIPE_BYTES = 1 << 20
"""The worker's answer pipe is widened to this (Linux, within ``/proc/sys/fs/pipe-max-size``):
a built schedule is pickled whole (74 kB at p = 16, m = 64), more than the default 64 kB, so the
worker's send waited until the explorer's next poll read it — every budget of a sweep then cost a
poll interval (0.1-0.3 s) on top of its build (milliseconds)."""


def _widen_pipe(fd: int) -> None:
    """Give pipe ``fd`` a buffer of :data:`PIPE_BYTES` where the system allows (else keep it)."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if setsize is None:
        return
    try:
        fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:  # above the system's limit for this user: the default buffer still works
        pass


def _covers(running: Job, wanted: Job) -> bool:
    """Whether the running job already does ``wanted``: the same job, or the same sweep whose
    limits still to do are among those it runs (the explorer asks again for what is left)."""
    if running == wanted:
        return True
    return bool(running.limits and wanted.limits and set(wanted.limits) <= set(running.limits)
                and replace(running, limits=()) == replace(wanted, limits=()))


def _kill(worker_box: list) -> None:
    """Finalizer: end the worker of a :class:`BackgroundBuilds` that was dropped or at exit."""
    for worker in worker_box:
        worker.kill()
    worker_box.clear()


class BackgroundBuilds:
    """Builds :class:`Job` s in one worker process, one at a time (see the module doc).

    """

    def __init__(self) -> None:
        self._box: list[_Worker] = []  # the live worker, shared with the finalizer
        self._queue: list[Job] = []
        self._running: Job | None = None
        self._started = 0.0
        self._done: list[Result] = []
        self._finished = 0
        self._number = 0
        self.started_workers = 0
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill, self._box)

    # -- the parent's side -------------------------------------------------------------------

    @property
    def _worker(self) -> _Worker | None:
        return self._box[0] if self._box else None

    def submit(self, jobs: Sequence[Job]) -> None:
        """Replace what was asked before by ``jobs`` (in this order). A job already running
        that is among ``jobs`` keeps running; one that is not is stopped (its worker killed)."""
        if self._closed:
            raise RuntimeError("BackgroundBuilds is closed")
        jobs = list(dict.fromkeys(jobs))
        self._finished = 0
        if self._running is not None:
            kept = next((j for j in jobs if _covers(self._running, j)), None)
            if kept is not None:
                jobs.remove(kept)
            else:
                log.info("stopping the build of %s (no longer wanted)", self._running.name)
                self._stop_worker()
        self._queue = jobs
        self._next()

    def cancel(self) -> None:
        """Drop every queued job and stop the running one."""
        self._queue = []
        if self._running is not None:
            self._stop_worker()

    def poll(self) -> list[Result]:
        """Finished builds since the last call (non-blocking); starts the next queued job."""
        worker = self._worker
        while worker is not None and self._running is not None:
            try:
                if not worker.conn.poll():
                    if not worker.alive():  # died without an answer (killed from outside, OOM)
                        job = self._running
                        code = worker.process.returncode
                        self._stop_worker()
                        self._done.append(Result(job, None, None, "the build process ended unexpectedly "
                                                 f"(exit code {code})", 0.0))
                    break
                number, schedule, costs, error, seconds, note, part, last = worker.conn.recv()
            except (EOFError, OSError):
                job = self._running
                self._stop_worker()
                self._done.append(Result(job, None, None, "the build process ended unexpectedly", 0.0))
                break
            job = self._running
            if job is not None and number == self._number:
                self._finished += 1
                self._done.append(Result(part or job, schedule, costs, error, seconds, note))
            if not last:  # a sweep goes on with its next limit
                continue
            self._running = None
            self._next()
            worker = self._worker
        done, self._done = self._done, []
        return done

    def wait(self, timeout: float | None = None, interval: float = 0.05) -> list[Result]:
        """Block until every job submitted so far is finished (or ``timeout`` seconds); returns
        what :meth:`poll` collected meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Result] = []
        while True:
            out += self.poll()
            if self.idle or (deadline is not None and time.monotonic() > deadline):
                return out
            worker = self._worker
            if worker is not None:
                worker.conn.poll(interval)
            else:
                time.sleep(interval)

    @property
    def idle(self) -> bool:
        """Nothing running and nothing queued."""
        return self._running is None and not self._queue and not self._done

    def progress(self) -> WorkerStatus:
        running = self._running
        return WorkerStatus(running, time.monotonic() - self._started if running else 0.0,
                        tuple(self._queue), self._finished)

    def close(self) -> None:
        """Stop everything and end the worker (idempotent)."""
        self._closed = True
        self._queue = []
        self._running = None
        worker = self._worker
        if worker is not None:
            try:
                worker.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._finalizer()

    # -- internals -------------------------------------------------------------------------------

    def _stop_worker(self) -> None:
        self._running = None
        _kill(self._box)

    def _next(self) -> None:
        if self._running is not None or not self._queue:
            return
        job = self._queue.pop(0)
        self._number += 1
        if self._worker is None:
            self._box.append(_Worker())
            self.started_workers += 1
        try:
            self._worker.send((self._number, job))
        except (BrokenPipeError, OSError):  # the worker died while idle: start another
            _kill(self._box)
            self._box.append(_Worker())
            self.started_workers += 1
            self._worker.send((self._number, job))
        self._running = job
        self._started = time.monotonic()


def _main(argv: Sequence[str]) -> None:  # pragma: no cover  (the worker's entry point)

    if len(argv) != 3 or not all(str(x).isdigit() for x in argv):
        sys.stderr.write("ctrlmem.explorer.background: error: this is the explorer's background worker, started by "
                         "the explorer with three numbers (FD_IN FD_OUT PARENT_PID); it is not a command to run\n")
        raise SystemExit(2)
    fd_in, fd_out, parent = (int(x) for x in argv)
    _worker_main(Connection(fd_in, writable=False), Connection(fd_out, readable=False), parent)


if __name__ == "__main__":  # pragma: no cover
    _main(sys.argv[1:])
