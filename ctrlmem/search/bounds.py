"""Lower bounds on the longest device span of any schedule, used to skip work that cannot win.

For a placement, ``m`` microbatches and costs, and a per-device memory cap ``C`` (in ``a``),
every schedule (any order) whose devices peak at most at ``C`` has, on each device ``d``,

* **work**: ``span_d ≥ m · Σ_{s on d} (f_s + b_s + w_s)``: the device runs every pass of its
  stages one after another;
* **memory × time**: an ``F`` of stage ``s`` allocates ``act_s`` at its start and the ``W`` (or
  fused ``BW``) releases it at its end, so microbatch ``k`` holds it at least its lifespan
  ``ℓ_s = f_s + chain_s + b_s + w_s``, where ``chain_s`` is the shortest time from the end of
  ``F(s)`` to the start of ``B(s)``: the forwards of every later stage, the backwards back down
  to ``s + 1``, and the hop latency on each change of device along the way. A device holds
  activations only between the start of its first pass and the end of its last, never more than
  ``C`` at once, so ``C · span_d ≥ ∫ memory_d(t) dt ≥ m · Σ_{s on d} act_s · ℓ_s``.

So ``span ≥ max_d max(work_d, m · Σ_{s on d} act_s ℓ_s / C)``. The second term is what makes
small budgets slow (it is the paper's *repeating bubble* when the budget is below what the
lifespans need, docs/theory.md §3); it decreases as ``C`` grows, which is what the search uses:
a cap whose bound exceeds the best span found cannot hold the winner. docs/theory.md §6 has the
bound's derivation and the tighter additive bounds of the cool-down and warm-up.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

from ..costs import Costs
from ..ir import Placement

__all__ = ["span_bound", "lifespans"]


def lifespans(placement: Placement, costs: Costs) -> list[float]:
    """Each stage's shortest activation lifespan ``ℓ_s`` under ``costs`` (see the module docstring)."""
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    comm = float(costs.comm)
    dev = placement.stage_device
    out = [0.0] * S
    after = 0.0  # chain from the end of F(s) to the start of B(s), built from the last stage down
    for s in range(S - 1, -1, -1):
        if s < S - 1:
            hop = comm if dev[s] != dev[s + 1] else 0.0
            # F(s) -> [hop] F(s+1) ... F(S-1) -> B(S-1) ... B(s+1) -> [hop] B(s)
            after = after + f[s + 1] + b[s + 1] + 2 * hop
        out[s] = f[s] + after + b[s] + w[s]
    return out


@lru_cache(maxsize=256)
def _terms(placement: Placement, m: int, costs: Costs) -> tuple[tuple[float, float], ...]:
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    act = p / S
    life = lifespans(placement, costs)
    out = []
    for d in range(p):
        st = placement.stages_of(d)
        work = m * math.fsum(f[s] + b[s] + w[s] for s in st)
        held = m * math.fsum(act * life[s] for s in st)
        out.append((work, held))
    return tuple(out)


def span_bound(placement: Placement, m: int, costs: Costs) -> Callable[[float], float]:
    """``bound(cap)``: a lower bound on the longest device span of any schedule of ``placement``
    and ``m`` microbatches under ``costs`` whose devices peak at most at ``cap`` (``a``); the
    default memory model (each stage's activation ``p/S``, released at its ``W``)."""
    terms = _terms(placement, m, costs)

    def bound(cap: float) -> float:
        if cap <= 0:
            return math.inf
        return max(max(work, held / cap) for work, held in terms) * (1 - 1e-12)

    return bound
