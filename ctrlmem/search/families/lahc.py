"""Late-acceptance candidates for small pipelines: the best schedules at each cap, improved by
late-acceptance hill climbing over single-pass moves (what the solver's last optima at p ≤ 4 do
that the strict descents of the other families cannot reach).

The polish, relocate and periodic families (:mod:`.polish`, :mod:`.relocate`, :mod:`.periodic`)
keep a move only when it shortens the schedule at once. Where ``cm.improve`` still proved the
search's schedules 2–4 % too long at p ≤ 4 (docs/theory.md §12), the optimum is a few moves
away through schedules that are *not* shorter: e.g. at p = 3, m = 3 under half of 1F1B's memory
the last microbatch's forwards run through the upper stages *before* the backwards of the one
ahead of it (each device's cool-down reordered), and no single one of those moves shortens the
schedule until the last is made.

Late-acceptance hill climbing (Burke and Bykov, European Journal of Operational Research 258,
2017) crosses such plateaus and small rises: a move is kept when the result is no worse than
the current schedule *or than the current schedule* :data:`HISTORY` *timings ago*; one
parameter, no temperature, and only comparisons (so the compiled and the plain Python forms
agree bit for bit, :mod:`ctrlmem.search.kernels`). The moves are those of :mod:`.relocate`:
one pass of a device to another position up to :data:`REACH` away, never before its own input
on the device nor after its own output, drawn by a fixed-seed generator; a move is made only
when the device's peak stays within the cap and the schedule still runs. Whether it runs is
decided before timing it, by a search for the one cycle the move can close over the few passes
that started between the two positions (:func:`ctrlmem.search.timing.closes_cycle`; about half
the moves of a climb deadlock, and timing found each only after running half the pipeline); a
move is timed from the times before it: only the passes that started at or after the old start
of the moved position's pass run again (:func:`ctrlmem.search.timing.retime`: the same times bit
for bit, for about half the work; nothing to undo when the move is not kept). The score is the
query's objective (longest span, or makespan), then the sum of the device spans (span) or of
the devices' end times (makespan): a move that ends a device earlier without shortening the
schedule yet counts as progress.

At each cap of the list family's grid up to the budget and up to 1F1B's memory, the climbs
start from the :data:`STARTS` best distinct candidates the other families give within that cap
(the earlier caps' results included); from each start, :data:`SEEDS` climbs one after the
other (each from the last one's best, with its own seed), each of at most :data:`EVALS`
timings and ending :data:`PATIENCE` timings after its last new best. A start that already meets
the lower bound is left as it is. Deterministic. For pipelines of at most :data:`LAHC_MAX_PM`
passes per stage pair (``p·m``), split backward; above that, up to :data:`MEDIUM_MAX_PM`, the
V-shape search climbs once per quarter of 1F1B's memory (:class:`MediumLateAcceptanceFamily`),
then once more at ``¼, ⅜, ½`` of it for about the same time whatever the size
(:class:`LongLateAcceptanceFamily`; the ``zb`` search has this one only). In the V-shape search that
long climb on a medium pipeline is *patient*: the same climb (seed, history) going on until an
eighth of its timings has passed without a new best, :data:`PATIENT_WORK` ``/ (p·m)`` timings at
most (its 2,000-timing patience stopped it within a few thousand timings, on plateaus that a
climb of 100,000 crosses), and at every cap of the list family's grid from ¼ to ½ of 1F1B's
memory, so that a budget between the three climbs at its own cap (docs/theory.md §12, "A patient
climb"). That long climb also runs
on the V-shape's small pipelines from :data:`SMALL_LONG_MIN_P` devices on, after the climbs at every
cap, at every cap of the list family's grid from ¼ to ½ of 1F1B's memory, :data:`SMALL_WORK`
``/ (p·m)`` timings long: at p = 6 and 8 with m = p those climbs left
schedules 2–11 % above what ``cm.improve`` proves (docs/theory.md §12, "Small pipelines on many
devices"). Monotone: a cap's candidates include every smaller cap's.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.encoding import CandidateSet, concat, tables
from ctrlmem.search.engine import Family, Incumbent, Query
from ctrlmem.search.kernels import kernel
from ctrlmem.search.timing import closes_cycle, keep, order_tables, retime, time_candidate, work_arrays, durations
from ctrlmem.search.families.lists import PerCapFamily, caps
from ctrlmem.search.families.relocate import keeps_order, move_pass, peak_ok, random_move, distinct, ranked

__all__ = ["LateAcceptanceFamily", "MediumLateAcceptanceFamily", "LongLateAcceptanceFamily", "lahc_keys", "LAHC_MAX_PM", "MEDIUM_MAX_PM", "MEDIUM_WORK", "LONG_EIGHTHS", "LONG_EVALS_MAX", "SMALL_LONG_MIN_P", "SMALL_WORK",
           "SMALL_EVALS_MAX", "PATIENT_WORK", "PATIENT_EVALS_MAX", "PATIENT_SHARE", "STARTS", "SEEDS", "EVALS", "HISTORY", "PATIENCE", "REACH"]

LAHC_MAX_PM = 64
#: the largest ``p·m`` the medium tier (:class:`MediumLateAcceptanceFamily`) climbs
MEDIUM_MAX_PM = 256
#: the caps of :class:`LongLateAcceptanceFamily`, in eighths of 1F1B's memory
LONG_EIGHTHS = (2, 3, 4)
#: timings × ``p·m`` of one long climb (:data:`EVALS` at ``p·m`` = :data:`MEDIUM_MAX_PM`)
MEDIUM_WORK = 12_000 * 256
#: the most timings of one long climb
LONG_EVALS_MAX = 48_000
#: from this ``p`` on, small pipelines (``p·m <=`` :data:`LAHC_MAX_PM`) get the long climbs too
#: (V-shape): at p ≤ 4 their other climbs reach the optimum, at p = 6 and 8 with m = p they left
#: schedules 2–11 % above what ``cm.improve`` proves (docs/theory.md §12, "Small pipelines on many devices")
SMALL_LONG_MIN_P = 5
#: timings × ``p·m`` of one long climb on a small pipeline
SMALL_WORK = 100_000 * 64
#: the most timings of one long climb on a small pipeline
SMALL_EVALS_MAX = 100_000
#: timings × ``p·m`` of the V-shape search's long climb on a medium pipeline
#: (:class:`LongLateAcceptanceFamily` with ``patient``): 100,000 at p·m = 256
PATIENT_WORK = 100_000 * 256
#: the most timings of one such climb (p·m = 128 and below)
PATIENT_EVALS_MAX = 200_000
#: such a climb stops once ``1 / PATIENT_SHARE`` of its timings (an eighth) brings no new best
PATIENT_SHARE = 8
STARTS = 3
SEEDS = 2
EVALS = 12_000
HISTORY = 50
PATIENCE = 2_000
REACH = 8


@kernel(inline=True)
def _le2(a0, a1, b0, b1):  # pragma: no cover - compiled
    """(a0, a1) <= (b0, b1), each compared with a 1e-9 tolerance."""
    if a0 < b0 - 1e-9:
        return True
    if a0 > b0 + 1e-9:
        return False
    return a1 <= b1 + 1e-9


@kernel
def _lahc(keys, dep, cross, dur, comm, delta, cap, reach, max_evals, history, patience, by_makespan,
          seed):  # pragma: no cover - compiled
    """Late-acceptance hill climbing of ``keys`` (one candidate, ``[1, p, L]``), in place (the
    best schedule met); returns 1 if it improved. It stops after ``max_evals`` timings, or
    ``patience`` timings after the last new best."""
    p = keys.shape[1]
    L = keys.shape[2]
    n = dep.shape[0]
    end, start, stamp, ptr, free, first, res = work_arrays(n, p)  # res: span, makespan, sums (time_candidate)
    time_candidate(keys, 0, dep, cross, dur, comm, end, start, stamp, ptr, free, first, res)
    end2, start2, cut = np.empty(n), np.empty(n), np.empty(p, np.int64)  # a move's timing (retime)
    device, pos, head, users = order_tables(keys, 0, dep)  # closes_cycle
    seen, stack = np.zeros(n + 1, np.int64), np.empty(n, np.int64)
    # the score: the objective, then the sum of the device ends (makespan) or of the spans (span)
    c0 = res[1] if by_makespan else res[0]
    c1 = res[4] if by_makespan else res[2]
    b0, b1 = c0, c1
    best = keys.copy()
    h0 = np.full(history, c0)
    h1 = np.full(history, c1)
    state = 1 + seed % 2147483646  # MINSTD (random_move)
    evals = 0
    tries = 0
    changed = 0
    last = 0  # the timing that last found a new best
    while evals < max_evals and tries < 20 * max_evals and evals - last < patience:
        tries += 1
        state, d, i, j = random_move(state, p, L, reach)
        row = keys[0, d]
        if j < 0 or j >= L or j == i or not keeps_order(row, i, j, dep):
            continue
        move_pass(row, i, j)
        within = peak_ok(row, delta, cap)
        move_pass(row, j, i)
        if not within:
            continue
        timed = np.isfinite(c0)  # the current order's times are in end, start
        if timed and closes_cycle(keys, 0, d, i, j, dep, device, pos, head, users, start, seen, stack):
            continue  # the move deadlocks (what timing it would find, for a fraction of the work)
        lo = min(i, j)
        t0 = start[row[lo]]
        move_pass(row, i, j)
        if timed:  # only the passes the move can delay are timed again
            retime(keys, 0, d, lo, t0, dep, cross, dur, comm, end, start, end2, start2, stamp, ptr, free, first, cut, res)
        else:  # the order climbed from deadlocks: no times to start from
            time_candidate(keys, 0, dep, cross, dur, comm, end, start, stamp, ptr, free, first, res)
        if not np.isfinite(res[0]):
            move_pass(row, j, i)
            continue
        v = evals % history
        evals += 1
        n0 = res[1] if by_makespan else res[0]
        n1 = res[4] if by_makespan else res[2]
        if _le2(n0, n1, h0[v], h1[v]) or _le2(n0, n1, c0, c1):  # late acceptance
            c0, c1 = n0, n1
            if timed:
                keep(keys, 0, end, start, end2, start2, cut)
            for t in range(lo, max(i, j) + 1):
                pos[row[t]] = t
            if not _le2(b0, b1, c0, c1):
                b0, b1 = c0, c1
                best[:, :, :] = keys
                changed = 1
                last = evals
        else:
            move_pass(row, j, i)
        if _le2(c0, c1, h0[v], h1[v]):
            h0[v], h1[v] = c0, c1
    keys[:, :, :] = best
    return changed


def lahc_keys(cs: CandidateSet, index: int, costs, cap: float, by_makespan: bool = False, seed: int = 1,
              max_evals: int | None = None, history: int | None = None,
              patience: int | None = None) -> CandidateSet | None:
    """Candidate ``index`` of ``cs`` improved by late-acceptance hill climbing under ``cap``
    (``a``), scored by the longest span, then the sum of the device spans (``by_makespan``: the
    makespan, then the sum of the devices' end times); ``None`` if it found nothing better.
    ``max_evals``: timings (default :data:`EVALS`); ``history``, ``patience``: default
    :data:`HISTORY`, :data:`PATIENCE`."""
    max_evals = EVALS if max_evals is None else max_evals
    history = HISTORY if history is None else history
    patience = PATIENCE if patience is None else patience
    t = tables(cs.placement, cs.m, cs.fused)
    keys = cs.keys[index: index + 1].copy()
    dur = durations(cs.placement, cs.m, cs.fused, costs)
    if not _lahc(keys, t.dep, t.cross, dur, float(costs.comm), t.delta, float(cap), REACH, int(max_evals), int(history),
                 int(patience), bool(by_makespan), int(seed)):
        return None
    return CandidateSet(cs.placement, cs.m, cs.fused, keys, (f"{cs.labels[index]} late-acceptance {seed}",))


class LateAcceptanceFamily(PerCapFamily):
    """See the module docstring; ``others`` are the families whose best are climbed from."""

    name = "late-acceptance"
    starts = STARTS
    seeds = SEEDS

    def applies(self, q: Query) -> bool:
        return not q.fused and q.placement.num_devices * q.m <= LAHC_MAX_PM

    def top(self, q: Query, base: int) -> int:
        """Caps up to 1F1B's memory (``p·a``): above it the other families' schedules are
        bubble-free or nearly so, and a larger budget keeps what the smaller caps found."""
        return min(int(np.floor(q.cap * base + 1e-9)), base * q.placement.num_devices, base * q.m)

    def at_cap(self, sub: Query, done: list[CandidateSet]) -> tuple[CandidateSet, ...]:
        pool = ranked(list(done) + [x for fam in self.others for x in fam.sets(sub, Incumbent())], sub.costs,
                      sub.cap, sub.by_makespan)
        floor = sub.bound(sub.cap)  # no schedule within the cap has a shorter span (nor makespan)
        out = []
        for span, make, cs, i in distinct(pool, self.starts):
            if (make if sub.by_makespan else span) <= floor + 1e-9:
                break  # it meets the bound: nothing left to gain
            for seed in range(1, self.seeds + 1):  # each climb goes on from the last one's best
                got = self.climb(cs, i, sub, seed)
                if got is not None:
                    out.append(got)
                    cs, i = got, 0
        return (concat(out),) if out else ()

    def climb(self, cs: CandidateSet, index: int, sub: Query, seed: int) -> CandidateSet | None:
        """One climb from candidate ``index`` of ``cs`` at the sub-query's cap (:func:`lahc_keys`)."""
        return lahc_keys(cs, index, sub.costs, sub.cap, sub.by_makespan, seed)


class MediumLateAcceptanceFamily(LateAcceptanceFamily):
    """Late acceptance for medium pipelines, ``LAHC_MAX_PM < p·m <=`` :data:`MEDIUM_MAX_PM`: one
    climb (the best start, one seed) at each quarter of 1F1B's memory up to the budget, instead of
    three starts × two seeds at every cap of the list family's grid (their cost grows with
    ``p·m``, the number of caps with ``p``). Measured where the issue's solver runs showed the
    search 2–9 % above ``cm.improve``'s 60 s (docs/theory.md §12): up to 5 % shorter schedules at
    p = 6–16, m = p–4p (most at half of 1F1B's memory and with the profiled costs), none longer,
    at most about a second more of search at p·m = 256."""

    name = "late-acceptance-medium"
    starts = 1
    seeds = 1

    def applies(self, q: Query) -> bool:
        return not q.fused and LAHC_MAX_PM < q.placement.num_devices * q.m <= MEDIUM_MAX_PM

    def grid(self, p: int, top: int, base: int) -> list[int]:
        one = base * p
        return sorted({h for h in (max(base, one * k // 4) for k in (1, 2, 3, 4)) if h <= top})


class LongLateAcceptanceFamily(MediumLateAcceptanceFamily):
    """A second climb for medium pipelines: at each of the caps ``¼, ⅜, ½`` of 1F1B's memory
    (:data:`LONG_EIGHTHS`) up to the budget, from the best schedule everything before it gives
    (the medium climbs' included), with the next seed and a length scaled to the pipeline:
    ``MEDIUM_WORK / (p·m)`` timings (between :data:`EVALS` and :data:`LONG_EVALS_MAX`: a timing
    costs about ``p·m``, so each climb takes about the same time whatever the size), the history
    and the patience in proportion (``HISTORY`` and ``PATIENCE`` per ``EVALS``). Last in the V-shape
    search (after :class:`MediumLateAcceptanceFamily`, so nothing it found is lost) and in ``zb``'s
    (where it is the only medium climb: that search is otherwise 0.01–0.02 s). With ``small_min_p``
    (the V-shape search: :data:`SMALL_LONG_MIN_P`) it climbs small pipelines (``p·m <=``
    :data:`LAHC_MAX_PM`) of that many devices or more too, at every cap from ¼ to ½
    (:meth:`caps_for`), :data:`SMALL_WORK` ``/ (p·m)`` timings (at most :data:`SMALL_EVALS_MAX`),
    after their climbs at every cap. With ``patient`` (the V-shape search), a medium pipeline's
    climb goes on until one :data:`PATIENT_SHARE`-th of its timings has passed without a new best,
    up to ``PATIENT_WORK / (p·m)`` timings (at most :data:`PATIENT_EVALS_MAX`), with the same seed
    and history (it passes every schedule the shorter climb passes, so it is never longer than
    that climb from the same start), at every cap from ¼ to ½ as on small pipelines
    (docs/theory.md §12, "A patient climb").

    Measured (docs/theory.md §12, "A longer climb"): the quarters' single 12,000-timing climb left
    the half-budget rows 3–6 % above ``cm.improve``'s 60 s and gained nothing at 0.375 (between
    quarters); the longer climb, with its history in proportion, crosses more of the plateaus."""

    name = "late-acceptance-long"

    def __init__(self, others: list[Family], small_min_p: int | None = None, patient: bool = False) -> None:
        super().__init__(others)
        self.small_min_p = small_min_p
        self.patient = patient

    def applies(self, q: Query) -> bool:
        if super().applies(q):
            return True
        p = q.placement.num_devices
        return (not q.fused and self.small_min_p is not None and p >= self.small_min_p
                and p * q.m <= LAHC_MAX_PM)

    def grid(self, p: int, top: int, base: int) -> list[int]:
        one = base * p
        return sorted({h for h in (max(base, one * k // 8) for k in LONG_EIGHTHS) if h <= top})

    def caps_for(self, q: Query, top: int, base: int) -> list[int]:
        """Medium pipelines: :meth:`grid` (¼, ⅜, ½ of 1F1B's memory). Small ones, and medium ones
        with ``patient``: every cap of the list family's grid from ¼ to ½ (those three among them),
        so a budget between them climbs at its own cap too (where a patient climb gains most)."""
        p = q.placement.num_devices
        if p * q.m > LAHC_MAX_PM and not self.patient:
            return self.grid(p, top, base)
        one = base * p
        lo, hi = max(base, one * LONG_EIGHTHS[0] // 8), one * LONG_EIGHTHS[-1] // 8
        return [h for h in caps(p, top, base) if lo <= h <= hi]

    def climb(self, cs: CandidateSet, index: int, sub: Query, seed: int) -> CandidateSet | None:
        pm = sub.placement.num_devices * sub.m
        if pm <= LAHC_MAX_PM:
            evals = min(SMALL_EVALS_MAX, max(EVALS, SMALL_WORK // pm))
        else:
            evals = min(LONG_EVALS_MAX, max(EVALS, MEDIUM_WORK // pm))
        history, patience = HISTORY * evals // EVALS, PATIENCE * evals // EVALS
        if self.patient and pm > LAHC_MAX_PM:
            # the same climb (seed, history), only on for longer: it meets every schedule the
            # climb above does, so its best is never longer
            evals = max(evals, min(PATIENT_EVALS_MAX, PATIENT_WORK // pm))
            patience = max(patience, evals // PATIENT_SHARE)
        return lahc_keys(cs, index, sub.costs, sub.cap, sub.by_makespan, seed + 1, evals, history, patience)
