"""Candidate families of the searches (:mod:`ctrlmem.search`): one small module per family.

A family is a :class:`ctrlmem.search.Family`: given a query (placement, ``m``, costs, memory cap)
it yields candidate sets, keeping what does not depend on the costs in its own caches. Which
families each search runs, in which order (earlier candidates win ties), is a recipe of the
schedules that use them: :mod:`ctrlmem.schedules.recipes`. A family knows no named schedule; one
that seeds from fixed schedules (ZB-V, ZB-H1/H2) takes their generators as arguments.

* :mod:`.paperblocks` — the paper's V-Min / V-Half / V-ZB blocks, ZB-V, offset-level mixes;
* :mod:`.costblocks` — V blocks laid out in the costs' own slots;
* :mod:`.grid` — the paper's App. A framework (device-0 patterns × two offset levels);
* :mod:`.zbv` — the Zero Bubble paper's cost-aware ZB-V greedy;
* :mod:`.fused` — the paper's App. I construction of 1F1B-V (fused backward);
* :mod:`.lists` — cost-aware list schedules under a memory cap (any placement, fused or split);
* :mod:`.fillahead` — list schedules whose devices run a higher stage's forward before a lower
  stage's backward (small V-shape pipelines; what the solver's optima at p ≤ 4 do);
* :mod:`.polish` — neighbour-swap hill-climbing of the best at each cap (small pipelines);
* :mod:`.relocate` — the best at each cap with single passes moved over several positions, with
  kicks (small pipelines; what the solver's optima at p ≤ 4 do, docs/theory.md §12);
* :mod:`.fillahead` (``forward-first``, the periodic family's seeds) — list schedules whose devices
  run any ready forward that fits before a ready backward (small V-shape pipelines; the optima's
  stable phase at p ≤ 4);
* :mod:`.periodic` — the best at each cap with a pass of every later microbatch moved at once
  (the same move in each period), then single relocations; only what is no longer in makespan than
  the others' best (small pipelines; last in the V-shape and ``zb`` searches; docs/theory.md §12);
* :mod:`.lahc` — late-acceptance hill climbing from the best at each cap: moves through
  schedules that are not yet shorter (small pipelines; last in the V-shape and ``zb`` searches;
  docs/theory.md §12); for medium V-shape pipelines (``64 < p·m <= 256``) one climb at each quarter
  of 1F1B's memory, then a longer one at ¼, ⅜, ½ of it, last of all (``zb``: the longer one);
* :mod:`.cyclic` — the building block searched for its shortest period under the exact periodic
  peak (the arcs of its stages' lifespans placed apart), repeated (any size; last in the V-shape and
  ``zb`` searches; docs/theory.md §12);
* :mod:`.sequential` — ZB-H1/H2 and the ZB greedy on one stage per device (``zb``).
"""

from ctrlmem.search.families.costblocks import CostBlockFamily
from ctrlmem.search.families.cyclic import CyclicFamily
from ctrlmem.search.families.fillahead import FillAheadFamily, ForwardFirstFamily
from ctrlmem.search.families.fused import FusedConstructionFamily
from ctrlmem.search.families.grid import GridFamily
from ctrlmem.search.families.lahc import LateAcceptanceFamily, LongLateAcceptanceFamily, MediumLateAcceptanceFamily
from ctrlmem.search.families.lists import ListFamily
from ctrlmem.search.families.paperblocks import BlockFamily
from ctrlmem.search.families.periodic import PeriodicFamily
from ctrlmem.search.families.polish import PolishFamily
from ctrlmem.search.families.relocate import RelocateFamily
from ctrlmem.search.families.sequential import ZBCapFamily, ZBFixedFamily
from ctrlmem.search.families.zbv import ZBVFamily

__all__ = ["BlockFamily", "CostBlockFamily", "CyclicFamily", "FillAheadFamily", "ForwardFirstFamily", "FusedConstructionFamily",
           "GridFamily", "LateAcceptanceFamily", "ListFamily", "LongLateAcceptanceFamily", "MediumLateAcceptanceFamily", "PeriodicFamily", "PolishFamily", "RelocateFamily",
           "ZBCapFamily", "ZBFixedFamily", "ZBVFamily"]
