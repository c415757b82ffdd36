"""Timing candidates under costs: the simulator's as-soon-as-possible run, on compact arrays.

Each device runs its passes in order; a pass starts when its device is free and its input has
ended (plus the hop latency when the input ran on another device). This is exactly
:func:`ctrlmem.simulate`'s execution (the paper's *squeeze*), so the numbers agree with it: the
longest device span (start of a device's first pass to the end of its last), the makespan and
the sum of the spans. A candidate whose device orders deadlock gets an infinite span.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet, tables
from ctrlmem.search.kernels import floats, kernel

__all__ = ["durations", "time_set", "Timed"]


@lru_cache(maxsize=64)
def durations(placement: Placement, m: int, fused: bool, costs: Costs) -> np.ndarray:
    """Each key's pass time under ``costs`` (a fused backward takes ``b + w``)."""
    S = placement.num_stages
    f, b, w = costs.stage_times(S, placement.num_devices)
    f, b, w = floats(f), floats(b), floats(w)
    back = b + w if fused else b
    return floats(np.concatenate([np.repeat(f, m), np.repeat(back, m), np.repeat(w, m)]))


@kernel(inline=True)
def time_candidate(keys, c, dep, cross, dur, comm, end, ptr, free, first, out):  # pragma: no cover - compiled
    """Candidate ``c``: as-soon-as-possible run of every device's order. Devices are swept
    forwards and backwards, each advancing as far as its inputs allow, until all passes ran (or
    none can: a deadlock, everything inf). ``out`` gets the longest span, the makespan, the sum
    of the device spans and the sum of every pass's end time; ``end``, ``ptr``, ``free``,
    ``first`` are work arrays (``n`` passes, ``p`` devices); ``out`` has room for five: the
    fifth is the sum of the devices' end times."""
    p = keys.shape[1]
    L = keys.shape[2]
    n = dep.shape[0]
    for i in range(n):
        end[i] = -1.0
    for d in range(p):
        ptr[d] = 0
        free[d] = 0.0
        first[d] = 0.0
    remaining = p * L
    flow = 0.0
    while remaining > 0:
        moved = 0
        for sweep in range(2 * p):
            d = sweep if sweep < p else 2 * p - 1 - sweep
            i = ptr[d]
            t_free = free[d]
            start_i = i
            while i < L:
                k = keys[c, d, i]
                q = dep[k]
                t = t_free
                if q >= 0:
                    e = end[q]
                    if e < 0.0:
                        break
                    if cross[k] != 0:
                        e = e + comm
                    if e > t:
                        t = e
                if i == 0:
                    first[d] = t
                t_free = t + dur[k]
                end[k] = t_free
                flow += t_free
                i += 1
            moved += i - start_i
            ptr[d] = i
            free[d] = t_free
        if moved == 0:
            break
        remaining -= moved
    if remaining > 0:
        for j in range(5):
            out[j] = np.inf
        return
    s = 0.0
    mk = 0.0
    tot = 0.0
    ends = 0.0
    for d in range(p):
        x = free[d] - first[d]
        tot += x
        ends += free[d]
        if x > s:
            s = x
        if free[d] > mk:
            mk = free[d]
    out[0] = s
    out[1] = mk
    out[2] = tot
    out[3] = flow
    out[4] = ends


@kernel(inline=True)
def work_arrays(n, p):  # pragma: no cover - compiled
    """The work arrays of :func:`time_candidate` for ``n`` passes on ``p`` devices: ``(end, ptr, free,
    first, out)``; ``out`` gets the longest span, the makespan, the sum of the device spans, the
    sum of every pass's end time and the sum of the devices' end times."""
    return np.empty(n), np.zeros(p, np.int64), np.zeros(p), np.zeros(p), np.empty(5)


@kernel
def asap(keys, dep, cross, dur, comm, span, make, total):  # pragma: no cover - compiled; py_func tested
    """For each candidate: :func:`time_candidate` (longest span, makespan, sum of the device spans)."""
    K, p, L = keys.shape
    end, ptr, free, first, out = work_arrays(dep.shape[0], p)
    for c in range(K):
        time_candidate(keys, c, dep, cross, dur, comm, end, ptr, free, first, out)
        span[c] = out[0]
        make[c] = out[1]
        total[c] = out[2]


def _clean(x: np.ndarray) -> np.ndarray:
    """Round away float noise as :func:`ctrlmem.simulate` does (9 decimals, Python's rounding)."""
    return np.array([round(v, 9) + 0.0 if math.isfinite(v) else v for v in x.tolist()])


class Timed:
    """A :class:`CandidateSet` timed under one costs: ``span`` (longest device span),
    ``makespan`` and ``total`` (sum of the device spans), each ``float64[K]`` (``inf`` for a
    deadlock), rounded like :func:`ctrlmem.simulate`."""

    __slots__ = ("cs", "span", "makespan", "total")

    def __init__(self, cs: CandidateSet, span: np.ndarray, makespan: np.ndarray, total: np.ndarray):
        self.cs, self.span, self.makespan, self.total = cs, span, makespan, total

    def best(self, cap: float) -> int | None:
        """Index of the best candidate (span, then makespan, then peak; first on ties) whose
        peak is at most ``cap`` (in ``a``), or ``None``."""
        ok = (self.cs.peak <= cap + 1e-9) & np.isfinite(self.span)
        idx = np.nonzero(ok)[0]
        if not len(idx):
            return None
        order = np.lexsort((idx, self.cs.peak[idx], self.makespan[idx], self.span[idx]))
        return int(idx[order[0]])


def time_set(cs: CandidateSet, costs: Costs) -> Timed:
    """Time every candidate of ``cs`` under ``costs``."""
    K = len(cs)
    span, make, total = np.empty(K), np.empty(K), np.empty(K)
    if K:
        t = tables(cs.placement, cs.m, cs.fused)
        dur = durations(cs.placement, cs.m, cs.fused, costs)
        asap(cs.keys, t.dep, t.cross, dur, float(costs.comm), span, make, total)
    return Timed(cs, _clean(span), _clean(make), _clean(total))
