"""Compare ctrlmem's schedules with published scheduler outputs, record by record.

A *reference record* is a dict with the keys ``schedule`` (the reference's name: ``1F1B``,
``ZB-H1``, ``ZB-H2``, ``ZB-1P``, ``ZB-2P``, ``ZB-V``, ``V-Min``, ``V-Half``, ``1F1B-V``,
``V-Auto``), ``p``, ``m``, ``F``, ``B``, ``W``, ``C`` (full-stage pass times and the hop
latency), ``memory_limit`` (fraction of 1F1B's peak for memory-limited schedulers, else
``None``), ``max_span`` (the longest device span) and ``peak_mem_a`` (peak activation in ``a``).

:func:`compare_record` builds the matching ctrlmem schedule for the same costs and returns our
longest span and peak next to the reference's, and the memory we were allowed: the reference's
own peak for the fixed patterns, the budget for the memory-limited schedulers (``v-shape`` for
``V-Auto`` and ``ZB-V``, ``zb`` for ``ZB-1P`` / ``ZB-2P``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from ctrlmem.model.costs import Costs
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules.registry import build

__all__ = ["OURS", "Comparison", "compare_record", "summarize"]

#: reference name -> (our schedule, takes the record's memory_limit?)
OURS: dict[str, tuple[str, bool]] = {
    "1F1B": ("1f1b", False),
    "ZB-H1": ("zb-h1", False),
    "ZB-H2": ("zb-h2", False),
    "ZB-1P": ("zb", True),
    "ZB-2P": ("zb", True),
    "ZB-V": ("v-shape", True),
    "V-Min": ("v-min", False),
    "V-Half": ("v-half", False),
    "1F1B-V": ("1f1b-v", False),
    "V-Auto": ("v-shape", True),
}


@dataclass(frozen=True)
class Comparison:
    """One reference record next to ours.

    ``ratio`` is our longest device span over the reference's; ``allowed`` the peak we may use
    (in ``a``); ``fits`` whether our peak is within it.
    """

    record: Mapping
    ours: str
    max_span: float
    peak: float
    allowed: float

    @property
    def ratio(self) -> float:
        return self.max_span / float(self.record["max_span"])

    @property
    def fits(self) -> bool:
        return self.peak <= self.allowed + 1e-9


def compare_record(record: Mapping) -> Comparison:
    """Build our schedule for ``record``'s inputs and simulate it under its costs."""
    name = record["schedule"]
    if name not in OURS:
        raise ValueError(f"no ctrlmem schedule corresponds to reference schedule {name!r}; known: {', '.join(OURS)}")
    ours, limited = OURS[name]
    p, m = int(record["p"]), int(record["m"])
    costs = Costs(record["F"], record["B"], record["W"], record.get("C", 0.0) or 0.0)
    limit = record.get("memory_limit") if limited else None
    sched = build(ours, p, m, costs=costs, memory_limit=limit)
    r = simulate(sched, costs)
    allowed = limit * p if limit is not None else float(record["peak_mem_a"])
    return Comparison(record, ours, max(r.device_spans), max(r.peak_memory), allowed)


def summarize(comparisons: Iterable[Comparison], tolerance: float = 0.01) -> dict[str, dict]:
    """Per reference schedule: cases, worse (ratio > 1 + tolerance or over memory), better
    (ratio < 1 − tolerance), geometric-mean ratio, worst ratio."""
    out: dict[str, dict] = {}
    for c in comparisons:
        key = c.record["schedule"]
        s = out.setdefault(key, {"ours": c.ours, "cases": 0, "worse": 0, "better": 0, "over_memory": 0,
                                 "_log": 0.0, "worst": 0.0, "worst_case": None})
        s["cases"] += 1
        s["_log"] += math.log(c.ratio)
        if not c.fits:
            s["over_memory"] += 1
        if c.ratio > 1 + tolerance or not c.fits:
            s["worse"] += 1
        elif c.ratio < 1 - tolerance:
            s["better"] += 1
        if c.ratio > s["worst"]:
            r = c.record
            s["worst"] = c.ratio
            s["worst_case"] = (f"p={r['p']} m={r['m']} F:B:W:C={r['F']:g}:{r['B']:g}:{r['W']:g}:{r['C']:g}"
                               + (f" limit={r['memory_limit']:g}" if r.get("memory_limit") is not None else ""))
    for s in out.values():
        s["geomean"] = math.exp(s.pop("_log") / s["cases"])
    return out
