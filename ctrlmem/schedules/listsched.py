"""A cost-aware, memory-capped list scheduler for any placement (the search's second family).

The block family of :mod:`ctrlmem.blocks` fixes the passes' order from a unit-slot building
block; its times then follow the real costs. This module builds orders *from* the real costs:
it runs the pipeline as a discrete-event simulation, and each device, whenever it is free, picks
its next pass among those whose inputs have arrived (``comm`` added across devices), under a
per-device activation cap. It is the Zero Bubble paper's automatic-scheduling heuristic
(§4 there; the authors' ``zb.py`` / ``zbv.py`` greedy, docs/theory.md §10) generalised to any
placement, fused or split backward, and a cap anywhere from one microbatch to 2× 1F1B.

Rules on a free device (a *policy* picks among the variants):

1. a backward (``B`` or fused ``BW``) whose input has arrived, first; between two ready
   backwards the one ready earlier (``"ready"``) or the one of the higher stage (``"high"``);
2. else a forward whose input has arrived and that fits the cap; between two, the stage
   nearer the loss (``"high"``: finish microbatches in flight) or the earlier ready (``"ready"``);
3. else a pending ``W`` — always (``"lazy"``: W only fills what would be idle time), only if it
   ends before the next known input arrives (``"fit"``; or when the cap blocks a forward), or
   before any forward (``"eager"``: B > W > F, lowest memory).

Deadlock freedom under a cap: a microbatch *enters* a device at its first stage there only if
the device can hold the activations of all its stages for every microbatch that has entered and
not yet released them (a reservation). Forwards of later stages then always fit, backwards
need no memory, and ``W`` frees it; so every cap of at least one microbatch's activation on a
device completes.
"""

from __future__ import annotations

import heapq
import math
from functools import partial
from typing import NamedTuple, Sequence

from ..ir import Op, Pass, Placement

# a Pass without the NamedTuple's Python-level constructor (these loops make millions)
_new_pass = partial(tuple.__new__, Pass)

__all__ = ["POLICIES", "ListResult", "list_schedule"]

_INF = math.inf
_EPS = 1e-9

#: (backward pick, forward pick, W mode) variants the searches try.
POLICIES: tuple[tuple[str, str, str], ...] = (
    ("ready", "high", "lazy"),
    ("ready", "high", "fit"),
    ("high", "high", "lazy"),
    ("ready", "ready", "fit"),
    ("ready", "high", "eager"),
    ("high", "high", "mem"),
    ("ready", "ready", "mem"),
)


class ListResult(NamedTuple):
    """Device orders, and whether the cap ever held a forward back (if not, any larger cap
    gives the same orders)."""

    orders: list[list[Pass]]
    capped: bool


def list_schedule(
    placement: Placement,
    num_microbatches: int,
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float],
    comm: float,
    act: Sequence[float],
    cap: float,
    fused: bool = False,
    policy: tuple[str, str, str] = POLICIES[0],
) -> ListResult | None:
    """Device orders for ``placement`` and ``num_microbatches`` under per-stage pass times
    ``f``, ``b``, ``w``, hop latency ``comm``, per-stage activations ``act`` and a per-device cap
    ``cap`` (same unit as ``act``). ``fused``: one ``BW`` pass (``b + w``) per stage instead of
    ``B`` and ``W``. Returns ``None`` if ``cap`` cannot hold one microbatch on some device."""
    b_pick, f_pick, w_mode = policy
    P, m = placement, num_microbatches
    S, p = P.num_stages, P.num_devices
    dev = [P.device_of(s) for s in range(S)]
    stages = [sorted(P.stages_of(d)) for d in range(p)]
    # a microbatch enters device d at its first stage there (stages of a device in chain order)
    entry = [st[0] for st in stages]
    need = [sum(act[s] for s in st) for st in stages]
    if any(need[d] > cap + _EPS for d in range(p)):
        return None
    f_end = [[_INF] * m for _ in range(S)]
    b_end = [[_INF] * m for _ in range(S)]
    nf, nb, nw = [0] * S, [0] * S, [0] * S
    live = [0.0] * p  # allocated activations
    committed = [0.0] * p  # allocated + reserved for entered microbatches
    free = [0.0] * p
    wq: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # pending W (stage, mb), FIFO
    wh = [0] * p
    orders: list[list[Pass]] = [[] for _ in range(p)]
    remaining = S * m * (2 if fused else 3)
    heap = [(0.0, d) for d in range(p)]
    capped = False
    back_op = Op.BW if fused else Op.B
    c_in_f = [comm if s > 0 and dev[s - 1] != dev[s] else 0.0 for s in range(S)]
    c_in_b = [comm if s < S - 1 and dev[s + 1] != dev[s] else 0.0 for s in range(S)]
    while remaining:
        t, d = heapq.heappop(heap)
        if t < free[d] - _EPS:
            continue
        t = max(t, free[d])
        best_b = None  # (key, stage, arrival)
        best_f = None
        next_arrival = _INF
        blocked_f = False
        for s in stages[d]:
            k = nb[s]
            if k < m and f_end[s][k] < _INF:
                tb = f_end[s][k] if s == S - 1 else b_end[s + 1][k] + c_in_b[s]
                if tb <= t + _EPS:
                    key = (tb, k, -s) if b_pick == "ready" else (-s, tb, k)
                    if best_b is None or key < best_b[0]:
                        best_b = (key, s)
                elif tb < next_arrival:
                    next_arrival = tb
            k = nf[s]
            if k < m:
                tf = 0.0 if s == 0 else f_end[s - 1][k] + c_in_f[s]
                if tf < _INF:
                    if live[d] + (need[d] if s == entry[d] else act[s]) > cap + _EPS:
                        blocked_f = capped = True
                    elif tf <= t + _EPS:
                        key = (-s, tf, k) if f_pick == "high" else (tf, k, -s)
                        if best_f is None or key < best_f[0]:
                            best_f = (key, s)
                    elif tf < next_arrival:
                        next_arrival = tf
        has_w = wh[d] < len(wq[d])
        choice = None
        if best_b is not None:
            choice = ("B", best_b[1])
        elif has_w and (w_mode == "eager" or (w_mode == "mem" and blocked_f)):
            choice = ("W", None)
        elif best_f is not None:
            choice = ("F", best_f[1])
        elif has_w:
            if w_mode == "fit" and not blocked_f:
                s_w = wq[d][wh[d]][0]
                if next_arrival == _INF or t + w[s_w] <= next_arrival + _EPS:
                    choice = ("W", None)
            else:
                choice = ("W", None)
        if choice is None:
            if next_arrival < _INF:
                heapq.heappush(heap, (next_arrival, d))
            continue  # otherwise a producer pushes this device when it schedules its input
        kind, s = choice
        if kind == "B":
            k = nb[s]
            nb[s] = k + 1
            dur = b[s] + w[s] if fused else b[s]
            e = t + dur
            b_end[s][k] = e
            orders[d].append(_new_pass((back_op, s, k)))
            if fused:
                live[d] -= act[s]
                committed[d] -= act[s]
            else:
                wq[d].append((s, k))
            if s > 0:
                e2 = dev[s - 1]
                if e2 != d:
                    heapq.heappush(heap, (max(free[e2], t), e2))
        elif kind == "F":
            k = nf[s]
            nf[s] = k + 1
            e = t + f[s]
            f_end[s][k] = e
            orders[d].append(_new_pass((Op.F, s, k)))
            live[d] += act[s]
            if s == entry[d]:
                committed[d] += need[d]
            if s < S - 1:
                e2 = dev[s + 1]
                if e2 != d:
                    heapq.heappush(heap, (max(free[e2], t), e2))
        else:
            s, k = wq[d][wh[d]]
            wh[d] += 1
            nw[s] += 1
            e = t + w[s]
            orders[d].append(_new_pass((Op.W, s, k)))
            live[d] -= act[s]
            committed[d] -= act[s]
        free[d] = e
        remaining -= 1
        heapq.heappush(heap, (e, d))
    return ListResult(orders, capped)
