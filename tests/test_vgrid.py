"""The v-shape search's App. A grid family (ctrlmem.schedules.vgrid) and cost-aware ZB-V greedy
(ctrlmem.schedules.vgreedy). Their agreement with the authors' own scheduler outputs is checked
in test_authors_dev.py; here the properties that hold whatever the data."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.ir import Placement, Schedule
from ctrlmem.schedules import vgrid
from ctrlmem.schedules.vgreedy import zbv_orders, zbv_variants

UNIT = cm.Costs(1, 1, 1, 0)


@pytest.mark.parametrize("p", [2, 4, 7])
def test_grid_blocks_never_collide(p):
    """Every block keeps its six passes per device on six distinct slots of the interval, each W
    after its own backward's slot, and device i+1 follows device i by the block's offsets."""
    blocks = vgrid.grid_blocks(p)
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


def test_reduced_family_keeps_the_loss_turn_tight():
    """For p > 12 only patterns whose chunk-1 backward follows the chunk-1 forward on device 0."""
    full, reduced = vgrid.grid_blocks(13), vgrid.grid_blocks(13, reduced=True)
    assert 0 < len(reduced) < len(full)
    assert all(prm[0][1] < prm[0][2] for prm, _ in reduced)
    assert {prm for prm, _ in reduced} <= {prm for prm, _ in full}


@pytest.mark.parametrize("p, m", [(3, 3), (4, 8), (4, 20), (6, 9)])
def test_grid_schedules_are_valid_within_their_block_peak(p, m):
    """Every schedule of the family validates, has every pass once, and never peaks above its
    block's repeated grid (the steps do not raise the peak) nor above 1F1B's memory."""
    got = vgrid.grid_schedules(p, m)
    assert got
    for label, s in got:
        cm.validate(s)
        r = cm.simulate(s, UNIT)
        assert max(r.peak_memory) <= p, label
        assert s.num_microbatches == m and s.placement.kind == "v-shape"


def test_budget_subsets_grow_with_the_budget():
    """grid_schedules(p, m, top) for a larger top contains every schedule of a smaller one (what
    keeps the v-shape search monotone)."""
    p, m = 5, 12
    prev: set = set()
    for top in range(2, 2 * p + 1):
        now = {s.device_passes for _, s in vgrid.grid_schedules(p, m, top)}
        assert prev <= now
        prev = now
    assert prev == {s.device_passes for _, s in vgrid.grid_schedules(p, m)}


def test_lengthened_stable_phase_equals_running_every_microbatch():
    """For many microbatches the steps run on a shorter pipeline whose stable phase is then
    lengthened; the result is the schedule the steps give on all of them."""
    p, m = 4, 24
    assert vgrid._short(p, m) < m
    short = {label: s for label, s in vgrid.grid_schedules(p, m)}
    checked = 0
    for (pattern, k0, k1, len0), slots in vgrid.grid_blocks(p):
        direct = vgrid.grid_schedule(p, m, slots)
        label = f"grid {''.join(map(str, pattern[1:]))} k{k0}/{k1}x{len0}"
        if direct is None or label not in short:
            continue
        assert short[label].device_passes == direct.device_passes, label
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("p", [4, 6])
def test_grid_family_meets_the_lower_bound_with_equal_costs(p):
    """With F = B = W (m = 4p) the family's best schedule at k half-a meets the bound 6p − 1 − 3k
    of docs/theory.md §6 for every k from p (half of 1F1B's memory) to 2p, except k = 2p − 1,
    where it is one τ above (3 for a bound of 2; as measured for p = 4, 6, 8, 9)."""
    m = 4 * p
    results = [cm.simulate(s, UNIT) for _, s in vgrid.grid_schedules(p, m)]
    for k in range(p, 2 * p + 1):
        fits = [r for r in results if 2 * max(r.peak_memory) <= k]
        best = min(2 * max(r.device_spans) - 6 * m for r in fits)  # bubble in τ (a chunk pass = 1τ)
        assert best == max(0, 6 * p - 1 - 3 * k) + (k == 2 * p - 1), k


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (5, 13)])
def test_zbv_greedy_zero_bubble_at_1f1b_memory(p, m):
    """The ZB-V greedy with F = B = W and m ≥ 2p: no bubble, peak p·a, valid."""
    f = b = w = [0.5] * (2 * p)
    for label, orders in zbv_variants(p, m, f, b, w, 0.0, 2 * p):
        s = Schedule.from_orders("v-shape", Placement.v_shape(p), m, orders)
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
        orders = zbv_orders(p, m, f, b, w, float(costs.comm), cap)
        if orders is None:
            continue
        r = cm.simulate(Schedule.from_orders("v-shape", Placement.v_shape(p), m, orders), costs)
        assert 2 * max(r.peak_memory) <= cap
    assert zbv_orders(p, m, f, b, w, float(costs.comm), 1) is None
    assert zbv_orders(p, m, f, b, w, float(costs.comm), 2 * p) is not None
