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

from collections import deque
from functools import partial
from typing import Sequence

from ..ir import Op, Pass

# a Pass without the NamedTuple's Python-level constructor (these loops make millions)
_new_pass = partial(tuple.__new__, Pass)

__all__ = ["zbv_orders", "zbv_variants"]


class _Stuck(Exception):
    """The heuristic reached a state its rules do not cover (input missing, cap exceeded)."""


def _run(p: int, m: int, cost, comm: float, cap: int, fill_b: bool, fill_f: bool, approved) -> tuple[list, float]:
    """One run. ``cost[cat][chunk][i]``: time of kind (cat 0 F, 1 B, 2 W; chunk in the order the
    passes flow: 0 down the devices, 1 up) on device ``i``. Returns (orders, largest idle)."""
    count = [[0] * 6 for _ in range(p)]
    end: dict[tuple[int, int, int, int], float] = {}
    cur = [0.0] * p
    mem = [0] * p
    bubble = [0.0] * p
    pending: list[deque] = [deque() for _ in range(p)]
    orders: list[list[tuple[int, int, int]]] = [[] for _ in range(p)]
    top_approved = max(approved) if approved is not None else -1.0

    def largest(i: int) -> float:
        b = max(bubble)
        if approved is not None:
            b = max(b, top_approved - approved[i])
        return b

    def dep_end(cat: int, chunk: int, i: int, n: int) -> float | None:
        """End of the input on the neighbouring device (None: none there; -1: not yet run)."""
        if chunk == 1 and i < p - 1:
            return end.get((cat, 1, i + 1, n), -1.0)
        if chunk == 0 and i > 0:
            return end.get((cat, 0, i - 1, n), -1.0)
        return None

    def put(cat: int, chunk: int, i: int) -> None:
        n = count[i][cat * 2 + chunk]
        if n >= m:
            raise _Stuck
        dmem = 1 if cat == 0 else -1 if cat == 2 else 0
        if mem[i] + dmem > cap:
            raise _Stuck
        t = cur[i] + cost[cat][chunk][i]
        free_end = t
        if cat < 2:
            d = dep_end(cat, chunk, i, n)
            if d is not None:
                if d < 0:
                    raise _Stuck
                t = max(t, d + comm + cost[cat][chunk][i])
        if count[i][0] > 0:
            bubble[i] += t - free_end
        end[(cat, chunk, i, n)] = t
        cur[i] = t
        mem[i] += dmem
        orders[i].append((cat, chunk, n))
        if cat == 1:
            pending[i].append(chunk)
        count[i][cat * 2 + chunk] = n + 1

    def put_w(i: int) -> None:
        if not pending[i]:
            raise _Stuck
        put(2, pending[i].popleft(), i)

    def fill_wait(i: int, d: float | None, extra: bool) -> None:
        """Pending W into the wait for an input ending at ``d``; one more if the wait is longer
        than the idle time allowed (and ``extra``)."""
        while pending[i] and d is not None and d + comm >= cur[i] + cost[2][pending[i][0]][i]:
            put_w(i)
        dd = -1.0 if d is None else d
        if pending[i] and dd + comm - cur[i] > largest(i) - bubble[i] and extra:
            put_w(i)

    # 1. warm-up
    for i in range(p):
        put(0, 0, i)
    for i in range(p - 1, -1, -1):
        if i < p - 1:
            due = end[(0, 1, i + 1, 0)] + comm
            while mem[i] + 2 + 2 * i <= cap and cur[i] + cost[0][0][i] <= due and count[i][0] < m:
                for j in range(i + 1):
                    put(0, 0, j)
        put(0, 1, i)
    chunk = 0
    guard = 4 * p * m + 16
    for i in range(1, p):
        while (count[i][0] + count[i][1] < count[i - 1][0] + count[i - 1][1]
               or count[i][1] <= count[i - 1][1] < m):
            guard -= 1
            if guard < 0:
                raise _Stuck
            for j in range(p - 1, i - 1, -1):
                if count[j][chunk] < m:
                    put(0, chunk, j)
            chunk = 1 - chunk
    # 2. rounds
    for _ in range(2 * m):
        lead, other = [], []
        for i in range(p):
            if count[i][3] >= count[i][2]:
                other.append(i)
            elif i == p - 1 or end.get((1, 1, i + 1, count[i][3]), -1.0) >= 0 or count[i][2] >= m:
                lead.append(i)
            else:
                other.append(i)
        for i, ch in [(i, 1) for i in reversed(lead)] + [(i, 0) for i in other]:
            n = count[i][3] if ch == 1 else count[i][2]
            fill_wait(i, dep_end(1, ch, i, n), ch == 1 or fill_b)
            put(1, ch, i)
        for i in range(p):
            if count[i][1] >= m:
                continue
            item = None
            if count[i][1] >= count[i][0]:
                item = 0
            elif i == p - 1 or end.get((0, 1, i + 1, count[i][1]), -1.0) >= 0:
                item = 1
            elif count[i][0] < m and (i == 0 or end.get((0, 0, i - 1, count[i][0]), -1.0) >= 0):
                item = 0
            if item is None:
                continue
            while mem[i] + 1 > cap:
                put_w(i)
            n = count[i][item * 1 + 0] if item == 0 else count[i][1]
            fill_wait(i, dep_end(0, item, i, n), fill_f)
            put(0, item, i)
    # 3. the rest of the W
    for i in range(p):
        while pending[i]:
            put_w(i)
    if any(sum(c) != 6 * m for c in count):
        raise _Stuck
    return orders, max(bubble), bubble


def zbv_orders(p: int, m: int, f: Sequence[float], b: Sequence[float], w: Sequence[float], comm: float,
               cap: int, fill_b: bool = True, fill_f: bool = True) -> list[list[Pass]] | None:
    """Device orders of the heuristic (with its approved-bubble reruns) for per-stage pass times
    ``f``, ``b``, ``w`` (2p stages, V-shape placement), hop latency ``comm`` and a cap of ``cap``
    half-a per device; ``None`` if it cannot keep to the cap."""
    S = 2 * p
    lo = list(range(p))  # chunk flowing down the devices: stage i
    hi = [S - 1 - i for i in range(p)]  # flowing up: stage 2p-1-i
    # forward chunk 0 flows down (stage i), chunk 1 up; backward chunk 0 = stage 2p-1-i flows
    # down, chunk 1 = stage i flows up
    stage = ((lo, hi), (hi, lo), (hi, lo))
    cost = tuple(tuple([t[s] for s in stage[cat][ch]] for ch in (0, 1)) for cat, t in enumerate((f, b, w)))
    try:
        best = _run(p, m, cost, comm, cap, fill_b, fill_f, None)
        while True:
            nxt = _run(p, m, cost, comm, cap, fill_b, fill_f, best[2])
            if nxt[1] < best[1]:
                best = nxt
            else:
                break
    except _Stuck:
        return None
    ops = (Op.F, Op.B, Op.W)
    return [[_new_pass((ops[cat], stage[cat][ch][i], n)) for cat, ch, n in row] for i, row in enumerate(best[0])]


def zbv_variants(p: int, m: int, f, b, w, comm: float, cap: int) -> list[tuple[str, list[list[Pass]]]]:
    """The heuristic with each of (fill_b, fill_f) in {True, False}², distinct results only."""
    out, seen = [], set()
    for fill_b in (True, False):
        for fill_f in (True, False):
            orders = zbv_orders(p, m, f, b, w, comm, cap, fill_b, fill_f)
            if orders is None:
                continue
            key = tuple(map(tuple, orders))
            if key not in seen:
                seen.add(key)
                out.append((f"zbv fill b{'+' if fill_b else '-'} f{'+' if fill_f else '-'}", orders))
    return out
