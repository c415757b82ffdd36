"""Polished candidates for small pipelines: the best schedule at each cap, improved by swapping
neighbouring passes of a device (the paper's reordering, App. C, with the real costs).

For pipelines of at most :data:`POLISH_MAX_PM` passes per stage pair (``p·m``), at each cap of
the list family's grid up to 1F1B's memory, the best candidate the other families give within
that cap (the polished ones of smaller caps included), and the best of each family on its own, are
hill-climbed: a swap of two
neighbouring passes of a device is kept when the schedule still runs (no deadlock), its peak stays
within the cap and it gets shorter (longest span, then makespan, then the sum of the spans), for at
most :data:`POLISH_EVALS` timings per cap. Monotone: a cap's polished candidates include every
smaller cap's.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.encoding import CandidateSet, tables
from ctrlmem.search.engine import Query, search
from ctrlmem.search.kernels import kernel, lex_less3
from ctrlmem.search.timing import asap, durations
from ctrlmem.search.families.lists import PerCapFamily

__all__ = ["PolishFamily", "POLISH_MAX_PM", "POLISH_EVALS", "polish_keys"]

POLISH_MAX_PM = 64
POLISH_EVALS = 800


@kernel(inline=True)
def _level_peak(row, delta):  # pragma: no cover - compiled
    level = 0.0
    top = 0.0
    for k in row:
        level += delta[k]
        if level > top:
            top = level
    return top


@kernel
def _polish(keys, dep, cross, dur, comm, delta, kind, stage, m, cap, max_evals):  # pragma: no cover - compiled
    """Hill-climb ``keys`` (one candidate, ``[1, p, L]``) in place; returns 1 if it improved."""
    p = keys.shape[1]
    L = keys.shape[2]
    span = np.empty(1)
    make = np.empty(1)
    total = np.empty(1)
    asap(keys, dep, cross, dur, comm, span, make, total)
    b0, b1, b2 = span[0], make[0], total[0]
    evals = 0
    improved = True
    changed = 0
    while improved and evals < max_evals:
        improved = False
        for d in range(p):
            for i in range(L - 1):
                if evals >= max_evals:
                    break
                a = keys[0, d, i]
                b = keys[0, d, i + 1]
                if stage[a] == stage[b] and (a % m == b % m or kind[a] == kind[b]):
                    continue  # a pass and its own input, or a relabelling of identical microbatches
                keys[0, d, i] = b
                keys[0, d, i + 1] = a
                evals += 1
                ok = _level_peak(keys[0, d], delta) <= cap + 1e-9
                if ok:
                    asap(keys, dep, cross, dur, comm, span, make, total)
                    ok = np.isfinite(span[0]) and lex_less3(span[0], make[0], total[0], b0, b1, b2)
                if ok:
                    b0, b1, b2 = span[0], make[0], total[0]
                    improved = True
                    changed = 1
                else:
                    keys[0, d, i] = a
                    keys[0, d, i + 1] = b
    return changed


def polish_keys(cs: CandidateSet, index: int, costs, cap: float, max_evals: int = POLISH_EVALS) -> CandidateSet | None:
    """Candidate ``index`` of ``cs`` polished under ``cap`` (``a``); ``None`` if no swap helped."""
    t = tables(cs.placement, cs.m, cs.fused)
    keys = cs.keys[index : index + 1].copy()
    dur = durations(cs.placement, cs.m, cs.fused, costs)
    if not _polish(keys, t.dep, t.cross, dur, float(costs.comm), t.delta, t.kind, t.stage, cs.m, float(cap), int(max_evals)):
        return None
    return CandidateSet(cs.placement, cs.m, cs.fused, keys, (cs.labels[index] + " polished",))


class PolishFamily(PerCapFamily):
    """See the module docstring; ``others`` are the families whose best is polished."""

    name = "polish"

    def applies(self, q: Query) -> bool:
        return not q.fused and q.placement.num_devices * q.m <= POLISH_MAX_PM

    def top(self, q: Query, base: int) -> int:
        return min(int(np.floor(q.cap * base + 1e-9)), base * q.placement.num_devices, base * q.m)

    def at_cap(self, sub: Query, done: list[CandidateSet]) -> tuple[CandidateSet, ...]:
        return self._polished(sub, done, sub.cap)

    def _polished(self, sub: Query, done: list[CandidateSet], cap: float) -> tuple[CandidateSet, ...]:
        """The best of everything within ``cap`` polished, and the best of each family alone: a
        hill-climb from the overall best can end above one from another family's best, so adding
        a family never makes a polished result worse."""
        seeds = [search(sub, self.others, first=list(done))]
        seeds += [search(sub, [fam]) for fam in self.others]
        out: list[CandidateSet] = []
        seen: list[np.ndarray] = []
        for found in seeds:
            if found is None:
                continue
            row = found.cs.keys[found.index]
            if any(np.array_equal(row, s) for s in seen):
                continue
            seen.append(row)
            got = polish_keys(found.cs, found.index, sub.costs, cap)
            if got is not None:
                out.append(got)
        return tuple(out)
