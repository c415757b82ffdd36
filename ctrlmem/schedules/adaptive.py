"""Memory-budgeted schedules: the adaptive V-shape search ``v-shape`` (docs/theory.md §10, App. A/B)
and the Zero Bubble paper's memory-limited automatic scheduler ``zb`` (ZB-1P / ZB-2P,
docs/theory.md §8, §6).

``memory_limit`` is a fraction of 1F1B's peak activation ``p·a`` throughout: 1.0 is 1F1B's
memory, 0.5 half of it, 2.0 twice it. Both generators take ``costs`` and return, among the
schedules they consider, the one with the shortest longest device span (the basis of the paper's
bubble rate; ties go to the shorter makespan, then the lower peak) whose simulated peak (default
:class:`~ctrlmem.costs.MemoryModel`) is within the limit. Every candidate is simulated with
:func:`ctrlmem.simulate` under the given costs (per-stage lists and ``comm`` included).

Five families make up the search, so that it is right at any budget and for any costs:

* **the paper's App. A framework** (:mod:`ctrlmem.schedules.vgrid`): unit-slot V blocks from a
  device-0 pattern and two offset levels, repeated, warm-up and cool-down rewritten under the
  peak, idle slots filled; cost-independent orders, cached per (p, m). It reproduces the
  authors' adaptive scheduler and meets the lower bound of docs/theory.md §6 with F = B = W.
  Searched for ``p <= 24`` (all 60 device-0 patterns up to p = 12, the 8 of a survey above);
  beyond, building and timing it would take most of the search's time;
* **the cost-aware ZB-V greedy** (:mod:`ctrlmem.schedules.vgreedy`) at 1F1B's memory;
* **building blocks** (:mod:`ctrlmem.blocks`): the V-Min, V-Half and V-ZB blocks, ZB-V, and (for
  ``p <= 12``) blocks whose device links mix two offset levels (δ0, δ1) — the first ``j`` links
  at one level, the rest at the other — for neighbouring levels among (1,1), (2,1), (3,1), (4,2);
* **blocks laid out in the costs' own slots** (:func:`ctrlmem.blocks.v_cost_block`);
* **cost-aware list schedules** (:mod:`ctrlmem.schedules.listsched`): the pipeline run pass by
  pass under the real costs and a per-device activation cap, for every cap in half-a steps from
  one microbatch (``a``, the smallest feasible budget: ``1/p``) up to the budget, under a few
  tie-breaking policies. They fill the budgets above 1F1B's (extra warm-up, up to 2× and
  beyond) and the costs the unit-slot blocks do not suit.

The candidates of a budget are those of every smaller budget plus the list schedules of its own
cap (and the grid blocks that fit it), so the result never gets slower as the budget grows (the
search is monotone by construction). For ``p > 12`` the caps are taken on a grid (every
``⌈p/12⌉``-th half-a step, twice as coarse above 1F1B's memory; the same grid for every budget,
so monotonicity holds) to keep the search within seconds. Every candidate's index and peak are
computed once (they do not depend on the costs); timing it under the costs is then one
as-soon-as-possible run.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from ..blocks import (
    BuildingBlock,
    _short_pipeline,
    build_from_block,
    extend_stable,
    slot_lengths,
    v_cost_block,
    v_half_block,
    v_min_block,
    v_shape_block,
    v_zb_block,
)
from ..costs import Costs, MemoryModel
from ..ir import Op, Pass, Placement, Schedule
from ..simulate import _clean, pass_durations, simulate
from ..validate import ScheduleError, ScheduleIndex, execute, index_schedule, validate
from .listsched import POLICIES, list_schedule
from .vgreedy import zbv_variants
from .vgrid import clear_cache as clear_grid
from .vgrid import grid_schedules
from .registry import register
from .zero_bubble import zb_h1, zb_h2, zb_v

__all__ = [
    "v_shape", "VShapeCandidate", "v_shape_candidates", "zb", "min_v_shape_limit", "best_v_shape",
    "best_fused_v",
]

log = logging.getLogger(__name__)

_EPS = 1e-9

# Offset levels (delta0, delta1) of docs/theory.md §4 and the pairs of levels whose mixes the block
# family contains: (wide, narrow, wide links first?).
_MIXES = (
    ((2, 1), (1, 1), True), ((2, 1), (1, 1), False),
    ((3, 1), (2, 1), True), ((3, 1), (2, 1), False),
    ((4, 2), (2, 1), True), ((4, 2), (3, 1), True),
)


@dataclass(frozen=True)
class VShapeCandidate:
    """One schedule the search considered, simulated.

    Attributes:
        label: how it was built, e.g. ``"v-half"``, ``"mix (2, 1)x5+(1, 1)x2"`` (the offsets
            of the device links 0→1, 1→2, ... in order) or ``"list cap 2.5a ready/high/lazy"``.
        schedule: the schedule.
        makespan: simulated makespan under the search's costs.
        peak: simulated peak over devices, in units of ``a``.
        bubble_rate: simulated bubble rate.
        max_span: the longest device span.
    """

    label: str
    schedule: Schedule
    makespan: float
    peak: float
    bubble_rate: float
    max_span: float

    @property
    def memory_fraction(self) -> float:
        """Peak as a fraction of 1F1B's ``p·a``."""
        return self.peak / self.schedule.num_devices

    def _replace_label(self, label: str) -> "VShapeCandidate":
        return VShapeCandidate(label, self.schedule, self.makespan, self.peak, self.bubble_rate, self.max_span)

    @property
    def key(self) -> tuple[float, float, float]:
        """What the search minimises: longest span, then makespan, then peak."""
        return (self.max_span, self.makespan, self.peak)


def _candidate(label: str, sched: Schedule, costs: Costs) -> VShapeCandidate:
    return _score(_prepare(label, sched), costs)


@dataclass(frozen=True)
class _Prepared:
    """A schedule with what does not depend on the costs: its index and its peak (a device runs
    its passes one after another, so its memory curve follows its order whatever the costs)."""

    label: str
    schedule: Schedule
    index: ScheduleIndex
    peak: float


def _prepare(label: str, sched: Schedule) -> _Prepared:
    idx = index_schedule(sched)
    S, m = sched.num_stages, sched.num_microbatches
    act = MemoryModel().stage_activation(S, sched.num_devices)
    sm = S * m
    fused = idx.fused
    peak = 0.0
    for keys in idx.device_keys:  # F allocates, W (or a fused BW) releases; B releases nothing
        level = top = 0.0
        for key in keys:
            kind, r = divmod(key, sm)
            if kind == 0:
                level += act[r // m]
                if level > top:
                    top = level
            elif kind == 2 or fused[r]:
                level -= act[r // m]
        peak = max(peak, _clean(top))
    return _Prepared(label, sched, idx, peak)


def _score(prep: _Prepared, costs: Costs) -> VShapeCandidate:
    """``prep`` timed under ``costs`` (the simulator's ASAP execution; same numbers as
    :func:`ctrlmem.simulate`, without recomputing what does not depend on the costs)."""
    s, idx = prep.schedule, prep.index
    S, m, p = s.num_stages, s.num_microbatches, s.num_devices
    f, b, w = costs.stage_times(S, p)
    durations = pass_durations(idx, f, b, w)
    start, end = execute(s, idx, durations, float(costs.comm))
    spans, work, makespan = [], [], 0.0
    for d, keys in enumerate(idx.device_keys):
        if not keys:
            spans.append(0.0)
            work.append(0.0)
            continue
        last = end[keys[-1]]
        makespan = max(makespan, last)
        spans.append(_clean(last - start[keys[0]]))
        work.append(_clean(math.fsum(m * (f[st] + b[st] + w[st]) for st in s.placement.stages_of(d))))
    max_span = max(spans)
    rate = max(0.0, _clean(1.0 - max(work) / max_span)) if max_span > 0 else 0.0
    return VShapeCandidate(prep.label, s, _clean(makespan), prep.peak, rate, max_span)


def _mixed_block(p: int, first: tuple[int, int], second: tuple[int, int], j: int) -> BuildingBlock:
    d0 = [first[0]] * j + [second[0]] * (p - 1 - j)
    d1 = [first[1]] * j + [second[1]] * (p - 1 - j)
    return v_shape_block(p, d0, d1, name="v-shape")


def _family(p: int) -> list[tuple[str, object]]:
    """The block family: the V-Min, V-Half and V-ZB blocks, ZB-V, and (for ``p <= 12``) for each
    pair of offset levels the blocks whose first ``j`` device links use one level and the rest
    the other (``j = 1 .. p−2``). Above ``p = 12`` the mixes are left to the App. A grid family
    (:mod:`ctrlmem.schedules.vgrid`), which covers the same offset levels with every turn
    pattern: on a survey at p = 8 (7 cost mixes, every budget up to 2.0) the mixes were the
    only best candidate in 5 of 434 cases, by at most 1.3 %, and they take seconds to build at
    p = 16."""
    fam: list[tuple[str, object]] = [
        ("v-min", v_min_block(p)),
        ("v-half", v_half_block(p)),
        ("v-zb", v_zb_block(p)),
        ("zb-v", None),
    ]
    if p > 12:
        return fam
    for wide, narrow, wide_first in _MIXES:
        first, second = (wide, narrow) if wide_first else (narrow, wide)
        for j in range(1, p - 1):
            fam.append((f"mix {first}x{j}+{second}x{p - 1 - j}", (first, second, j)))
    return fam


@lru_cache(maxsize=16)
def _block_schedules(p: int, m: int) -> tuple[tuple[str, Schedule], ...]:
    """The block family's schedules (their orders do not depend on the costs: cached apart)."""
    out = []
    for label, spec in _family(p):
        if spec is None:
            sched = zb_v(p, m)
        elif isinstance(spec, BuildingBlock):
            sched = build_from_block(spec, m, spec.name)
        else:
            try:
                sched = build_from_block(_mixed_block(p, *spec), m, "v-shape")
            except ValueError:  # no collision-free block for this mix
                continue
        out.append((label, sched))
    return tuple(out)


@lru_cache(maxsize=16)
def _block_prepared(p: int, m: int) -> tuple[_Prepared, ...]:
    return tuple(_prepare(label, sched) for label, sched in _block_schedules(p, m))


@lru_cache(maxsize=64)
def _blocks(p: int, m: int, costs: Costs) -> tuple[VShapeCandidate, ...]:
    return tuple(_score(prep, costs) for prep in _block_prepared(p, m))


# (p, m, label) -> prepared (None when it deadlocks) and (p, m, label, costs) -> timed: each grid
# schedule (cached in vgrid, its label unique for its p and m) prepared once and timed once per costs,
# whatever the budget
_GRID_PREPARED: dict[tuple[int, int, str], _Prepared | None] = {}
_GRID_SCORED: dict[tuple[int, int, str, Costs], VShapeCandidate] = {}


@lru_cache(maxsize=256)
def _grid(p: int, m: int, costs: Costs, top: int) -> tuple[VShapeCandidate, ...]:
    """The App. A framework's schedules (:mod:`ctrlmem.schedules.vgrid`) from blocks peaking at
    most ``top`` half-a, timed under ``costs``."""
    out = []
    for label, sched in grid_schedules(p, m, top):
        key = (p, m, label)
        if key not in _GRID_PREPARED:
            if len(_GRID_PREPARED) > 4096:
                _GRID_PREPARED.clear()
            try:
                _GRID_PREPARED[key] = _prepare(label, sched)
            except ScheduleError:  # not a complete schedule: never again
                _GRID_PREPARED[key] = None
        prep = _GRID_PREPARED[key]
        if prep is None:
            continue
        got = _GRID_SCORED.get(key + (costs,))
        if got is None:
            try:
                got = _score(prep, costs)
            except ScheduleError:  # deadlocks (whatever the costs): never again
                _GRID_PREPARED[key] = None
                continue
            if len(_GRID_SCORED) > 8192:
                _GRID_SCORED.clear()
            _GRID_SCORED[key + (costs,)] = got
        out.append(got)
    return tuple(out)


# The grid family is searched up to this many devices: at p = 32, m = 256 building and timing its
# ~130 schedules takes about 30 s of the 60 s the whole search may take (the other families stay).
_GRID_MAX_P = 24


def _grid_top(p: int, limit: float) -> int:
    return min(2 * p, math.floor(2 * p * limit + _EPS))


def _mix_js(p: int, most: int) -> list[int]:
    """Split points ``j`` (links before it use one setting, the rest the other): all of
    ``1 .. p−2``, or about ``most`` of them spread evenly."""
    js = list(range(1, p - 1))
    if len(js) > most:
        step = math.ceil(len(js) / (most - 1))
        js = sorted(set(js[::step]) | {js[-1]})
    return js


def _cost_lengths(p: int, costs: Costs) -> list[tuple[int, int, int, int]]:
    """The costs' chunk pass times (mean over stages) as slots, at 1, 2 and 3 slots for the
    shortest pass (distinct ratios only; at most 48 slots per interval)."""
    f, b, w = costs.stage_times(2 * p, p)
    fa, ba, wa = (math.fsum(x) / len(x) for x in (f, b, w))
    out: list[tuple[int, int, int, int]] = []
    for r in (1, 2, 3):
        ln = slot_lengths(fa, ba, wa, float(costs.comm), r)
        if 2 * sum(ln[:3]) > 48:
            break
        g = math.gcd(*ln)
        if tuple(x // g for x in ln) not in {tuple(x // math.gcd(*o) for x in o) for o in out}:
            out.append(ln)
    return out


@lru_cache(maxsize=512)
def _cost_block_schedule(p: int, m: int, lengths: tuple, gap0: tuple, gap1: tuple,
                         reorder: bool = True) -> tuple[tuple[str, _Prepared], ...]:
    """The schedules of one cost-aware block (cost-independent once quantised: cached): the
    block repeated as it is (its own W slots, squeezed by the simulator), and, for one-slot W,
    the block through the whole pipeline (place W, reorder, squeeze). Empty when it collides."""
    try:
        block = v_cost_block(p, lengths, gap0, gap1)
    except ValueError:  # no collision-free block with these gaps
        return ()
    short = _short_pipeline(block, m)
    if short < m:  # the repeated block is periodic after its first copies: repeat a few, lengthen
        try:
            rep = extend_stable(block.repeat(short).to_schedule("v-shape"), m)
        except ValueError:
            rep = block.repeat(m).to_schedule("v-shape")
    else:
        rep = block.repeat(m).to_schedule("v-shape")
    out = [("repeat", rep)]
    if lengths[2] == 1 and reorder:  # the reorder rounds of ctrlmem.blocks assume one-slot W
        try:
            full = build_from_block(block, m, "v-shape", direct_fallback=False)
            validate(full)  # the reorder rounds assume one-slot W; keep the result only when valid
            out.append(("reorder", full))
        except (ValueError, ScheduleError):
            pass
    return tuple((how, _prepare(how, sched)) for how, sched in out)


@lru_cache(maxsize=64)
def _cost_blocks(p: int, m: int, costs: Costs) -> tuple[VShapeCandidate, ...]:
    """Cost-aware blocks (:func:`ctrlmem.blocks.v_cost_block`): for each slot quantisation of
    the costs, uniform gaps (g0, g1) along the links, then, between each two neighbouring peak
    levels the uniform blocks reach, blocks whose first ``j`` links use one level's gaps and
    the rest the other's (stepping the peak between the levels)."""
    out: list[VShapeCandidate] = []
    big = p > 16

    def add(ln, g0, g1, label, reorder=True) -> list[VShapeCandidate]:
        got = [_score(prep, costs)._replace_label(f"cost {':'.join(map(str, ln))} gaps {label} {how}")
               for how, prep in _cost_block_schedule(p, m, ln, g0, g1, reorder)]
        out.extend(got)
        return got

    for ln in _cost_lengths(p, costs)[: 1 if p > 12 else 3]:
        fl, bl, wl, cl = ln
        r = min(fl, bl, wl)
        uniform: dict[float, tuple[VShapeCandidate, tuple[int, int]]] = {}
        for a in range(0, 2 * max(fl, bl) + 1, r):
            for b in range(0, max(fl, bl) + 1, r):
                for c in add(ln, (a,) * (p - 1), (b,) * (p - 1), f"({a}, {b})"):
                    if c.peak not in uniform or c.key < uniform[c.peak][0].key:
                        uniform[c.peak] = (c, (a, b))
        levels = [uniform[k][1] for k in sorted(uniform)]
        for lo, hi in zip(levels, levels[1:]):
            for first, second in ((hi, lo),) if big else ((hi, lo), (lo, hi)):
                for j in _mix_js(p, 5 if big else 12):
                    g0 = (first[0],) * j + (second[0],) * (p - 1 - j)
                    g1 = (first[1],) * j + (second[1],) * (p - 1 - j)
                    add(ln, g0, g1, f"{first}x{j}+{second}x{p - 1 - j}", reorder=p <= 12)
    return tuple(out)


@lru_cache(maxsize=64)
def _zbv(p: int, m: int, costs: Costs) -> tuple[VShapeCandidate, ...]:
    """The cost-aware ZB-V heuristic (:mod:`ctrlmem.schedules.vgreedy`) at 1F1B's memory."""
    f, b, w = costs.stage_times(2 * p, p)
    placement = Placement.v_shape(p)
    return tuple(_candidate(label, Schedule.from_orders("v-shape", placement, m, orders), costs)
                 for label, orders in zbv_variants(p, m, f, b, w, float(costs.comm), 2 * p))


def _cap_grid(p: int) -> int:
    """Step, in half-a, between the caps the list scheduler tries (1 for p <= 12)."""
    return max(1, math.ceil(p / 12))


def _policies(p: int) -> tuple[tuple[str, str, str], ...]:
    return POLICIES if p <= 12 else POLICIES[:3]


_LISTED: dict[tuple, tuple] = {}


def _listed_raw(p: int, m: int, costs: Costs, half: int, fused: bool) -> tuple[tuple[tuple, VShapeCandidate | None, bool], ...]:
    """Per policy: (policy, candidate or None when the next smaller cap of the grid already gave
    the same orders, capped?) for list schedules on the V-shape placement with ``half`` half-a.
    Cached (at most 512 entries); the skip applies when the smaller cap was computed first."""
    key = (p, m, costs, half, fused)
    if key in _LISTED:
        return _LISTED[key]
    placement = Placement.v_shape(p)
    f, b, w = costs.stage_times(2 * p, p)
    act = MemoryModel().stage_activation(2 * p, p)
    levels = _half_levels(p, half / (2 * p))
    below = levels[-2] if len(levels) > 1 else 0
    prev = {pol: capped for pol, _, capped in _LISTED.get((p, m, costs, below, fused), ())}
    out = []
    pols = (POLICIES[0], POLICIES[2]) if fused else _policies(p)
    for pol in pols:
        if prev.get(pol) is False:  # the cap did not bind one step below: same orders
            out.append((pol, None, False))
            continue
        res = list_schedule(placement, m, f, b, w, float(costs.comm), act, half / 2, fused=fused, policy=pol)
        if res is None:
            continue
        sched = Schedule.from_orders("1f1b-v" if fused else "v-shape", placement, m, res.orders)
        out.append((pol, _candidate(f"list cap {half / 2:g}a {'/'.join(pol)}", sched, costs), res.capped))
    if len(_LISTED) >= 512:
        _LISTED.clear()
    _POLISHED.clear()
    _LISTED[key] = tuple(out)
    return _LISTED[key]


def _listed(p: int, m: int, costs: Costs, half: int, fused: bool) -> list[VShapeCandidate]:
    return [c for _, c, _ in _listed_raw(p, m, costs, half, fused) if c is not None]


def _half_levels(p: int, limit: float) -> list[int]:
    """The caps (in half-a) the list scheduler tries for ``limit``: the grid from 2 (one
    microbatch, ``a``) up to ``⌊2p·limit⌋``."""
    top = math.floor(2 * p * limit + _EPS)
    step = _cap_grid(p)
    # above 1F1B's memory (2p half-a) the grid is twice as coarse
    return [h for h in range(2, top + 1) if (h - 2) % (step if h <= 2 * p else 2 * step) == 0]


def v_shape_candidates(
    num_devices: int, num_microbatches: int, costs: Costs | None = None, memory_limit: float = 1.0,
    fused: bool = False,
) -> list[VShapeCandidate]:
    """Every schedule the ``v-shape`` search considers for ``memory_limit``, simulated under
    ``costs`` (cached): the block family (all of it, whatever its peak), the list schedules of
    every cap up to the limit, and, for small pipelines (``p·m <= 64``), at each cap up to 1F1B's
    memory the best schedule so far polished by neighbour swaps under that cap (:func:`polish`).
    ``fused=True``: the fused-backward list schedules (``1f1b-v``)."""
    _check_v(num_devices, num_microbatches)
    p, m = num_devices, num_microbatches
    costs = costs if costs is not None else Costs()
    out = [] if fused else (list(_blocks(p, m, costs)) + list(_cost_blocks(p, m, costs)))
    if not fused and p <= _GRID_MAX_P:
        out.extend(_grid(p, m, costs, _grid_top(p, memory_limit)))
    polish_here = not fused and p * m <= _POLISH_MAX_PM
    if not fused and memory_limit >= 1.0 - _EPS:
        out.extend(_zbv(p, m, costs))
    for h in _half_levels(p, memory_limit):
        out.extend(_listed(p, m, costs, h, fused))
        if polish_here and h <= 2 * p:  # small pipelines, budgets up to 1F1B's: polish per cap
            best = _polished(p, m, costs, h, out)
            if best is not None:
                out.append(best)
    return out


_POLISH_MAX_PM = 64  # polish instances with p·m up to this (a few hundred passes)
_POLISH_EVALS = 800  # simulations per polished cap
_POLISHED: dict[tuple, VShapeCandidate | None] = {}


def polish(cand: VShapeCandidate, costs: Costs, cap: float, max_evals: int = _POLISH_EVALS) -> VShapeCandidate:
    """Hill-climb ``cand`` by swapping neighbouring passes of a device (the paper's reordering,
    App. C, with real costs): a swap is kept when the simulated schedule is valid, its peak stays
    within ``cap`` (in ``a``) and it shortens (longest span, makespan, sum of spans); at most
    ``max_evals`` simulations. Returns the improved candidate (``cand`` itself if none)."""
    s = cand.schedule
    orders = [list(o) for o in s.device_passes]

    def score(r):
        return (max(r.device_spans), r.makespan, math.fsum(r.device_spans))

    best = simulate(s, costs)
    best_key = score(best)
    best_sched = s
    evals, improved = 0, True
    while improved and evals < max_evals:
        improved = False
        for o in orders:
            for i in range(len(o) - 1):
                a, b = o[i], o[i + 1]
                if (a.stage == b.stage and (a.microbatch == b.microbatch or a.op is b.op)) or evals >= max_evals:
                    continue  # a pass and its own input, or a relabelling of identical microbatches
                o[i], o[i + 1] = b, a
                evals += 1
                trial = Schedule(s.name, s.num_devices, s.num_microbatches, s.placement,
                                 tuple(tuple(x) for x in orders), s.params)
                try:
                    r = simulate(trial, costs)
                except ScheduleError:
                    r = None
                if r is not None and max(r.peak_memory) <= cap + _EPS and score(r) < best_key:
                    best, best_key, best_sched, improved = r, score(r), trial, True
                else:
                    o[i], o[i + 1] = a, b
    if best_sched is s:
        return cand
    return VShapeCandidate(cand.label + " polished", best_sched, best.makespan, max(best.peak_memory),
                           best.bubble_rate, max(best.device_spans))


def _polished(p: int, m: int, costs: Costs, half: int, pool: list[VShapeCandidate]) -> VShapeCandidate | None:
    """The best of ``pool`` within ``half`` half-a, polished under that cap (cached per cap)."""
    key = (p, m, costs, half)
    if key not in _POLISHED:
        fits = [c for c in pool if c.peak <= half / 2 + _EPS]
        _POLISHED[key] = polish(min(fits, key=lambda c: c.key), costs, half / 2) if fits else None
        if len(_POLISHED) > 512:
            _POLISHED.pop(next(iter(_POLISHED)))
    return _POLISHED[key]


def min_v_shape_limit(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> float:
    """The smallest memory limit (fraction of 1F1B's peak) the ``v-shape`` search meets: one
    microbatch's activation per device, ``a``, so ``1/p``."""
    _check_v(num_devices, num_microbatches)
    return 1.0 / num_devices


def _check_v(p: int, m: int) -> None:
    if p < 2:
        raise ValueError(
            f"v-shape needs num_devices >= 2: the V-shape puts stages i and 2p-1-i on device i, so "
            f"with p={p} there is no pipeline to trade memory against bubbles; use '1f1b' with num_devices=1"
        )
    if m < 2:
        raise ValueError(
            f"v-shape needs num_microbatches >= 2 (got {m}): with one microbatch every schedule is the "
            "same chain of passes and there is no memory to trade; use 'v-min' for m=1, or any m >= 2 "
            "(the exact-values table closed forms hold for m >= 2p)"
        )


def best_v_shape(p: int, m: int, costs: Costs, limit: float, first: VShapeCandidate | None = None) -> VShapeCandidate:
    """The best candidate of the ``v-shape`` search within ``limit`` (``first``, if given, wins
    ties: a fixed pattern stays unless something is strictly better)."""
    cands = ([first] if first is not None else []) + v_shape_candidates(p, m, costs, limit)
    return _pick(cands, p, m, limit)


def _pick(cands: list[VShapeCandidate], p: int, m: int, limit: float) -> VShapeCandidate:
    fits = [c for c in cands if c.peak <= limit * p + _EPS]
    if not fits:
        raise ValueError(
            f"memory_limit={limit:g} is below what any V-shape schedule reaches for p={p}, m={m}: the "
            f"smallest feasible limit is {1 / p:.6g} (one microbatch's activation a per device, of "
            f"1F1B's p·a); raise memory_limit to at least {1 / p:.6g}"
        )
    return min(fits, key=lambda c: c.key)


def adapt_at_level(p: int, m: int, costs: Costs, limit: float, first: VShapeCandidate) -> VShapeCandidate:
    """The cost-adaptive form of a fixed V pattern at its memory level ``limit``: the best of the
    pattern (``first``, kept on ties), the cost-aware blocks and the list schedules whose cap is
    that level (a subset of what ``v-shape`` searches at the same limit, so ``v-shape`` is never
    slower there)."""
    cands = [first] + list(_cost_blocks(p, m, costs))
    if limit >= 1.0 - _EPS:
        cands += _zbv(p, m, costs)
    levels = _half_levels(p, limit)
    if levels:
        cands += _listed(p, m, costs, levels[-1], False)
    return _pick(cands, p, m, limit)


def best_fused_v(p: int, m: int, costs: Costs, limit: float, first: VShapeCandidate) -> VShapeCandidate:
    """The best fused-backward V-shape schedule (``1f1b-v``) within ``limit``: ``first`` (the
    pattern) or a fused list schedule."""
    cands = [first] + v_shape_candidates(p, m, costs, limit, fused=True)
    fits = [c for c in cands if c.peak <= limit * p + _EPS]
    if not fits:
        raise ValueError(f"no fused V-shape schedule within memory_limit={limit:g} for p={p}, m={m}")
    return min(fits, key=lambda c: c.key)


@register("v-shape", source="Qi et al. 2024 (this paper) App. A/B, Fig. 9–10; docs/theory.md §10 (adaptive V-Shape scheduler)")
def v_shape(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Adaptive V-shape schedule: the shortest longest-span schedule within ``memory_limit``.

    Searches five families under the given costs (per-stage and unequal costs, ``comm``
    included), every candidate scored by the exact simulator: the paper's App. A framework
    (device-0 patterns × two offset levels, repeated, warm-up and cool-down rewritten under the
    peak, idle slots filled), the cost-aware ZB-V greedy at 1F1B's memory, building blocks
    (V-Min, V-Half, V-ZB, ZB-V and offset-level mixes), blocks laid out in the costs' own slots,
    and cost-aware list schedules run under a per-device activation cap at every half-a step up
    to the limit (see :mod:`ctrlmem.schedules.adaptive`). The result is the candidate with the
    shortest longest device span (so the lowest bubble rate), then the shortest makespan, whose
    simulated peak is at most ``memory_limit · p · a`` (default 1.0). Any limit from ``1/p``
    (one microbatch per device) up works, 2.0 and beyond included; a larger limit never gives a
    slower schedule.

    Raises ``ValueError`` below ``1/p``, naming the smallest feasible limit.
    """
    p, m = num_devices, num_microbatches
    _check_v(p, m)
    limit = 1.0 if memory_limit is None else float(memory_limit)
    costs = costs if costs is not None else Costs()
    best = best_v_shape(p, m, costs, limit)
    log.debug("v-shape p=%d m=%d limit=%g: %s (span %g, peak %g a)", p, m, limit, best.label, best.max_span, best.peak)
    s = best.schedule
    return Schedule(
        "v-shape", s.num_devices, s.num_microbatches, s.placement, s.device_passes,
        tuple(sorted({"memory_limit": limit, "block": best.label}.items())),
    )


# --------------------------------------------------------------------------------------------
# Memory-limited zero bubble (one stage per device)


def _zb_greedy(p: int, m: int, f: list[float], b: list[float], w: list[float], comm: float,
               cap: int, policy: str) -> list[list[Pass]]:
    """List-schedule F/B/W on p devices (one stage each) with at most ``cap`` live activations
    per device. ``policy``: ``"bfw"`` B > F > W; ``"bwf"`` B > W > F; ``"fit"`` B > F > W but a
    W only when it ends before the next input is due (or memory forces it)."""
    INF = math.inf
    f_end = [[INF] * m for _ in range(p)]
    b_end = [[INF] * m for _ in range(p)]
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    live = [0] * p
    free = [0.0] * p
    orders: list[list[Pass]] = [[] for _ in range(p)]
    remaining = 3 * p * m
    heap = [(0.0, d) for d in range(p)]
    while remaining:
        t, d = heapq.heappop(heap)
        if t < free[d]:
            continue
        k_f, k_b, k_w = nf[d], nb[d], nw[d]
        # arrival times of the next F and B inputs (INF while unknown)
        if k_b < m:
            t_b = f_end[d][k_b] if d == p - 1 else b_end[d + 1][k_b] + comm
        else:
            t_b = INF
        if k_f < m and live[d] < cap:
            t_f = 0.0 if d == 0 else f_end[d - 1][k_f] + comm
        else:
            t_f = INF
        has_w = k_w < k_b
        ready_b, ready_f = t_b <= t, t_f <= t
        choice = None
        if ready_b:
            choice = "B"
        elif policy == "bwf" and has_w:
            choice = "W"
        elif ready_f:
            choice = "F"
        elif has_w:
            if policy == "fit":
                nxt = min(t_b, t_f)
                if nxt == INF or t + w[d] <= nxt or live[d] >= cap:
                    choice = "W"
            else:
                choice = "W"
        if choice is None:
            nxt = min(t_b, t_f)
            if has_w:  # "fit" waits for an input due before the W would end
                nxt = min(nxt, t + w[d])
            if nxt < INF:
                heapq.heappush(heap, (max(nxt, t), d))
            continue  # otherwise its neighbours push it when they finish a pass
        if choice == "B":
            b_end[d][k_b] = t + b[d]
            orders[d].append(Pass(Op.B, d, k_b))
            nb[d] += 1
            free[d] = t + b[d]
        elif choice == "F":
            f_end[d][k_f] = t + f[d]
            orders[d].append(Pass(Op.F, d, k_f))
            nf[d] += 1
            live[d] += 1
            free[d] = t + f[d]
        else:
            orders[d].append(Pass(Op.W, d, k_w))
            nw[d] += 1
            live[d] -= 1
            free[d] = t + w[d]
        remaining -= 1
        heapq.heappush(heap, (free[d], d))
        # neighbours may now have inputs: revisit them at their free time
        for e in (d - 1, d + 1):
            if 0 <= e < p:
                heapq.heappush(heap, (free[e], e))
    return orders


@lru_cache(maxsize=512)
def _zb_level(p: int, m: int, costs: Costs, cap: int) -> tuple[VShapeCandidate, ...]:
    """The one-stage-per-device candidates with at most ``cap`` activations per device."""
    f, b, w = costs.stage_times(p, p)
    placement = Placement.sequential(p)
    out, seen = [], set()
    runs = [(policy, _zb_greedy(p, m, f, b, w, float(costs.comm), cap, policy)) for policy in ("bfw", "fit", "bwf")]
    for pol in _policies(p):
        res = list_schedule(placement, m, f, b, w, float(costs.comm), [1.0] * p, cap, policy=pol)
        if res is not None:
            runs.append(("list " + "/".join(pol), res.orders))
    for label, orders in runs:
        sig = tuple(tuple(o) for o in orders)
        if sig in seen:
            continue
        seen.add(sig)
        s = Schedule.from_orders("zb", placement, m, orders)
        out.append(_candidate(f"cap {cap}a {label}", s, costs))
    return tuple(out)


@lru_cache(maxsize=64)
def _zb_fixed(p: int, m: int, costs: Costs) -> tuple[VShapeCandidate, ...]:
    return tuple(_candidate(name, gen(p, m), costs) for name, gen in (("zb-h1", zb_h1), ("zb-h2", zb_h2)))


@register("zb", source="Zero Bubble paper §4 (automatic scheduling, ZB-1P/ZB-2P); docs/theory.md §8, §6")
def zb(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Memory-limited automatic zero-bubble schedule, one stage per device (ZB-1P at
    ``memory_limit=1.0``, ZB-2P at ``2.0``; docs/theory.md §8, Table 4, Fig. 7).

    Greedy list schedules in the spirit of the Zero Bubble paper's heuristic: each device,
    whenever it is free, runs a ready ``B`` first (it is on the critical path), else a ready
    ``F`` while it holds fewer activations than its cap, else a pending ``W`` to fill the gap.
    Several tie policies (W as filler only, W eagerly, W only when it ends before the next input
    is due, and those of :mod:`ctrlmem.schedules.listsched`) run at every cap from one
    activation up to ``⌊memory_limit · p⌋`` (on a grid for ``p > 12``), next to the handcrafted
    ZB-H1 (peak p·a) and ZB-H2 (peak (2p−1)·a) orders; each is simulated under ``costs`` and the
    shortest longest span (then makespan) within the limit wins, so a larger limit never gives a
    slower schedule. Default limit 1.0 (ZB-1P).
    """
    p, m = num_devices, num_microbatches
    limit = 1.0 if memory_limit is None else float(memory_limit)
    top = math.floor(limit * p + _EPS)
    if top < 1:
        raise ValueError(
            f"memory_limit={limit:g} lets a device hold no activation at all (p={p}); the smallest "
            f"feasible limit is {1 / p:.6g} (one microbatch in flight); ZB-1P is 1.0 and ZB-2P 2.0"
        )
    costs = costs if costs is not None else Costs()
    step = _cap_grid(p)
    cands = list(_zb_fixed(p, m, costs))
    for cap in range(1, top + 1):
        if (cap - 1) % step == 0 or cap == p or cap == 2 * p - 1 or cap == 2 * p:
            cands.extend(_zb_level(p, m, costs, cap))
    fits = [c for c in cands if c.peak <= limit * p + _EPS]
    best = min(fits, key=lambda c: c.key)
    s = best.schedule
    return Schedule("zb", s.num_devices, s.num_microbatches, s.placement, s.device_passes,
                    tuple(sorted({"memory_limit": limit, "policy": best.label}.items())))


def clear_caches() -> None:
    """Forget every cached candidate (for cold-start timings)."""
    _GRID_PREPARED.clear()
    _GRID_SCORED.clear()
    clear_grid()
    for fn in (_block_schedules, _block_prepared, _blocks, _grid, _zbv,
               _cost_block_schedule, _cost_blocks, _zb_level, _zb_fixed):
        fn.cache_clear()
    _LISTED.clear()
    _POLISHED.clear()
