"""Process supervision shared by ``ctrlmem run`` and ``ctrlmem sweep``: nothing of a run keeps
running after the command reports an end.

A supervised child is started in its own session (so a terminal's Ctrl-C reaches only the
supervisor, which then stops the child's whole tree in order), with ``PR_SET_PDEATHSIG`` (Linux:
the kernel sends it SIGTERM if the supervisor dies, even by SIGKILL), and with a *tag* in its
environment (``CTRLMEM_PROCESS_TAG``). Every descendant inherits the tag, including those that
start their own sessions (torchrun's workers, papermill's kernel), so :func:`kill_tagged` finds
and ends all of them even after their parents died and they were re-parented. Tags nest: a
``ctrlmem run`` started by a sweep's notebook appends its own tag to the sweep's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Any, Callable, Iterable, Iterator
import ctypes

__all__ = ["TAG_ENV", "new_tag", "start", "tagged", "kill_tree", "kill_tagged", "pid_alive", "no_interrupts"]

TAG_ENV = "CTRLMEM_PROCESS_TAG"


def new_tag(prefix: str = "ctrlmem") -> str:
    """A fresh tag (unique across machines and restarts)."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _pdeathsig_preexec(sig: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os.kill(os.getpid(), int(sig))

    return preexec


def start(cmd: list[str], tag: str, env: dict[str, str] | None = None, **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd)`` in a new session, tagged with ``tag`` (appended to an inherited
    tag), killed with SIGTERM by the kernel when this process dies."""
    env = dict(os.environ if env is None else env)
    inherited = env.get(TAG_ENV)
    env[TAG_ENV] = f"{inherited}:{tag}" if inherited else tag
    return subprocess.Popen(cmd, env=env, start_new_session=True,
                            preexec_fn=_pdeathsig_preexec(signal.SIGTERM), **popen_kwargs)


def tagged(tag: str) -> list:
    """Every live process (``psutil.Process``) whose environment carries ``tag``."""
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            value = proc.environ().get(TAG_ENV)
        except (psutil.Error, OSError):
            continue
        if value and tag in value.split(":"):
            found.append(proc)
    return found


def _signal_all(procs: Iterable, sig: int) -> None:
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.Error, OSError):
            pass


def _alive(proc) -> bool:
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(root: subprocess.Popen | None, tag: str | None, grace_s: float = 5.0) -> list[int]:
    """End ``root``, all its descendants and every process carrying ``tag``: SIGTERM first (so
    torchrun and papermill can stop their own children), SIGKILL after ``grace_s``; returns when
    every one of them has ended (the direct child is reaped). Returns the pids it signalled."""
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    procs: dict[int, Any] = {}

    def collect() -> None:
        if root is not None and root.poll() is None:
            try:
                rp = psutil.Process(root.pid)
                procs.setdefault(rp.pid, rp)
                for c in rp.children(recursive=True):
                    procs.setdefault(c.pid, c)
            except psutil.Error:
                pass
        if tag:
            for p in tagged(tag):
                procs.setdefault(p.pid, p)

    collect()
    _signal_all(procs.values(), signal.SIGTERM)
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    collect()  # children started meanwhile
    alive = [p for p in procs.values() if _alive(p)]
    if alive:
        _signal_all(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)
    if root is not None:
        try:
            root.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            root.kill()
            root.wait()
    return sorted(procs)


@contextlib.contextmanager
def no_interrupts() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while the block runs (a clean-up that a second Ctrl-C must not cut
    short); a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, signal.SIG_IGN)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def kill_tagged(tag: str, grace_s: float = 5.0) -> list[int]:
    """End every process carrying ``tag`` (a stale run whose supervisor died)."""
    return kill_tree(None, tag, grace_s)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
