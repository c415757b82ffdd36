"""The one-device relaxation (``ctrlmem.solver.relax``, docs/theory.md §6 bound 7): a lower bound
on every schedule within the cap — never above a proven optimum nor a schedule the searches build
within its cap — and where the closed forms are loose it is the better bound."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search.bounds import makespan_bound

pytest.importorskip("ortools")
from ctrlmem.solver.relax import relaxed_bounds


def test_between_the_closed_forms_and_the_optimum():
    """V-shape p = 4, m = 8, 3:4:2 at 0.375 of 1F1B's memory (three half-activations a device):
    the closed forms give 126 (levels), the bottom device's relaxation 134, and the optimum
    (`ctrlmem optimal -p 4 -m 8 --costs 3,4,2 --memory-limit 0.375`, proven in 7 s) is 143."""
    P, costs = Placement.v_shape(4), cm.Costs(3, 4, 2)
    assert makespan_bound(P, 8, costs, 1.5) == pytest.approx(126.0)
    got = relaxed_bounds(P, 8, costs, 1.5, seconds=5)
    assert [r.device for r in got] == [0, 1, 2, 3] and all(r.proven for r in got)
    top = max(got, key=lambda r: r.bound)
    assert (top.device, top.bound) == (3, 134.0) and top.bound <= 143.0
    assert relaxed_bounds(P, 8, costs, 1.5, seconds=5, devices=[3]) == [top]  # deterministic, any subset


@pytest.mark.slow
@pytest.mark.parametrize("m,costs,cap,optimum,closed,want", [
    (12, cm.Costs(3, 4, 2), 2.25, 193.0, 153.75, 184.5),  # budget 0.375: four half-activations (ramps)
    (12, cm.Costs(3, 4, 2), 1.5, 300.0, 273.0, 285.0),    # budget 0.25: three
])
def test_closer_to_the_proven_optimum_than_the_closed_forms(m, costs, cap, optimum, closed, want):
    """V-shape p = 6 (optima proved by cm.improve's whole model): the relaxation is between the
    closed forms and the optimum, best on the bottom device (stages 5 and 6)."""
    P = Placement.v_shape(6)
    assert makespan_bound(P, m, costs, cap) == pytest.approx(closed)
    got = relaxed_bounds(P, m, costs, cap, devices=[4, 5])  # the two lowest devices; 5 is the best of all six
    top = max(got, key=lambda r: r.bound)
    assert closed < top.bound == want <= optimum and top.device == 5 and top.proven


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(p=st.integers(2, 3), m=st.integers(2, 4), data=st.data(), comm=st.sampled_from([0.0, 0.3]),
       placement=st.sampled_from(["v-shape", "sequential"]))
def test_never_above_a_proven_optimum(p, m, data, comm, placement):
    """Random costs (two decimals: the rounding down is exercised), budgets from the smallest up:
    every device's relaxation is at most what CP-SAT proves optimal for the whole problem."""
    x = st.floats(0.5, 4.0, allow_nan=False).map(lambda v: round(v, 2))
    costs = cm.Costs(data.draw(x), data.draw(x), data.draw(x), comm)
    limit = data.draw(st.sampled_from([1 / p, 0.5, 0.75, 1.0, 1.5 / p, 2.5 / p]))
    res = cm.optimal(p, m, costs, memory_limit=limit, placement=placement, time_limit=20)
    if res.status != "optimal":
        return
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    for r in relaxed_bounds(P, m, costs, limit * p, seconds=5):
        assert r.bound <= res.makespan + 1e-6, (r, res.makespan)
    # and the closed forms, the levels bound among them (odd numbers of half-activations included)
    assert makespan_bound(P, m, costs, limit * p) <= res.makespan + 1e-6


@pytest.mark.slow  # ~8 s of CPU: the full tier (scripts/test.sh) runs it, --fast does not
@settings(max_examples=10, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 3), data=st.data(), comm=st.sampled_from([0.0, 0.7]),
       limit=st.sampled_from([0.5, 0.75, 1.0]))
def test_never_above_a_schedule_within_the_cap(p, extra, data, comm, limit):
    """The budgeted searches' schedules (V-shape and one stage per device, split and fused
    backward): every device's relaxation is at most the schedule's makespan at its own peak."""
    x = st.floats(0.5, 4.0, allow_nan=False).map(lambda v: round(v, 1))
    costs = cm.Costs(data.draw(x), data.draw(x), data.draw(x), comm)
    m = p + extra
    for name in ("v-shape", "zb", "1f1b"):
        s = cm.build(name, p, m, costs=costs, **({} if name == "1f1b" else {"memory_limit": limit}))
        r = cm.simulate(s, costs)
        for b in relaxed_bounds(s.placement, m, costs, max(r.peak_memory), fused=not s.split_backward, seconds=1):
            assert b.bound <= r.makespan + 1e-6, (name, b, r.makespan)


@pytest.mark.slow  # ~5 s of CPU
@settings(max_examples=12, deadline=None)
@given(p=st.integers(2, 5), m=st.integers(2, 8), data=st.data(), comm=st.sampled_from([0.0, 0.3, 0.04]),
       placement=st.sampled_from(["v-shape", "sequential"]), fused=st.booleans())
def test_the_memory_precedences_keep_the_relaxations_optimum(p, m, data, comm, placement, fused):
    """The cap's implied precedences (`precedences=True`, the default) cut no schedule of the
    relaxation: wherever both solves prove their optimum, it is the same, at every cap from one
    microbatch's activations up (costs with two decimals; some passes round down to nothing at
    the model's scale, where the precedences that would need them are left out)."""
    x = st.one_of(st.floats(0.5, 4.0, allow_nan=False).map(lambda v: round(v, 2)), st.sampled_from([0.04, 0.11]))
    costs = cm.Costs(data.draw(x), data.draw(x), data.draw(x), comm)
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    act = p / P.num_stages
    cap = data.draw(st.integers(P.num_stages // p, 2 * p)) * act
    devices = [data.draw(st.integers(0, p - 1))]
    got = [relaxed_bounds(P, m, costs, cap, fused=fused, seconds=5, devices=devices, precedences=on)[0]
           for on in (False, True)]
    if all(r.proven for r in got):
        assert got[0].bound == got[1].bound, got


@pytest.mark.slow  # ~6 s of CPU
@settings(max_examples=10, deadline=None)
@given(p=st.integers(2, 4), m=st.integers(3, 7), window=st.integers(2, 4), data=st.data(),
       comm=st.sampled_from([0.0, 0.3, 0.04]), placement=st.sampled_from(["v-shape", "sequential"]),
       fused=st.booleans())
def test_windows_chained_never_above_the_whole_relaxation(p, m, window, data, comm, placement, fused):
    """A bound from windows of a few microbatches chained (`window`) is a bound on the relaxation
    itself: never above its proven optimum for all `m` microbatches, nor above what the searches
    build within the cap (costs with two decimals, some rounding to nothing)."""
    x = st.one_of(st.floats(0.5, 4.0, allow_nan=False).map(lambda v: round(v, 2)), st.sampled_from([0.04, 0.11]))
    costs = cm.Costs(data.draw(x), data.draw(x), data.draw(x), comm)
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    cap = data.draw(st.integers(P.num_stages // p, 2 * p)) * p / P.num_stages
    whole = relaxed_bounds(P, m, costs, cap, fused=fused, seconds=5)
    chained = relaxed_bounds(P, m, costs, cap, fused=fused, seconds=5, window=window)
    for w, c in zip(whole, chained):
        assert c.window == (window if m > window else 0)
        if w.proven:
            assert c.bound <= w.bound + 1e-6, (w, c)
    limit = cap / p
    name = "v-shape" if placement == "v-shape" else "zb"
    if not fused and limit <= 1.0:
        r = cm.simulate(cm.build(name, p, m, costs=costs, memory_limit=limit), costs)
        assert max(c.bound for c in chained) <= r.makespan + 1e-6


@pytest.mark.slow  # ~3 s of CPU: the full tier runs it
def test_windows_chained_see_what_the_closed_forms_miss():
    """V-shape p = 6, m = 24, F = B = W at 0.375, the bottom device (144 passes: beyond what CP-SAT
    proves whole): windows of 10 chained give 93.5, every window proven, where the closed forms give
    88; `v-shape` builds 104.5 (docs/theory.md §6, bound 7: windows of 12 give 95)."""
    P = Placement.v_shape(6)
    costs = cm.Costs(1, 1, 1)
    got = relaxed_bounds(P, 24, costs, 2.25, devices=[5], window=10, seconds=10)[0]
    assert got.proven and got.window == 10 and got.bound == 93.5
    built = cm.simulate(cm.build("v-shape", 6, 24, costs=costs, memory_limit=0.375), costs).makespan
    assert makespan_bound(P, 24, costs, 2.25) == pytest.approx(88.0) and 88.0 < got.bound <= built == 104.5


def test_the_smallest_cap_has_a_schedule():
    """One activation per device with one stage per device (microbatches one at a time, a hop of
    half a pass): the relaxation's horizon allows the serial schedule, and its bound is below
    what zb builds there."""
    costs = cm.Costs(1, 1, 1, 0.5)
    r = cm.simulate(cm.build("zb", 4, 8, costs=costs, memory_limit=0.25), costs)
    got = relaxed_bounds(Placement.sequential(4), 8, costs, 1.0, seconds=5)
    assert all(b.proven for b in got)
    assert max(b.bound for b in got) <= r.makespan + 1e-9


def test_bad_input_is_named():
    P = Placement.v_shape(4)
    with pytest.raises(ValueError, match="needs 2 for one microbatch: give cap >= 1"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 0.5)
    with pytest.raises(ValueError, match="m must be at least 1"):
        relaxed_bounds(P, 0, cm.Costs(1, 1, 1), 1.0)
    with pytest.raises(ValueError, match="cap must be a positive number"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 0.0)
    with pytest.raises(ValueError, match="cap must be a positive number"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), float("inf"))
    with pytest.raises(ValueError, match="device 4 is not one of the placement's 0..3"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 1.0, devices=[0, 4])
    with pytest.raises(ValueError, match="seconds must be a positive number"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 1.0, seconds=float("nan"))
    for bad in (True, 1.0):  # a flag or a float is not a device index
        with pytest.raises(ValueError, match="is not one of the placement's 0..3"):
            relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 1.0, devices=[bad])
    for bad in (1, True, 2.5, 0):
        with pytest.raises(ValueError, match="window must be a whole number of microbatches, at least 2"):
            relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 1.0, window=bad)
    with pytest.raises(ValueError, match="device 0 has 2400 passes a window, more than the 2000"):
        relaxed_bounds(P, 1000, cm.Costs(1, 1, 1), 1.0, window=400)
    import numpy as np

    (got,) = relaxed_bounds(P, 2, cm.Costs(1, 1, 1), 1.0, seconds=1.0, devices=[np.int64(3)])
    assert type(got.device) is int and got.device == 3


def test_cli(capsys):
    """`ctrlmem bound`: the closed forms, each device's relaxation (* where proven) and the best, in
    words or JSON; bad input is one line and exit status 2."""
    from ctrlmem.cli import main

    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.25", "--placement", "sequential",
                 "--costs", "1,1,1,0.5"]) == 0
    out = capsys.readouterr().out
    assert "one-device relaxation" in out and "0: 96*" in out and "at least 96 (memory)" in out
    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.25", "--placement", "sequential",
                 "--costs", "1,1,1,0.5", "--relax", "5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["lower_bound"] == 96.0 and got["best"] == "memory" and len(got["one_device"]) == 4
    assert [d["bound"] for d in got["one_device"]] == [96.0, 75.0, 54.0, 33.0]
    assert got["closed_forms"]["levels"] == 96.0 and got["relax_seconds"] == 5.0
    assert main(["bound", "-p", "16", "-m", "64", "--memory-limit", "0.25", "--relax", "0", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["one_device"] == [] and got["best"] == "ramps"  # memory × time with its ramps
    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.25", "--placement", "sequential",
                 "--costs", "1,1,1,0.5", "--relax", "5", "--window", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)  # windows of 3 chained: still bounds, never above the whole
    assert got["window"] == 3 and all(d["window"] == 3 for d in got["one_device"])
    assert all(d["bound"] <= w + 1e-9 for d, w in zip(got["one_device"], [96.0, 75.0, 54.0, 33.0]))
    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.25", "--window", "3", "--relax", "0"]) == 2
    assert "--window chains the one-device relaxation, which --relax 0 turns off" in capsys.readouterr().err
    assert main(["bound", "-p", "4", "-m", "8", "--window", "3"]) == 2  # no cap: the flag that is missing is named
    assert "--window chains the one-device relaxation, which needs --memory-limit" in capsys.readouterr().err
    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.25", "--window", "1"]) == 2
    assert "must be an integer >= 2 (microbatches), got 1" in capsys.readouterr().err
    assert main(["bound", "-p", "4", "-m", "8", "--memory-limit", "0.1"]) == 2
    assert "the smallest budget is 1/p = 0.25" in capsys.readouterr().err
    assert main(["bound", "-p", "8", "-m", "400", "--memory-limit", "0.5"]) == 2
    assert "more than the 2000 a relaxation takes" in capsys.readouterr().err


def test_a_solve_stopped_by_the_wall_clock_says_so(caplog):
    """A relaxation whose solve the wall-clock safety limit stopped before its solver-seconds were
    spent (here a limit of 0.05 s for 30 solver-seconds) is marked ``cut_short``, with a warning:
    its bound is still valid but depends on the machine. One that spends its solver-seconds unproven
    is not marked."""
    costs = cm.Costs(3, 4, 2, 0.1)
    with caplog.at_level("WARNING", logger="ctrlmem.solver.relax"):
        (cut,) = relaxed_bounds(Placement.v_shape(6), 12, costs, 0.25 * 6, seconds=30, devices=[5], wall_factor=1e-9)
    assert cut.cut_short and not cut.proven
    assert any("safety limit" in r.getMessage() for r in caplog.records)
    (spent,) = relaxed_bounds(Placement.v_shape(6), 12, costs, 0.25 * 6, seconds=0.5, devices=[5])
    assert not spent.proven and not spent.cut_short


def test_the_gap_grid_marks_a_relaxation_cut_short(monkeypatch):
    """The optimality-gap grid's relaxation records carry ``cut_short`` when a device's solve was
    stopped by the wall clock (so that its cache leaves them out), and only then."""
    from ctrlmem.solver import gap
    from ctrlmem.solver.relax import DeviceBound

    inst = gap.Instance(6, 6, "3:4:2", 0.5, False)
    for flag in (False, True):
        monkeypatch.setattr(gap, "relaxed_bounds", lambda *a, flag=flag, **k: [
            DeviceBound(0, 50.0, True, 18), DeviceBound(1, 60.0, False, 18, cut_short=flag)])
        assert gap.relaxed(inst, "v-shape").get("cut_short", False) is flag
        monkeypatch.setattr(gap, "relaxed_bounds", lambda *a, flag=flag, **k: [
            DeviceBound(5, 70.0, False, 36, 12, cut_short=flag)])
        assert gap.windowed(inst, "v-shape").get("cut_short", False) is flag
