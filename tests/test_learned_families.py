"""The families learned from cm.improve's optima at p ≤ 4 (docs/theory.md §12): fill-ahead (list
schedules running a higher stage's forward first, banker's admission) and relocate (single-pass
moves with kicks). They only add candidates, stay monotone in the budget, and close the gaps the
solver showed.

Units: ``Costs`` are full-stage pass times; budgets fractions of 1F1B's ``p·a``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.ir import Placement
from ctrlmem.schedules.families.fillahead import FILL_MAX_PM, FillAheadFamily
from ctrlmem.schedules.families.lists import list_schedule
from ctrlmem.schedules.families.relocate import RelocateFamily, relocate_keys
from ctrlmem.search import Progress, Query
from ctrlmem.search.encoding import CandidateSet, from_schedules, problem
from ctrlmem.search.engine import timed


@pytest.mark.parametrize("p,m,costs,limit,before,optimum", [
    # (v-shape's makespan before these families, the CP-SAT optimum): odd half-activation budgets
    (3, 6, cm.Costs(1, 1, 1), 0.5, 29.0, 26.0),
    (2, 8, cm.Costs(2, 1, 1), 0.75, 41.5, 34.5),
    (3, 12, cm.Costs(2, 1, 1), 0.5, 81.0, 69.5),
])
def test_closes_the_gaps_the_solver_showed(p, m, costs, limit, before, optimum):
    r = cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=limit), costs)
    assert optimum <= r.makespan < before
    assert r.makespan <= 1.02 * optimum


def test_banker_admits_what_the_full_reservation_refuses():
    """Three half-activations per device at p = 3: the banker's rule lets a second microbatch in
    while the first still needs its upper stage, and the schedule runs (no deadlock)."""
    P = Placement.v_shape(3)
    costs = cm.Costs(1, 1, 1)
    f, b, w = costs.stage_times(6, 3)
    full = list_schedule(P, 6, f, b, w, 0.0, [0.5] * 6, 1.5, policy=("upper", "high", "lazy"))
    bank = list_schedule(P, 6, f, b, w, 0.0, [0.5] * 6, 1.5, policy=("upper", "high", "lazy"), banker=True)
    assert full is not None and bank is not None
    got = []
    for keys, label in ((full.keys, "full"), (bank.keys, "banker")):
        one = CandidateSet(P, 6, False, keys[None], (label,))
        assert problem(one, 0) is None
        assert one.peak[0] <= 1.5 + 1e-9
        got.append(float(timed(one, costs).makespan[0]))
    assert got[1] < got[0]


def test_relocate_never_worse_and_within_the_cap():
    costs = cm.Costs(1, 2, 2)
    s = cm.build("v-min", 3, 6)
    cs = from_schedules([("v-min", s)])
    start = timed(cs, costs)
    got = relocate_keys(cs, 0, costs, 2.0)
    assert got is not None
    tm = timed(got, costs)
    assert (tm.span[0], tm.makespan[0]) < (start.span[0], start.makespan[0])
    assert got.peak[0] <= 2.0 + 1e-9 and problem(got, 0) is None
    again = relocate_keys(cs, 0, costs, 2.0)  # a fixed seed: the same schedule every time
    assert np.array_equal(again.keys, got.keys)


@settings(max_examples=6)
@given(p=st.integers(2, 4), extra=st.integers(0, 4), fbw=st.tuples(*(st.integers(1, 4),) * 3),
       comm=st.sampled_from([0.0, 0.3]))
def test_families_monotone_in_the_cap(p, extra, fbw, comm):
    """Each family's candidates for a cap include those for every smaller cap (labels), so a
    larger budget never loses a candidate."""
    m = p + extra + 1
    costs = cm.Costs(*fbw, comm)
    P = Placement.v_shape(p)
    from ctrlmem.schedules.families import V_SPLIT

    relocate = next(f for f in V_SPLIT if isinstance(f, RelocateFamily))
    for fam in (FillAheadFamily(), relocate):
        prev: set = set()
        for cap in (1.0, 1.5, 2.0, p, 1.5 * p):
            labels = {lab for cs in fam.sets(Query(P, m, costs, cap), Progress()) for lab in cs.labels}
            assert prev <= labels, (type(fam).__name__, cap, prev - labels)
            prev = labels


def test_only_small_pipelines():
    """Both families stay out of pipelines above p·m = 64 (the large-size timings are unchanged)."""
    P = Placement.v_shape(8)
    q = Query(P, 9, cm.Costs(3, 4, 2), 4.0)
    assert 8 * 9 > FILL_MAX_PM
    assert not list(FillAheadFamily().sets(q, Progress()))
    assert not list(RelocateFamily([]).sets(q, Progress()))


@settings(max_examples=6)
@given(p=st.integers(2, 4), m=st.integers(2, 10), fbw=st.tuples(*(st.integers(1, 4),) * 3))
def test_zb_monotone_with_relocate(p, m, fbw):
    costs = cm.Costs(*fbw)
    prev = None
    for limit in (1 / p, 0.5, 0.75, 1.0, 1.5, 2.0):
        r = cm.simulate(cm.build("zb", p, m, costs=costs, memory_limit=limit), costs)
        assert max(r.peak_memory) <= limit * p + 1e-9
        assert prev is None or max(r.device_spans) <= prev + 1e-9
        prev = max(r.device_spans)
