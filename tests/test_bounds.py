"""The lower bounds on the makespan (``ctrlmem.search.bounds.makespan_bounds``, docs/theory.md §6):
each holds for every schedule within the memory cap — never above a CP-SAT proven optimum, never
above any candidate the searches produce within its cap — and at F = B = W the last-forward bound
is the paper's ``6n + 6p − 1 − 3k``.

Units: ``Costs`` are full-stage pass times; caps in ``a`` (1F1B's peak is ``p·a``).
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search.bounds import makespan_bound, makespan_bounds


def _costs(data, stages, per_stage, comm):
    x = st.floats(0.25, 4.0, allow_nan=False).map(lambda v: round(v, 2))
    if per_stage:
        f, b, w = (data.draw(st.lists(x, min_size=stages, max_size=stages)) for _ in range(3))
    else:
        f, b, w = (data.draw(x) for _ in range(3))
    return cm.Costs(f, b, w, comm)


@pytest.mark.slow
@settings(max_examples=15)
@given(p=st.integers(2, 5), extra=st.integers(0, 5), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.1, 0.7]))
def test_never_above_a_candidate_within_its_cap(p, extra, data, per_stage, comm):
    """Random costs: every V-shape candidate of the searches (split and fused backward), and the
    ``zb`` schedules, take at least the bound at their own peak."""
    from ctrlmem.schedules.budgeted import v_shape_candidates

    m = p + extra + 1
    costs = _costs(data, 2 * p, per_stage, comm)
    P = Placement.v_shape(p)
    for fused in (False, True):
        cands = v_shape_candidates(p, m, costs, 1.5, fused=fused)
        assert cands
        for c in cands[:: max(1, len(cands) // 40)]:
            got = makespan_bounds(P, m, costs, c.peak, fused=fused)
            for name, value in got.items():
                assert value <= c.makespan + 1e-6, (name, value, c.label, c.makespan, fused)
    seq = Placement.sequential(p)
    flat = cm.Costs(costs.f if not per_stage else 1.0, costs.b if not per_stage else 2.0,
                    costs.w if not per_stage else 1.0, comm)
    for limit in (1 / p, 0.5, 1.0, 2.0):
        r = cm.simulate(cm.build("zb", p, m, costs=flat, memory_limit=limit), flat)
        assert makespan_bound(seq, m, flat, max(r.peak_memory)) <= r.makespan + 1e-6
    for name in ("1f1b", "gpipe"):
        s = cm.build(name, p, m)
        r = cm.simulate(s, flat)
        assert makespan_bound(seq, m, flat, max(r.peak_memory), fused=not s.split_backward) <= r.makespan + 1e-6


# Instances CP-SAT proved optimal (ctrlmem.optimal, 2 workers): p, m, costs, cap (a), placement,
# the optimum. The unit-cost ones at p = 3, 4 are where the last-forward bound is exact.
PROVEN = [
    (3, 6, cm.Costs(2, 2, 2), 2.0, "v-shape", 41.0),
    (4, 8, cm.Costs(2, 2, 2), 3.0, "v-shape", 53.0),
    (4, 8, cm.Costs(2, 2, 2), 2.5, "v-shape", 56.0),
    (3, 6, cm.Costs(2, 2, 2), 1.5, "v-shape", 52.0),
    (2, 4, cm.Costs(2, 2, 2), 1.0, "v-shape", 33.0),
    (3, 3, cm.Costs(3, 4, 2), 1.5, "v-shape", 46.5),
    (4, 8, cm.Costs(6, 8, 4), 2.0, "v-shape", 200.0),
    (6, 12, cm.Costs(3, 4, 2), 1.0, "v-shape", 334.5),   # proven by cm.improve's whole model
    (4, 8, cm.Costs(2, 1, 1, 0.3), 1.0, "v-shape", 91.7),
    (4, 8, cm.Costs(2, 1, 1, 0.3), 1.0, "sequential", 118.4),
    (3, 6, cm.Costs(1, 2, 2, 0.5), 1.0, "v-shape", 64.0),
    # budgets 0.25 and 0.375 of 1F1B's at p = 6 (3 and 4 half-activations), cm.improve's whole model
    (6, 12, cm.Costs(3, 4, 2), 1.5, "v-shape", 300.0),
    (6, 12, cm.Costs(3, 4, 2), 2.25, "v-shape", 193.0),
    (6, 12, cm.Costs(1, 1, 1), 2.25, "v-shape", 55.5),
]


@pytest.mark.parametrize("p,m,costs,cap,placement,optimum", PROVEN)
def test_never_above_the_proven_optimum(p, m, costs, cap, placement, optimum):
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    for name, value in makespan_bounds(P, m, costs, cap).items():
        assert value <= optimum + 1e-9, name


@pytest.mark.slow
def test_never_above_optima_proved_now():
    """The same, against optima CP-SAT proves in this run (both placements, comm included)."""
    pytest.importorskip("ortools")
    for p, m, costs, limit, placement in ((2, 4, cm.Costs(1, 2, 1, 0.5), 0.5, "v-shape"),
                                          (3, 3, cm.Costs(3, 4, 2, 0.2), 0.75, "v-shape"),
                                          (3, 6, cm.Costs(2, 1, 1), 1 / 3, "sequential"),
                                          (4, 4, cm.Costs(1, 2, 2, 0.3), 0.5, "sequential")):
        r = cm.optimal(p, m, costs, memory_limit=limit, placement=placement, time_limit=30)
        if r.status != "optimal":
            continue
        P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
        assert makespan_bound(P, m, costs, limit * p) <= r.makespan + 1e-9


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_last_forward_is_the_papers_bound_at_equal_costs(p):
    """F = B = W = τ per V-shape chunk, ``k`` half-activations per device: the last-forward bound
    of device p − 1 is the paper's 6n + 6p − 1 − 3k (in τ) for p ≤ k ≤ 3p/2, and 6n + 3p − 1 − k
    (k ≤ 2p) when the chain after the last forward is covered."""
    n = 4 * p
    tau = cm.Costs(2, 2, 2)  # full stage 2: chunk passes of 1
    P = Placement.v_shape(p)
    for k in range(p, 2 * p + 1):
        got = makespan_bounds(P, n, tau, k / 2)["last forward"]
        want = 6 * n + 6 * p - 1 - 3 * k if 2 * k <= 3 * p else 6 * n + 3 * p - 1 - k
        assert got == want, (k, got, want)


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
@settings(max_examples=15)
@given(p=st.integers(2, 6), m=st.integers(2, 6), data=st.data(), comm=st.sampled_from([0.0, 0.5, 1.7]))
def test_never_above_a_schedule_when_memory_cannot_bind(p, m, data, comm):
    """Few microbatches and budgets up to 3× 1F1B's: the warm-up and last-forward bounds must not
    assume the cap binds when a device can hold all its forwards (a regression: zb at p = 8, m = 8
    with the profiled costs is 294.12, below what the unguarded last-forward term gave)."""
    costs = _costs(data, 1, False, comm)
    for limit in (0.5, 1.0, 1.5, 3.0):
        for name, placement in (("zb", Placement.sequential(p)), ("v-shape", Placement.v_shape(p))):
            s = cm.build(name, p, m, costs=costs, memory_limit=limit)
            r = cm.simulate(s, costs)
            for key, value in makespan_bounds(placement, m, costs, max(r.peak_memory)).items():
                assert value <= r.makespan + 1e-6, (name, limit, key, value, r.makespan)
    prof = cm.Costs(7.98, 9.32, 8.37, 1.68)
    r = cm.simulate(cm.build("zb", 8, 8, costs=prof, memory_limit=1.0), prof)
    assert makespan_bound(Placement.sequential(8), 8, prof, 8.0) <= r.makespan == 294.12


def test_one_at_a_time_meets_the_optimum_at_the_smallest_budget():
    """One microbatch's activations per device (1/p of 1F1B's): the one-at-a-time bound is the
    proven optimum at p = 6, m = 12, 3:4:2 (334.5), and what zb reaches with one stage per device."""
    assert makespan_bounds(Placement.v_shape(6), 12, cm.Costs(3, 4, 2), 1.0)["one at a time"] == 334.5
    unit = cm.Costs(1, 1, 1)
    r = cm.simulate(cm.build("zb", 4, 8, costs=unit, memory_limit=0.25), unit)
    assert makespan_bounds(Placement.sequential(4), 8, unit, 1.0)["one at a time"] == r.makespan == 72
    # F-heavy: the next microbatch's entry waits for the first release (CP-SAT optimum 91.7 here)
    assert makespan_bounds(Placement.v_shape(4), 8, cm.Costs(2, 1, 1, 0.3), 1.0)["one at a time"] == \
        pytest.approx(91.7)


def test_one_at_a_time_counts_the_device_between_two_top_forwards():
    """Between two forwards of a device's top stage at the smallest budget, the device runs the
    first microbatch's backwards and W s and the next one's lower forward, one at a time: on the
    V-shape's bottom device (stages p − 1 and p) the backward chain goes on at once on the device,
    so the top stage's W and the next forward queue behind it. F = B = W: p = 6, m = 6: 52.5 (was
    47.5), the optimum CP-SAT proves and what v-shape reaches; p = 8, m = 16: 166.5 (was 151.5),
    v-shape's too. One stage per device it is the release chain, as before."""
    unit = cm.Costs(1, 1, 1)
    for p, m, want in ((6, 6, 52.5), (8, 16, 166.5)):
        got = makespan_bounds(Placement.v_shape(p), m, unit, 1.0)["one at a time"]
        r = cm.simulate(cm.build("v-shape", p, m, costs=unit, memory_limit=1 / p, objective="makespan"), unit)
        assert got == pytest.approx(want) == r.makespan
    assert makespan_bounds(Placement.sequential(4), 8, unit, 1.0)["one at a time"] == 72


@pytest.mark.slow
@settings(max_examples=12)
@given(p=st.integers(2, 4), m=st.integers(2, 6), f=st.sampled_from([1, 2, 3]), b=st.sampled_from([1, 2, 3, 4]),
       w=st.sampled_from([1, 2, 3]), comm=st.sampled_from([0.0, 0.5, 1.0]),
       placement=st.sampled_from(["v-shape", "sequential"]))
def test_one_at_a_time_never_above_an_optimum_proved_now(p, m, f, b, w, comm, placement):
    """At the smallest budget (one microbatch's activations a device) the bound is at most the
    makespan CP-SAT reaches, and at most its proven optimum (656 random instances of this kind
    checked once: 641 at the optimum exactly, none above)."""
    pytest.importorskip("ortools")
    costs = cm.Costs(f, b, w, comm)
    r = cm.optimal(p, m, costs, memory_limit=1 / p, placement=placement, time_limit=20, deterministic=True)
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    got = makespan_bounds(P, m, costs, 1.0)["one at a time"]
    assert got <= r.makespan + 1e-9
    if r.status == "optimal":
        assert got <= r.lower_bound + 1e-9


def test_no_cap_and_tiny_cap():
    """Without a cap only the per-device bound is informative; a cap below one activation makes
    the memory bound infinite only through the division (no schedule exists there)."""
    P = Placement.v_shape(4)
    free = makespan_bounds(P, 8, cm.Costs(1, 1, 1), None)
    assert free["memory"] == 0 and free["warm-up"] == 0 and free["device"] > 0
    assert math.isfinite(makespan_bound(P, 8, cm.Costs(1, 1, 1), 1.0))


def test_levels_sees_an_odd_number_of_activations():
    """Three half-activations per device on the V-shape (p = 6, budget 0.25 of 1F1B's): only one
    microbatch at a time can hold both of a device's stages, so the bottom device (stages 5 and 6,
    the two longest-overlapping lifespans) passes the microbatches one ``L_2`` apart. The bound is
    273 (memory × time says 197.5; the optimum cm.improve proves is 300); with four half-activations
    two microbatches hold both at once and the levels add nothing to memory × time."""
    P, c = Placement.v_shape(6), cm.Costs(3, 4, 2)
    odd = makespan_bounds(P, 12, c, 1.5)
    assert odd["levels"] == 273.0 and odd["memory"] == 197.5
    assert makespan_bound(P, 12, c, 1.5) == pytest.approx(273.0)
    even = makespan_bounds(P, 12, c, 2.0)
    assert even["levels"] <= even["memory"] + 9.0  # only the first forward's arrival is added
    # a cap that is not a whole number of activations counts as its whole part
    assert makespan_bounds(P, 12, c, 1.99)["levels"] == odd["levels"]


def test_ramps_add_what_the_cap_cannot_hold_at_the_ends():
    """Where memory binds, the cap cannot be full while the first forwards start one at a time nor
    while the last releases end one at a time: V-shape p = 16, m = 32, F:B:W = 2:1:1 at a quarter
    of 1F1B's memory (k = 8 half-activations, chunk F = 1 and W = 0.5) gives memory × time's 217
    plus (k − 1)(F + W) / 2 = 5.25 (and the fused backward's levels plus (k − 1)(F + BW) / 2).
    Where memory does not bind (a cap above what the lifespans need) it adds nothing, and without
    a cap, or with a lever, it is absent or 0."""
    P, c = Placement.v_shape(16), cm.Costs(2, 1, 1)
    got = makespan_bounds(P, 32, c, 4.0)
    assert got["levels"] == got["memory"] == 217.0
    assert got["ramps"] == pytest.approx(217.0 + 7 * 1.5 / 2)
    assert makespan_bound(P, 32, c, 4.0) == pytest.approx(222.25)
    fused = makespan_bounds(P, 32, c, 4.0, fused=True)  # a release is a BW (1): + 7 · 2 / 2 on the levels'
    assert fused["ramps"] == pytest.approx(fused["levels"] + 7.0)  # 279 (the fused chains are longer) + 7
    assert makespan_bounds(P, 4, c, 16.0)["ramps"] == 0.0  # 4 microbatches cannot fill 32 half-activations
    assert "ramps" not in makespan_bounds(P, 32, c, None)
    assert makespan_bounds(P, 32, cm.Costs(2, 1, 1, recompute=1.0), 4.0, recompute="full").get("ramps", 0.0) == 0.0


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 4), chunks=st.integers(2, 4), extra=st.integers(0, 6), data=st.data(),
       comm=st.sampled_from([0.0, 0.3, 1.1]), name=st.sampled_from(["interleaved-1f1b", "looped-bfs"]))
def test_never_above_a_schedule_with_more_stages_per_device(p, chunks, extra, data, comm, name):
    """Looped placements with 2–4 stages per device (the levels bound's subsets of stages, the
    memory bound's sum) and random per-stage costs: no bound is above the schedule's makespan at
    the schedule's own peak."""
    m = p * (1 + extra // 3) if name == "interleaved-1f1b" else p + extra
    costs = _costs(data, p * chunks, True, comm)
    s = cm.build(name, p, m, num_chunks=chunks)
    r = cm.simulate(s, costs)
    for key, value in makespan_bounds(s.placement, m, costs, max(r.peak_memory),
                                      fused=not s.split_backward).items():
        assert value <= r.makespan + 1e-6, (key, value, r.makespan)
