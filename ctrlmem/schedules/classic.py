"""Classic fused-backward schedules: GPipe, 1F1B, interleaved 1F1B and looped BFS (docs/theory.md §8)."""

from __future__ import annotations

from dataclasses import replace

from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.model.levers import with_recompute
from ctrlmem.schedules.registry import register

__all__ = ["gpipe", "one_f_one_b", "one_f_one_b_r", "interleaved_1f1b", "looped_bfs"]


@register("gpipe", source="Huang et al., GPipe (2019); docs/theory.md §8, Fig. 18(e)")
def gpipe(num_devices: int, num_microbatches: int) -> Schedule:
    """GPipe: every device runs all forwards, then all fused backwards (peak memory m·a).

    Device ``i`` holds stage ``i``; order ``F0 … F(m−1), BW0 … BW(m−1)``.
    """
    p, m = num_devices, num_microbatches
    orders = [
        [Pass(Op.F, i, k) for k in range(m)] + [Pass(Op.BW, i, k) for k in range(m)]
        for i in range(p)
    ]
    return Schedule.from_orders("gpipe", Placement.sequential(p), m, orders)


@register("1f1b", source="Narayanan et al., PipeDream-Flush (2021); docs/theory.md §8, Fig. 1(a)")
def one_f_one_b(num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B: warm-up forwards, then one forward one fused backward, then the cool-down.

    Device ``i`` runs ``min(p−1−i, m)`` warm-up forwards, alternates ``F``/``BW`` in the steady
    phase and drains the remaining backwards. Peak activation ``p·a`` on device 0 (for m ≥ p);
    bubble ``(p−1)(F+B+W)`` on device 0.
    """
    p, m = num_devices, num_microbatches
    orders = []
    for i in range(p):
        warm = min(p - 1 - i, m)
        order = [Pass(Op.F, i, k) for k in range(warm)]
        for j in range(m - warm):
            order += [Pass(Op.F, i, warm + j), Pass(Op.BW, i, j)]
        order += [Pass(Op.BW, i, k) for k in range(m - warm, m)]
        orders.append(order)
    return Schedule.from_orders("1f1b", Placement.sequential(p), m, orders)


@register("1f1b-r", source="Qi et al. 2024 (this paper) Tables 3-4, Fig. 6-7 (1F1B-R); Korthikanti et al. 2022; "
                            "docs/theory.md §13")
def one_f_one_b_r(num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B-R: 1F1B with full recomputation, an ``R`` of every forward right before its ``BW``.

    Peak ``a(1 + (p−1)κ)`` on device 0 (κ = ``Costs.input_fraction``, 2/34 for a GPT layer); with
    comm 0 the makespan is 1F1B's ``(m+p−1)(F+B+W)`` plus ``m·R``: one recompute per microbatch on
    the critical path (docs/theory.md §13).
    """
    return replace(with_recompute(one_f_one_b(num_devices, num_microbatches), "full"), name="1f1b-r")


def microbatch_groups(num_devices: int, num_microbatches: int) -> int:
    """Group size of interleaved schedules: torch's rule, ``m // max(1, m // p)`` microbatches
    per round; ``m`` must be a multiple of the number of rounds."""
    p, m = num_devices, num_microbatches
    rounds = max(1, m // p)
    if m % rounds:
        lo, hi = rounds * (m // rounds), rounds * (m // rounds + 1)
        raise ValueError(
            f"interleaved schedules split the {m} microbatches into {rounds} equal rounds of at "
            f"least p={p}; {m} is not a multiple of {rounds}: use m={lo} or m={hi} (any multiple "
            f"of p works)"
        )
    return m // rounds


@register(
    "interleaved-1f1b",
    source="Narayanan et al., Megatron-LM interleaved schedule (SC 2021); docs/theory.md §8, App. G",
)
def interleaved_1f1b(num_devices: int, num_microbatches: int, num_chunks: int = 2) -> Schedule:
    """Interleaved 1F1B (Megatron's order): ``v = num_chunks`` stages per device, looped placement.

    Device ``i`` holds stages ``i, i+p, …``. Microbatches go in rounds of ``g`` (``g = p`` when
    ``m`` is a multiple of ``p``); forward virtual step ``k`` runs chunk ``(k // g) mod v`` of
    microbatch ``(k // gv)·g + k mod g``, backwards visit the chunks in reverse. Warm-up is
    ``2(p−1−i) + (v−1)·g`` forwards, then 1F1B on virtual steps. Bubble ``(p−1)(F+B+W)/v`` for
    ``m`` a multiple of ``p``.
    """
    p, m, v = num_devices, num_microbatches, num_chunks
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
    g = microbatch_groups(p, m)
    total = v * m

    def fwd(k: int, i: int) -> Pass:
        chunk = (k // g) % v
        return Pass(Op.F, chunk * p + i, (k // (g * v)) * g + k % g)

    def bwd(k: int, i: int) -> Pass:
        chunk = v - 1 - (k // g) % v
        return Pass(Op.BW, chunk * p + i, (k // (g * v)) * g + k % g)

    orders = []
    for i in range(p):
        warm = min(2 * (p - 1 - i) + (v - 1) * g, total)
        order = [fwd(k, i) for k in range(warm)]
        for j in range(total - warm):
            order += [fwd(warm + j, i), bwd(j, i)]
        order += [bwd(k, i) for k in range(total - warm, total)]
        orders.append(order)
    return Schedule.from_orders(
        "interleaved-1f1b", Placement.interleaved(p, v), m, orders, params={"num_chunks": v}
    )


@register("looped-bfs", source="Lamy-Poirier, Breadth-First Pipeline Parallelism (MLSys 2023); torch's ScheduleLoopedBFS")
def looped_bfs(num_devices: int, num_microbatches: int, num_chunks: int = 2) -> Schedule:
    """Looped BFS: ``v = num_chunks`` stages per device (looped placement), breadth first.

    Device ``i`` holds stages ``i, i+p, …``; it runs the forwards of every microbatch on its
    lowest stage, then on the next, and so on, then the fused backwards stage by stage from its
    highest, microbatches in reverse (``m−1`` first): torch's ``ScheduleLoopedBFS`` action for
    action. Peak activation ``v·m`` chunks (``m·a``), like GPipe.
    """
    p, m, v = num_devices, num_microbatches, num_chunks
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
    orders = []
    for i in range(p):
        stages = range(i, p * v, p)
        order = [Pass(Op.F, s, k) for s in stages for k in range(m)]
        order += [Pass(Op.BW, s, k) for s in reversed(stages) for k in reversed(range(m))]
        orders.append(order)
    return Schedule.from_orders("looped-bfs", Placement.interleaved(p, v), m, orders, params={"num_chunks": v})
