"""The search's candidate families (ctrlmem.search.families): the properties that hold whatever
the reference data. Their agreement with the authors' own scheduler outputs is checked in
test_authors_dev.py; the engine that times them in test_search.py."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.search import buildingblock
from ctrlmem.model.ir import Placement
from ctrlmem.search.families import fused, grid, lists, sequential, zbv
from ctrlmem.search.encoding import CandidateSet, problem

UNIT = cm.Costs(1, 1, 1, 0)


def _schedules(cs: CandidateSet):
    return [(cs.labels[i], cs.schedule(i, "x")) for i in range(len(cs))]


@pytest.mark.parametrize("p", [2, 4, 7])
def test_grid_blocks_never_collide(p):
    """Every block keeps its six passes per device on six distinct slots of the interval, each W
    after its own backward's slot, and device i+1 follows device i by the block's offsets."""
    blocks = grid.grid_blocks(p)
    assert blocks
    for (pattern, k0, k1, len0), rows in blocks:
        assert len(rows) == p and rows[0][:4] == list(pattern)
        for i, slots in enumerate(rows):
            assert sorted(slots) == list(range(6)), (pattern, k0, k1, len0, i, slots)
            if i:
                k = k0 if i - 1 < len0 else k1
                prev = rows[i - 1]
                assert slots[0] == (prev[0] + k) % 6 and slots[2] == (prev[2] + k) % 6
                assert slots[1] == (prev[1] - 1) % 6 and slots[3] == (prev[3] - 1) % 6


def test_reduced_families_keep_the_loss_turn_tight():
    """Above p = 16 only patterns whose chunk-1 backward follows the chunk-1 forward on device 0
    (a subset of all 60); above p = 24 a subset of that."""
    full, reduced, narrow = grid.grid_blocks(13), grid.grid_blocks(13, reduced=True), grid.grid_blocks(13, reduced="narrow")
    assert 0 < len(narrow) < len(reduced) < len(full)
    assert all(prm[0][1] < prm[0][2] for prm, _ in reduced)
    assert {prm for prm, _ in narrow} <= {prm for prm, _ in reduced} <= {prm for prm, _ in full}


@pytest.mark.parametrize("p, m", [(3, 3), (4, 8), (4, 20), (6, 9)])
def test_grid_schedules_are_valid_within_their_block_peak(p, m):
    """Every schedule of the family validates, has every pass once, and never peaks above 1F1B's
    memory (the steps do not raise the peak)."""
    got = grid.grid_set(p, m)
    assert len(got)
    for label, s in _schedules(got):
        cm.validate(s)
        r = cm.simulate(s, UNIT)
        assert max(r.peak_memory) <= p, label
        assert s.num_microbatches == m and s.placement.kind == "v-shape"


def test_grid_budget_subsets_grow_with_the_budget():
    """grid_set(p, m, top) for a larger top contains every schedule of a smaller one (what keeps
    the v-shape search monotone)."""
    p, m = 5, 12
    prev: set = set()
    for top in range(2, 2 * p + 1):
        now = {cs.tobytes() for cs in grid.grid_set(p, m, top).keys}
        assert prev <= now
        prev = now
    assert prev == {k.tobytes() for k in grid.grid_set(p, m).keys}


def test_grid_lengthened_stable_phase_equals_running_every_microbatch():
    """For many microbatches the steps run on a shorter pipeline whose stable phase is then
    lengthened; the result is the schedule the steps give on all of them."""
    p, m = 4, 24
    assert grid.short_m(p, m) < m
    short = dict(zip(grid.grid_set(p, m).labels, grid.grid_set(p, m).keys))
    checked = 0
    for params, slots in grid.grid_blocks(p):
        direct = grid.grid_keys(p, m, slots)
        label = f"grid {''.join(map(str, params[0][1:]))} k{params[1]}/{params[2]}x{params[3]}"
        if direct is None or label not in short:
            continue
        assert (short[label] == direct).all(), label
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("p", [4, 6])
def test_grid_family_meets_the_lower_bound_with_equal_costs(p):
    """With F = B = W (m = 4p) the family's best schedule at k half-a meets the bound 6p − 1 − 3k
    of docs/theory.md §6 for every k from p (half of 1F1B's memory) to 2p, except k = 2p − 1,
    where it is one τ above (3 for a bound of 2; as measured for p = 4, 6, 8, 9)."""
    m = 4 * p
    results = [cm.simulate(s, UNIT) for _, s in _schedules(grid.grid_set(p, m))]
    for k in range(p, 2 * p + 1):
        fits = [r for r in results if 2 * max(r.peak_memory) <= k]
        best = min(2 * max(r.device_spans) - 6 * m for r in fits)  # bubble in τ (a chunk pass = 1τ)
        assert best == max(0, 6 * p - 1 - 3 * k) + (k == 2 * p - 1), k


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (5, 13)])
def test_zbv_greedy_zero_bubble_at_1f1b_memory(p, m):
    """The ZB-V greedy with F = B = W and m ≥ 2p: no bubble, peak p·a, valid."""
    f = b = w = [0.5] * (2 * p)
    got = zbv.zbv_variants(p, m, f, b, w, 0.0, 2 * p)
    assert len(got)
    for label, s in _schedules(got):
        cm.validate(s)
        r = cm.simulate(s, UNIT)
        assert max(r.peak_memory) <= p
        if m >= 2 * p:
            assert r.bubble_rate == 0, label


def test_zbv_greedy_with_comm_and_unequal_costs_respects_its_cap():
    """Per-stage costs and comm: valid orders within the cap, or None when the cap cannot hold
    its warm-up."""
    p, m = 4, 10
    costs = cm.Costs([1.5, 1.2, 1.8, 1.5, 1.5, 1.6, 1.2, 1.5], [2, 2, 2.5, 1.8, 2, 2, 2.2, 1.9], [1, 1, 0.8, 1, 1.1, 1, 1, 0.9], 0.3)
    f, b, w = costs.stage_times(2 * p, p)
    for cap in (p + 2, 2 * p - 1, 2 * p, 3 * p):
        keys = zbv.zbv_keys(p, m, f, b, w, float(costs.comm), cap)
        if keys is None:
            continue
        s = CandidateSet(Placement.v_shape(p), m, False, keys[None], ("z",)).schedule(0, "z")
        cm.validate(s)
        assert 2 * max(cm.simulate(s, costs).peak_memory) <= cap
    assert zbv.zbv_keys(p, m, f, b, w, float(costs.comm), 1) is None
    assert zbv.zbv_keys(p, m, f, b, w, float(costs.comm), 2 * p) is not None


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 9])
def test_fused_construction_valid_and_as_good_as_the_block_pipeline(p):
    """The 1F1B-V construction gives a complete, deadlock-free fused schedule for any m, at the
    peak of the block's own pipeline and with no more bubble than it (equal costs)."""
    U = cm.Costs(2, 2, 2, 0)
    for m in (1, 2, p, 2 * p + 1, 4 * p):
        keys = fused.construction_keys(p, m)
        assert keys is not None, (p, m)
        cs = CandidateSet(Placement.v_shape(p), m, True, keys[None], ("c",))
        assert problem(cs, 0) is None
        s = cs.schedule(0, "c")
        cm.validate(s)
        r = cm.simulate(s, U)
        other = cm.simulate(cm.build_from_block(buildingblock.v_1f1b_block(p), m), U)
        assert max(r.peak_memory) == max(other.peak_memory), (p, m)
        if m >= 2 * p:
            assert max(r.device_spans) <= max(other.device_spans), (p, m)


def test_fused_block_residues_are_a_collision_free_block():
    """The 1F1B-V block puts every device's F, f and both fused backwards (two slots each) on
    six distinct residues modulo 6."""
    for p in range(2, 40):
        res = fused.block_residues(p)
        assert all(sorted(row) == list(range(6)) for row in res.tolist()), p


@pytest.mark.parametrize("p, m", [(2, 3), (4, 8), (5, 11)])
def test_zb_round_heuristic_valid_within_its_cap(p, m):
    """The Zero Bubble heuristic's eight variants give valid schedules within the cap, or None
    when the cap cannot be kept (below one microbatch per device)."""
    costs = cm.Costs(3, 4, 2, 0.1)
    f, b, w = costs.stage_times(p, p)
    for cap in (1, 2, p, 2 * p):
        for variant in sequential.ROUND_VARIANTS:
            keys = sequential.zb_rounds(p, m, f, b, w, 0.1, cap, *variant)
            if keys is None:
                continue
            s = CandidateSet(Placement.sequential(p), m, False, keys[None], ("r",)).schedule(0, "r")
            cm.validate(s)
            assert max(cm.simulate(s, costs).peak_memory) <= cap, (cap, variant)


def test_list_caps_contain_every_whole_activation_budget():
    """The list family's cap grid holds every whole number of activations (so budgets such as
    0.5 or 0.75 of 1F1B are never rounded down to a coarser cap), the same for every budget."""
    for p in (4, 12, 16, 20, 32):
        base = 2
        for top in range(base, 4 * p + 1):
            got = lists.caps(p, top, base)
            assert set(range(base, min(top, base * p) + 1, base)) <= set(got), (p, top)
            assert got == [c for c in lists.caps(p, 4 * p, base) if c <= top]
        if p != 20:  # common budgets above 1F1B's memory, where they are whole steps of the grid
            for frac in (1.25, 1.5, 2.0):
                assert int(frac * base * p) in lists.caps(p, 4 * p, base), (p, frac)


@pytest.mark.parametrize("p,m,costs,budget", [(4, 8, (3, 4, 2, 0.1), 0.5), (4, 16, (3, 4, 2, 0), 0.5),
                                              (3, 6, (1, 2, 2, 0), 0.75)])
def test_polish_starts_from_every_familys_best(p, m, costs, budget):
    """The hill-climb of the polish family starts from the best of each family alone, not only
    from the best of all: a better start can climb to a worse end (at p = 4, m = 8, 3:4:2:0.1,
    budget 0.5 the fill-ahead family's best climbed to 108 where the grid's climbs to 106), so the
    search is never above any family's polished best."""
    from ctrlmem.schedules.recipes import _BASE
    from ctrlmem.search.families.polish import polish_keys
    from ctrlmem.search.engine import Query, search, timed

    costs = cm.Costs(*costs)
    got = max(cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=budget), costs).device_spans)
    for h in lists.caps(p, int(budget * 2 * p + 1e-9), 2):
        q = Query(Placement.v_shape(p), m, costs, h / 2, False)
        for fam in _BASE:
            found = search(q, [fam])
            if found is None:
                continue
            polished = polish_keys(found.cs, found.index, costs, h / 2)
            span = found.span if polished is None else float(timed(polished, costs).span[0])
            assert got <= span + 1e-9, (fam.name, h)
