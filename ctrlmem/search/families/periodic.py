"""Periodic relocations for small pipelines: the best schedule at each cap, improved by moving one
pass *of every later microbatch* at once (what the solver's optima at p ≤ 4 do in their stable
phase, docs/theory.md §12).

The relocate family (:mod:`.relocate`) moves single passes. Where the optima beat it by a whole
period length (under budgets of an odd number of half-activations with ``B`` heavier than ``F``),
they run a different *stable phase*: each period of a device is reordered the same way (e.g. on
the last device ``B₃ W₃ F₂ F₃ B₂ W₂`` instead of ``B₃ B₂ W₃ F₂ F₃ W₂``: the lower stage's backward
waits for the next microbatch's forwards). Moving one pass of one period does not shorten a
schedule whose length is set by the period, so single moves never find it; moving the same pass
of microbatches ``x, x+1, …`` together by the same offset does.

At each cap of the list family's grid up to the budget, the :data:`STARTS` best distinct
candidates the other families and the *seeds* give within that cap (the improved ones of smaller
caps included; the seeds: the forward-first list schedules, :class:`.fillahead.ForwardFirstFamily`)
are improved by first-improvement local search over such moves: a pass (kind, stage) and a first
microbatch ``x``; every microbatch from ``x`` to the last (or to the one before the last: the
cool-down differs) has that pass moved by the same offset, up to :data:`REACH` positions either
way on its device (and single passes); kept when the schedule runs, its peak stays within the cap
and it gets shorter (longest span, then makespan, then the sum of every pass's end time: a move
that advances passes without shortening the schedule yet is kept, so the next can build on it),
within :data:`MAX_EVALS` timings per start; then the same moves made on every device at once (the
pass of each device's stage of the same rank; :data:`EVERY_EVALS` timings); then the single-pass
relocations of :mod:`.relocate` on the result (:data:`RELOCATE_EVALS` timings). The family yields those and the seeds' own
candidates, only those no longer in makespan than the other families' best (span, then makespan)
at that cap: the search ranks by span first, and a shorter span with a longer makespan must not
replace what the others give. A cap whose best already meets the lower bound is left as it is.
Deterministic. For pipelines of at most :data:`PERIODIC_MAX_PM` passes per stage pair (``p·m``)
and ``m ≥ 3``. Monotone: a cap's candidates include every smaller cap's.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.encoding import CandidateSet, concat, tables
from ctrlmem.search.engine import Family, Incumbent, Query, timed
from ctrlmem.search.kernels import ints, kernel, lex_less3
from ctrlmem.search.timing import time_candidate, work_arrays, durations
from ctrlmem.search.families.lists import PerCapFamily
from ctrlmem.search.families.relocate import move_pass, peak_ok, distinct, ranked, relocate_keys

__all__ = ["PeriodicFamily", "periodic_keys", "PERIODIC_MAX_PM", "STARTS", "REACH", "MAX_EVALS", "EVERY_EVALS",
           "RELOCATE_EVALS"]

PERIODIC_MAX_PM = 64
STARTS = 3
REACH = 6
MAX_EVALS = 4_000
#: timings of the moves made on every device at once, after those on one device
EVERY_EVALS = 2_000
#: timings of the single relocations that follow (:func:`.relocate.relocate_keys`)
RELOCATE_EVALS = 1_500


@kernel(inline=True)
def _find(row, k):  # pragma: no cover - compiled
    for t in range(row.shape[0]):
        if row[t] == k:
            return t
    return -1


@kernel
def _periodic(keys, dep, cross, dur, comm, delta, m, S, stages, cap, reach, max_evals, every):  # pragma: no cover - compiled
    """Improve ``keys`` (one candidate, ``[1, p, L]``) in place by periodic moves; returns 1 if
    it improved. ``stages[d]``: device ``d``'s stages in chain order. ``every``: each move is
    made on every device at once (the pass of its stage of the same rank), else on one device."""
    p = keys.shape[1]
    L = keys.shape[2]
    v = stages.shape[1]
    end, start, stamp, ptr, free, first, res = work_arrays(dep.shape[0], p)  # res: span, makespan, sums (time_candidate)
    time_candidate(keys, 0, dep, cross, dur, comm, end, start, stamp, ptr, free, first, res)
    c0, c1, c2 = res[0], res[1], res[3]
    save = np.empty((p, L), np.int64)
    evals = 0
    changed = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(1 if every else p):  # every device has each (kind, stage rank, microbatch)
            for i in range(L):
                if evals >= max_evals:
                    break
                k = keys[0, d, i]
                x = k % m
                kind = k // (S * m)
                s = (k % (S * m)) // m
                j = 0
                for t in range(v):
                    if stages[d, t] == s:
                        j = t
                done = False
                for off in range(1, 2 * reach + 1):
                    if done:
                        break
                    shift = off if off <= reach else reach - off
                    for r in range(3):  # microbatches x .. last, x .. last but one, x alone
                        last = x + 1 if r == 2 else m - r
                        if r < 2 and last - x < 2:
                            continue
                        if every and p < 2:
                            continue
                        lo = 0 if every else d
                        hi = p if every else d + 1
                        for e in range(lo, hi):
                            for t in range(L):
                                save[e, t] = keys[0, e, t]
                        moved = 0
                        ok = True
                        for e in range(lo, hi):
                            head = (kind * S + stages[e, j]) * m
                            for y in range(x, last):
                                a = _find(keys[0, e], head + y)
                                b = a + shift
                                if b < 0:
                                    b = 0
                                if b > L - 1:
                                    b = L - 1
                                if b != a:
                                    move_pass(keys[0, e], a, b)
                                    moved += 1
                            if not peak_ok(keys[0, e], delta, cap):
                                ok = False
                        ok = ok and moved > 0
                        if ok:
                            time_candidate(keys, 0, dep, cross, dur, comm, end, start, stamp, ptr, free, first, res)
                            evals += 1
                            ok = np.isfinite(res[0]) and lex_less3(res[0], res[1], res[3], c0, c1, c2)
                        if ok:
                            c0, c1, c2 = res[0], res[1], res[3]
                            improved = True
                            changed = 1
                            done = True
                            break
                        for e in range(lo, hi):
                            for t in range(L):
                                keys[0, e, t] = save[e, t]
    return changed


def periodic_keys(cs: CandidateSet, index: int, costs, cap: float, max_evals: int = MAX_EVALS) -> CandidateSet | None:
    """Candidate ``index`` of ``cs`` improved by periodic moves, then single relocations, under
    ``cap`` (``a``); ``None`` if nothing helped."""
    t = tables(cs.placement, cs.m, cs.fused)
    keys = cs.keys[index: index + 1].copy()
    dur = durations(cs.placement, cs.m, cs.fused, costs)
    P = cs.placement
    stages = ints([sorted(P.stages_of(d)) for d in range(P.num_devices)])
    one = _periodic(keys, t.dep, t.cross, dur, float(costs.comm), t.delta, cs.m, P.num_stages, stages, float(cap),
                    REACH, int(max_evals), False)
    every = _periodic(keys, t.dep, t.cross, dur, float(costs.comm), t.delta, cs.m, P.num_stages, stages, float(cap),
                      REACH, EVERY_EVALS, True)
    if not (one or every):
        return None
    out = CandidateSet(cs.placement, cs.m, cs.fused, keys, (cs.labels[index] + " periodic",))
    more = relocate_keys(out, 0, costs, cap, max_evals=RELOCATE_EVALS)
    return more if more is not None else out


class PeriodicFamily(PerCapFamily):
    """See the module docstring; ``others`` are the families whose best is improved."""

    name = "periodic"

    def __init__(self, others: list[Family], seeds: list[Family] = ()) -> None:
        super().__init__(others)
        self.seeds = list(seeds)

    def applies(self, q: Query) -> bool:
        return q.placement.num_devices * q.m <= PERIODIC_MAX_PM and q.m >= 3

    def at_cap(self, sub: Query, done: list[CandidateSet]) -> tuple[CandidateSet, ...]:
        got = self._improved(sub, done)
        return () if got is None else (got,)

    def _improved(self, sub: Query, done: list[CandidateSet]) -> CandidateSet | None:
        """The :data:`STARTS` best distinct candidates within ``sub.cap`` of the others, the
        seeds and the earlier caps' results, improved; with the seeds' own candidates, those no
        longer in makespan than the others' best (span, then makespan) at this cap, as one set."""
        seeded = [x for fam in self.seeds for x in fam.sets(sub, Incumbent())]
        others = [x for fam in self.others for x in fam.sets(sub, Incumbent())]
        pool = ranked(list(done) + others + seeded, sub.costs, sub.cap, sub.by_makespan)
        ids = {id(cs) for cs in others}
        best_old = min((sub.key(span, make, 0.0) for span, make, _n, cs, _i in pool if id(cs) in ids),
                       default=(np.inf, np.inf, 0.0))
        best_make = best_old[0] if sub.by_makespan else best_old[1]
        out = []
        floor = sub.bound(sub.cap)  # no schedule within the cap has a shorter span (nor makespan)
        for _span, make, cs, i in distinct(pool, STARTS):
            if make <= floor + 1e-9:
                break  # it meets the bound: nothing left to gain
            got = periodic_keys(cs, i, sub.costs, sub.cap)
            if got is not None:
                out.append(got)
        out += [cs for cs in seeded if len(cs)]
        # never longer in makespan than what the other families give at this cap (the engine
        # ranks by span first: a shorter span with a longer makespan would otherwise win)
        kept = []
        for cs in out:
            tm = timed(cs, sub.costs)
            ok = np.nonzero((cs.peak <= sub.cap + 1e-9) & np.isfinite(tm.span) & (tm.makespan <= best_make + 1e-9))[0]
            if len(ok):
                kept.append(cs.subset(ok))
        return concat(kept) if kept else None
