"""DualPipe and DualPipeV (DeepSeek-V3 report, arXiv 2412.19437; github.com/deepseek-ai/DualPipe):
schedules that run one microbatch's forward together with another's backward as one overlapped
unit (:attr:`ctrlmem.Schedule.overlaps`), so that the expert-parallel all-to-all of one hides under
the other's compute (docs/theory.md, DualPipe)."""

from __future__ import annotations

from collections import defaultdict

from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.schedules.registry import register

__all__ = ["dualpipe", "dualpipe_v"]


class _Rank:
    """One rank's order as torch's ``ScheduleDualPipeV`` writes it: per stage, the next forward
    and the next backward microbatch; input backwards queue their weight passes."""

    def __init__(self) -> None:
        self.order: list[Pass] = []
        self.overlaps: list[int] = []
        self.next_f: dict[int, int] = defaultdict(int)
        self.next_b: dict[int, int] = defaultdict(int)
        self.weights: list[tuple[int, int]] = []

    def forward(self, stage: int) -> None:
        self.order.append(Pass(Op.F, stage, self.next_f[stage]))
        self.next_f[stage] += 1

    def backward(self, stage: int, split: bool = False) -> None:
        k = self.next_b[stage]
        self.order.append(Pass(Op.B if split else Op.BW, stage, k))
        self.next_b[stage] += 1
        if split:
            self.weights.append((stage, k))

    def weight(self) -> None:
        if self.weights:
            stage, k = self.weights.pop(0)
            self.order.append(Pass(Op.W, stage, k))

    def overlapped(self, f_stage: int, b_stage: int) -> None:
        self.overlaps.append(len(self.order))
        self.forward(f_stage)
        self.backward(b_stage)


def _dualpipe_v_rank(p: int, m: int, r: int) -> _Rank:
    """Rank ``r``'s order: the eight steps of DualPipeV (torch's ``ScheduleDualPipeV``)."""
    s0, s1 = r, 2 * p - 1 - r
    rank = _Rank()
    for _ in range(2 * (p - r - 1)):  # 1: forwards of the first chunk
        rank.forward(s0)
    for _ in range(r + 1):  # 2: both chunks' forwards
        rank.forward(s0)
        rank.forward(s1)
    for _ in range(p - r - 1):  # 3: zero-bubble input backward, weight, forward of chunk 1
        rank.backward(s1, split=True)
        rank.weight()
        rank.forward(s1)
    for i in range(m - 2 * p + r + 1):  # 4: steady state, F0&B1 then F1&B0
        if i == 0 and r == p - 1:  # the last rank runs its first pair apart (a smaller bubble)
            rank.forward(s0)
            rank.backward(s1)
        else:
            rank.overlapped(s0, s1)
        rank.overlapped(s1, s0)
    for _ in range(p - r - 1):  # 5: B1, then F1&B0
        rank.backward(s1)
        rank.overlapped(s1, s0)
    split = False
    for i in range(r + 1):  # 6: B1 B0, the second half with split backwards
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        rank.backward(s1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        rank.backward(s0, split)
    for _ in range(p - r - 1):  # 7: W, B0
        rank.weight()
        rank.backward(s0, split)
    for _ in range(r + 1):  # 8: the remaining weights
        rank.weight()
    return rank


@register("dualpipe-v", source="DeepSeek-AI, DualPipeV (github.com/deepseek-ai/DualPipe); torch's ScheduleDualPipeV")
def dualpipe_v(num_devices: int, num_microbatches: int) -> Schedule:
    """DualPipeV: V-shape placement, one microbatch's forward overlapped with another's backward.

    Device ``i`` holds stages ``i`` and ``2p−1−i``. Warm-up forwards, a zero-bubble phase, then
    the steady state of overlapped pairs F(chunk 0)&B(chunk 1), F(chunk 1)&B(chunk 0), then the
    cool-down with split backwards on half of the last ones: torch's ``ScheduleDualPipeV`` action
    for action, ``OVERLAP_F_B`` pairs included. Needs ``m ≥ 2p``. Bubble
    ``(p−1)(F&B + B − 3W)`` in chunk times (docs/theory.md, DualPipe); peak ``p + 1`` chunk
    activations of 1F1B's stage size on device 0 (``(p+1)/2·a`` with ``a`` a device-stage).
    """
    p, m = num_devices, num_microbatches
    if m < 2 * p:
        raise ValueError(f"dualpipe-v needs at least as many microbatches as stages (m >= 2p = {2 * p}, as torch's "
                         f"ScheduleDualPipeV), got m={m}; use m={2 * p} or more")
    ranks = [_dualpipe_v_rank(p, m, r) for r in range(p)]
    return Schedule.from_orders("dualpipe-v", Placement.v_shape(p), m, [r.order for r in ranks],
                                overlaps=[r.overlaps for r in ranks])


@register("dualpipe", source="DeepSeek-AI, DeepSeek-V3 technical report (arXiv 2412.19437) §3.2.1; github.com/deepseek-ai/DualPipe")
def dualpipe(num_devices: int, num_microbatches: int) -> Schedule:
    """DualPipe: two copies of the model fed from both ends, forwards overlapped with backwards.

    Microbatches ``0 … m/2−1`` run down the first copy (stages ``0 … p−1``, stage ``s`` on device
    ``s``), microbatches ``m/2 … m−1`` up the second (stages ``p … 2p−1``, stage ``p+u`` on device
    ``p−1−u``): every device holds one stage of each copy, twice 1F1B's parameters. Device ``i`` and
    its mirror ``p−1−i`` run DualPipeV's order for ``p/2`` devices and ``m/2`` microbatches
    (DualPipe's own step loop has that form: half-rank ``min(i, p−1−i)``), the two copies' roles
    swapped between them. Needs even ``p`` and ``m`` with ``m ≥ 2p``. Bubble
    ``(p/2−1)(F&B + B − 3W)`` in stage times, peak ``p + 1`` stage activations (``(p+1)·a``).
    """
    p, m = num_devices, num_microbatches
    if p % 2 or m % 2 or m < 2 * p:
        raise ValueError(f"dualpipe needs an even p, an even m and m >= 2p (DualPipe's own checks), got p={p}, m={m}; "
                         f"use p={p + p % 2}, m={max(2 * (p + p % 2), m + m % 2)}")
    half, h_m = p // 2, m // 2
    orders, overlaps = [], []
    for r in range(p):
        v = _dualpipe_v_rank(half, h_m, min(r, p - 1 - r))
        down_low = r < half  # on the first half, the V's first chunk is the first copy's stage
        orders.append([ps if (ps.stage < half) == down_low else Pass(ps.op, p + ps.stage, h_m + ps.microbatch)
                       for ps in v.order])
        overlaps.append(v.overlaps)
    return Schedule.from_orders("dualpipe", Placement.v_shape(p), m, orders, overlaps=overlaps, model_copies=2)
