"""Memory-budgeted schedules: the adaptive ``v-shape`` search and the ``zb`` scheduler
(docs/theory.md §10, App. A/B; §8 ZB-1P/ZB-2P).

Units as in test_v_shape.py: ``tau = 2 * device_bubble`` for V-shape schedules under
``Costs(1, 1, 1)``; memory in ``a``; ``memory_limit`` a fraction of 1F1B's ``p·a``.
"""

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.schedules.budgeted import min_v_shape_limit, v_shape_candidates
from ctrlmem.search.engine import clear_caches
from ctrlmem.search.families import lahc

UNIT = cm.Costs(1, 1, 1, 0)
UNEQUAL = cm.Costs(3, 4, 2, 0.1)


def tau_bubble(result) -> float:
    return 2 * max(result.device_bubbles)


def limits_for(p: int, m: int, costs) -> list[float]:
    """From the smallest feasible limit (1/p) to 2.0: every half-a step, every peak level the
    block family reaches, and a few fractions in between."""
    levels = {c.memory_fraction for c in v_shape_candidates(p, m, costs, 2.0)}
    grid = {x / 16 for x in range(4, 33)} | {h / (2 * p) for h in range(2, 4 * p + 1)}
    return sorted(x for x in levels | grid if 1 / p <= x <= 2.0)


@pytest.mark.parametrize("costs", [UNIT, UNEQUAL], ids=["equal", "unequal"])
@pytest.mark.parametrize("p", [4, 5, pytest.param(6, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
def test_v_shape_respects_limit_and_improves_with_it(p, costs):
    """From the smallest feasible limit to 2.0: the peak stays within the limit and the longest
    device span (the bubble rate's basis) never grows as the limit grows."""
    m = 2 * p + 2
    prev = None
    # p = 5, m = 12 is a small pipeline: its long climb a tenth as long (monotone whatever the length)
    with mock.patch.object(lahc, "SMALL_WORK", lahc.SMALL_WORK // 10):
        try:
            for limit in limits_for(p, m, costs):
                s = cm.build("v-shape", p, m, costs=costs, memory_limit=limit)
                cm.validate(s)
                r = cm.simulate(s, costs)
                assert max(r.peak_memory) <= limit * p + 1e-9, (limit, r.peak_memory)
                if prev is not None:
                    assert max(r.device_spans) <= max(prev.device_spans) + 1e-9, limit
                prev = r
        finally:  # the shorter climbs' results are cached: not for the tests after this one
            clear_caches()


@pytest.mark.parametrize("costs", [UNIT, UNEQUAL], ids=["equal", "unequal"])
@pytest.mark.parametrize("p", [4, 5, 6, 8])
def test_v_shape_no_worse_than_fixed_v_schedules(p, costs):
    """At V-Half's own peak (⌊(p+2)/2⌋/p, which is ≥ 0.5) the search is no slower than v-half;
    at V-Min's, no slower than v-min; at 1.0 no slower than v-zb and ZB-V."""
    m = 2 * p + 2
    for name, level in (("v-min", (p + 4) // 3 / p), ("v-half", (p + 2) // 2 / p), ("v-zb", 1.0), ("zb-v", 1.0)):
        ours = cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=level), costs)
        fixed = cm.simulate(cm.build(name, p, m), costs)
        assert max(ours.device_spans) <= max(fixed.device_spans) + 1e-9, (name, level)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_v_shape_zero_bubble_at_full_memory(p):
    """With F = B = W and m ≥ 2p, the search at 1F1B's memory has no bubble."""
    for m in (2 * p, 2 * p + 3):
        r = cm.simulate(cm.build("v-shape", p, m, memory_limit=1.0), UNIT)
        assert r.bubble_rate == 0, (p, m)


def test_v_shape_at_literal_half_is_below_v_half_memory():
    """memory_limit=0.5 means 0.5·p·a exactly: below V-Half's ⌊(p+2)/2⌋·a, so the result uses
    less memory than v-half and (by the lower bound) cannot match its bubble."""
    for p in (4, 6, 8):
        r = cm.simulate(cm.build("v-shape", p, 2 * p + 2, memory_limit=0.5), UNIT)
        assert max(r.peak_memory) <= p / 2
        assert tau_bubble(r) >= 6 * p - 1 - 3 * p


def test_v_shape_p8_m32_values():
    """docs/theory.md §6: the authors' adaptive scheduler gives 23 / 20 / 11 / 0 τ at k = 8 / 9 /
    12 / 16 half-stage activations (p = 8, m = 32), the bound 6p − 1 − 3k at k = 9, 12, 16; ours
    gives the same (the App. A grid family reaches 20 at k = 9, where the other families stay
    at 21)."""
    p, m = 8, 32
    got = {}
    for k in (8, 9, 12, 16):
        r = cm.simulate(cm.build("v-shape", p, m, memory_limit=k / (2 * p)), UNIT)
        assert 2 * max(r.peak_memory) <= k
        got[k] = tau_bubble(r)
        assert got[k] >= 6 * p - 1 - 3 * k
    assert got == {8: 23, 9: 20, 12: 11, 16: 0}


@pytest.mark.slow
def test_v_shape_p16_curve_matches_paper():
    """docs/theory.md §9.6 (slow, about 5 s): with F = B = W at p = 16, m = 64 the adaptive curve is .1332 / .1213 /
    .1090 / .0965 / .0565 / 0 at limits 0.375 / 0.4375 / 0.5 / 0.5625 / 0.75 / 1.0."""
    want = {0.375: 0.1332, 0.4375: 0.1213, 0.5: 0.1090, 0.5625: 0.0965, 0.75: 0.0565, 1.0: 0.0}
    got = {
        lim: round(cm.simulate(cm.build("v-shape", 16, 64, memory_limit=lim), UNIT).bubble_rate, 4)
        for lim in want
    }
    assert got == want


@pytest.mark.parametrize("p", [3, 4, 5, 7, 8])
def test_v_shape_never_beats_lower_bound(p):
    """No candidate of the search beats 6p−1−3k τ for its own peak k (docs/theory.md §6): every
    family's candidates, timed by the engine (equal work on every device, so the largest device
    bubble is the longest span minus the work)."""
    from ctrlmem.search.engine import Incumbent, Query
    from ctrlmem.search.timing import time_set
    from ctrlmem.schedules.recipes import V_SPLIT

    m = 2 * p + 2
    q = Query(cm.Placement.v_shape(p), m, UNIT, 2.0 * p)
    checked = 0
    for fam in V_SPLIT:
        for cs in fam.sets(q, Incumbent()):
            tm = time_set(cs, UNIT)
            for i in range(len(cs)):
                if tm.span[i] == float("inf"):
                    continue
                tau = 2 * (tm.span[i] - 3 * m)  # a chunk pass is 0.5 with Costs(1, 1, 1): 1 tau
                assert tau >= 6 * p - 1 - 3 * 2 * cs.peak[i] - 1e-9, cs.labels[i]
                checked += 1
    assert checked > 50


def test_v_shape_per_stage_costs():
    """Per-stage (unequal) costs: a heavy first and last stage; the limit still holds and the
    choice is no slower than v-half at V-Half's level."""
    p = 6
    S = 2 * p
    f = [1.0] * S
    f[0] = f[-1] = 2.5
    costs = cm.Costs(f=f, b=[2 * x for x in f], w=[0.8 * x for x in f], comm=0.05)
    level = ((p + 2) // 2) / p
    s = cm.build("v-shape", p, 3 * p, costs=costs, memory_limit=level)
    r = cm.simulate(s, costs)
    assert max(r.peak_memory) <= level * p + 1e-9
    span = max(r.device_spans)
    assert span <= max(cm.simulate(cm.build("v-half", p, 3 * p), costs).device_spans) + 1e-9
    assert span <= max(cm.simulate(cm.build("v-half", p, 3 * p, costs=costs), costs).device_spans) + 1e-9


def test_v_shape_bad_limit_names_smallest_feasible():
    """The smallest feasible limit is one microbatch per device (1/p, the list scheduler's
    smallest cap); below it the error names it, at it a schedule exists."""
    p, m = 8, 20
    least = min_v_shape_limit(p, m)
    assert least == pytest.approx(1 / p)
    s = cm.build("v-shape", p, m, memory_limit=least)
    assert max(cm.simulate(s).peak_memory) <= 1.0
    with pytest.raises(ValueError, match=r"smallest feasible limit is 0\.125\b"):
        cm.build("v-shape", p, m, memory_limit=0.1)


def test_v_shape_bad_sizes_explained():
    """p = 1 and m = 1 are refused with what is supported."""
    with pytest.raises(ValueError, match="num_devices >= 2"):
        cm.build("v-shape", 1, 8, memory_limit=1.0)
    with pytest.raises(ValueError, match="num_microbatches >= 2"):
        cm.build("v-shape", 4, 1, memory_limit=1.0)


def test_v_shape_records_choice():
    """The schedule says which block it came from and under which limit."""
    s = cm.build("v-shape", 4, 10, memory_limit=0.75)
    params = dict(s.params)
    assert params["memory_limit"] == 0.75 and params["block"]


# -- zb --------------------------------------------------------------------------------------


@pytest.mark.parametrize("costs", [UNIT, UNEQUAL], ids=["equal", "unequal"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (6, 12), (8, 24)])
def test_zb_respects_limit(p, m, costs):
    """The peak stays within the limit for limits from one microbatch up to 2x 1F1B."""
    for limit in (1 / p, 0.5, 0.75, 1.0, 1.5, 2.0):
        s = cm.build("zb", p, m, costs=costs, memory_limit=limit)
        cm.validate(s)
        r = cm.simulate(s, costs)
        assert max(r.peak_memory) <= limit * p + 1e-9, (limit, r.peak_memory)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (6, 12), (8, 24), (8, 32)])
def test_zb_1p_and_2p(p, m):
    """ZB-1P (limit 1.0) is no slower than ZB-H1 and than 1F1B; ZB-2P (limit 2.0) has no
    bubble with F = B = W (docs/theory.md §8)."""
    for costs in (UNIT, UNEQUAL):
        one = cm.simulate(cm.build("zb", p, m, costs=costs, memory_limit=1.0), costs)
        assert one.makespan <= cm.simulate(cm.build("zb-h1", p, m), costs).makespan + 1e-9
        assert one.makespan <= cm.simulate(cm.build("1f1b", p, m), costs).makespan + 1e-9
    two = cm.simulate(cm.build("zb", p, m, memory_limit=2.0), UNIT)
    assert two.bubble_rate == 0


def test_zb_bad_limit():
    """A limit that allows no activation names the smallest feasible one."""
    with pytest.raises(ValueError, match=r"smallest feasible limit is 0\.25"):
        cm.build("zb", 4, 8, memory_limit=0.2)


@pytest.mark.slow
@settings(max_examples=8)
@given(
    p=st.integers(3, 5),
    fbw=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    comm=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_v_shape_any_costs_limit_and_monotone(p, fbw, comm):
    """For any F, B, W ∈ 1..4 and comm, the search respects every limit and its longest span
    never grows as the limit grows."""
    costs = cm.Costs(*fbw, comm)
    m = 2 * p + 1
    prev = None
    for limit in limits_for(p, m, costs)[::3]:
        r = cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=limit), costs)
        assert max(r.peak_memory) <= limit * p + 1e-9
        assert prev is None or max(r.device_spans) <= prev + 1e-9
        prev = max(r.device_spans)


_stage_cost = st.floats(0.25, 4.0, allow_nan=False).map(lambda x: round(x, 2))


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
@settings(max_examples=10, deadline=None)
@given(
    p=st.integers(2, 5),
    extra=st.integers(0, 6),
    data=st.data(),
    comm=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    per_stage=st.booleans(),
    budgets=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=3),
)
def test_v_shape_property_random_costs(p, extra, data, comm, per_stage, budgets):
    """Random costs (per-stage lists or one value each, comm) and budgets in [1/p, 2.0]:
    ``v-shape`` validates, respects the budget, is monotone in it (longest span), and is never
    slower than the cost-adaptive ``v-min``, ``v-half`` and ``v-zb`` at their memory levels."""
    m = p + extra + 1
    S = 2 * p
    if per_stage:
        f, b, w = (data.draw(st.lists(_stage_cost, min_size=S, max_size=S)) for _ in range(3))
    else:
        f, b, w = (data.draw(_stage_cost) for _ in range(3))
    costs = cm.Costs(f, b, w, comm)
    least = 1 / p
    limits = sorted(least + x * (2.0 - least) for x in budgets)
    prev = None
    for limit in limits:
        s = cm.build("v-shape", p, m, costs=costs, memory_limit=limit)
        cm.validate(s)
        r = cm.simulate(s, costs)
        assert max(r.peak_memory) <= limit * p + 1e-9
        assert prev is None or max(r.device_spans) <= prev + 1e-9
        prev = max(r.device_spans)
    for name in ("v-min", "v-half", "v-zb"):
        fixed = cm.build(name, p, m, costs=costs)
        fr = cm.simulate(fixed, costs)
        level = max(cm.simulate(cm.build(name, p, m)).peak_memory) / p  # the pattern's memory level
        assert max(fr.peak_memory) <= level * p + 1e-9, name
        ours = cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=level), costs)
        assert max(ours.device_spans) <= max(fr.device_spans) + 1e-9, name
