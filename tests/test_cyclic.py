"""The cyclic-block family (docs/theory.md §12, "Cyclic blocks"): a building block searched for its
shortest period under the exact periodic peak, repeated. It must fit its cap exactly as the
simulator counts memory, beat the block whose peak Eq. 1 bounds where memory binds, only ever add
candidates to the searches, and stay deterministic and monotone in the budget.

Units: ``Costs`` are full-stage pass times; caps are activation units (half an ``a`` on the
V-shape, one ``a`` with one stage per device); budgets fractions of 1F1B's ``p·a``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search import Incumbent, Query
from ctrlmem.search.encoding import CandidateSet
from ctrlmem.search.engine import clear_caches
from ctrlmem.search.families import cyclic
from ctrlmem.search.families.cyclic import (COPIES_FINER_MAX_P, COPIES_MAX_P, FINER, RESOLUTION, CyclicFamily, _arrays,
                                            _evaluate, _fits, _mark, _one_block, _peak, _peak_floor, _place, _steps,
                                            block_order,
                                            copies_block, cyclic_block, quantisation_error, quantise, resolutions)
from ctrlmem.search.kernels import ints


def _block_schedule(placement, m, period, x):
    cs = CandidateSet(placement, m, False, block_order(placement, m, period, x)[None], ("cyclic",))
    return cs.schedule(0, "cyclic")


def _eq1_bound(placement, period, x, dW):
    """Eq. 1's peak of the block: every stage counts ⌈ℓ / T⌉ activations, per device."""
    out = [0] * placement.num_devices
    for s, d in enumerate(placement.stage_device):
        life = x[2, s] + dW[s] - x[0, s]
        out[d] += -(-life // period)
    return max(out)


def test_beats_every_block_whose_peak_eq1_bounds():
    """p = 6, F:B:W = 3:4:2, half of 1F1B's memory (6 half-activations per device): the shortest
    period of a block whose Eq. 1 sum fits is 12 per microbatch (a CP-SAT model of the block
    proves it, docs/theory.md §12); with the arcs placed apart a block of period 10.5 fits, and
    repeated it peaks exactly at the cap."""
    placement, costs = Placement.v_shape(6), cm.Costs(3, 4, 2)
    dur = quantise(placement, costs)
    assert dur[:3] == ((3,) * 12, (4,) * 12, (2,) * 12)  # 1.5, 2, 1 at two slots per shortest pass
    period, x = cyclic_block(placement, dur, 6)
    assert period == 21  # 10.5 time units: the shortest the exact peak allows (CP-SAT: 10.5)
    assert _eq1_bound(placement, period, x, dur[2]) > 6  # Eq. 1 would call it over the cap
    for m in (12, 24):
        r = cm.simulate(_block_schedule(placement, m, period, x), costs)
        assert max(r.peak_memory) == 3.0  # 6 half-activations: exactly the cap
    # the repeat's makespan grows by one period per microbatch in the stable phase
    longer = cm.simulate(_block_schedule(placement, 36, period, x), costs).makespan
    assert longer - cm.simulate(_block_schedule(placement, 24, period, x), costs).makespan == pytest.approx(12 * 10.5)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 10), data=st.data(), sequential=st.booleans(),
       fbw=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2])),
       comm=st.sampled_from([0.0, 0.1, 0.5]), resolution=st.sampled_from((RESOLUTION, *FINER)))
def test_a_block_repeated_is_valid_and_peaks_within_its_cap(p, data, sequential, fbw, comm, resolution):
    """Any block found, at any resolution, repeated any number of times, is a valid schedule
    (every pass once, on its stage's device, no deadlock) whose simulated peak is within the
    cap it was found for."""
    placement = Placement.sequential(p) if sequential else Placement.v_shape(p)
    base = placement.num_stages // p
    cap = data.draw(st.integers(base, base * p))
    costs = cm.Costs(*fbw, comm)
    got = cyclic_block(placement, quantise(placement, costs, resolution), cap)
    if got is None:
        return
    m = data.draw(st.integers(1, 3 * p))
    s = _block_schedule(placement, m, *got)
    cm.validate(s)
    assert max(cm.simulate(s, costs).peak_memory) <= cap / base + 1e-9


@pytest.mark.parametrize("p,m,costs,limit,before", [
    # v-shape's makespan before the family (main, 2026-12-06), all simulated
    (8, 32, cm.Costs(3, 4, 2), 0.5, 408.5),
    (6, 24, cm.Costs(3, 4, 2), 0.5, 307.0),
    (8, 16, cm.Costs(2, 1, 1), 0.5, 99.5),
])
def test_the_search_gets_shorter_where_memory_binds(p, m, costs, limit, before):
    _shorter_within_budget(p, m, costs, limit, 0.95 * before, "cyclic block")


def _shorter_within_budget(p, m, costs, limit, below, label):
    """``v-shape`` (makespan objective) is shorter than ``below``, within the budget, and its winner's
    label starts with ``label``."""
    s = cm.build("v-shape", p, m, costs=costs, memory_limit=limit, objective="makespan")
    r = cm.simulate(s, costs)
    assert r.makespan < below
    assert max(r.peak_memory) <= limit * p + 1e-9
    assert dict(s.params)["block"].startswith(label)


@pytest.mark.parametrize("costs,exact", [
    (cm.Costs(3, 4, 2), True), (cm.Costs(2, 1, 1), True), (cm.Costs(3, 3, 2, 0.5), True),
    (cm.Costs(4, 5, 3, 0.3), False), (cm.Costs(2, 2.5, 1.5), False), (cm.Costs(3, 4, 2, 0.1), False),
])
def test_finer_slots_only_where_two_slots_miss_the_costs(costs, exact):
    """Costs that two slots per shortest pass represent exactly are searched at that resolution
    only; otherwise the finer resolution nearest the costs is added, and it is nearer them."""
    placement = Placement.v_shape(8)
    got = resolutions(placement, costs)
    assert got[0] == RESOLUTION
    if exact:
        assert got == (RESOLUTION,) and quantisation_error(placement, costs, RESOLUTION) == 0
        return
    assert len(got) == 2 and got[1] in FINER
    err = {r: quantisation_error(placement, costs, r) for r in FINER}
    assert err[got[1]] == min(err.values()) < quantisation_error(placement, costs, RESOLUTION)


def test_quantisation_error_counts_a_hop_rounded_away():
    """4:5:3 with a hop of 0.3: two slots per shortest chunk pass (0.75 each) round the hop to
    nothing, an error of a fifth of the shortest pass; six slots (0.25) come within 0.05."""
    placement, costs = Placement.v_shape(4), cm.Costs(4, 5, 3, 0.3)
    assert quantise(placement, costs)[3] == (0,)
    assert quantisation_error(placement, costs, 2) == pytest.approx(max(0.3 / 1.5, abs(3 * 0.75 - 2) / 2))
    assert quantise(placement, costs, 6) == ((8,) * 8, (10,) * 8, (6,) * 8, (1,))
    assert quantisation_error(placement, costs, 6) == pytest.approx(0.05 / 1.5)


def test_the_finer_family_adds_blocks_only_where_the_coarse_slots_miss():
    """``CyclicFamily(finer=True)`` has nothing where two slots a pass are exact, and otherwise
    blocks laid out at the finer resolution (labelled so), none of them the coarse family's."""
    placement = Placement.v_shape(6)
    exact = Query(placement, 12, cm.Costs(3, 4, 2), 3.0)
    assert list(CyclicFamily(finer=True).sets(exact, Incumbent())) == []
    q = Query(placement, 12, cm.Costs(4, 5, 3, 0.3), 3.0)
    fine = [lab for cs in CyclicFamily(finer=True).sets(q, Incumbent()) for lab in cs.labels]
    coarse = [lab for cs in CyclicFamily().sets(q, Incumbent()) for lab in cs.labels]
    assert fine and coarse
    assert all(f"at resolution {resolutions(placement, q.costs)[1]}" in lab for lab in fine)
    assert not any("at resolution" in lab for lab in coarse)
    from ctrlmem.schedules.recipes import SEQUENTIAL, V_SPLIT
    for recipe in (V_SPLIT, SEQUENTIAL):  # last: every climb starts from what it started from before
        tail = [(f.finer, f.copies) for f in recipe[-3:] if isinstance(f, CyclicFamily)]
        assert tail == [(True, 1), (False, 2), (True, 2)]
        assert not any(isinstance(f, CyclicFamily) and (f.finer or f.copies > 1) for f in recipe[:-3])


@pytest.mark.parametrize("p,m,costs,limit,before", [
    # v-shape's makespan with two slots a pass only (main e565f56, 2026-12-06), all simulated
    (9, 36, cm.Costs(3.13, 3.44, 1.07, 0.7), 0.3, 898.79),
    (12, 48, cm.Costs(1.72, 3.79, 1.21, 0.1), 0.375, 626.64),
])
def test_the_search_gets_shorter_where_two_slots_miss_the_costs(p, m, costs, limit, before):
    s = cm.build("v-shape", p, m, costs=costs, memory_limit=limit, objective="makespan")
    r = cm.simulate(s, costs)
    assert r.makespan < 0.98 * before
    assert max(r.peak_memory) <= limit * p + 1e-9
    assert "at resolution" in dict(s.params)["block"]


def test_the_finer_family_above_p16_searches_every_other_cap_and_stays_monotone():
    """Above p = 16 the finer resolution searches every other cap of the grid, counted down from
    half of 1F1B's memory (a fixed grid per p): a larger budget keeps a smaller one's blocks."""
    placement, costs = Placement.v_shape(20), cm.Costs(4, 5, 3, 0.3)
    fam = CyclicFamily(finer=True)

    def labels(cap):
        return {lab for cs in fam.sets(Query(placement, 40, costs, cap), Incumbent()) for lab in cs.labels}

    small, large = labels(5.0), labels(10.0)  # a quarter and half of 1F1B's memory (p·a = 20)
    assert small and small <= large
    found = {int(lab.rsplit("cap ", 1)[1]) for lab in large}
    assert found <= {20, 16, 12, 8, 4} and 20 in found


def _block_arrays(p, sequential, copies, fbw, comm):
    """The layout kernels' arrays for a random block: stages per microbatch, all stages, the
    quantised pass times and hop, each stage's device, each device's stages and count, the
    activations, and the most work a device has in one period (the shortest period)."""
    placement = Placement.sequential(p) if sequential else Placement.v_shape(p)
    S0 = placement.num_stages
    S = copies * S0
    dF, dB, dW, (comm_slots,) = quantise(placement, cm.Costs(*fbw, comm))
    dF, dB, dW = (ints(list(t) * copies) for t in (dF, dB, dW))
    dev, stages, nst = _arrays(placement, copies)
    act = np.ones(S, dtype=np.int64)
    work = max(int(sum(dF[s] + dB[s] + dW[s] for s in range(S) if dev[s] == d)) for d in range(p))
    return S0, S, dF, dB, dW, comm_slots, dev, stages, nst, act, work


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 8), data=st.data(), sequential=st.booleans(), copies=st.sampled_from([1, 2]),
       fbw=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2])),
       comm=st.sampled_from([0.0, 0.1, 0.5]))
def test_a_layout_stops_early_only_when_it_would_be_rejected(p, data, sequential, copies, fbw, comm):
    """The layout of any delays stops early (returns 2) only where the whole layout's key —
    summed excess of the devices' peaks over the cap, then their sum — exceeds the limit (or a
    pass would find no slots); where it does not stop, it is the whole layout, slot for slot.
    Every device's floor (each ``W`` at its ``B``'s end) is at most its exact peak."""
    S0, S, dF, dB, dW, comm_slots, dev, stages, nst, act, work = _block_arrays(p, sequential, copies, fbw, comm)
    P = data.draw(st.integers(work, 3 * work))
    cap = data.draw(st.integers(1, 2 * copies * p))
    delta = ints(data.draw(st.lists(st.integers(0, P), min_size=S, max_size=S)))

    def layout(limit):
        occ, x, res = np.zeros((p, P), np.int64), np.zeros((3, S), np.int64), np.zeros(2, np.int64)
        return _evaluate(delta, dev, stages, nst, dF, dB, dW, comm_slots, act, cap, P, occ, x, res, S0, limit), x, res

    ok, x, res = layout(-1)
    if ok == 1:
        key = int(res[0]) * (1 << 40) + int(res[1])
        for d in range(p):
            assert _peak_floor(d, stages, nst, x, dB, dW, act, P) <= _peak(d, stages, nst, x, dW, act, P)
        for limit in (key - 1, key, key + 1, max(0, key - (1 << 40)), int(res[1])):
            got, x2, res2 = layout(limit)
            if key > limit:
                assert got == 2
            else:
                assert got == 1 and x2.tolist() == x.tolist() and res2.tolist() == res.tolist()
    else:  # a pass finds no slots: with a limit it fails or stops, never completes
        assert layout(data.draw(st.integers(0, 1 << 42)))[0] in (0, 2)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 8), data=st.data(), sequential=st.booleans(), copies=st.sampled_from([1, 2]),
       fbw=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2])),
       comm=st.sampled_from([0.0, 0.1, 0.5]))
def test_each_device_lays_its_ws_out_in_the_order_of_the_lower_peak(p, data, sequential, copies, fbw, comm):
    """Whatever the delays, each device's ``W`` s are where the order (its stages one way round or
    the other) with the lower exact peak puts them — the first order on a tie — each ``W`` in the
    first free slots after its ``B`` (the layout skips the second order where the first meets the
    device's floor, and does not lay the chosen one out twice: the same slots either way)."""
    S0, S, dF, dB, dW, comm_slots, dev, stages, nst, act, work = _block_arrays(p, sequential, copies, fbw, comm)
    P = data.draw(st.integers(work, 2 * work))  # tight periods, short delays: Ws compete for slots
    delta = ints(data.draw(st.lists(st.integers(0, 4), min_size=S, max_size=S)))
    occ, x, res = np.zeros((p, P), np.uint8), np.zeros((3, S), np.int64), np.zeros(2, np.int64)
    if _evaluate(delta, dev, stages, nst, dF, dB, dW, comm_slots, act, 2 * copies * p, P, occ, x, res, S0, -1) != 1:
        return
    for d in range(p):
        n = int(nst[d])
        n0 = n // copies
        peaks, starts = [], []
        for o in range(2 if n0 == 2 else 1):
            own = np.zeros((p, P), np.uint8)  # device d's forwards and backwards, then its Ws in order o
            for s in (int(t) for t in stages[d, :n]):
                _mark(own, d, int(x[0, s]), int(dF[s]), P, 1)
                _mark(own, d, int(x[1, s]), int(dB[s]), P, 1)
            y = x.copy()
            for jj in range(n):
                s = int(stages[d, (jj % copies) * n0 + (jj // copies if o == 0 else n0 - 1 - jj // copies)])
                y[2, s] = _place(own, d, int(y[1, s] + dB[s]), int(dW[s]), P)
                assert y[2, s] >= 0
                _mark(own, d, int(y[2, s]), int(dW[s]), P, 1)
            peaks.append(_peak(d, stages, nst, y, dW, act, P))
            starts.append([int(y[2, s]) for s in stages[d, :n]])
        best = int(np.argmin(peaks))  # the first of equal peaks
        assert [int(x[2, s]) for s in stages[d, :n]] == starts[best], (d, peaks)
        assert _peak(d, stages, nst, x, dW, act, P) == peaks[best]


def test_skipping_the_restarts_that_failed_before_changes_no_block(monkeypatch):
    """A block search never runs a restart it already ran and saw fail (same period, seed and
    starting delays: the local search is deterministic); without that memory it finds the same
    blocks, with more restarts."""
    cases = [(Placement.v_shape(6), cm.Costs(3, 4, 2, 0.1), 2), (Placement.v_shape(8), cm.Costs(1, 2, 2), 1),
             (Placement.sequential(6), cm.Costs(2, 1, 1, 0.3), 2)]
    runs = [0]
    search = cyclic._search

    def counted(*args):
        runs[0] += 1
        return search(*args)

    def blocks():
        runs[0] = 0
        out = []
        for placement, costs, scale in cases:
            dur = quantise(placement, costs, scale * RESOLUTION)
            base = placement.num_stages // placement.num_devices
            for cap in range(base * 2, base * placement.num_devices // 2 + 1, 2):
                out.append(_one_block(placement, dur, cap, 3000, 5, scale))
        return out, runs[0]

    monkeypatch.setattr(cyclic, "_search", counted)
    with_memory, fewer = blocks()
    fits = cyclic._fits
    monkeypatch.setattr(cyclic, "_fits", lambda *a, failed=None, **k: fits(*a[:9], **k))  # every restart run
    without, more = blocks()
    assert fewer < more and sum(b is not None for b in without) >= 5
    for a, b in zip(with_memory, without, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a[0] == b[0] and a[1].tolist() == b[1].tolist() and a[2].tolist() == b[2].tolist()


def test_deterministic_and_independent_of_the_cache():
    """The same block from a fresh family and from one that already searched other caps and
    costs (fixed seeds; each cap's search starts from nothing)."""
    placement, costs = Placement.v_shape(8), cm.Costs(3, 4, 2, 0.1)
    dur = quantise(placement, costs)
    clear_caches()  # the one-microbatch blocks are shared by the families: start from none
    a = CyclicFamily().block(placement, dur, 8)
    clear_caches()
    warm = CyclicFamily()
    for h in (16, 5, 12):
        warm.block(placement, dur, h)
    warm.block(placement, quantise(placement, cm.Costs(1, 2, 2)), 8)
    b = warm.block(placement, dur, 8)
    assert a[0] == b[0] and a[1].tolist() == b[1].tolist()


def test_monotone_in_the_budget():
    """A larger budget yields every candidate a smaller one yields (the engine's contract)."""
    placement, costs = Placement.v_shape(6), cm.Costs(3, 4, 2)
    fam = CyclicFamily()

    def labels(cap):
        q = Query(placement, 12, costs, cap)
        return {lab for cs in fam.sets(q, Incumbent()) for lab in cs.labels}

    small, large = labels(1.5), labels(3.0)
    assert small and small <= large


def test_fused_and_looped_placements_are_left_to_the_other_families():
    fam = CyclicFamily()
    assert list(fam.sets(Query(Placement.v_shape(4), 8, cm.Costs(1, 1, 1), 2.0, fused=True), Incumbent())) == []
    looped = Placement.interleaved(4, 4)  # four stages a device: more than the W orders it tries
    assert list(fam.sets(Query(looped, 8, cm.Costs(1, 1, 1), 2.0), Incumbent())) == []


def test_block_order_runs_each_pass_once_in_time_order():
    placement = Placement.v_shape(3)
    x = np.array([[0, 2, 4, 6, 8, 10], [24, 20, 18, 16, 14, 12], [26, 22, 21, 19, 15, 13]])
    keys = block_order(placement, 4, 30, x)
    assert keys.shape == (3, 24)
    assert sorted(keys.ravel().tolist()) == list(range(3 * 6 * 4))


# -- blocks of two microbatches -------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 8), data=st.data(), sequential=st.booleans(),
       fbw=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2])),
       comm=st.sampled_from([0.0, 0.1, 0.5]))
def test_a_block_repeated_twice_lays_out_as_itself_and_a_pair_block_is_valid(p, data, sequential, fbw, comm):
    """The one-microbatch block's delays, copied with the second copy one period later, lay out
    (at twice the period) as that block repeated: the same slots shifted by one period, within
    the cap — the start that guarantees a pair block is never worse. A shorter pair block, where
    one is found, repeated any number of times is a valid schedule within the cap."""
    placement = Placement.sequential(p) if sequential else Placement.v_shape(p)
    base = placement.num_stages // p
    S = placement.num_stages
    cap = data.draw(st.integers(base, base * p))
    costs = cm.Costs(*fbw, comm)
    dur = quantise(placement, costs)
    one = _one_block(placement, dur, cap, 3000, 2, 1)
    if one is None:
        return
    P1, x1, d1 = one
    start = np.concatenate([d1, d1])
    start[S] = P1
    got = _fits(placement, dur, cap, 2 * P1, 3000, 0, start, _steps(1), copies=2)
    assert got is not None
    assert got[1][:, :S].tolist() == x1.tolist() and got[1][:, S:].tolist() == (x1 + P1).tolist()
    pair = copies_block(placement, dur, cap, one)
    if pair is None:
        return
    assert pair[0] < 2 * P1 and pair[1].shape == (3, 2 * S)
    m = data.draw(st.integers(1, 3 * p))
    s = _block_schedule(placement, m, *pair)
    cm.validate(s)
    assert max(cm.simulate(s, costs).peak_memory) <= cap / base + 1e-9


@pytest.mark.parametrize("p,m,costs,limit,before", [
    # v-shape's makespan with one-microbatch blocks only (main f68dc7c, 2026-12-06), all simulated;
    # from the low-memory held-out sets (benchmarks/bench_v_shape.py --low-memory) and the gap grid
    (7, 21, cm.Costs(3, 3, 2, 0.5), 0.5, 277.0),
    (20, 40, cm.Costs(3, 3, 2, 0.5), 0.25, 905.0),
    (8, 32, cm.Costs(1, 2, 2), 0.25, 314.0),
])
def test_the_search_gets_shorter_with_blocks_of_two_microbatches(p, m, costs, limit, before):
    _shorter_within_budget(p, m, costs, limit, 0.98 * before, "cyclic block of 2 microbatches")


def test_pair_blocks_stay_monotone_and_stop_above_their_largest_p():
    """Blocks of two microbatches: a larger budget keeps a smaller one's; none above
    ``COPIES_MAX_P`` (at the finer resolution, above ``COPIES_FINER_MAX_P``)."""
    placement, costs = Placement.v_shape(8), cm.Costs(1, 2, 2)
    fam = CyclicFamily(copies=2)

    def labels(cap):
        return {lab for cs in fam.sets(Query(placement, 32, costs, cap), Incumbent()) for lab in cs.labels}

    small, large = labels(2.0), labels(4.0)
    assert small and small <= large
    assert all(lab.startswith("cyclic block of 2 microbatches") for lab in large)
    big = Query(Placement.v_shape(COPIES_MAX_P + 2), 2 * COPIES_MAX_P, cm.Costs(3, 3, 2, 0.5), 4.0)
    assert list(CyclicFamily(copies=2).sets(big, Incumbent())) == []
    finer = Placement.v_shape(COPIES_FINER_MAX_P + 2)
    assert list(CyclicFamily(finer=True, copies=2).sets(Query(finer, 2 * COPIES_FINER_MAX_P + 4, cm.Costs(4, 5, 3, 0.3),
                                                              4.0), Incumbent())) == []


# -- benchmarks/check_block_period.py: the CP-SAT block model the docs' claims about the search use ----


def _block_model():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "check_block_period.py"
    spec = importlib.util.spec_from_file_location("check_block_period", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("p,costs,cap", [(4, (3, 4, 2), 4), (4, (2, 1, 1), 3), (3, (1, 2, 2, 0.5), 3)])
def test_block_model_accepts_the_familys_block_and_refuses_below_the_work(p, costs, cap):
    """The CP-SAT model of one periodic block says the family's own period has a block (it does:
    the family laid one out), and that no period below a device's work has one; so its verdicts
    on the periods between are about the same blocks the family searches."""
    model = _block_model()
    P = Placement.v_shape(p)
    dur = quantise(P, cm.Costs(*costs), RESOLUTION)
    found = cyclic_block(P, dur, cap)
    assert found is not None
    assert model.period_status(P, dur, cap, found[0], 20.0, workers=1) in ("OPTIMAL", "FEASIBLE")
    work = max(sum(dur[0][s] + dur[1][s] + dur[2][s] for s in range(P.num_stages) if P.stage_device[s] == d)
               for d in range(p))
    assert model.period_status(P, dur, cap, work - 1, 20.0, workers=1) == "INFEASIBLE"


def test_block_model_of_two_microbatches_accepts_the_block_repeated_and_refuses_below_twice_the_work():
    """With ``copies=2`` the model holds two chains, each on the devices' slots and in their memory:
    the family's one-microbatch block twice (the second a period later) is a block of two within
    twice its period, and no block of two fits below twice a device's work."""
    model = _block_model()
    P = Placement.v_shape(3)
    dur = quantise(P, cm.Costs(1, 2, 2, 0.5), RESOLUTION)
    found = cyclic_block(P, dur, 3)
    assert found is not None
    assert model.period_status(P, dur, 3, 2 * found[0], 20.0, workers=1, copies=2) in ("OPTIMAL", "FEASIBLE")
    work = max(sum(dur[0][s] + dur[1][s] + dur[2][s] for s in range(P.num_stages) if P.stage_device[s] == d)
               for d in range(3))
    assert model.period_status(P, dur, 3, 2 * work - 1, 20.0, workers=1, copies=2) == "INFEASIBLE"
