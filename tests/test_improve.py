"""``cm.improve``: any schedule improved by the solver within a time limit — valid, within the
budget, never longer than its input, with a proven lower bound; time limits kept, Ctrl-C stops
the solver thread, bad input named.

Units: ``Costs`` are full-stage pass times; ``memory_limit`` a fraction of 1F1B's ``p·a``.
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import ctrlmem as cm
from ctrlmem.solver.optimal import OptimalResult

pytest.importorskip("ortools")

C342 = cm.Costs(3, 4, 2, 0.1)


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()


def _check(res, schedule, costs, limit):
    assert isinstance(res, OptimalResult)
    cm.validate(res.schedule)
    before = cm.simulate(schedule, costs)
    after = cm.simulate(res.schedule, costs)
    assert after.makespan == pytest.approx(res.makespan)
    assert res.makespan <= before.makespan + 1e-9
    assert max(after.peak_memory) <= limit * schedule.num_devices + 1e-9
    assert res.lower_bound <= res.makespan + 1e-9
    assert res.seed == (schedule.name, before.makespan)
    assert res.gap >= 0
    return before, after


@pytest.mark.parametrize("name,p,m,costs,limit,kw", [
    ("v-shape", 3, 6, C342, 0.5, {}),
    ("v-min", 4, 8, cm.Costs(1, 2, 1, 0.2), None, {}),
    ("zb", 4, 8, cm.Costs(2, 1, 1), 0.5, {}),
    ("1f1b", 4, 8, cm.Costs(1, 2, 0, 0.1), None, {}),               # fused backward
    ("interleaved-1f1b", 2, 4, cm.Costs(1, 2, 1), None, {"num_chunks": 2}),
])
def test_valid_within_budget_never_longer(name, p, m, costs, limit, kw):
    s = cm.build(name, p, m, costs=costs, **({"memory_limit": limit} if name in ("v-shape", "zb") else {}), **kw)
    res = cm.improve(s, costs, memory_limit=limit, time_limit=3)
    peak = max(cm.simulate(s, costs).peak_memory) / p
    _check(res, s, costs, limit if limit is not None else peak)
    assert res.status in ("optimal", "feasible")
    assert dict(res.bounds)  # every lower bound by name
    assert res.trace[0] == (0.0, cm.simulate(s, costs).makespan)


def test_finds_and_proves_the_optimum_the_heuristic_misses():
    """p = 3, m = 3, F = B = W, budget 0.5: from the search's best without its late-acceptance
    family (14.5), the whole model finds the optimum 14 and proves it."""
    from ctrlmem.model.ir import Placement
    from ctrlmem.schedules.recipes import V_SPLIT
    from ctrlmem.search.families.lahc import LateAcceptanceFamily
    from ctrlmem.search import Query, search

    costs = cm.Costs(1, 1, 1)
    at = next(i for i, fam in enumerate(V_SPLIT) if isinstance(fam, LateAcceptanceFamily))
    s = search(Query(Placement.v_shape(3), 3, costs, 1.5), V_SPLIT[:at]).schedule("v-shape")
    res = cm.improve(s, costs, memory_limit=0.5, time_limit=20)
    before, _ = _check(res, s, costs, 0.5)
    assert before.makespan > 14  # the start misses it (14.5)
    assert res.status == "optimal" and res.makespan == 14 and res.lower_bound == 14
    assert res.schedule.name == "v-shape+improved"
    assert dict(res.bounds)["solver"] == 14


def test_input_meeting_a_bound_returns_at_once():
    """V-ZB with F = B = W at 1F1B's memory meets the per-device bound: proven without a solve."""
    costs = cm.Costs(1, 1, 1)
    s = cm.build("v-zb", 4, 8)
    t0 = time.monotonic()
    res = cm.improve(s, costs, time_limit=30)
    assert time.monotonic() - t0 < 2
    assert res.status == "optimal" and res.schedule is s and res.gap == 0


def test_memory_limit_default_keeps_the_inputs_peak():
    s = cm.build("v-half", 4, 8)
    peak = max(cm.simulate(s, C342).peak_memory)
    res = cm.improve(s, C342, time_limit=2)
    assert max(cm.simulate(res.schedule, C342).peak_memory) <= peak + 1e-9


@pytest.mark.parametrize("seconds", [1.0, pytest.param(3.0, marks=pytest.mark.slow)])
def test_time_limit_kept(seconds):
    """The whole call (model building, windows, the final check) ends within a second of the
    limit, at p = 8, m = 32 (1,536 passes)."""
    s = cm.build("v-min", 8, 32)
    t0 = time.monotonic()
    res = cm.improve(s, C342, time_limit=seconds)
    took = time.monotonic() - t0
    assert took <= seconds + 1.0, took
    assert res.wall_s <= seconds + 1.0


@pytest.mark.slow  # two exact searches: the full tier runs it, --fast does not
def test_deterministic_gives_the_same_schedule():
    s = cm.build("v-shape", 4, 8, costs=C342, memory_limit=0.5)
    a = cm.improve(s, C342, 0.5, time_limit=2, deterministic=True, seed=3)
    b = cm.improve(s, C342, 0.5, time_limit=2, deterministic=True, seed=3)
    assert a.schedule.to_text() == b.schedule.to_text() and a.trace == b.trace
    assert not a.cut_short and not b.cut_short


def test_a_deterministic_run_stopped_by_the_wall_clock_says_so(monkeypatch, caplog):
    """A deterministic run that the wall-clock safety limit stops before its solver-seconds are
    spent (here a clock that runs 4 s a reading: a machine far slower than the budget assumed)
    returns ``cut_short`` and warns: its result is the machine's, not the reproducible one."""
    import time as real_time

    from ctrlmem.solver import improve as improve_module

    class SlowMachine:
        def __init__(self):
            self.readings = 0

        def monotonic(self):
            self.readings += 1
            return real_time.monotonic() + 4.0 * self.readings

        def __getattr__(self, name):
            return getattr(real_time, name)

    s = cm.build("v-shape", 4, 8, costs=C342, memory_limit=0.5)
    monkeypatch.setattr(improve_module, "time", SlowMachine())
    with caplog.at_level("WARNING", logger="ctrlmem.solver.improve"):
        r = cm.improve(s, C342, 0.5, time_limit=2, deterministic=True, seed=3)
    assert r.cut_short
    assert any("safety limit" in rec.getMessage() for rec in caplog.records)
    assert r.makespan <= cm.simulate(s, C342).makespan + 1e-9  # still never longer than its input


@pytest.mark.slow  # a signal during an exact search: the full tier runs it, --fast does not
def test_ctrl_c_stops_the_solver_thread():
    """A KeyboardInterrupt during the search propagates within a second, and no solver thread
    (Python's, or CP-SAT's own) is left running."""
    import _thread
    import signal

    s = cm.build("v-min", 8, 32)
    cm.improve(s, C342, time_limit=0.5)  # warm the imports
    base = _threads()
    # Python's own SIGINT handler (interrupt_main does nothing where SIGINT is ignored, as it is in
    # a test run started in the background of a non-interactive shell)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, _thread.interrupt_main)
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            cm.improve(s, C342, time_limit=30)
        assert time.monotonic() - t0 < 3.0
        timer.join()
    finally:
        signal.signal(signal.SIGINT, old)
    assert not [t for t in threading.enumerate() if t.name == "ctrlmem-cp-sat"]
    for _ in range(50):  # CP-SAT's worker threads end with its Solve
        if _threads() <= base:
            break
        time.sleep(0.05)
    assert _threads() <= base


@pytest.mark.slow
def test_sigint_on_the_command_line(tmp_path):
    """``ctrlmem simulate ... --optimize 60`` interrupted: exit status 130 within seconds, one line."""
    import signal

    # the default SIGINT disposition in the child (a test run started in the background of a
    # non-interactive shell ignores SIGINT, and an ignored signal stays ignored across exec)
    proc = subprocess.Popen([sys.executable, "-m", "ctrlmem.cli", "simulate", "v-min", "-p", "8", "-m", "32",
                             "--costs", "3,4,2,0.1", "--optimize", "60"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)

    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 5
    assert "interrupted" in err and "Traceback" not in err


def test_sigint_during_the_solvers_import_is_an_interruption(monkeypatch, capsys):
    """Ctrl-C while ortools' C extension is being imported (the first solver call) surfaces as that
    import's ``ImportError("initialization failed")``: the command still says "interrupted" and exits
    130, without a traceback (it printed one and exited 1 when the signal came 4 s into a loaded run)."""
    from ctrlmem.cli import app, args as cli_args

    def interrupted_import(*a, **k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("initialization failed")  # noqa: B904 - the interrupt as context only, as the import gives it

    monkeypatch.setattr(cli_args, "improve", interrupted_import)
    assert app.main(["simulate", "v-half", "-p", "4", "-m", "8", "--optimize", "5"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT)" in err and "Traceback" not in err
    monkeypatch.setattr(cli_args, "improve", lambda *a, **k: (_ for _ in ()).throw(ImportError("no ortools")))
    with pytest.raises(ImportError, match="no ortools"):  # an ImportError of its own is not an interruption
        app.main(["simulate", "v-half", "-p", "4", "-m", "8", "--optimize", "5"])


def test_bad_input_named():
    s = cm.build("v-half", 4, 8)
    with pytest.raises(TypeError, match="schedule must be a ctrlmem Schedule"):
        cm.improve("v-half", C342)
    with pytest.raises(ValueError, match=r"peaks at 3 a = 0.75 of 1F1B.*memory_limit >= 0.75"):
        cm.improve(s, C342, memory_limit=0.5)
    with pytest.raises(ValueError, match="time_limit"):
        cm.improve(s, C342, time_limit=0)
    with pytest.raises(ValueError, match="workers"):
        cm.improve(s, C342, workers=0)
    with pytest.raises(TypeError, match="deterministic"):
        cm.improve(s, C342, deterministic="yes")
    bad = cm.Schedule(s.name, s.num_devices, s.num_microbatches, s.placement,
                      (tuple(reversed(s.device_passes[0])),) + s.device_passes[1:])
    with pytest.raises(cm.ScheduleError):
        cm.improve(bad, C342)


def test_cli_optimize(capsys, tmp_path):
    """``--optimize`` on simulate prints the input's and the improved makespan, the bound and the
    gap; with --json they are an ``optimize`` object; export writes the improved schedule."""
    from ctrlmem.cli import main

    costs = cm.Costs(3, 4, 2)  # p = 3, m = 6, budget 1.5: the search gives 57.5, the optimum is 57
    h = cm.simulate(cm.build("v-shape", 3, 6, costs=costs, memory_limit=1.5), costs).makespan
    assert h > 57
    assert main(["simulate", "v-shape", "-p", "3", "-m", "6", "--costs", "3,4,2", "--memory-limit", "1.5",
                 "--optimize", "10"]) == 0
    out = capsys.readouterr().out
    assert "v-shape+improved" in out and f"makespan {h:g} -> 57" in out and "lower bound 57" in out
    assert "gap 0.00 %" in out
    assert main(["simulate", "v-shape", "-p", "3", "-m", "6", "--costs", "3,4,2", "--memory-limit", "1.5",
                 "--optimize", "10", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["makespan"] == 57 and got["optimize"]["input_makespan"] == h
    assert got["optimize"]["status"] == "optimal"
    assert main(["export", "v-shape", "-p", "3", "-m", "6", "--costs", "3,4,2", "--memory-limit", "1.5",
                 "--optimize", "10", "--text", "-"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("schedule v-shape+improved") and f"{h:g} -> 57" in cap.err
    assert main(["simulate", "v-shape", "-p", "3", "-m", "3", "--optimize", "0"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    out_file = tmp_path / "d.html"
    assert main(["draw", "v-shape", "-p", "3", "-m", "6", "--costs", "3,4,2", "--memory-limit", "1.5",
                 "--optimize", "10", "-o", str(out_file)]) == 0
    assert "-> 57" in capsys.readouterr().out and out_file.stat().st_size > 0
    assert main(["draw", "v-shape", "-p", "3", "-m", "3", "--view", "bubble", "--optimize", "5",
                 "-o", str(tmp_path / "b.html")]) == 2
    assert "--optimize improves one schedule" in capsys.readouterr().err


def test_explorer_optimize_option():
    """The explorer's optimize option (off by default) shows the first schedule improved right
    below it, with the before/after line, and its command has --optimize."""
    from ctrlmem.explorer.ui import Settings, command_line, compute

    off = compute(Settings(schedules=("v-shape",), num_devices=3, num_microbatches=6, f=3, b=4, w=2, memory_limit=1.5))
    assert list(off.results) == ["v-shape"] and Settings().optimize == 0
    s = Settings(schedules=("v-shape", "1f1b"), num_devices=3, num_microbatches=6, f=3, b=4, w=2, memory_limit=1.5,
                 optimize=5)
    on = compute(s)
    assert list(on.results) == ["v-shape", "v-shape+improved", "1f1b"]
    assert on.results["v-shape+improved"].makespan == 57
    h = off.results["v-shape"].makespan
    assert h > 57 and f"makespan {h:g} -> 57" in on.origins["v-shape+improved"]
    assert "lower bound 57" in on.stats.set_index("schedule").loc["v-shape+improved", "order"]
    assert "--optimize 5" in command_line(s)


def test_explorer_optimizes_in_the_background_and_saves_the_order(tmp_path):
    """In the widget explorer the improvement is a background job (the edit is answered at once,
    the improved row waits), then it shows up below the first schedule; the state file keeps the
    improved order and redraws it without the solver; unticking the option drops it."""
    from ctrlmem.explorer import views as explore, ui

    e = ui.explorer(schedules=["v-shape", "1f1b"], num_devices=3, num_microbatches=6, f=3, b=4, w=2,
                    memory_limit=1.5, export_dir=None)
    try:
        e.wait()
        assert "v-shape+improved" not in e.view.results
        e.optimize.value = 5.0
        e.optimize_on.value = True
        assert "v-shape+improved" in e.view.waiting
        assert any(job.optimize == 5.0 and job.name == "v-shape" for job in e.view.jobs)
        view = e.wait(120)
        assert list(view.results) == ["v-shape", "v-shape+improved", "1f1b"]
        assert view.results["v-shape+improved"].makespan == 57
        assert "lower bound 57" in view.origins["v-shape+improved"]
        path = explore.write_state(view, tmp_path / "s.json")
        again, _style = explore.state_view(path)
        assert again.results["v-shape+improved"].schedule.device_passes == \
            view.results["v-shape+improved"].schedule.device_passes
        e.optimize_on.value = False
        assert "v-shape+improved" not in e.view.results and not e.view.waiting
    finally:
        e.close()
