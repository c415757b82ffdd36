"""Memory-budgeted schedules: the adaptive V-shape search ``v-shape`` (docs/theory.md §10, App. A/B)
and the Zero Bubble paper's memory-limited automatic scheduler ``zb`` (ZB-1P / ZB-2P,
docs/theory.md §8, §6), both run by the search engine (:mod:`ctrlmem.search`).

``memory_limit`` is a fraction of 1F1B's peak activation ``p·a`` throughout: 1.0 is 1F1B's
memory, 0.5 half of it, 2.0 twice it. Both generators take ``costs`` and return, among the
candidates of their families, the one with the shortest longest device span (the basis of the
paper's bubble rate; ties go to the shorter makespan, then the lower peak) whose peak (default
:class:`~ctrlmem.model.costs.MemoryModel`) is within the limit, timed exactly as
:func:`ctrlmem.simulate` times it (per-stage lists and ``comm`` included).

The V-shape families (:mod:`ctrlmem.search.families`), searched in this order:

* **building blocks**: the V-Min, V-Half and V-ZB blocks, ZB-V, and (for ``p <= 12``) blocks
  whose device links mix two offset levels;
* **blocks laid out in the costs' own slots**;
* **the paper's App. A framework** (device-0 patterns × two offset levels, repeated, warm-up and
  cool-down rewritten under the peak, idle slots filled; it reproduces the authors' adaptive
  scheduler and meets the lower bound of docs/theory.md §6 with F = B = W), for ``p <= 24``;
* **the cost-aware ZB-V greedy** at 1F1B's memory;
* **cost-aware list schedules** under a per-device activation cap, at every half-a step from
  one microbatch (``a``, the smallest feasible budget: ``1/p``) up to the budget (every
  ``⌈p/12⌉``-th above p = 12), under several tie-breaking policies; they fill the budgets
  above 1F1B's (up to 2× and beyond) and the costs the unit-slot blocks do not suit;
* for small pipelines (``p·m <= 64``), the best schedule at each cap polished by neighbour swaps,
  relocated passes, periodic moves and late-acceptance hill climbing (docs/theory.md §11–§12);
  for medium ones (``64 < p·m <= 256``), one late-acceptance climb at each quarter of 1F1B's
  memory up to the budget, then a longer one at ¼, ⅜, ½ of it (its length scaled to ``p·m``).

``objective="makespan"`` ranks by makespan first instead of the longest span (docs/theory.md §11).

Each family's candidates for a budget contain those of every smaller budget, so the result
never gets slower as the budget grows (monotone by construction). The named schedules
``v-min``, ``v-half``, ``v-zb`` search the same families at their own memory level
(:mod:`ctrlmem.schedules.v_shape`), so they are never slower than ``v-shape`` at that peak.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement, Schedule
from ctrlmem.search import Query, search
from ctrlmem.search.bounds import span_bound
from ctrlmem.search.encoding import CandidateSet
from ctrlmem.search.engine import OBJECTIVES, Found, Incumbent, timed
from ctrlmem.schedules.recipes import SEQUENTIAL, V_FUSED, V_SPLIT
from ctrlmem.schedules.registry import register

__all__ = ["v_shape", "zb", "min_v_shape_limit", "v_shape_candidates", "VShapeCandidate", "search_v"]

log = logging.getLogger(__name__)

_EPS = 1e-9


def min_v_shape_limit(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> float:
    """The smallest memory limit (fraction of 1F1B's peak) the ``v-shape`` search meets: one
    microbatch's activation per device, ``a``, so ``1/p``."""
    _check_v(num_devices, num_microbatches)
    return 1.0 / num_devices


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


def _objective(objective: object) -> str:
    if objective not in OBJECTIVES:
        raise ValueError(
            f"objective={objective!r} is not an objective of the search; use 'span' (the longest device "
            "span, the paper's bubble-rate basis: the default) or 'makespan' (the end of the last pass, all "
            "devices starting together: the iteration time when the optimizer step synchronises them)"
        )
    return str(objective)


def _query(placement: Placement, m: int, costs: Costs, cap: float, fused: bool, objective: str = "span") -> Query:
    return Query(placement, m, costs, cap, fused, span_bound(placement, m, costs), objective)


def _search(q: Query, families, first: list[CandidateSet]) -> Found | None:
    """:func:`~ctrlmem.search.search`; with the makespan objective, what the families whose
    candidates follow the objective (the small-pipeline climbs) give for the span is tried too:
    so asking for the makespan never gives a longer one than the default, and stays monotone in
    the budget (each family's span candidates for a cap include every smaller cap's)."""
    if q.by_makespan:
        span_q = dataclasses.replace(q, objective="span")
        first = [*first, *(cs for fam in families if fam.by_objective for cs in fam.sets(span_q, Incumbent()))]
    return search(q, families, first=first)


def search_v(p: int, m: int, costs: Costs, cap: float, fused: bool = False,
             first: CandidateSet | None = None, objective: str = "span") -> Found | None:
    """The V-shape search within ``cap`` (``a``) under ``costs``: the split-backward families
    (or the fused ones), ``first`` tried first (it wins ties); ranked by ``objective``."""
    q = _query(Placement.v_shape(p), m, costs, cap, fused, objective)
    return _search(q, V_FUSED if fused else V_SPLIT, [first] if first is not None else [])


@register("v-shape", source="Qi et al. 2024 (this paper) App. A/B, Fig. 9–10; docs/theory.md §10 (adaptive V-Shape scheduler)")
def v_shape(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    objective: str = "span",
) -> Schedule:
    """Adaptive V-shape schedule: the shortest longest-span schedule within ``memory_limit``.

    Searches the V-shape candidate families under the given costs (per-stage and unequal
    costs, ``comm`` included), every candidate timed exactly: building blocks (V-Min, V-Half,
    V-ZB, ZB-V, offset-level mixes), blocks laid out in the costs' own slots, the paper's App. A
    framework (device-0 patterns × two offset levels, repeated, warm-up and cool-down rewritten
    under the peak, idle slots filled), the cost-aware ZB-V greedy at 1F1B's memory, and
    cost-aware list schedules under a per-device activation cap at every half-a step up to the
    limit (see :mod:`ctrlmem.schedules.budgeted`). The result is the candidate with the shortest
    longest device span (so the lowest bubble rate), then the shortest makespan, whose peak is
    at most ``memory_limit · p · a`` (default 1.0). Any limit from ``1/p`` (one microbatch per
    device) up works, 2.0 and beyond included; a larger limit never gives a slower schedule.

    ``objective="makespan"`` ranks by makespan first instead (the end of the last pass with
    every device starting together: the iteration time when the optimizer step synchronises the
    devices; ties: the longest span). The two differ only where devices start or end at
    different times by more than the bubbles inside, as with a hop latency (``comm``).

    Raises ``ValueError`` below ``1/p``, naming the smallest feasible limit.
    """
    p, m = num_devices, num_microbatches
    _check_v(p, m)
    limit = 1.0 if memory_limit is None else float(memory_limit)
    costs = costs if costs is not None else Costs()
    objective = _objective(objective)
    found = search_v(p, m, costs, limit * p, objective=objective)
    if found is None:
        raise ValueError(
            f"memory_limit={limit:g} is below what any V-shape schedule reaches for p={p}, m={m}: the "
            f"smallest feasible limit is {1 / p:.6g} (one microbatch's activation a per device, of "
            f"1F1B's p·a); raise memory_limit to at least {1 / p:.6g}"
        )
    log.debug("v-shape p=%d m=%d limit=%g: %s (span %g, peak %g a)", p, m, limit, found.label, found.span, found.peak)
    params = {"memory_limit": limit, "block": found.label}
    if objective != "span":
        params["objective"] = objective
    return found.schedule("v-shape", params)


class VShapeCandidate:
    """One candidate of the search, simulated: ``label``, ``schedule``, ``makespan``,
    ``peak`` (``a``), ``max_span``, and ``memory_fraction`` (peak / ``p``)."""

    __slots__ = ("label", "schedule", "makespan", "peak", "max_span")

    def __init__(self, label: str, schedule: Schedule, makespan: float, peak: float, max_span: float):
        self.label, self.schedule, self.makespan, self.peak, self.max_span = label, schedule, makespan, peak, max_span

    @property
    def memory_fraction(self) -> float:
        return self.peak / self.schedule.num_devices

    def __repr__(self) -> str:
        return f"VShapeCandidate({self.label!r}, span={self.max_span:g}, peak={self.peak:g})"


def v_shape_candidates(
    num_devices: int, num_microbatches: int, costs: Costs | None = None, memory_limit: float = 1.0,
    fused: bool = False,
) -> list[VShapeCandidate]:
    """Every candidate the ``v-shape`` search (``fused=True``: the fused-backward one of
    ``1f1b-v``) considers for ``memory_limit``, within it or not, each as a
    :class:`VShapeCandidate` (for inspection and tests: it makes a ``Schedule`` of every one)."""
    _check_v(num_devices, num_microbatches)
    p, m = num_devices, num_microbatches
    costs = costs if costs is not None else Costs()
    q = Query(Placement.v_shape(p), m, costs, memory_limit * p, fused)  # no bound: nothing skipped
    out = []
    for fam in (V_FUSED if fused else V_SPLIT):
        for cs in fam.sets(q, Incumbent()):
            tm = timed(cs, costs)
            for i in range(len(cs)):
                if math.isfinite(tm.span[i]):
                    out.append(VShapeCandidate(cs.labels[i], cs.schedule(i, "v-shape"), float(tm.makespan[i]),
                                               float(cs.peak[i]), float(tm.span[i])))
    return out


# --------------------------------------------------------------------------------------------
# Memory-limited zero bubble (one stage per device)


@register("zb", source="Zero Bubble paper §4 (automatic scheduling, ZB-1P/ZB-2P); docs/theory.md §8, §6")
def zb(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    objective: str = "span",
) -> Schedule:
    """Memory-limited automatic zero-bubble schedule, one stage per device (ZB-1P at
    ``memory_limit=1.0``, ZB-2P at ``2.0``; docs/theory.md §8, Table 4, Fig. 7).

    Greedy list schedules in the spirit of the Zero Bubble paper's heuristic: each device,
    whenever it is free, runs a ready ``B`` first (it is on the critical path), else a ready
    ``F`` while it holds fewer activations than its cap, else a pending ``W`` to fill the gap.
    Several tie policies (W as filler only, W eagerly, W only when it ends before the next input
    is due, and those of :mod:`ctrlmem.search.families.lists`) run at every cap from one
    activation up to ``⌊memory_limit · p⌋`` (on a grid for ``p > 12``), next to the handcrafted
    ZB-H1 (peak p·a) and ZB-H2 (peak (2p−1)·a) orders; each is timed under ``costs`` and the
    shortest longest span (then makespan) within the limit wins, so a larger limit never gives a
    slower schedule. The best at each cap are then improved as on the V-shape (docs/theory.md
    §11–§12): relocated passes, periodic moves and late-acceptance climbs for small pipelines
    (``p·m <= 64``), cyclic blocks at any size, and one longer late-acceptance climb at ¼, ⅜ and ½
    of 1F1B's memory for medium ones (``64 < p·m <= 256``). Default limit 1.0 (ZB-1P).
    ``objective="makespan"``: ranked by makespan first, as :func:`v_shape`.
    """
    p, m = num_devices, num_microbatches
    limit = 1.0 if memory_limit is None else float(memory_limit)
    top = math.floor(limit * p + _EPS)
    if top < 1:
        raise ValueError(
            f"memory_limit={limit:g} lets a device hold no activation at all (p={p}); the smallest "
            f"feasible limit is {1 / p:.6g} (one microbatch in flight); ZB-1P is 1.0 and ZB-2P 2.0"
        )
    costs = costs if costs is not None else Costs()
    objective = _objective(objective)
    q = _query(Placement.sequential(p), m, costs, limit * p, False, objective)
    found = _search(q, SEQUENTIAL, [])
    params = {"memory_limit": limit, "policy": found.label}
    if objective != "span":
        params["objective"] = objective
    return found.schedule("zb", params)
