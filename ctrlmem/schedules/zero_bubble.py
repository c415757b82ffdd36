"""Handcrafted schedules of the Zero Bubble paper (Qi et al., ICLR 2024, arXiv 2401.10241):
ZB-H1, ZB-H2 (one stage per device) and ZB-V (V-shape placement). They split the backward into
``B`` (input gradient, on the critical path) and ``W`` (weight gradient, free to move), and use
``W`` to fill the bubbles. docs/theory.md §8.
"""

from __future__ import annotations

from collections import deque

from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.schedules.registry import register

__all__ = ["zb_h1", "zb_h2", "zb_v"]


@register("zb-h1", source="Zero Bubble paper §3.1 (ZB-H1); docs/theory.md §8, Fig. 18(c)")
def zb_h1(num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B with the backward split, each device ``i`` deferring ``i`` weight passes.

    Warm-up as 1F1B (``p−1−i`` forwards); in the steady phase ``F, B`` and then the oldest
    pending ``W`` once more than ``i`` are pending; the deferred ``W`` fill the cool-down.
    Peak activation ``p·a`` on every device (as 1F1B); bubble ``(p−1)(F+B−W)``, a third of
    1F1B's when F = B = W.
    """
    p, m = num_devices, num_microbatches
    orders = []
    for i in range(p):
        warm = min(p - 1 - i, m)
        order = [Pass(Op.F, i, k) for k in range(warm)]
        pending: deque[int] = deque()

        def backward(k: int) -> None:
            order.append(Pass(Op.B, i, k))
            pending.append(k)
            if len(pending) > i:
                order.append(Pass(Op.W, i, pending.popleft()))

        for j in range(m - warm):
            order.append(Pass(Op.F, i, warm + j))
            backward(j)
        for k in range(m - warm, m):
            backward(k)
        order += [Pass(Op.W, i, k) for k in pending]
        orders.append(order)
    return Schedule.from_orders("zb-h1", Placement.sequential(p), m, orders)


@register("zb-h2", source="Zero Bubble paper §3.1 (ZB-H2); docs/theory.md §8, Fig. 18(d)")
def zb_h2(num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-H2: extra warm-up forwards and the weight passes pushed to the tail (a parallelogram).

    Built by running the pipeline with unit pass times, each device taking, whenever it is free,
    a ready ``B`` first, else a ready ``F`` while it holds fewer than ``2p−1`` activations, else
    its oldest pending ``W``. The result: ``2(p−1−i)+1`` warm-up forwards on device ``i``,
    ``B``-``F``-``W`` in the steady phase, and the ``W`` of the last microbatches filling the
    cool-down. Peak activation ``(2p−1)·a``; bubble ``(p−1)(F+B−2W)`` when that is ≥ 0, so zero
    bubble for F = B = W.
    """
    p, m = num_devices, num_microbatches
    limit = 2 * p - 1
    f_end = [[-1] * m for _ in range(p)]  # unit-time step at which F(i, k) finishes
    b_end = [[-1] * m for _ in range(p)]
    next_f, next_b, held = [0] * p, [0] * p, [0] * p
    pending: list[deque[int]] = [deque() for _ in range(p)]
    orders: list[list[Pass]] = [[] for _ in range(p)]
    remaining, t = 3 * p * m, 0
    while remaining:
        for i in range(p):
            kb, kf = next_b[i], next_f[i]
            ready_b = kb < m and 0 <= (f_end[i][kb] if i == p - 1 else b_end[i + 1][kb]) <= t
            ready_f = kf < m and held[i] < limit and (i == 0 or 0 <= f_end[i - 1][kf] <= t)
            if ready_b:
                orders[i].append(Pass(Op.B, i, kb))
                b_end[i][kb] = t + 1
                next_b[i] += 1
                pending[i].append(kb)
            elif ready_f:
                orders[i].append(Pass(Op.F, i, kf))
                f_end[i][kf] = t + 1
                next_f[i] += 1
                held[i] += 1
            elif pending[i]:
                orders[i].append(Pass(Op.W, i, pending[i].popleft()))
                held[i] -= 1
            else:
                continue
            remaining -= 1
        t += 1
    return Schedule.from_orders("zb-h2", Placement.sequential(p), m, orders)


@register("zb-v", source="Zero Bubble paper §6 (ZB-V); docs/theory.md §8")
def zb_v(num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-V: V-shape placement (device ``i`` holds stages ``i`` and ``2p−1−i``) at 1F1B memory.

    Device ``i``: ``2(p−i)−1`` forwards of chunk 0; ``i`` pairs ``F1, F0``; ``p−i`` triples
    ``F1, B1, W1``; then the steady phase ``F0, B0, W0, F1, B1, W1``; the cool-down runs ``i``
    pairs ``B0, B1`` with their ``W`` deferred, ``p−i`` pairs ``B0, W0``, and the deferred
    ``W``. The pattern needs ``2p−1`` microbatches; with fewer it is built for ``2p−1`` and the
    passes of the extra microbatches are dropped (which keeps it deadlock-free). Peak ``p·a``,
    zero bubble for F = B = W and ``m ≥ 2p−1``.
    """
    p, m = num_devices, num_microbatches
    n = max(m, 2 * p - 1)
    orders = []
    for i in range(p):
        stage = (i, 2 * p - 1 - i)
        count = {Op.F: [0, 0], Op.B: [0, 0], Op.W: [0, 0]}
        order: list[Pass] = []

        def put(op: Op, chunk: int) -> None:
            k = count[op][chunk]
            count[op][chunk] = k + 1
            if k < m:  # passes of the padding microbatches are dropped
                order.append(Pass(op, stage[chunk], k))

        F, B, W = Op.F, Op.B, Op.W
        for _ in range(2 * (p - i) - 1):
            put(F, 0)
        for _ in range(i):
            put(F, 1), put(F, 0)
        for _ in range(p - i):
            put(F, 1), put(B, 1), put(W, 1)
        f0, f1 = count[F]
        while f1 < f0 or f0 < n:
            if f0 < n:
                put(F, 0)
            put(B, 0), put(W, 0), put(F, 1), put(B, 1), put(W, 1)
            f0, f1 = count[F]
        for _ in range(i):
            put(B, 0), put(B, 1)
        for _ in range(p - i):
            put(B, 0), put(W, 0)
        while count[W][1] < count[B][1]:
            put(W, 1)
        while count[W][0] < count[B][0]:
            put(W, 0)
        orders.append(order)
    return Schedule.from_orders("zb-v", Placement.v_shape(p), m, orders)
