"""The one-device relaxation (``ctrlmem.solver.relax``, docs/theory.md §6 bound 7): a lower bound
on every schedule within the cap — never above a proven optimum nor a schedule the searches build
within its cap — and where the closed forms are loose it is the better bound."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search.bounds import makespan_bound

pytest.importorskip("ortools")
from ctrlmem.solver.relax import relaxed_bounds


def _best(placement, m, costs, cap, **kw):
    return max(r.bound for r in relaxed_bounds(placement, m, costs, cap, **kw))


@pytest.mark.parametrize("m,costs,cap,optimum,closed", [
    (12, cm.Costs(3, 4, 2), 2.25, 193.0, 150.5),   # budget 0.375: four half-activations
    (12, cm.Costs(3, 4, 2), 1.5, 300.0, 273.0),    # budget 0.25: three
])
def test_closer_to_the_proven_optimum_than_the_closed_forms(m, costs, cap, optimum, closed):
    """V-shape p = 6 (optima proved by cm.improve's whole model): the relaxation is between the
    closed forms and the optimum, and at 0.375 it is 184.5 (the bottom device alone)."""
    P = Placement.v_shape(6)
    assert makespan_bound(P, m, costs, cap) == pytest.approx(closed)
    got = relaxed_bounds(P, m, costs, cap, seconds=20)
    best = max(r.bound for r in got)
    assert closed < best <= optimum
    if cap == 2.25:
        assert best == 184.5 and max(got, key=lambda r: r.bound).device == 5


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(p=st.integers(2, 3), m=st.integers(2, 4), data=st.data(), comm=st.sampled_from([0.0, 0.3]),
       placement=st.sampled_from(["v-shape", "sequential"]))
def test_never_above_a_proven_optimum(p, m, data, comm, placement):
    """Random costs (two decimals: the rounding down is exercised), budgets from the smallest up:
    every device's relaxation is at most what CP-SAT proves optimal for the whole problem."""
    x = st.floats(0.5, 4.0, allow_nan=False).map(lambda v: round(v, 2))
    costs = cm.Costs(data.draw(x), data.draw(x), data.draw(x), comm)
    limit = data.draw(st.sampled_from([1 / p, 0.5, 0.75, 1.0]))
    res = cm.optimal(p, m, costs, memory_limit=limit, placement=placement, time_limit=20)
    if res.status != "optimal":
        return
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    for r in relaxed_bounds(P, m, costs, limit * p, seconds=5):
        assert r.bound <= res.makespan + 1e-6, (r, res.makespan)


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
        for b in relaxed_bounds(s.placement, m, costs, max(r.peak_memory), fused=not s.split_backward, seconds=2):
            assert b.bound <= r.makespan + 1e-6, (name, b, r.makespan)


def test_bad_input_is_named():
    P = Placement.v_shape(4)
    with pytest.raises(ValueError, match="needs 2 for one microbatch: give cap >= 1"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 0.5)
    with pytest.raises(ValueError, match="m must be at least 1"):
        relaxed_bounds(P, 0, cm.Costs(1, 1, 1), 1.0)
    with pytest.raises(ValueError, match="cap must be positive"):
        relaxed_bounds(P, 4, cm.Costs(1, 1, 1), 0.0)
