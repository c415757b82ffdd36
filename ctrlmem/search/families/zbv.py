"""The Zero Bubble paper's cost-aware ZB-V heuristic (its §6 / App., the authors' ``zbv``
scheduler; docs/theory.md §10), our own implementation: a candidate family of the ``v-shape``
search at 1F1B's memory.

It builds each device's order round by round with the real pass times, on the V-shape
placement (device ``i`` holds chunk 0 = stage ``i`` and chunk 1 = stage ``2p−1−i``):

1. **warm-up**: one chunk-0 ``F`` per device; then, from the last device back to the first, the
   chunk-1 ``F`` — each device first runs extra chunk-0 ``F`` (on itself and every device before
   it) while they fit the memory cap and end before its chunk-1 input arrives; then devices are
   evened out so each has at least as many forwards as the next;
2. **2m rounds**: every device puts one backward — of chunk 1 when its input is there (the
   chunk-1 backward leads), else of chunk 0 — then one forward (chunk 1 if its input is there,
   else chunk 0). Before each, pending ``W`` fill the wait for the input when they fit in it, and
   one more ``W`` goes in when the wait would exceed the largest idle time any device has so far
   (``fill_b`` / ``fill_f`` switch this for chunk-0 backwards / forwards); ``W`` are also flushed
   whenever the next forward would exceed the cap;
3. the remaining ``W``; then the whole run is repeated with each device allowed the idle time the
   previous run gave it ("approved bubble") as long as the largest idle time shrinks.

Memory counts half-a units: +1 per chunk ``F``, −1 per ``W`` (the backward ``B`` releases
nothing). A run that cannot keep to the cap returns ``None``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet, dedupe
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.kernels import floats, kernel

__all__ = ["zbv_keys", "zbv_variants", "ZBVFamily"]


@kernel(inline=True)
def _put(cat, chunk, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):  # pragma: no cover - compiled
    """Put the next pass of (cat, chunk) on device ``i`` at the earliest time after the device
    is free and its input (on the neighbouring device) has arrived; returns False when the rules
    do not cover the state (no pass left, cap exceeded, input not yet placed)."""
    n = count[i, cat * 2 + chunk]
    if n >= m:
        return False
    dmem = 1 if cat == 0 else (-1 if cat == 2 else 0)
    if mem[i] + dmem > cap:
        return False
    t = cur[i] + cost[cat, chunk, i]
    free_end = t
    if cat < 2:
        d = -2.0  # none
        if chunk == 1 and i < p - 1:
            d = end[cat, 1, i + 1, n]
        elif chunk == 0 and i > 0:
            d = end[cat, 0, i - 1, n]
        if d != -2.0:
            if d < 0.0:
                return False
            if d + comm + cost[cat, chunk, i] > t:
                t = d + comm + cost[cat, chunk, i]
    if count[i, 0] > 0:
        bubble[i] += t - free_end
    end[cat, chunk, i, n] = t
    cur[i] = t
    mem[i] += dmem
    S = 2 * p
    sm = S * m
    if cat == 0:
        st = i if chunk == 0 else S - 1 - i
    else:
        st = S - 1 - i if chunk == 0 else i
    out[i, n_out[i]] = cat * sm + st * m + n
    n_out[i] += 1
    if cat == 1:
        pq[i, pt[i]] = chunk
        pt[i] += 1
    count[i, cat * 2 + chunk] = n + 1
    return True


@kernel(inline=True)
def _dep_end(cat, chunk, i, p, n, end):  # pragma: no cover - compiled
    """End of the input on the neighbouring device (-2: none there; -1: not yet run)."""
    if chunk == 1 and i < p - 1:
        return end[cat, 1, i + 1, n]
    if chunk == 0 and i > 0:
        return end[cat, 0, i - 1, n]
    return -2.0


@kernel
def _run(p, m, cost, comm, cap, fill_b, fill_f, use_approved, approved, out, bubble):  # pragma: no cover - compiled
    """One run of the heuristic (see the module docstring). ``cost[cat, chunk, i]``: time of
    kind cat (0 F, 1 B, 2 W) of the chunk flowing down (0) or up (1) on device ``i``. Fills
    ``out`` (pass keys) and ``bubble`` (each device's idle time); returns 1, or 0 when stuck."""
    count = np.zeros((p, 6), np.int64)
    end = np.full((3, 2, p, m), -1.0)
    cur = np.zeros(p)
    mem = np.zeros(p, np.int64)
    for i in range(p):
        bubble[i] = 0.0
    pq = np.zeros((p, 2 * m + 1), np.int64)  # pending W's chunks, FIFO per device
    ph = np.zeros(p, np.int64)
    pt = np.zeros(p, np.int64)
    n_out = np.zeros(p, np.int64)
    top_approved = -1.0
    if use_approved:
        for i in range(p):
            if approved[i] > top_approved:
                top_approved = approved[i]
    # 1. warm-up
    for i in range(p):
        if not _put(0, 0, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
            return 0
    for i in range(p - 1, -1, -1):
        if i < p - 1:
            due = end[0, 1, i + 1, 0] + comm
            while mem[i] + 2 + 2 * i <= cap and cur[i] + cost[0, 0, i] <= due and count[i, 0] < m:
                for j in range(i + 1):
                    if not _put(0, 0, j, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                        return 0
        if not _put(0, 1, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
            return 0
    chunk = 0
    guard = 4 * p * m + 16
    for i in range(1, p):
        while (count[i, 0] + count[i, 1] < count[i - 1, 0] + count[i - 1, 1]
               or (count[i, 1] <= count[i - 1, 1] and count[i - 1, 1] < m)):
            guard -= 1
            if guard < 0:
                return 0
            for j in range(p - 1, i - 1, -1):
                if count[j, chunk] < m:
                    if not _put(0, chunk, j, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                        return 0
            chunk = 1 - chunk
    # 2. rounds
    lead = np.zeros(p, np.int64)
    other = np.zeros(p, np.int64)
    for _ in range(2 * m):
        nl = 0
        no = 0
        for i in range(p):
            if count[i, 3] >= count[i, 2]:
                other[no] = i
                no += 1
            elif i == p - 1 or end[1, 1, i + 1, count[i, 3]] >= 0 or count[i, 2] >= m:
                lead[nl] = i
                nl += 1
            else:
                other[no] = i
                no += 1
        for q in range(nl + no):
            if q < nl:
                i = lead[nl - 1 - q]
                ch = 1
            else:
                i = other[q - nl]
                ch = 0
            n = count[i, 3] if ch == 1 else count[i, 2]
            d = _dep_end(1, ch, i, p, n, end)
            if not _fill_wait(i, d, ch == 1 or fill_b, p, m, cost, comm, cap, count, end, cur, mem, bubble,
                              pq, ph, pt, out, n_out, use_approved, approved, top_approved):
                return 0
            if not _put(1, ch, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                return 0
        for i in range(p):
            if count[i, 1] >= m:
                continue
            item = -1
            if count[i, 1] >= count[i, 0]:
                item = 0
            elif i == p - 1 or end[0, 1, i + 1, count[i, 1]] >= 0:
                item = 1
            elif count[i, 0] < m and (i == 0 or end[0, 0, i - 1, count[i, 0]] >= 0):
                item = 0
            if item < 0:
                continue
            while mem[i] + 1 > cap:
                if ph[i] >= pt[i]:
                    return 0
                c = pq[i, ph[i]]
                ph[i] += 1
                if not _put(2, c, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                    return 0
            n = count[i, 0] if item == 0 else count[i, 1]
            d = _dep_end(0, item, i, p, n, end)
            if not _fill_wait(i, d, fill_f, p, m, cost, comm, cap, count, end, cur, mem, bubble,
                              pq, ph, pt, out, n_out, use_approved, approved, top_approved):
                return 0
            if not _put(0, item, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                return 0
    # 3. the rest of the W
    for i in range(p):
        while ph[i] < pt[i]:
            c = pq[i, ph[i]]
            ph[i] += 1
            if not _put(2, c, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                return 0
    for i in range(p):
        total = 0
        for c in range(6):
            total += count[i, c]
        if total != 6 * m:
            return 0
    return 1


@kernel(inline=True)
def _fill_wait(i, d, extra, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out,
               use_approved, approved, top_approved):  # pragma: no cover - compiled
    """Pending W into the wait for an input ending at ``d`` (-2: none); one more if the wait is
    longer than the idle time allowed (and ``extra``). Returns False when stuck."""
    while ph[i] < pt[i] and d != -2.0 and d + comm >= cur[i] + cost[2, pq[i, ph[i]], i]:
        c = pq[i, ph[i]]
        ph[i] += 1
        if not _put(2, c, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
            return False
    dd = -1.0 if d == -2.0 else d
    if ph[i] < pt[i] and extra:
        largest = bubble[0]
        for j in range(1, p):
            if bubble[j] > largest:
                largest = bubble[j]
        if use_approved and top_approved - approved[i] > largest:
            largest = top_approved - approved[i]
        if dd + comm - cur[i] > largest - bubble[i]:
            c = pq[i, ph[i]]
            ph[i] += 1
            if not _put(2, c, i, p, m, cost, comm, cap, count, end, cur, mem, bubble, pq, ph, pt, out, n_out):
                return False
    return True


def _costs(p: int, f: Sequence[float], b: Sequence[float], w: Sequence[float]) -> np.ndarray:
    """``cost[cat, chunk, i]`` from per-stage times: forward chunk 0 flows down (stage i),
    chunk 1 up (stage 2p−1−i); the backward's chunk 0 is stage 2p−1−i (flowing down), chunk 1
    stage i (flowing up); W as its backward."""
    S = 2 * p
    lo = list(range(p))
    hi = [S - 1 - i for i in range(p)]
    stage = ((lo, hi), (hi, lo), (hi, lo))
    return floats([[[t[s] for s in stage[cat][ch]] for ch in (0, 1)] for cat, t in enumerate((f, b, w))])


def zbv_keys(p: int, m: int, f: Sequence[float], b: Sequence[float], w: Sequence[float], comm: float,
             cap: int, fill_b: bool = True, fill_f: bool = True) -> np.ndarray | None:
    """Device orders (pass keys ``[p, 6m]``) of the heuristic with its approved-bubble reruns,
    for per-stage pass times ``f``, ``b``, ``w`` (2p stages, V-shape placement), hop latency
    ``comm`` and a cap of ``cap`` half-a per device; ``None`` if it cannot keep to the cap."""
    cost = _costs(p, f, b, w)
    out = np.zeros((p, 6 * m), dtype=np.int64)
    bubble = np.zeros(p)
    none = np.zeros(p)
    if not _run(p, m, cost, float(comm), int(cap), bool(fill_b), bool(fill_f), False, none, out, bubble):
        return None
    best, best_bubble = out, bubble
    while True:
        nxt, nb = np.zeros_like(out), np.zeros(p)
        if not _run(p, m, cost, float(comm), int(cap), bool(fill_b), bool(fill_f), True, best_bubble, nxt, nb):
            return None
        if nb.max() < best_bubble.max():
            best, best_bubble = nxt, nb
        else:
            return best


def zbv_variants(p: int, m: int, f, b, w, comm: float, cap: int) -> CandidateSet:
    """The heuristic with each of (fill_b, fill_f) in {True, False}², distinct results only."""
    keys, labels = [], []
    for fill_b in (True, False):
        for fill_f in (True, False):
            got = zbv_keys(p, m, f, b, w, comm, cap, fill_b, fill_f)
            if got is not None:
                keys.append(got)
                labels.append(f"zbv fill b{'+' if fill_b else '-'} f{'+' if fill_f else '-'}")
    arr = np.stack(keys) if keys else np.zeros((0, p, 6 * m), dtype=np.int64)
    return dedupe(CandidateSet(Placement.v_shape(p), m, False, arr, tuple(labels)))


# ---------------------------------------------------------------------------------------------
# the family


class ZBVFamily(Family):
    """The heuristic at 1F1B's memory (cap ``2p`` half-a), its four fill variants: candidates
    for budgets of 1F1B's memory and above. Cost-dependent: cached per (p, m, costs)."""

    name = "zbv"

    def __init__(self) -> None:
        self._cache = LRU(64)

    def sets(self, q: Query, progress: Incumbent):
        p = q.p
        if q.fused or q.placement.kind != "v-shape" or q.cap < p - 1e-9:
            return
        if progress.hopeless(q, float(p)):
            return
        key = (p, q.m, q.costs)
        got = self._cache.get(key)
        if got is None:
            f, b, w = q.costs.stage_times(2 * p, p)
            got = self._cache.put(key, zbv_variants(p, q.m, f, b, w, float(q.costs.comm), 2 * p))
        yield got
