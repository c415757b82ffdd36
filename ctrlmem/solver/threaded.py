"""CP-SAT's ``Solve`` in a thread that Ctrl-C and termination signals stop.

``solver.Solve(model)`` in the main thread holds the interpreter inside C++ until it returns: a
SIGTERM handler does not run before then, and CP-SAT's own SIGINT handler turns Ctrl-C into an
early, normal-looking answer. :func:`solve` runs it in a daemon thread while the main thread
waits on an event; a ``KeyboardInterrupt`` or any exception a signal handler raises (the CLI's
``Terminated``) calls ``StopSearch`` and waits for the thread to end before it propagates, so the
command exits at once (130 / 143) with no solver left, and the interrupted search is never
reported as a result. Used by :func:`ctrlmem.optimal` and :func:`ctrlmem.improve`.
"""

from __future__ import annotations

import threading

__all__ = ["solve", "DET_SECONDS"]

DET_SECONDS = 5.0
"""With ``deterministic=True`` (:func:`ctrlmem.improve`, :func:`ctrlmem.optimal`), one unit of
CP-SAT's deterministic time counts as this many seconds: on the windows' models it took 4–7 CPU
seconds of one core of the reference machine (docs/reproduce.md), so that a deterministic run of
``time_limit`` spends about that much solver CPU time (the Python side is not counted)."""


def solve(solver, model) -> int:
    """``solver.Solve(model)`` (its status code), run in a thread as the module doc says; the
    solver's own SIGINT handling is switched off."""
    solver.parameters.catch_sigint_signal = False
    box: dict = {}
    done = threading.Event()

    def run():
        try:
            box["code"] = solver.Solve(model)
        except BaseException as exc:  # noqa: BLE001 - pragma: no cover - the solver raising is a bug to surface
            box["error"] = exc
        finally:
            done.set()

    th = threading.Thread(target=run, name="ctrlmem-cp-sat", daemon=True)
    try:
        th.start()
        while not done.wait(0.05):
            pass
    except BaseException:
        # Ctrl-C or a termination signal: stop the search and wait for the solver thread
        # (waiting on an Event, not Thread.join, which an interrupt can leave inconsistent)
        solver.StopSearch()
        while True:
            try:
                if done.wait(0.05) or not th.is_alive():
                    break
            except BaseException:  # noqa: BLE001 - a second Ctrl-C while stopping: keep stopping
                solver.StopSearch()
        raise
    th.join(1.0)
    if "error" in box:
        raise box["error"]
    return box["code"]
