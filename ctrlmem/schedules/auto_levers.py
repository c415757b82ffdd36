"""Budgeted search with the memory levers: ``recompute="auto"`` / ``offload="auto"`` on a
memory-budgeted schedule (``v-shape``, ``zb``; docs/theory.md §13).

A greedy on top of the budgeted search. Reordering alone pays a growing bubble below V-Min's
memory; the levers pay a recompute or a copy instead. For each looser budget ``L' = L·2^j`` (up
to 1F1B's memory) the search's schedule at ``L'`` is taken and, on every device still above the
budget ``L``, levers are put on its forwards in order of their lifespan (the time from the
forward's end to its backward's start: the longest hide a copy best, PipeOffload's insight),
an eighth of the remaining ones at a time, until the device fits. A forward is offloaded when
offload is allowed and its lifespan covers the copy out and back (``2 · Costs.offload`` per
``a``), else recomputed when recompute is allowed. The fastest schedule within the budget wins,
the reordering-only one at ``L`` included, so the levers are used only when they are faster.
"""

from __future__ import annotations

import math
from typing import Callable

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.model.levers import with_offload, with_recompute
from ctrlmem.model.simulate import SimResult, simulate

__all__ = ["search_with_levers", "fit_with_levers"]

_EPS = 1e-9


def search_with_levers(generate: Callable[[float], Schedule], memory_limit: float, costs: Costs,
                       recompute: str, offload: object) -> Schedule:
    """The fastest schedule within ``memory_limit`` (a fraction of 1F1B's peak ``p·a``) among the
    budgeted search's own (``generate(limit)``) and its schedules at looser budgets brought under
    the limit with levers. ``recompute`` is ``none``, ``selective``, ``full`` or ``auto`` (both
    modes tried); ``offload`` ``none``, a fraction or ``auto`` (fraction 1)."""
    modes = {"auto": ("selective", "full"), "none": (None,)}.get(recompute, (recompute,))
    fraction = None if offload == "none" else 1.0 if offload == "auto" else float(offload)
    best: tuple[float, float, Schedule] | None = None
    try:
        plain = generate(memory_limit)
    except ValueError:  # below what reordering alone reaches: the levers must do it
        plain = None
    if plain is not None:
        r = simulate(plain, costs)
        best = (r.makespan, r.max_peak_memory, plain)
    p = (plain or generate(1.0)).num_devices
    cap = memory_limit * p
    for loose in _looser(memory_limit):
        seed = generate(loose)
        for mode in modes:
            fitted = fit_with_levers(seed, cap, costs, mode, fraction)
            if fitted is None:
                continue
            r = simulate(fitted, costs)
            if best is None or (r.makespan, r.max_peak_memory) < best[:2]:
                best = (r.makespan, r.max_peak_memory, fitted)
    if best is None:
        raise ValueError(f"no schedule fits memory_limit={memory_limit:g} of 1F1B's peak even with the levers "
                         f"(recompute={recompute}, offload={offload}); raise the limit or allow recompute")
    return best[2]


def _looser(limit: float) -> list[float]:
    """``L·2^j`` for ``j >= 1`` below 1F1B's memory, then 1.0."""
    out, x = [], limit * 2
    while x < 1.0 - _EPS:
        out.append(x)
        x *= 2
    return out + ([1.0] if limit < 1.0 - _EPS else [])


def fit_with_levers(schedule: Schedule, cap: float, costs: Costs, mode: str | None,
                    fraction: float | None) -> Schedule | None:
    """``schedule`` with levers on its longest-lived forwards until every device's peak is at
    most ``cap`` (in ``a``), or ``None`` when the allowed levers cannot get there."""
    if mode is None and fraction is None:
        return None
    r = simulate(schedule, costs)
    while r.max_peak_memory > cap + _EPS:
        picks = _next_picks(r, cap, costs, fraction)
        if not picks:
            return None
        offs = [k for k, lever in picks if lever == "O"]
        recs = [k for k, lever in picks if lever == "R"]
        if recs and mode is None:
            return None
        if offs:
            schedule = with_offload(schedule, fraction, which=offs, costs=costs)
        if recs:
            schedule = with_recompute(schedule, mode, which=recs)
        r = simulate(schedule, costs)
    return schedule


def _next_picks(r: SimResult, cap: float, costs: Costs, fraction: float | None) -> list[tuple[tuple[int, int], str]]:
    """On every device above ``cap``: an eighth of its forwards without a lever yet (at least
    one), longest lifespan first, each with its lever (``O`` offload, ``R`` recompute)."""
    s = r.schedule
    taken = {(ps.stage, ps.microbatch) for row in s.device_passes for ps in row if ps.op is Op.R}
    taken |= {(c.stage, c.microbatch) for row in s.copies for c in row}
    f_end, b_start = {}, {}
    for tp in r.passes:
        if tp.op is Op.F:
            f_end[(tp.stage, tp.microbatch)] = (tp.device, tp.end)
        elif tp.op in (Op.B, Op.BW):
            b_start[(tp.stage, tp.microbatch)] = tp.start
    act = s.num_devices / s.num_stages
    copy = 2 * float(costs.offload) * act * (fraction or 0.0)
    picks = []
    for d, peak in enumerate(r.peak_memory):
        if peak <= cap + _EPS:
            continue
        free = sorted(((b_start[k] - end, k) for k, (dev, end) in f_end.items() if dev == d and k not in taken),
                      reverse=True)
        for life, key in free[: max(1, math.ceil(len(free) / 8))]:
            picks.append((key, "O" if fraction is not None and life >= copy else "R"))
    return picks
