"""The exact solver with activation offload allowed (docs/theory.md §12-13): the solver may copy
any forward's activation to host memory and back, its schedules carry those copies and simulate
to exactly the solver's makespan within the budget, its optimum is never longer than the one
without offload, and its bound stays below every schedule that may offload."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.cli import main
from ctrlmem.model.ir import Op, Placement
from ctrlmem.model.validate import validate
from ctrlmem.search.bounds import makespan_bound, makespan_bounds
from ctrlmem.solver.copies import share_units
from ctrlmem.solver.optimal import optimal


def _check(result, costs, cap):
    """The schedule validates, each forward has at most one lever, the simulated makespan is the
    solver's and the peak within ``cap``; returns the simulation."""
    s = result.schedule
    validate(s)
    recomputed = {(ps.stage, ps.microbatch) for row in s.device_passes for ps in row if ps.op is Op.R}
    offloaded = {(c.stage, c.microbatch) for row in s.copies for c in row if c.kind == "O"}
    assert not recomputed & offloaded
    r = cm.simulate(s, costs)
    assert r.makespan == pytest.approx(result.makespan)
    assert r.max_peak_memory <= cap + 1e-9
    assert result.lower_bound <= result.makespan + 1e-9
    assert cm.Schedule.from_text(s.to_text()) == s  # the copies round-trip through the text form
    return r


@pytest.mark.parametrize("p, m, limit, placement, costs, fraction", [
    (2, 2, 0.5, "v-shape", cm.Costs(1, 1, 1, offload=0.5), "auto"),
    (2, 2, 0.5, "v-shape", cm.Costs(1, 2, 1, offload=1.0), 0.5),
    (3, 3, 1 / 3, "sequential", cm.Costs(1, 2, 1, offload=0.5), "auto"),
    (2, 3, 0.5, "sequential", cm.Costs(2, 3, 1, 0.5, offload=1.5), "auto"),
])
def test_offload_never_loses_and_simulates_to_the_solver_makespan(p, m, limit, placement, costs, fraction):
    """Allowed to offload, the proven optimum is at most the one without (not offloading is one
    of the solver's choices), its schedule carries the copies and simulates to the solver's own
    makespan (the model times passes and copies as the simulator does) within the budget."""
    plain = optimal(p, m, costs, limit, placement, time_limit=30)
    off = optimal(p, m, costs, limit, placement, time_limit=30, offload=fraction)
    assert plain.status == off.status == "optimal"
    assert off.makespan <= plain.makespan + 1e-9
    _check(off, costs, limit * p)
    want = 1.0 if fraction == "auto" else fraction
    assert all(c.fraction == want for row in off.schedule.copies for c in row if c.kind == "O")


def test_offload_pays_where_memory_binds():
    """At one microbatch per device (V-shape, p = 2) reordering alone runs the microbatches
    nearly one at a time; the solver offloads and is 20 % faster, its copies on the lanes."""
    costs = cm.Costs(1, 1, 1, offload=0.5)
    plain = optimal(2, 2, costs, 0.5, time_limit=30)
    off = optimal(2, 2, costs, 0.5, time_limit=30, offload="auto")
    assert (plain.makespan, off.makespan) == (8.5, 6.75)
    assert off.schedule.offloads and dict(off.schedule.params)["offload"] == 1.0
    r = _check(off, costs, 1.0)
    assert any(c.op == "L" for c in r.copies) and any(c.op == "O" for c in r.copies)


@pytest.mark.parametrize("p, m, placement, costs, reaches", [
    (2, 2, "v-shape", "1,1,1", True),
    (2, 3, "v-shape", "1,1,1", True),
    (2, 2, "sequential", "1,1,1", False),
    (3, 3, "sequential", "1,2,1", False),
])
def test_free_copies_at_one_microbatch_per_device(p, m, placement, costs, reaches):
    """With copies of no time at the smallest budget (1/p), offloading removes every activation
    between a forward's end and its reload, so the V-shape reaches the unlimited optimum; with one
    stage per device it does not: a device holds whole activations while a forward runs and from
    a backward to its weight gradient, which no copy can touch, and the unlimited optimum
    defers weight gradients (ZB's zero bubble) to hold two at once. It is always strictly faster
    than reordering alone and never below the unlimited optimum."""
    c = cm.Costs.parse(costs)
    free = optimal(p, m, c, None, placement, time_limit=20)
    plain = optimal(p, m, c, 1 / p, placement, time_limit=20)
    off = optimal(p, m, c, 1 / p, placement, time_limit=30, offload="auto")
    assert free.status == plain.status == off.status == "optimal"
    assert free.makespan <= off.makespan < plain.makespan
    assert (off.makespan == free.makespan) is reaches
    _check(off, c, 1.0)


def test_recompute_and_offload_together():
    """Both levers allowed: each forward is recomputed, offloaded or neither, never both; the
    result is no longer than with either lever alone."""
    costs = cm.Costs(1, 1, 1, offload=2.0)
    rec = optimal(2, 2, costs, 0.3, time_limit=30, recompute="full")
    both = optimal(2, 2, costs, 0.3, time_limit=30, recompute="full", offload="auto")
    assert rec.status == both.status == "optimal"
    assert both.makespan <= rec.makespan + 1e-9
    _check(both, costs, 0.6)


def test_deterministic_runs_repeat():
    """``deterministic=True`` gives the same schedule twice (one worker, fixed seed, the hint
    search run to its end)."""
    costs = cm.Costs(1, 2, 1, offload=1.0)
    a = optimal(2, 2, costs, 0.5, time_limit=1, offload="auto", deterministic=True)
    b = optimal(2, 2, costs, 0.5, time_limit=1, offload="auto", deterministic=True)
    assert a.schedule == b.schedule and a.makespan == b.makespan and a.lower_bound == b.lower_bound
    _check(a, costs, 1.0)


def test_bad_offload_arguments():
    """A bad fraction, and costs with a pass of no time (which leaves as-soon-as-possible timing
    ambiguous), are refused with the fix in the message."""
    with pytest.raises(ValueError, match="offload must be none, auto .* or a fraction in"):
        optimal(2, 2, offload=1.5)
    with pytest.raises(ValueError, match="offload needs positive pass times"):
        optimal(2, 2, cm.Costs(1, 1, 0), offload="auto")
    with pytest.raises(ValueError, match="MAX_OFFLOAD_PASSES"):
        optimal(8, 32, offload="auto")


def test_share_units():
    """The offloaded share as N / D: exact for halves and quarters, rounded down (the model frees
    at most the truth) otherwise."""
    assert share_units(1.0) == (1, 1, True)
    assert share_units(0.25) == (1, 4, True)
    n, d, exact = share_units(0.1234567891)
    assert not exact and n / d <= 0.1234567891


def test_cli_optimal_offload(capsys):
    """``ctrlmem optimal --offload auto --offload-cost T`` solves with copies and reports them."""
    assert main(["optimal", "-p", "2", "-m", "2", "--memory-limit", "0.5", "--offload", "auto",
                 "--offload-cost", "0.5", "--time-limit", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal" and out["makespan"] == 6.75
    assert out["offload_cost"] == 0.5 and out["offloaded_forwards"] > 0
    s = cm.Schedule.from_text(out["schedule"])
    assert s.offloads
    assert main(["optimal", "-p", "2", "-m", "2", "--memory-limit", "0.5", "--offload", "auto",
                 "--offload-cost", "0.5", "--time-limit", "20"]) == 0
    assert "the solver offloads" in capsys.readouterr().out


@pytest.mark.parametrize("p, m, limit, placement, costs, fraction, recompute", [
    (2, 2, 0.5, "v-shape", cm.Costs(1, 1, 1, offload=0.5), "auto", "none"),
    (2, 3, 0.5, "v-shape", cm.Costs(1, 1, 1), "auto", "none"),
    (2, 2, 0.5, "sequential", cm.Costs(1, 1, 1), 0.5, "none"),
    (3, 3, 1 / 3, "sequential", cm.Costs(1, 2, 1, offload=0.5), "auto", "none"),
    (2, 3, 0.5, "sequential", cm.Costs(2, 3, 1, 0.5, offload=1.5), "auto", "none"),
    (2, 2, 0.3, "v-shape", cm.Costs(1, 1, 1, offload=2.0), "auto", "full"),
])
def test_bounds_with_offload_stay_below_proven_optima(p, m, limit, placement, costs, fraction, recompute):
    """The closed-form bounds with offload allowed (and recompute, where allowed too) are never
    above the solver's proven optimum with those levers; where offloading pays, the bounds without
    it are (they count whole activations held from a forward to its release)."""
    res = optimal(p, m, costs, limit, placement, time_limit=30, offload=fraction, recompute=recompute)
    assert res.status == "optimal"
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    phi = 1.0 if fraction == "auto" else fraction
    bounds = makespan_bounds(P, m, costs, limit * p, recompute=recompute, offload=phi)
    assert max(bounds.values()) <= res.makespan + 1e-9, bounds
    assert "lever trade" in bounds and "recompute trade" not in bounds
    if res.makespan < optimal(p, m, costs, limit, placement, time_limit=30, recompute=recompute).makespan:
        assert makespan_bound(P, m, costs, limit * p, recompute=recompute) > res.makespan


@pytest.mark.slow  # a lever search per case: the full tier runs it, --fast does not
def test_bounds_with_offload_hold_for_the_lever_search():
    """On a grid of sizes, costs, copy costs and budgets, every schedule the lever search builds
    with offload allowed (and the fixed patterns with every forward offloaded) within the budget
    is at least the bound with offload allowed; the bound without levers is beaten by some."""
    beaten_plain = 0
    for p, m, costs, copy, limit, name in itertools.product(
            [2, 4], [4, 8], ["1,1,1", "2,3,1,0.2"], [0.0, 2.0], [0.25, 0.5], ["v-shape", "zb"]):
        c = cm.Costs.parse(costs)
        c = cm.Costs(c.f, c.b, c.w, c.comm, offload=copy)
        P = Placement.v_shape(p) if name == "v-shape" else Placement.sequential(p)
        candidates = [cm.build("1f1b" if name == "zb" else "v-min", p, m, costs=c, offload=1.0)]
        try:
            candidates.append(cm.build(name, p, m, costs=c, memory_limit=limit, offload="auto"))
        except ValueError:
            pass
        cap = limit * p
        bound = makespan_bound(P, m, c, cap, offload=1.0)
        plain = makespan_bound(P, m, c, cap)
        for s in candidates:
            r = cm.simulate(s, c)
            if r.max_peak_memory > cap + 1e-9 or s.placement != P:
                continue
            assert r.makespan >= bound, (p, m, costs, copy, limit, name, r.makespan, bound)
            beaten_plain += r.makespan < plain
    assert beaten_plain > 0


def test_offload_bounds_fall_to_the_forwards_own_passes_as_copies_get_free():
    """With free copies a microbatch holds its activation only while its own F, B, W run
    (``"memory"`` = first arrival + m·Σ act (f + b + w) / cap); with copies too long to fit in any
    lifespan the memory bound is the one without offload. Between the two, it falls as copies get
    cheaper and as the share offloaded grows."""
    P = Placement.sequential(3)
    costs = cm.Costs(1, 2, 1)
    cap, m = 1.0, 6
    free = makespan_bounds(P, m, costs, cap, offload=1.0)["memory"]
    assert free == pytest.approx(2 + m * 1.0 * (1 + 2 + 1) / cap)  # the last device's first forward arrives at 2
    plain = makespan_bounds(P, m, costs, cap)["memory"]
    never = makespan_bounds(P, m, cm.Costs(1, 2, 1, offload=1e6), cap, offload=1.0)["memory"]
    assert never == pytest.approx(plain)
    mems = [makespan_bounds(P, m, cm.Costs(1, 2, 1, offload=t), cap, offload=1.0)["memory"] for t in (0, 0.5, 1, 2, 4)]
    assert mems == sorted(mems) and mems[0] < mems[-1]
    shares = [makespan_bounds(P, m, cm.Costs(1, 2, 1, offload=0.5), cap, offload=f)["memory"] for f in (0.25, 0.5, 1)]
    assert shares == sorted(shares, reverse=True)


@settings(max_examples=6, deadline=None)
@given(placement=st.sampled_from(["v-shape", "sequential"]), f=st.integers(1, 3), b=st.integers(1, 3),
       w=st.integers(1, 2), copy=st.sampled_from([0.0, 0.5, 1.0, 2.0]), limit=st.sampled_from([0.5, 0.75]))
def test_offload_properties_on_random_costs(placement, f, b, w, copy, limit):
    """On random pass and copy costs at p = 2, m = 2: the optimum with offload is proven, no longer
    than without, simulates to its makespan within the budget, and the closed-form bounds with
    offload are not above it."""
    costs = cm.Costs(f, b, w, offload=copy)
    plain = optimal(2, 2, costs, limit, placement, time_limit=30)
    off = optimal(2, 2, costs, limit, placement, time_limit=30, offload="auto")
    assert off.status == "optimal" and off.makespan <= plain.makespan + 1e-9
    _check(off, costs, limit * 2)
    P = Placement.v_shape(2) if placement == "v-shape" else Placement.sequential(2)
    assert makespan_bound(P, 2, costs, limit * 2, offload=1.0) <= off.makespan + 1e-9
