"""Memory-budgeted schedules: the adaptive V-shape search ``v-shape`` (docs/theory.md §10, App. A/B)
and the Zero Bubble paper's memory-limited automatic scheduler ``zb`` (ZB-1P / ZB-2P,
docs/theory.md §8, §6).

``memory_limit`` is a fraction of 1F1B's peak activation ``p·a`` throughout: 1.0 is 1F1B's
memory, 0.5 half of it. Both generators take ``costs`` and return the schedule with the lowest
simulated makespan for *those* costs among the schedules they consider whose simulated peak
(default :class:`~ctrlmem.costs.MemoryModel`) is within the limit.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from ..blocks import BuildingBlock, build_from_block, v_half_block, v_min_block, v_shape_block, v_zb_block
from ..costs import Costs
from ..ir import Op, Pass, Placement, Schedule
from ..simulate import simulate
from .registry import register
from .zero_bubble import zb_h1, zb_h2, zb_v

__all__ = ["v_shape", "VShapeCandidate", "v_shape_candidates", "zb", "min_v_shape_limit"]

log = logging.getLogger(__name__)

_EPS = 1e-9

# (delta0, delta1) offset pairs of docs/theory.md §4: V-Min (1, 1), V-Half (2, 1), V-ZB (4, 2).
# Each mix: (wide, narrow, wide links first?). Between V-Min and V-Half both orientations pay
# off (wide first wins at some peaks, narrow first at others); above V-Half wide first does.
_MIXES = (((2, 1), (1, 1), True), ((2, 1), (1, 1), False), ((4, 2), (2, 1), True))


@dataclass(frozen=True)
class VShapeCandidate:
    """One member of the searched family, simulated.

    Attributes:
        label: how it was built, e.g. ``"v-half"`` or ``"mix (2, 1)x5+(1, 1)x2"`` (the offsets
            of the device links 0→1, 1→2, ... in order).
        schedule: the schedule.
        makespan: simulated makespan under the search's costs.
        peak: simulated peak over devices, in units of ``a``.
        bubble_rate: simulated bubble rate.
        max_span: the longest device span (ties on makespan go to the shorter span).
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


def _mixed_block(p: int, first: tuple[int, int], second: tuple[int, int], j: int) -> BuildingBlock:
    d0 = [first[0]] * j + [second[0]] * (p - 1 - j)
    d1 = [first[1]] * j + [second[1]] * (p - 1 - j)
    return v_shape_block(p, d0, d1, name="v-shape")


def _family(p: int) -> list[tuple[str, object]]:
    """The searched family: the V-Min, V-Half and V-ZB blocks, ZB-V, and for neighbouring
    offset levels the blocks whose first ``j`` device links use one level and the rest the
    other (``j = 1 .. p−2``), which steps the peak between the two levels."""
    fam: list[tuple[str, object]] = [
        ("v-min", v_min_block(p)),
        ("v-half", v_half_block(p)),
        ("v-zb", v_zb_block(p)),
        ("zb-v", None),
    ]
    for wide, narrow, wide_first in _MIXES:
        first, second = (wide, narrow) if wide_first else (narrow, wide)
        for j in range(1, p - 1):
            fam.append((f"mix {first}x{j}+{second}x{p - 1 - j}", (first, second, j)))
    return fam


@lru_cache(maxsize=64)
def _evaluate(p: int, m: int, costs: Costs) -> tuple[VShapeCandidate, ...]:
    out = []
    for label, spec in _family(p):
        if spec is None:
            sched = zb_v(p, m)
        elif isinstance(spec, BuildingBlock):
            sched = build_from_block(spec, m, spec.name)
        else:
            sched = build_from_block(_mixed_block(p, *spec), m, "v-shape")
        r = simulate(sched, costs)
        out.append(VShapeCandidate(label, sched, r.makespan, max(r.peak_memory), r.bubble_rate, max(r.device_spans)))
    return tuple(out)


def v_shape_candidates(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> list[VShapeCandidate]:
    """Every schedule the ``v-shape`` search considers, simulated under ``costs`` (cached)."""
    _check_v(num_devices, num_microbatches)
    return list(_evaluate(num_devices, num_microbatches, costs if costs is not None else Costs()))


def min_v_shape_limit(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> float:
    """The smallest memory limit (fraction of 1F1B's peak) the ``v-shape`` family meets."""
    return min(c.memory_fraction for c in v_shape_candidates(num_devices, num_microbatches, costs))


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


@register("v-shape", source="Qi et al. 2024 (this paper) App. A/B, Fig. 9–10; docs/theory.md §10 (adaptive V-Shape scheduler)")
def v_shape(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Adaptive V-shape schedule: the lowest simulated makespan within ``memory_limit``.

    Searches a structured family of V-shape building blocks (docs/theory.md §10, adaptive scheduler):
    the V-Min, V-Half and V-ZB blocks, the ZB-V schedule, and blocks whose device links mix two
    neighbouring offset levels (δ0, δ1) ∈ {(1,1), (2,1), (4,2)}, the first ``j`` links at one
    level and the rest at the other, so the peak steps from V-Min's level to 1F1B's. Every candidate is built by repeat → place W → reorder
    → squeeze and simulated under ``costs`` (per-stage and unequal costs included); the result
    is the candidate with the lowest makespan (then the shortest longest device span, so the
    lowest bubble rate) whose simulated peak is at most ``memory_limit · p · a`` (default 1.0). Since the family does not depend on the limit, the
    makespan never grows when the limit grows.

    Raises ``ValueError`` when no candidate fits the limit, naming the smallest feasible limit
    for this ``p`` and ``m``.
    """
    p, m = num_devices, num_microbatches
    _check_v(p, m)
    limit = 1.0 if memory_limit is None else float(memory_limit)
    costs = costs if costs is not None else Costs()
    cands = _evaluate(p, m, costs)
    fits = [c for c in cands if c.peak <= limit * p + _EPS]
    if not fits:
        least = min(c.memory_fraction for c in cands)
        raise ValueError(
            f"memory_limit={limit:g} is below what any V-shape schedule reaches for p={p}, m={m}: the "
            f"smallest feasible limit is {least:.6g} (peak {least * p:g}·a, V-Min's level "
            f"⌊(p+4)/3⌋/p = {((p + 4) // 3) / p:.6g}); raise memory_limit to at least {least:.6g}"
        )
    best = min(fits, key=lambda c: (c.makespan, c.max_span, c.peak))
    log.debug("v-shape p=%d m=%d limit=%g: %s (makespan %g, peak %g a)", p, m, limit, best.label, best.makespan, best.peak)
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
            if nxt == INF:
                # wait for another device to make progress
                others = [free[e] for e in range(p) if e != d and free[e] > t]
                nxt = min(others) if others else t + min(f[d], b[d], w[d])
            heapq.heappush(heap, (max(nxt, t), d))  # neighbours also re-push it when they finish
            continue
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


@register("zb", source="Zero Bubble paper §4 (automatic scheduling, ZB-1P/ZB-2P); docs/theory.md §8, §6")
def zb(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Memory-limited automatic zero-bubble schedule, one stage per device (ZB-1P at
    ``memory_limit=1.0``, ZB-2P at ``2.0``; docs/theory.md §8, Table 4, Fig. 7).

    A greedy list scheduler in the spirit of the Zero Bubble paper's heuristic: each device,
    whenever it is free, runs a ready ``B`` first (it is on the critical path), else a ready
    ``F`` while it holds fewer than ``⌊memory_limit · p⌋`` activations, else a pending ``W`` to
    fill the gap. Three tie policies are tried (W as filler only, W eagerly, W only when it
    ends before the next input is due) together with the handcrafted ZB-H1 (peak p·a) and
    ZB-H2 (peak (2p−1)·a) orders; each is simulated under ``costs`` and the lowest makespan
    among those within the limit wins. Default limit 1.0 (ZB-1P).
    """
    p, m = num_devices, num_microbatches
    limit = 1.0 if memory_limit is None else float(memory_limit)
    cap = math.floor(limit * p + _EPS)
    if cap < 1:
        raise ValueError(
            f"memory_limit={limit:g} lets a device hold no activation at all (p={p}); the smallest "
            f"feasible limit is {1 / p:.6g} (one microbatch in flight); ZB-1P is 1.0 and ZB-2P 2.0"
        )
    costs = costs if costs is not None else Costs()
    f, b, w = costs.stage_times(p, p)
    placement = Placement.sequential(p)
    candidates = []
    for policy in ("bfw", "fit", "bwf"):
        orders = _zb_greedy(p, m, f, b, w, float(costs.comm), cap, policy)
        candidates.append((policy, orders))
    for name, gen in (("zb-h1", zb_h1), ("zb-h2", zb_h2)):
        candidates.append((name, gen(p, m).device_passes))
    best = None
    for label, orders in candidates:
        s = Schedule.from_orders("zb", placement, m, orders, params={"memory_limit": limit, "policy": label})
        r = simulate(s, costs)
        if max(r.peak_memory) > cap + _EPS:
            continue
        key = (r.makespan, max(r.device_spans), max(r.peak_memory))
        if best is None or key < best[0]:
            best = (key, s)
    return best[1]
