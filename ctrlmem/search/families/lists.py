"""Cost-aware, memory-capped list schedules for any placement (a candidate family of the searches).

The block families fix the passes' order from a unit-slot building block; their times then
follow the real costs. This family builds orders *from* the real costs: it runs the pipeline as
a discrete-event simulation, and each device, whenever it is free, picks its next pass among
those whose inputs have arrived (``comm`` added across devices), under a per-device activation
cap. It is the Zero Bubble paper's automatic-scheduling heuristic (§4 there; the authors'
``zb.py`` / ``zbv.py`` greedy, docs/theory.md §10) generalised to any placement, fused or split
backward, and a cap anywhere from one microbatch to 2× 1F1B.

Rules on a free device (a *policy* picks among the variants):

1. a backward (``B`` or fused ``BW``) whose input has arrived, first; between two ready
   backwards the one ready earlier (``"ready"``) or the one of the higher stage (``"high"``);
   ``"upper"`` (:mod:`.fillahead`) as ``"ready"``, except that a ready forward of a higher stage
   of the device than the backward goes first; ``"first"`` (:mod:`.fillahead`'s forward-first
   family): any ready forward that fits goes first;
2. else a forward whose input has arrived and that fits the cap; between two, the stage
   nearer the loss (``"high"``: finish microbatches in flight) or the earlier ready (``"ready"``);
3. else a pending ``W`` — always (``"lazy"``: W only fills what would be idle time), only if it
   ends before the next known input arrives (``"fit"``; or when the cap blocks a forward), before
   any forward (``"eager"``: B > W > F, lowest memory), or only when the cap blocks a forward
   (``"mem"``); ``"upper"`` (:mod:`.fillahead`): a pending ``W`` of the device's highest stage
   before anything else (it frees the memory that stage's next forward needs), the others lazy.

Deadlock freedom under a cap: a microbatch *enters* a device at its first stage there only if
the device can hold the activations of all its stages for every microbatch that has entered and
not yet released them (a reservation). Forwards of later stages then always fit, backwards
need no memory, and ``W`` frees it; so every cap of at least one microbatch's activation on a
device completes.

The event loop is a compiled kernel (:mod:`ctrlmem.search.kernels`); :func:`list_schedule`
returns device orders of pass keys (:mod:`ctrlmem.search.encoding`).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet, dedupe, passes_per_device
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.kernels import floats, ints, kernel

__all__ = ["POLICIES", "ListResult", "list_schedule", "policy_label", "ListFamily", "PerCapFamily", "caps"]

#: (backward pick, forward pick, W mode) variants the searches try.
POLICIES: tuple[tuple[str, str, str], ...] = (
    ("ready", "high", "lazy"),
    ("ready", "high", "fit"),
    ("high", "high", "lazy"),
    ("ready", "ready", "fit"),
    ("ready", "high", "eager"),
    ("high", "high", "mem"),
    ("ready", "ready", "mem"),
)
_B_PICK = {"ready": 0, "high": 1, "upper": 2, "first": 3}
_F_PICK = {"high": 0, "ready": 1}
_W_MODE = {"lazy": 0, "fit": 1, "eager": 2, "mem": 3, "upper": 4}


def policy_label(policy: tuple[str, str, str]) -> str:
    return "/".join(policy)


class ListResult(NamedTuple):
    """Device orders as pass keys (``int64[p, L]``, see :mod:`ctrlmem.search.encoding`), and
    whether the cap ever held a forward back (if not, any larger cap gives the same orders)."""

    keys: np.ndarray
    capped: bool


def _lt(a0: float, a1: float, a2: float, b0: float, b1: float, b2: float) -> bool:
    """Lexicographic ``(a0, a1, a2) < (b0, b1, b2)``."""
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    return a2 < b2


_lt_k = kernel(_lt, inline=True)




@kernel(inline=True)
def _admit(d, e, k, stages, nf, nr, act, live, cap, keep):  # pragma: no cover - compiled
    """The banker's rule for microbatch ``k`` entering device ``d`` at its stage ``e``: after
    the entry, the microbatches in flight on ``d`` can finish oldest first, each allocating its
    device's remaining stages from what the older ones have freed. With ``keep``, also the oldest
    earlier microbatch that still needs a stage here must fit at once (room kept for it)."""
    v = stages.shape[1]
    free = cap - live - act[e]
    lo = k
    for j in range(v):
        if nr[stages[d, j]] < lo:
            lo = nr[stages[d, j]]
    first = True
    now = free  # what is free right after the entry
    for i in range(lo, k + 1):
        needs = 0.0
        held = 0.0
        for j in range(v):
            s = stages[d, j]
            done = nf[s] > i or (i == k and s == e)
            if not done:
                needs += act[s]
            elif nr[s] <= i:
                held += act[s]
        if keep and first and i < k and needs > 0.0:
            if needs > now + 1e-9:
                return False
            first = False
        if needs > free + 1e-9:
            return False
        free += held
    return True


@kernel
def _run(S, m, dev, stages, c_in_f, c_in_b, f, b, w, act, need, entry, cap, fused,
         b_pick, f_pick, w_mode, banker, out):  # pragma: no cover - compiled; py_func tested
    """The event loop (see the module docstring). ``out[d]`` receives device ``d``'s keys.
    Returns 1 if the cap held a forward back at least once, else 0 (-1: stuck).

    Each device keeps the earliest time it should look for work again (when it becomes free,
    when a known input arrives, when a neighbour gives it an input); the device with the
    earliest such time (then the lowest index) goes next. A device evaluated again with nothing
    new would decide the same, so one pending time per device is all an event queue would hold
    that matters."""
    INF = np.inf
    EPS = 1e-9
    p, v = stages.shape
    sm = S * m
    f_end = np.full(sm, INF)
    b_end = np.full(sm, INF)
    nf = np.zeros(S, np.int64)
    nb = np.zeros(S, np.int64)
    nr = np.zeros(S, np.int64)  # releases per stage (W, or fused BW), in microbatch order
    live = np.zeros(p)
    free = np.zeros(p)
    wq = np.zeros((p, v * m), np.int64)  # pending W as stage * m + microbatch, FIFO per device
    wh = np.zeros(p, np.int64)
    wt = np.zeros(p, np.int64)
    n_out = np.zeros(p, np.int64)
    remaining = sm * (2 if fused else 3)
    wake = np.zeros(p)  # when each device next looks for work (INF: when an input tells it)
    capped = 0
    back_kind = 1
    while remaining > 0:
        d = 0
        t = wake[0]
        for x in range(1, p):  # the earliest (time, device) first, as a heap of events would
            if wake[x] < t:
                t = wake[x]
                d = x
        if t == INF:
            return -1  # nothing can run: (not reached: the reservations prevent it)
        wake[d] = INF
        if t < free[d] - EPS:
            continue
        if free[d] > t:
            t = free[d]
        have_b = False
        bb0 = 0.0
        bb1 = 0.0
        bb2 = 0.0
        best_b = -1
        have_f = False
        bf0 = 0.0
        bf1 = 0.0
        bf2 = 0.0
        best_f = -1
        next_arrival = INF
        blocked_f = False
        for j in range(v):
            s = stages[d, j]
            k = nb[s]
            if k < m and f_end[s * m + k] < INF:
                if s == S - 1:
                    tb = f_end[s * m + k]
                else:
                    tb = b_end[(s + 1) * m + k] + c_in_b[s]
                if tb <= t + EPS:
                    if b_pick != 1:
                        k0, k1, k2 = tb, float(k), float(-s)
                    else:
                        k0, k1, k2 = float(-s), tb, float(k)
                    if not have_b or _lt_k(k0, k1, k2, bb0, bb1, bb2):
                        have_b = True
                        bb0, bb1, bb2 = k0, k1, k2
                        best_b = s
                elif tb < next_arrival:
                    next_arrival = tb
            k = nf[s]
            if k < m:
                if s == 0:
                    tf = 0.0
                else:
                    tf = f_end[(s - 1) * m + k] + c_in_f[s]
                if tf < INF:
                    extra = need[d] if s == entry[d] else act[s]
                    if banker and s == entry[d]:
                        extra = act[s] if _admit(d, s, k, stages, nf, nr, act, live[d], cap, banker == 2) else INF
                    if live[d] + extra > cap + EPS:
                        blocked_f = True
                        capped = 1
                    elif tf <= t + EPS:
                        if f_pick == 0:
                            k0, k1, k2 = float(-s), tf, float(k)
                        else:
                            k0, k1, k2 = tf, float(k), float(-s)
                        if not have_f or _lt_k(k0, k1, k2, bf0, bf1, bf2):
                            have_f = True
                            bf0, bf1, bf2 = k0, k1, k2
                            best_f = s
                    elif tf < next_arrival:
                        next_arrival = tf
        has_w = wh[d] < wt[d]
        choice = 0  # 0 none, 1 B, 2 F, 3 W
        top_w = -1
        if has_w and w_mode == 4:  # "upper": a pending W of the device's highest stage first
            top = stages[d, v - 1]
            for i in range(wh[d], wt[d]):
                if wq[d, i] // m == top:
                    top_w = i
                    break
        if top_w >= 0:
            choice = 3
            x = wq[d, top_w]  # to the head of the queue, which is taken below
            wq[d, top_w] = wq[d, wh[d]]
            wq[d, wh[d]] = x
        elif have_b and b_pick == 2 and have_f and best_f > best_b:
            choice = 2  # "upper": a forward of a higher stage of the device before a backward
        elif have_b and b_pick == 3 and have_f:
            choice = 2  # "first": any ready forward that fits before a backward
        elif have_b:
            choice = 1
        elif has_w and (w_mode == 2 or (w_mode == 3 and blocked_f)):
            choice = 3
        elif have_f:
            choice = 2
        elif has_w:
            if w_mode == 1 and not blocked_f:
                s_w = wq[d, wh[d]] // m
                if next_arrival == INF or t + w[s_w] <= next_arrival + EPS:
                    choice = 3
            else:
                choice = 3
        if choice == 0:
            if next_arrival < INF:
                wake[d] = min(wake[d], next_arrival)
            continue  # otherwise a producer pushes this device when it schedules its input
        if choice == 1:
            s = best_b
            k = nb[s]
            nb[s] = k + 1
            dur = b[s] + w[s] if fused else b[s]
            e = t + dur
            b_end[s * m + k] = e
            out[d, n_out[d]] = (back_kind * S + s) * m + k
            n_out[d] += 1
            if fused:
                live[d] -= act[s]
                nr[s] += 1
            else:
                wq[d, wt[d]] = s * m + k
                wt[d] += 1
            if s > 0:
                e2 = dev[s - 1]
                if e2 != d:
                    wake[e2] = min(wake[e2], max(free[e2], t))
        elif choice == 2:
            s = best_f
            k = nf[s]
            nf[s] = k + 1
            e = t + f[s]
            f_end[s * m + k] = e
            out[d, n_out[d]] = s * m + k
            n_out[d] += 1
            live[d] += act[s]
            if s < S - 1:
                e2 = dev[s + 1]
                if e2 != d:
                    wake[e2] = min(wake[e2], max(free[e2], t))
        else:
            r = wq[d, wh[d]]
            wh[d] += 1
            s = r // m
            e = t + w[s]
            out[d, n_out[d]] = 2 * sm + r
            n_out[d] += 1
            live[d] -= act[s]
            nr[s] += 1
        free[d] = e
        remaining -= 1
        wake[d] = min(wake[d], e)
    return capped


def list_schedule(
    placement: Placement,
    num_microbatches: int,
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float],
    comm: float,
    act: Sequence[float],
    cap: float,
    fused: bool = False,
    policy: tuple[str, str, str] = POLICIES[0],
    banker: int = 0,
) -> ListResult | None:
    """Device orders for ``placement`` and ``num_microbatches`` under per-stage pass times
    ``f``, ``b``, ``w``, hop latency ``comm``, per-stage activations ``act`` and a per-device cap
    ``cap`` (same unit as ``act``). ``fused``: one ``BW`` pass (``b + w``) per stage instead of
    ``B`` and ``W``. ``banker`` (1): a microbatch enters a device when the microbatches in flight
    there can still finish oldest first (instead of only when the device can hold all its
    stages at once); 2: also keeping room for the oldest one that still needs a stage there. It
    may deadlock (``None``). Returns ``None`` if ``cap`` cannot hold one
    microbatch on some device."""
    P, m = placement, num_microbatches
    S, p = P.num_stages, P.num_devices
    dev = ints([P.device_of(s) for s in range(S)])
    stages = ints([sorted(P.stages_of(d)) for d in range(p)])
    # a microbatch enters device d at its first stage there (stages of a device in chain order)
    entry = ints(stages[:, 0])
    actv = floats(act)
    need = floats([sum(act[s] for s in st) for st in stages.tolist()])
    if np.any(need > cap + 1e-9):
        return None
    c_in_f = floats([comm if s > 0 and dev[s - 1] != dev[s] else 0.0 for s in range(S)])
    c_in_b = floats([comm if s < S - 1 and dev[s + 1] != dev[s] else 0.0 for s in range(S)])
    L = (2 if fused else 3) * m * P.num_chunks
    out = np.empty((p, L), dtype=np.int64)
    b_pick, f_pick, w_mode = policy
    capped = _run(S, m, dev, stages, c_in_f, c_in_b, floats(f), floats(b), floats(w), actv, need, entry,
                  float(cap), bool(fused), _B_PICK[b_pick], _F_PICK[f_pick], _W_MODE[w_mode], int(banker), out)
    if capped < 0:  # only with banker: the reservations make every cap of one microbatch complete
        return None
    return ListResult(out, bool(capped))


# ---------------------------------------------------------------------------------------------
# the family


def cap_step(p: int, base: int) -> int:
    """Step, in activation units (half-a for V-shape, ``a`` for one stage per device), between
    the caps tried: every unit up to ``p = 16``, every ``a`` above (the same grid for every
    budget, so the family stays monotone; a budget of whole ``a`` is always on it)."""
    return 1 if p <= 16 else base


def caps(p: int, top: int, base: int) -> list[int]:
    """The caps (in activation units: half-a for V-shape, ``a`` for one stage per device) tried
    up to ``top``: from one microbatch's activation (``base`` units) on the grid of
    :func:`cap_step`, and above 1F1B's memory (``base · p``) twice as coarse, counted from it
    (so 1.25, 1.5 and 2.0 of 1F1B's memory are on it whenever they are whole steps)."""
    step = cap_step(p, base)
    one = base * p
    return [h for h in range(base, top + 1)
            if ((h - base) % step == 0 if h <= one else (h - one) % (2 * step) == 0)]


class PerCapFamily(Family):
    """A family that improves other families' candidates (``others``) at each cap of
    :func:`caps` up to the query's budget, smallest cap first: :meth:`at_cap` gets the sub-query of one cap and what the
    smaller caps gave (so a cap's candidates include every smaller cap's: monotone in the
    budget), and its result is cached per (placement, m, fused, costs, cap, objective)."""

    by_objective = True  # the starts (and late acceptance's climbs) follow the query's objective

    def __init__(self, others: list[Family]) -> None:
        self.others = others
        self._cache = LRU(1024)

    def applies(self, q: Query) -> bool:
        """Whether the family runs for ``q`` at all (the small-pipeline families: ``p·m`` small)."""
        raise NotImplementedError

    def top(self, q: Query, base: int) -> int:
        """The largest cap tried, in activation units (``base`` per microbatch and device)."""
        return min(int(np.floor(q.cap * base + 1e-9)), base * q.m * 2)

    def at_cap(self, sub: Query, done: list[CandidateSet]) -> tuple[CandidateSet, ...]:
        raise NotImplementedError

    def grid(self, p: int, top: int, base: int) -> list[int]:
        """The caps tried up to ``top`` (default: the list family's, :func:`caps`); any grid keeps
        the family monotone, since a budget's caps include every smaller budget's."""
        return caps(p, top, base)

    def caps_for(self, q: Query, top: int, base: int) -> list[int]:
        """The caps tried for ``q`` (default: :meth:`grid`, the same for every ``m``)."""
        return self.grid(q.placement.num_devices, top, base)

    def sets(self, q: Query, progress: Incumbent):
        if not self.applies(q):
            return
        P = q.placement
        base = P.num_stages // P.num_devices
        done: list[CandidateSet] = []
        for h in self.caps_for(q, self.top(q, base), base):
            key = (P, q.m, q.fused, q.costs, h, q.objective)
            got = self._cache.get(key)
            if got is None:
                got = self.at_cap(Query(P, q.m, q.costs, h / base, q.fused, q.bound, q.objective), done)
                self._cache.put(key, got)
            for cs in got:
                done.append(cs)
                yield cs


def policies(p: int, fused: bool) -> tuple[tuple[str, str, str], ...]:
    return POLICIES if p <= 16 else POLICIES[:3]


class ListFamily(Family):
    """List schedules on the query's placement at every cap of :func:`caps` up to the budget,
    under each policy of :func:`policies`, and at caps up to half of 1F1B's memory also the
    first policy with the banker's admission (a microbatch enters a device when those in flight
    there can still finish oldest first: at the smallest budget a device then holds a second
    microbatch's first stage while the first waits for its last backward, 35–45 % shorter than
    one microbatch at a time; what ``cm.improve``'s optima do). Cost-dependent: cached per (placement, m, costs,
    cap). A cap is skipped when the bound says nothing under it can win; a policy's run is
    skipped when the cap did not bind one grid step below (the same orders)."""

    name = "list"

    def __init__(self) -> None:
        self._cache = LRU(2048)

    def sets(self, q: Query, progress: Incumbent):
        P = q.placement
        p = P.num_devices
        base = P.num_stages // p  # activation units per microbatch on a device (chunks)
        unit = 1.0 / base  # a per unit
        # a device never holds more than all m microbatches: larger caps cannot bind
        top = min(int(math.floor(q.cap * base + 1e-9)), base * q.m)
        prev_capped: dict[tuple, bool] = {}
        for h in caps(p, top, base):
            if progress.hopeless(q, h * unit):
                prev_capped = {}
                continue
            key = (P, q.m, q.costs, h, q.fused)
            got = self._cache.get(key)
            if got is None:
                got = self._cache.put(key, self._build(q, h, unit, prev_capped))
            cs, capped = got
            prev_capped = capped
            if len(cs):
                yield cs

    def _build(self, q: Query, h: int, unit: float, prev_capped: dict) -> tuple[CandidateSet, dict]:
        P = q.placement
        S, p = P.num_stages, P.num_devices
        f, b, w = q.costs.stage_times(S, p)
        act = [p / S] * S
        keys, labels, capped = [], [], {}
        for pol in policies(p, q.fused):
            if prev_capped.get(pol) is False:  # did not bind one step below: same orders there
                capped[pol] = False
                continue
            res = list_schedule(P, q.m, f, b, w, float(q.costs.comm), act, h * unit, fused=q.fused, policy=pol)
            if res is None:
                continue
            capped[pol] = res.capped
            keys.append(res.keys)
            labels.append(f"list cap {h * unit:g}a {policy_label(pol)}")
        if h * unit <= p / 2 + 1e-9:  # the banker's admission where memory is tight (docs/theory.md §12)
            res = list_schedule(P, q.m, f, b, w, float(q.costs.comm), act, h * unit, fused=q.fused,
                                policy=POLICIES[0], banker=1)
            if res is not None:
                keys.append(res.keys)
                labels.append(f"list cap {h * unit:g}a {policy_label(POLICIES[0])} banker")
        arr = np.stack(keys) if keys else np.zeros((0, p, passes_per_device(P, q.m, q.fused)), dtype=np.int64)
        return dedupe(CandidateSet(P, q.m, q.fused, arr, tuple(labels))), capped
