"""Recipes: which candidate families each search of :mod:`ctrlmem.schedules.budgeted` runs, in
order (earlier candidates win ties). The families are plug-ins of the search engine
(:mod:`ctrlmem.search.families`); the fixed schedules some of them seed from (ZB-V, ZB-H1, ZB-H2)
are passed in here, so the engine and its families know no named schedule.

A new family is a module in :mod:`ctrlmem.search.families` and one entry in a list below.
"""

from __future__ import annotations

from ctrlmem.schedules.zero_bubble import zb_h1, zb_h2, zb_v
from ctrlmem.search.families import (
    BlockFamily, CostBlockFamily, CyclicFamily, FillAheadFamily, ForwardFirstFamily, FusedConstructionFamily, GridFamily,
    LateAcceptanceFamily, ListFamily, LongLateAcceptanceFamily, MediumLateAcceptanceFamily, PeriodicFamily, PolishFamily, RelocateFamily, ZBCapFamily, ZBFixedFamily,
    ZBVFamily,
)
from ctrlmem.search.families.lahc import SMALL_LONG_MIN_P

__all__ = ["V_SPLIT", "V_FUSED", "SEQUENTIAL"]

_LISTS = ListFamily()
_BASE = [BlockFamily(fixed=[("zb-v", zb_v)]), CostBlockFamily(), GridFamily(), ZBVFamily(), _LISTS, FillAheadFamily()]

_POLISH = PolishFamily(_BASE)
_RELOCATE = RelocateFamily(_BASE + [_POLISH])
_FIRST = ForwardFirstFamily()
#: the split-backward V-shape search (``v-shape``, ``v-min``, ``v-half``, ``v-zb``); the
#: periodic family (seeded with the forward-first one) and the late-acceptance one come last, so
#: the others' results are unchanged
_PERIODIC = PeriodicFamily(_BASE + [_POLISH, _RELOCATE], seeds=[_FIRST])
V_SPLIT = _BASE + [_POLISH, _RELOCATE, _PERIODIC, LateAcceptanceFamily(_BASE + [_POLISH, _RELOCATE, _PERIODIC]),
           CyclicFamily()]
#: medium pipelines (64 < p·m <= 256): one late-acceptance climb at each quarter of 1F1B's memory, from
#: the best of every family above, then a longer one from the best of all (patient: on until an
#: eighth of its timings brings no new best, at every cap from 1/4 to 1/2); last, so theirs are unchanged
V_SPLIT.append(MediumLateAcceptanceFamily(list(V_SPLIT)))
V_SPLIT.append(LongLateAcceptanceFamily(list(V_SPLIT), small_min_p=SMALL_LONG_MIN_P, patient=True))
#: cyclic blocks in finer slots where two a pass miss the costs: after the climbs, so their starts
#: (and results) are unchanged and a finer block only adds a candidate
V_SPLIT.append(CyclicFamily(finer=True))
#: blocks of two microbatches, each its own layout, from the one-microbatch blocks of both
#: resolutions: last of all, so everything above is unchanged and they only add candidates
V_SPLIT += [CyclicFamily(copies=2), CyclicFamily(finer=True, copies=2)]
#: the fused-backward V-shape search (``1f1b-v``)
V_FUSED = [FusedConstructionFamily(), _LISTS]
#: one stage per device (``zb``)
_ZB = [ZBFixedFamily(fixed=[("zb-h1", zb_h1), ("zb-h2", zb_h2)]), ZBCapFamily()]
_ZB_RELOCATE = RelocateFamily(_ZB)
_ZB_PERIODIC = PeriodicFamily(_ZB + [_ZB_RELOCATE])
SEQUENTIAL = _ZB + [_ZB_RELOCATE, _ZB_PERIODIC, LateAcceptanceFamily(_ZB + [_ZB_RELOCATE, _ZB_PERIODIC]), CyclicFamily()]
#: medium pipelines: the longer climb only (zb's other families take 0.01-0.02 s)
SEQUENTIAL.append(LongLateAcceptanceFamily(list(SEQUENTIAL)))
SEQUENTIAL += [CyclicFamily(finer=True), CyclicFamily(copies=2), CyclicFamily(finer=True, copies=2)]
