"""Relocated candidates for small pipelines: the best schedule at each cap, improved by moving
single passes over several positions of their device, with kicks (what the solver's optima at
p ≤ 4 do that the other families do not).

Where ``cm.improve`` finds shorter schedules than the search at p ≤ 4 (docs/theory.md §12), the
optima differ from the search's best in two ways, both a few passes moved on a device:

* under a budget the other families' reservations waste (an odd number of half-activations on
  the V-shape: 3 half-a at p = 2, 3), a *later* microbatch's forward runs in the memory a last
  stage's ``W`` has just freed, before the backward of an earlier microbatch returns, instead of
  the device idling until that backward (the list family admits a microbatch only when the
  device can hold all its stages, so it idles there);
* with a hop latency and unequal costs, the cool-down keeps fewer ``W`` s pending on the last
  devices, so the makespan ends with the longest span instead of after it.

Both are moves of one pass to another position of its device's order. At each cap of the list
family's grid up to the budget, the best candidate the other families give within that cap (the
relocated ones of smaller caps included) is improved by first-improvement local search over
such moves, from each of the :data:`STARTS` best distinct candidates (every pass, up to
:data:`REACH` positions either way; kept when the schedule runs,
its peak stays within the cap and it gets shorter: longest span, then makespan, then the sum of
the spans), restarted :data:`KICKS` times from the best after a few random moves (a fixed seed:
the same inputs give the same schedule), within :data:`MAX_EVALS` timings per cap. For
pipelines of at most :data:`RELOCATE_MAX_PM` passes per stage pair (``p·m``). Monotone: a cap's
candidates include every smaller cap's.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.encoding import CandidateSet, concat, tables
from ctrlmem.search.engine import Incumbent, Query, timed
from ctrlmem.search.kernels import kernel, lex_less3
from ctrlmem.search.timing import asap, durations
from ctrlmem.search.families.lists import PerCapFamily

__all__ = ["RelocateFamily", "relocate_keys", "RELOCATE_MAX_PM", "STARTS", "REACH", "KICKS", "MAX_EVALS"]

RELOCATE_MAX_PM = 64
STARTS = 3
REACH = 6
KICKS = 2
MAX_EVALS = 4_000


@kernel(inline=True)
def move_pass(row, i, j):  # pragma: no cover - compiled
    """Move ``row[i]`` to position ``j`` (the passes between shift by one)."""
    x = row[i]
    if j < i:
        for t in range(i, j, -1):
            row[t] = row[t - 1]
    else:
        for t in range(i, j):
            row[t] = row[t + 1]
    row[j] = x


@kernel(inline=True)
def random_move(state, p, L, reach):  # pragma: no cover - compiled
    """The next draw of the MINSTD generator ``state`` (products stay far inside int64 in both
    forms): a device ``d``, a position ``i`` and a target ``j`` up to ``reach`` either way (``j``
    may fall outside the order: the caller skips it). Returns ``(state, d, i, j)``."""
    state = (state * 48271) % 2147483647
    d = state % p
    state = (state * 48271) % 2147483647
    i = state % L
    state = (state * 48271) % 2147483647
    j = i + (state % (2 * reach + 1)) - reach
    return state, d, i, j


@kernel(inline=True)
def keeps_order(row, i, j, dep):  # pragma: no cover - compiled
    """Whether moving ``row[i]`` to position ``j`` keeps it after its own input on this device
    and before its own output (a move that breaks either cannot run)."""
    k = row[i]
    if j < i:
        q = dep[k]
        for t in range(j, i):
            if row[t] == q:
                return False
    else:
        for t in range(i + 1, j + 1):
            if dep[row[t]] == k:
                return False
    return True


@kernel(inline=True)
def peak_ok(row, delta, cap):  # pragma: no cover - compiled
    level = 0.0
    for k in row:
        level += delta[k]
        if level > cap + 1e-9:
            return False
    return True


@kernel
def _relocate(keys, dep, cross, dur, comm, delta, m, cap, reach, max_evals, kicks, seed):  # pragma: no cover - compiled
    """Improve ``keys`` (one candidate, ``[1, p, L]``) in place; returns 1 if it improved."""
    p = keys.shape[1]
    L = keys.shape[2]
    span = np.empty(1)
    make = np.empty(1)
    total = np.empty(1)
    asap(keys, dep, cross, dur, comm, span, make, total)
    b0, b1, b2 = span[0], make[0], total[0]
    best = keys.copy()
    cur = keys.copy()
    c0, c1, c2 = b0, b1, b2
    state = 1 + seed % 2147483646  # MINSTD (random_move)
    evals = 0
    changed = 0
    for kick in range(kicks + 1):
        if kick > 0:
            # restart from the best after a few random moves that keep it runnable and in the cap
            for d in range(p):
                cur[0, d, :] = best[0, d, :]
            c0, c1, c2 = b0, b1, b2
            done = 0
            tries = 0
            while done < 3 and tries < 50 and evals < max_evals:
                tries += 1
                state, d, i, j = random_move(state, p, L, reach)
                if j < 0 or j >= L or j == i:
                    continue
                move_pass(cur[0, d], i, j)
                ok = peak_ok(cur[0, d], delta, cap)
                if ok:
                    asap(cur, dep, cross, dur, comm, span, make, total)
                    evals += 1
                    ok = np.isfinite(span[0])
                if ok:
                    done += 1
                    c0, c1, c2 = span[0], make[0], total[0]
                else:
                    move_pass(cur[0, d], j, i)
            if done == 0:
                break
        improved = True
        while improved and evals < max_evals:
            improved = False
            for d in range(p):
                for i in range(L):
                    if evals >= max_evals:
                        break
                    for off in range(1, 2 * reach + 1):
                        j = i + (off if off <= reach else reach - off)
                        if j < 0 or j >= L or not keeps_order(cur[0, d], i, j, dep):
                            continue
                        move_pass(cur[0, d], i, j)
                        ok = peak_ok(cur[0, d], delta, cap)
                        if ok:
                            asap(cur, dep, cross, dur, comm, span, make, total)
                            evals += 1
                            ok = np.isfinite(span[0]) and lex_less3(span[0], make[0], total[0], c0, c1, c2)
                        if ok:
                            c0, c1, c2 = span[0], make[0], total[0]
                            improved = True
                            break
                        move_pass(cur[0, d], j, i)
        if lex_less3(c0, c1, c2, b0, b1, b2):
            b0, b1, b2 = c0, c1, c2
            for d in range(p):
                best[0, d, :] = cur[0, d, :]
            changed = 1
        if evals >= max_evals:
            break
    for d in range(p):
        keys[0, d, :] = best[0, d, :]
    return changed


def relocate_keys(cs: CandidateSet, index: int, costs, cap: float, max_evals: int = MAX_EVALS,
                  seed: int = 1) -> CandidateSet | None:
    """Candidate ``index`` of ``cs`` improved by relocations under ``cap`` (``a``); ``None`` if
    nothing helped."""
    t = tables(cs.placement, cs.m, cs.fused)
    keys = cs.keys[index: index + 1].copy()
    dur = durations(cs.placement, cs.m, cs.fused, costs)
    if not _relocate(keys, t.dep, t.cross, dur, float(costs.comm), t.delta, cs.m, float(cap), REACH,
                     int(max_evals), KICKS, int(seed)):
        return None
    return CandidateSet(cs.placement, cs.m, cs.fused, keys, (cs.labels[index] + " relocated",))


class RelocateFamily(PerCapFamily):
    """See the module docstring; ``others`` are the families whose best is relocated."""

    name = "relocate"

    def applies(self, q: Query) -> bool:
        return q.placement.num_devices * q.m <= RELOCATE_MAX_PM

    def at_cap(self, sub: Query, done: list[CandidateSet]) -> tuple[CandidateSet, ...]:
        got = self._relocated(sub, done)
        return () if got is None else (got,)

    def _relocated(self, sub: Query, done: list[CandidateSet]) -> CandidateSet | None:
        """The :data:`STARTS` best distinct candidates within ``sub.cap`` (the earlier caps'
        relocated ones included), each relocated; those that improved, as one set."""
        pool = ranked(list(done) + [x for fam in self.others for x in fam.sets(sub, Incumbent())], sub.costs, sub.cap,
                      sub.by_makespan)
        out = [got for _span, _make, cs, i in distinct(pool, STARTS)
               if (got := relocate_keys(cs, i, sub.costs, sub.cap)) is not None]
        return concat(out) if out else None


def ranked(sets, costs, cap: float, by_makespan: bool = False) -> list[tuple[float, float, int, CandidateSet, int]]:
    """Every candidate of ``sets`` that runs within ``cap`` (``a``) as ``(span, makespan, n, set,
    index)``, shortest first: by span, then makespan (``by_makespan``: the other way round);
    ties in the order given (``n``)."""
    pool = []
    for cs in sets:
        if not len(cs):
            continue
        tm = timed(cs, costs)
        for i in np.nonzero((cs.peak <= cap + 1e-9) & np.isfinite(tm.span))[0]:
            pool.append((float(tm.span[i]), float(tm.makespan[i]), len(pool), cs, int(i)))
    pool.sort(key=(lambda x: (x[1], x[0], x[2])) if by_makespan else (lambda x: x[:3]))
    return pool


def distinct(pool, most: int):
    """``(span, makespan, set, index)`` of the first ``most`` entries of :func:`ranked`'s ``pool``
    with distinct orders."""
    seen: set[bytes] = set()
    for span, make, _n, cs, i in pool:
        sig = cs.keys[i].tobytes()
        if sig in seen:
            continue
        seen.add(sig)
        yield span, make, cs, i
        if len(seen) >= most:
            return
