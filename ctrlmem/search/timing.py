"""Timing candidates under costs: the simulator's as-soon-as-possible run, on compact arrays.

Each device runs its passes in order; a pass starts when its device is free and its input has
ended (plus the hop latency when the input ran on another device). This is exactly
:func:`ctrlmem.simulate`'s execution (the paper's *squeeze*), so the numbers agree with it: the
longest device span (start of a device's first pass to the end of its last), the makespan and
the sum of the spans. A candidate whose device orders deadlock gets an infinite span.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet, tables
from ctrlmem.search.kernels import floats, kernel

__all__ = ["durations", "time_set", "Timed"]


@lru_cache(maxsize=64)
def durations(placement: Placement, m: int, fused: bool, costs: Costs) -> np.ndarray:
    """Each key's pass time under ``costs`` (a fused backward takes ``b + w``)."""
    S = placement.num_stages
    f, b, w = costs.stage_times(S, placement.num_devices)
    f, b, w = floats(f), floats(b), floats(w)
    back = b + w if fused else b
    return floats(np.concatenate([np.repeat(f, m), np.repeat(back, m), np.repeat(w, m)]))


@kernel(inline=True)
def time_candidate(keys, c, dep, cross, dur, comm, end, start, stamp, ptr, free, first, out):  # pragma: no cover - compiled
    """Candidate ``c``: as-soon-as-possible run of every device's order. Devices are swept
    forwards and backwards, each advancing as far as its inputs allow, until all passes ran (or
    none can: a deadlock, everything inf). ``out`` gets the longest span, the makespan, the sum
    of the device spans and the sum of every pass's end time; ``end``, ``start``, ``stamp``,
    ``ptr``, ``free``, ``first`` are work arrays (:func:`work_arrays`; ``end`` and ``start`` keep
    each pass's times, which :func:`retime` starts from); ``out`` has room for five: the fifth
    is the sum of the devices' end times."""
    p = keys.shape[1]
    L = keys.shape[2]
    for d in range(p):
        ptr[d] = 0
        free[d] = 0.0
        first[d] = 0.0
    flow = _sweep(keys, c, dep, cross, dur, comm, end, start, end, start, stamp, -np.inf, ptr, free, first, p * L)
    _totals(free, first, flow, out)


@kernel(inline=True)
def _sweep(keys, c, dep, cross, dur, comm, end0, start0, end, start, stamp, t0, ptr, free, first, remaining):  # pragma: no cover - compiled
    """Run ``remaining`` passes: device ``d`` from position ``ptr[d]`` on, free at ``free[d]``;
    devices swept forwards and backwards, each advancing as far as its inputs allow. A pass's
    input has run when it ran in this sweep (``stamp`` equal to the sweep's number, its time in
    ``end``) or when it started before ``t0`` in the timing ``end0`` / ``start0`` (:func:`retime`;
    ``-inf``: no such timing). Each pass run gets ``start``, ``end`` and the sweep's stamp.
    Returns the sum of the end times of the passes run, −1 on a deadlock (no device can advance)."""
    p = keys.shape[1]
    n = dep.shape[0]
    L = keys.shape[2]
    stamp[n] += 1  # this sweep's number (stamp[n] counts them)
    cur = stamp[n]
    flow = 0.0
    while remaining > 0:
        moved = 0
        for sweep in range(2 * p):
            d = sweep if sweep < p else 2 * p - 1 - sweep
            i = ptr[d]
            t_free = free[d]
            start_i = i
            while i < L:
                k = keys[c, d, i]
                q = dep[k]
                t = t_free
                if q >= 0:
                    if stamp[q] == cur:
                        e = end[q]
                    elif start0[q] < t0:
                        e = end0[q]
                    else:
                        break
                    if cross[k] != 0:
                        e = e + comm
                    if e > t:
                        t = e
                if i == 0:
                    first[d] = t
                start[k] = t
                t_free = t + dur[k]
                end[k] = t_free
                stamp[k] = cur
                flow += t_free
                i += 1
            moved += i - start_i
            ptr[d] = i
            free[d] = t_free
        if moved == 0:
            return -1.0
        remaining -= moved
    return flow


@kernel(inline=True)
def _totals(free, first, flow, out):  # pragma: no cover - compiled
    """``out`` from the devices' first starts and last ends (all inf after a deadlock: ``flow`` −1)."""
    p = free.shape[0]
    if flow < 0.0:
        for j in range(5):
            out[j] = np.inf
        return
    s = 0.0
    mk = 0.0
    tot = 0.0
    ends = 0.0
    for d in range(p):
        x = free[d] - first[d]
        tot += x
        ends += free[d]
        if x > s:
            s = x
        if free[d] > mk:
            mk = free[d]
    out[0] = s
    out[1] = mk
    out[2] = tot
    out[3] = flow
    out[4] = ends


@kernel(inline=True)
def retime(keys, c, d, lo, t0, dep, cross, dur, comm, end0, start0, end, start, stamp, ptr, free, first, cut, out):  # pragma: no cover - compiled
    """Candidate ``c`` timed again after a change to device ``d``'s order at positions ``lo`` and
    later, from its timing before the change (``end0``, ``start0``; ``t0``: the start there of the
    pass that was at position ``lo``). A pass that started before ``t0`` waited for nothing that
    started at ``t0`` or later (a pass starts no earlier than its input or the pass before it on
    its device), so on each device only the passes from the first that started at ``t0`` or
    later (``cut``) run again, into ``end`` and ``start``: the times :func:`time_candidate` gives,
    bit for bit (each is the same ``max`` and ``+`` of the same inputs), for about half the
    work. ``out`` as :func:`time_candidate`'s (``out[3]``: the passes run again only).
    :func:`keep` makes the new times those of the candidate; nothing to undo otherwise."""
    p = keys.shape[1]
    L = keys.shape[2]
    remaining = 0
    for e in range(p):
        a = 0
        b = lo if e == d else L  # device d's positions before lo are as they were
        while a < b:  # the first position that started at t0 or later (starts grow along a device)
            h = (a + b) // 2
            if start0[keys[c, e, h]] < t0:
                a = h + 1
            else:
                b = h
        cut[e] = a
        ptr[e] = a
        free[e] = end0[keys[c, e, a - 1]] if a > 0 else 0.0
        first[e] = start0[keys[c, e, 0]] if a > 0 else 0.0
        remaining += L - a
    flow = _sweep(keys, c, dep, cross, dur, comm, end0, start0, end, start, stamp, t0, ptr, free, first, remaining)
    _totals(free, first, flow, out)


@kernel(inline=True)
def keep(keys, c, end0, start0, end, start, cut):  # pragma: no cover - compiled
    """After :func:`retime`: its times become the timing ``end0``, ``start0``."""
    for e in range(keys.shape[1]):
        for i in range(cut[e], keys.shape[2]):
            k = keys[c, e, i]
            end0[k] = end[k]
            start0[k] = start[k]


@kernel
def order_tables(keys, c, dep):  # pragma: no cover - compiled
    """For :func:`closes_cycle`: each pass's device and position in candidate ``c``, and who
    waits for each pass (``head[k]:head[k + 1]`` of ``users``)."""
    p = keys.shape[1]
    L = keys.shape[2]
    n = dep.shape[0]
    device = np.zeros(n, np.int64)
    pos = np.zeros(n, np.int64)
    for d in range(p):
        for i in range(L):
            device[keys[c, d, i]] = d
            pos[keys[c, d, i]] = i
    head = np.zeros(n + 1, np.int64)
    for k in range(n):
        if dep[k] >= 0:
            head[dep[k] + 1] += 1
    for k in range(n):
        head[k + 1] += head[k]
    users = np.zeros(max(head[n], 1), np.int64)
    fill = head[:n].copy()
    for k in range(n):
        if dep[k] >= 0:
            users[fill[dep[k]]] = k
            fill[dep[k]] += 1
    return device, pos, head, users


@kernel(inline=True)
def closes_cycle(keys, c, d, i, j, dep, device, pos, head, users, start, seen, stack):  # pragma: no cover - compiled
    """Whether moving the pass at position ``i`` of device ``d`` to position ``j`` makes candidate
    ``c`` (whose as-soon-as-possible starts are ``start``; ``device``, ``pos``, ``head``, ``users``
    from :func:`order_tables`, up to date) deadlock — without timing it. The move adds one edge that
    can close a cycle: moved earlier, the pass ``k`` now runs before ``x``, the pass that was at
    ``j``, so a cycle is a path from ``x`` to ``k``'s input; moved later, after ``x``, the pass that
    was at ``j``: a path from ``k``'s users to ``x``. Every other edge on such a path is one of the
    order before the move, along which starts never decrease, so the search stops at passes that
    started after the path's end: a few passes' worth of time, where timing would run half the
    pipeline to find the deadlock. ``seen`` (``int64[n + 1]``, ``seen[n]`` the last search's
    number) and ``stack`` (``int64[n]``) are work arrays."""
    L = keys.shape[2]
    seen[dep.shape[0]] += 1
    mark = seen[dep.shape[0]]
    k = keys[c, d, i]
    top = 0
    if j < i:
        target = dep[k]
        if target < 0:
            return False
        x = keys[c, d, j]
        seen[x] = mark
        stack[0] = x
        top = 1
    else:
        target = keys[c, d, j]
        for u in range(head[k], head[k + 1]):  # not k's own next pass: that edge goes
            y = users[u]
            if start[y] <= start[target] and seen[y] != mark:
                seen[y] = mark
                stack[top] = y
                top += 1
    limit = start[target]
    while top > 0:
        top -= 1
        y = stack[top]
        if y == target:
            return True
        e = device[y]
        nxt = pos[y] + 1
        if nxt < L:
            z = keys[c, e, nxt]
            if start[z] <= limit and seen[z] != mark:
                seen[z] = mark
                stack[top] = z
                top += 1
        for u in range(head[y], head[y + 1]):
            z = users[u]
            if start[z] <= limit and seen[z] != mark:
                seen[z] = mark
                stack[top] = z
                top += 1
    return False


@kernel(inline=True)
def work_arrays(n, p):  # pragma: no cover - compiled
    """The work arrays of :func:`time_candidate` for ``n`` passes on ``p`` devices: ``(end, start,
    stamp, ptr, free, first, out)``; ``out`` gets the longest span, the makespan, the sum of the
    device spans, the sum of every pass's end time and the sum of the devices' end times."""
    return (np.empty(n), np.empty(n), np.zeros(n + 1, np.int64), np.zeros(p, np.int64), np.zeros(p), np.zeros(p),
            np.empty(5))


@kernel
def asap(keys, dep, cross, dur, comm, span, make, total):  # pragma: no cover - compiled; py_func tested
    """For each candidate: :func:`time_candidate` (longest span, makespan, sum of the device spans)."""
    K, p, L = keys.shape
    end, start, stamp, ptr, free, first, out = work_arrays(dep.shape[0], p)
    for c in range(K):
        time_candidate(keys, c, dep, cross, dur, comm, end, start, stamp, ptr, free, first, out)
        span[c] = out[0]
        make[c] = out[1]
        total[c] = out[2]


def _clean(x: np.ndarray) -> np.ndarray:
    """Round away float noise as :func:`ctrlmem.simulate` does (9 decimals, Python's rounding)."""
    return np.array([round(v, 9) + 0.0 if math.isfinite(v) else v for v in x.tolist()])


class Timed:
    """A :class:`CandidateSet` timed under one costs: ``span`` (longest device span),
    ``makespan`` and ``total`` (sum of the device spans), each ``float64[K]`` (``inf`` for a
    deadlock), rounded like :func:`ctrlmem.simulate`."""

    __slots__ = ("cs", "span", "makespan", "total")

    def __init__(self, cs: CandidateSet, span: np.ndarray, makespan: np.ndarray, total: np.ndarray):
        self.cs, self.span, self.makespan, self.total = cs, span, makespan, total

    def best(self, cap: float) -> int | None:
        """Index of the best candidate (span, then makespan, then peak; first on ties) whose
        peak is at most ``cap`` (in ``a``), or ``None``."""
        ok = (self.cs.peak <= cap + 1e-9) & np.isfinite(self.span)
        idx = np.nonzero(ok)[0]
        if not len(idx):
            return None
        order = np.lexsort((idx, self.cs.peak[idx], self.makespan[idx], self.span[idx]))
        return int(idx[order[0]])


def time_set(cs: CandidateSet, costs: Costs) -> Timed:
    """Time every candidate of ``cs`` under ``costs``."""
    K = len(cs)
    span, make, total = np.empty(K), np.empty(K), np.empty(K)
    if K:
        t = tables(cs.placement, cs.m, cs.fused)
        dur = durations(cs.placement, cs.m, cs.fused, costs)
        asap(cs.keys, t.dep, t.cross, dur, float(costs.comm), span, make, total)
    return Timed(cs, _clean(span), _clean(make), _clean(total))
