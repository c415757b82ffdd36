"""Candidate families on one stage per device (the ``zb`` search: ZB-1P, ZB-2P and any budget).

* the Zero Bubble paper's handcrafted ZB-H1 (peak ``p·a``) and ZB-H2 (``(2p−1)·a``) orders;
* at every cap (every activation from one up to the budget):
  - the Zero Bubble paper's own heuristic (its §4; our implementation of the round-based
    scheduler the authors publish): microbatch by microbatch, each stage adds its forwards
    (warm-up: as many as memory allows before the first backward's input arrives) and then the
    backwards down the pipeline, filling the wait for an input with pending ``W`` when they fit
    (or when the wait exceeds the largest idle time so far), under eight variants (bubble
    allowed before the first backward or not; backwards prioritised over forwards or not;
    greedy W filling or not);
  - the event-driven greedy under three policies — each device, whenever it is free, runs a
    ready ``B`` first (it is on the critical path), else a ready ``F`` while it holds fewer
    activations than the cap, else a pending ``W`` (``"bfw"``: W as filler only; ``"bwf"``: W
    before F; ``"fit"``: a W only when it ends before the next input is due, or memory forces
    it);
  - the list schedules of :mod:`.lists` on the sequential placement.

A larger cap's candidates include every smaller cap's (the grid is the same for every budget),
so the search is monotone in the budget.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ctrlmem.model.ir import Placement, Schedule
from ctrlmem.search.encoding import CandidateSet, dedupe, from_schedules
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.kernels import floats, kernel
from ctrlmem.search.families.lists import list_schedule, policies, policy_label

__all__ = ["ZBFixedFamily", "ZBCapFamily", "zb_greedy", "zb_caps"]

_GREEDY = ("bfw", "fit", "bwf")


@kernel
def _greedy(p, m, f, b, w, comm, cap, policy, out):  # pragma: no cover - compiled; py_func tested
    """The greedy (see the module docstring); policy 0 bfw, 1 fit, 2 bwf. ``out[d]`` gets
    device ``d``'s pass keys (``S = p``)."""
    INF = np.inf
    sm = p * m
    f_end = np.full((p, m), INF)
    b_end = np.full((p, m), INF)
    nf = np.zeros(p, np.int64)
    nb = np.zeros(p, np.int64)
    nw = np.zeros(p, np.int64)
    live = np.zeros(p, np.int64)
    free = np.zeros(p)
    n_out = np.zeros(p, np.int64)
    remaining = 3 * sm
    wake = np.zeros(p)  # when each device next looks for work (as the lists' event loop)
    while remaining > 0:
        d = 0
        t = wake[0]
        for x in range(1, p):
            if wake[x] < t:
                t = wake[x]
                d = x
        if t == INF:
            return -1
        wake[d] = INF
        if t < free[d]:
            continue
        k_f = nf[d]
        k_b = nb[d]
        k_w = nw[d]
        if k_b < m:
            t_b = f_end[d, k_b] if d == p - 1 else b_end[d + 1, k_b] + comm
        else:
            t_b = INF
        if k_f < m and live[d] < cap:
            t_f = 0.0 if d == 0 else f_end[d - 1, k_f] + comm
        else:
            t_f = INF
        has_w = k_w < k_b
        choice = 0  # 0 none, 1 B, 2 F, 3 W
        if t_b <= t:
            choice = 1
        elif policy == 2 and has_w:
            choice = 3
        elif t_f <= t:
            choice = 2
        elif has_w:
            if policy == 1:
                nxt = min(t_b, t_f)
                if nxt == INF or t + w[d] <= nxt or live[d] >= cap:
                    choice = 3
            else:
                choice = 3
        if choice == 0:
            nxt = min(t_b, t_f)
            if has_w:  # "fit" waits for an input due before the W would end
                nxt = min(nxt, t + w[d])
            if nxt < INF:
                wake[d] = min(wake[d], max(nxt, t))
            continue  # otherwise its neighbours push it when they finish a pass
        if choice == 1:
            b_end[d, k_b] = t + b[d]
            out[d, n_out[d]] = sm + d * m + k_b
            nb[d] += 1
            free[d] = t + b[d]
        elif choice == 2:
            f_end[d, k_f] = t + f[d]
            out[d, n_out[d]] = d * m + k_f
            nf[d] += 1
            live[d] += 1
            free[d] = t + f[d]
        else:
            out[d, n_out[d]] = 2 * sm + d * m + k_w
            nw[d] += 1
            live[d] -= 1
            free[d] = t + w[d]
        n_out[d] += 1
        remaining -= 1
        wake[d] = min(wake[d], free[d])
        # neighbours may now have inputs: revisit them at their free time
        if d > 0:
            wake[d - 1] = min(wake[d - 1], free[d - 1])
        if d < p - 1:
            wake[d + 1] = min(wake[d + 1], free[d + 1])
    return 1


@kernel(inline=True)
def _zb_put(j, kind, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out):  # pragma: no cover - compiled
    """Append the next pass of ``kind`` (0 F, 1 B, 2 W) to stage ``j`` at the earliest time after
    the stage's last pass and (F, B) its input on the neighbouring stage."""
    i = cnt[j, kind]
    key = (kind * p + j) * m + i
    c = cost[kind, j]
    tmp = e[j] + c
    nob = tmp
    if kind == 0 and j > 0:
        x = t[j - 1, i] + comm + c  # F of the previous stage
        if x > tmp:
            tmp = x
    if kind == 1 and j < p - 1:
        x = t[p + j + 1, i] + comm + c  # B of the next stage
        if x > tmp:
            tmp = x
    if cnt[j, 0] > 0:
        bubble[j] += tmp - nob
    e[j] = tmp
    t[kind * p + j, i] = tmp
    mem[j] += 1 if kind == 0 else (-1 if kind == 2 else 0)
    out[j, n_out[j]] = key
    n_out[j] += 1
    cnt[j, kind] = i + 1


@kernel(inline=True)
def _zb_wait(j, due, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out, greedy):  # pragma: no cover - compiled
    """Fill the wait for an input due at ``due`` with pending W: those that end by then, and one
    more if the idle time would exceed the largest any stage has (``greedy``: also when not)."""
    while cnt[j, 2] < cnt[j, 1] and e[j] + cost[2, j] <= due:
        _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
    if cnt[j, 2] < cnt[j, 1] and e[j] < due:
        top = bubble[0]
        for q in range(1, p):
            if bubble[q] > top:
                top = bubble[q]
        if due - e[j] <= top - bubble[j]:
            if greedy:
                _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
        else:
            _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)


@kernel
def _zb_rounds(p, m, cost, comm, cap, allow_bubble, prioritize_b, greedy, out):  # pragma: no cover - compiled
    """The round-based heuristic (see the module docstring) into ``out`` (``[p, 3m]`` keys);
    returns 0 when memory cannot be kept within ``cap`` activations per stage."""
    e = np.zeros(p)
    t = np.zeros((3 * p, m))  # end times, row kind * p + stage
    cnt = np.zeros((p, 3), np.int64)
    mem = np.zeros(p, np.int64)
    bubble = np.zeros(p)
    n_out = np.zeros(p, np.int64)
    req = np.zeros(p, np.int64)
    for i in range(m):
        if i == 0:
            for j in range(p):
                _zb_put(j, 0, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            for j in range(p):
                req[j] = 0
            last_t = 0.0
            for j in range(p - 1, -1, -1):
                if j == p - 1:
                    last_t = t[j, 0] + cost[1, j]
                    continue
                mm = mem[j]
                c = e[j]
                while cnt[j, 0] + req[j] < m and mm + 1 <= cap:
                    if allow_bubble:
                        if c + cost[0, j] > last_t + comm:
                            break
                    elif c >= last_t + comm:
                        break
                    mm += 1
                    c += cost[0, j]
                    req[j] += 1
                last_t = max(c, last_t + comm) + cost[1, j]
            for j in range(1, p):
                while req[j] > 0 and req[j] >= req[j - 1] and cnt[j, 0] + req[j] < m:
                    req[j] -= 1
            for j in range(p):
                for _ in range(req[j]):
                    _zb_put(j, 0, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            for j in range(p - 1, -1, -1):
                _zb_put(j, 1, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            continue
        for j in range(p):
            req[j] = 0
            if cnt[j, 0] >= m:
                continue
            if j + 1 < p and cnt[j, 0] >= cnt[j + 1, 0] + 2 and prioritize_b:
                nxt = e[j + 1] + cost[0, j + 1] + cost[1, j + 1] + comm
                if e[j] >= nxt:
                    continue
                wc = 0.0
                wn = 0
                mw = mem[j] + 1
                while mw > cap and cnt[j, 2] + wn < cnt[j, 1]:
                    wc += cost[2, j]
                    mw -= 1
                    wn += 1
                if e[j] + cost[0, j] + wc <= nxt:
                    req[j] = 1
                    continue
                top = bubble[0]
                for q in range(1, p):
                    if bubble[q] > top:
                        top = bubble[q]
                if nxt - e[j] <= top - bubble[j]:
                    continue
            req[j] = 1
        for j in range(p - 2, -1, -1):
            if req[j + 1] < req[j]:
                req[j] = req[j + 1]
        for j in range(p):
            if req[j] == 0:
                continue
            while mem[j] + 1 > cap:
                if cnt[j, 2] >= cnt[j, 1]:
                    return 0
                _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            if j > 0:
                _zb_wait(j, t[j - 1, cnt[j, 0]] + comm, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out, greedy)
            _zb_put(j, 0, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
        for j in range(p - 1, -1, -1):
            if cnt[j, 1] != i:
                return 0
            while mem[j] > cap:
                if cnt[j, 2] >= cnt[j, 1]:
                    return 0
                _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            if j + 1 < p:
                _zb_wait(j, t[p + j + 1, i] + comm, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out, greedy)
            if j == 0 and cnt[j, 0] == m:
                while cnt[j, 2] < cnt[j, 1]:
                    _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
            _zb_put(j, 1, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
    for j in range(p):
        while cnt[j, 2] < m:
            _zb_put(j, 2, p, m, cost, comm, e, t, cnt, mem, bubble, out, n_out)
    return 1


ROUND_VARIANTS = tuple((a, b, g) for a in (True, False) for b in (True, False) for g in (True, False))


def zb_rounds(p: int, m: int, f, b, w, comm: float, cap: int, allow_bubble: bool, prioritize_b: bool,
              greedy: bool) -> np.ndarray | None:
    """Device orders (pass keys ``[p, 3m]``) of the round-based heuristic, or ``None``."""
    out = np.zeros((p, 3 * m), dtype=np.int64)
    cost = floats([f, b, w])
    ok = _zb_rounds(p, m, cost, float(comm), int(cap), bool(allow_bubble), bool(prioritize_b), bool(greedy), out)
    return out if ok else None


def zb_greedy(p: int, m: int, f, b, w, comm: float, cap: int, policy: str) -> np.ndarray | None:
    """Device orders (pass keys ``[p, 3m]``) of the greedy with at most ``cap`` activations per
    device."""
    out = np.empty((p, 3 * m), dtype=np.int64)
    if _greedy(p, m, floats(f), floats(b), floats(w), float(comm), int(cap), _GREEDY.index(policy), out) < 0:
        return None  # pragma: no cover - the greedy always completes (W frees what F holds)
    return out


def zb_caps(p: int, top: int) -> list[int]:
    """The caps (in ``a``) tried up to ``top``."""
    return list(range(1, top + 1))


class ZBFixedFamily(Family):
    """Fixed one-stage-per-device schedules, e.g. ZB-H1 and ZB-H2 (cost-independent; cached per
    (p, m)). ``fixed``: (label, ``(p, m) -> Schedule``) generators, in order (the recipe passes
    them: the search knows no schedule of its own)."""

    name = "zb fixed"

    def __init__(self, fixed: Sequence[tuple[str, Callable[[int, int], Schedule]]]) -> None:
        self._fixed = tuple(fixed)
        self._cache = LRU(32)

    def sets(self, q: Query, progress: Incumbent):
        if q.placement.kind != "sequential" or q.fused:
            return
        key = (q.p, q.m)
        got = self._cache.get(key)
        if got is None:
            got = self._cache.put(key, from_schedules([(label, gen(q.p, q.m)) for label, gen in self._fixed]))
        yield got


class ZBCapFamily(Family):
    """The greedy and the list schedules at every cap of :func:`zb_caps` up to the budget
    (cost-dependent; cached per (p, m, costs, cap)); a cap is skipped when the bound says
    nothing under it can win."""

    name = "zb caps"

    def __init__(self) -> None:
        self._cache = LRU(2048)

    def sets(self, q: Query, progress: Incumbent):
        if q.placement.kind != "sequential" or q.fused:
            return
        p = q.p
        top = min(int(np.floor(q.cap + 1e-9)), q.m)  # larger caps than m activations cannot bind
        for cap in zb_caps(p, top):
            if progress.hopeless(q, float(cap)):
                continue
            key = (p, q.m, q.costs, cap)
            got = self._cache.get(key)
            if got is None:
                got = self._cache.put(key, self._level(q, cap))
            yield got

    @staticmethod
    def _level(q: Query, cap: int) -> CandidateSet:
        p, m = q.p, q.m
        P = Placement.sequential(p)
        f, b, w = q.costs.stage_times(p, p)
        comm = float(q.costs.comm)
        keys, labels = [], []
        for variant in ROUND_VARIANTS:
            got = zb_rounds(p, m, f, b, w, comm, cap, *variant)
            if got is not None:
                keys.append(got)
                labels.append(f"cap {cap}a rounds " + "".join("+" if x else "-" for x in variant))
        for pol in _GREEDY:
            got = zb_greedy(p, m, f, b, w, comm, cap, pol)
            if got is not None:
                keys.append(got)
                labels.append(f"cap {cap}a {pol}")
        for pol in policies(p, False):
            res = list_schedule(P, m, f, b, w, comm, [1.0] * p, cap, policy=pol)
            if res is not None:
                keys.append(res.keys)
                labels.append(f"cap {cap}a list {policy_label(pol)}")
        return dedupe(CandidateSet(P, m, False, np.stack(keys), tuple(labels)))
