"""Cyclic blocks: the building block searched for its period under the exact periodic peak
(docs/theory.md §11 item 11, §12 "Cyclic blocks").

The paper builds a schedule by repeating one microbatch's *building block* every interval and
bounds the peak by the lifespans (Eq. 1: a stage whose lifespan is ℓ holds ⌈ℓ / T⌉
microbatches' activations). Where memory binds, the repeated block's real peak is lower than
that sum: a stage holds ``⌊ℓ / T⌋`` microbatches all the time and one more only during an *arc*
of the period, ``ℓ mod T`` long from its forward's start, so two stages of a device whose arcs do
not meet peak one below Eq. 1's sum. A CP-SAT model of one periodic block shows what that is worth
(docs/theory.md §12): with F:B:W = 3:4:2 and half of 1F1B's memory, the best block whose peak
Eq. 1 bounds has a period of 12 per microbatch at p = 6 (the searches' stable phase), while blocks
with a period of 10.5 fit the same memory once the arcs are placed apart.

This family searches such blocks without a solver, for the caps of the list family's grid from the
budget (at most :data:`TOP` of 1F1B's memory) down until the bound says no smaller cap can win, in
integer slots (the costs' chunk pass times quantised: the shortest pass at
:data:`RESOLUTION` slots; where those slots miss the costs, also at the resolution of :data:`FINER`
whose slots come nearest them, :func:`resolutions`, as a second family run last in the searches —
a block laid out for times 10–20 % off, or for a hop rounded to nothing, is not the block the real
costs want). A block is the start time of each pass of one microbatch; a pass of
microbatch ``j`` runs at that time plus ``j·T``, so a device runs each of its passes once per
period and no two may overlap modulo ``T``. The block is laid out along its dependency chain
(every forward, then every backward from the last stage back, ``comm`` slots across devices),
each pass at the earliest start whose slots modulo ``T`` are free on its device; each device's
``W`` s then fill the earliest free slots after their ``B`` (both orders tried for a device's two
stages, the lower peak kept). The free choice is a *delay* before each forward: a late forward
shortens its own stage's lifespan and moves its arc. For a period, a fixed-seed local search over
the delays (one delay changed at a time, kept when the summed excess of the devices' exact periodic
peaks over the cap, then their sum, is no larger) looks for a block within the cap; the period is
bisected between a lower bound and twice it, then shortened one slot at a time while a block is
found (:func:`cyclic_block`). Most steps are rejected and most restarts find nothing, so the search
skips what cannot change its course: a layout stops as soon as its key is sure to exceed the one to
beat (the devices' peak floors after the forwards and as each device's backwards are done, then
device by device), a step that changes no delay is not laid out, and a restart already seen to
fail (same period, seed and starting delays) is not run again. The block repeated ``m`` times,
each device's passes in start order, is the candidate (the engine times it with the real costs:
the repeat squeezed, ramps included). Its peak is the block's exact periodic peak (a device's
memory follows its order).

A block may also hold several microbatches (:func:`copies_block`, ``CyclicFamily(copies=2)``), each
with its own layout, repeated every period: where one microbatch's block repeated leaves slots no
single layout can use, two may fill them (docs/theory.md §12, "Blocks of two microbatches"). Its
search starts from the one-microbatch block repeated, which lays out as itself, so it only ever
finds a shorter period.

Deterministic (MINSTD), cached per (placement, quantised costs, cap); cost-adapted like the
list family. Split backward only (``B`` and ``W``), any placement whose devices hold one or two
stages (the V-shape and one stage per device). Monotone: a cap's candidates include every
smaller cap's. Each cap's candidate is yielded as found, so the engine's bound can stop the
caps below.
"""

from __future__ import annotations

import math

import numpy as np

from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.families.lists import caps
from ctrlmem.search.kernels import ints, kernel

__all__ = ["CyclicFamily", "cyclic_block", "copies_block", "block_order", "quantise", "quantisation_error",
           "resolutions", "RESOLUTION", "FINER", "FINER_SEEDS", "COPIES", "COPIES_SEEDS", "COPIES_MAX_P",
           "COPIES_FINER_MAX_P", "FINER_ALL_CAPS_P", "ITERS", "SEEDS", "MAX_SLOTS"]

#: slots per shortest pass in the quantisation of the costs
RESOLUTION = 2
#: the finer resolutions of which the nearest to the costs is tried too when :data:`RESOLUTION` is not exact
FINER = (3, 4, 5, 6, 8)
#: restarts per period at the finer resolution (its periods are longer in slots, each search slower)
FINER_SEEDS = 2
#: above this ``p`` the finer resolution searches every other cap of the grid only, counted down
#: from :data:`TOP`'s (a fixed grid per ``p``, so still monotone in the budget): at p = 32 each cap
#: costs 0.2-0.4 s there
FINER_ALL_CAPS_P = 16
#: local-search steps per period and seed
ITERS = 3000
#: local-search steps without a strict improvement after which a restart gives up
PATIENCE = 300
#: restarts (fixed seeds) per period
SEEDS = 5
#: microbatches in a block of several (:class:`CyclicFamily` ``copies``): each its own layout, so a
#: device's passes may fall where one microbatch's block repeated could not put them
COPIES = 2
#: restarts per period of a block of several microbatches
COPIES_SEEDS = 2
#: local-search steps per period and seed of a block of several microbatches
COPIES_ITERS = 2000
#: the largest ``p`` with blocks of several microbatches at the coarse resolution: at p = 32, m = 256
#: they took a second more than the rest of the search (3:4:2:0.1, half of 1F1B's memory) and found
#: nothing shorter; on the held-out sets they shortened schedules up to p = 24
COPIES_MAX_P = 24
#: the same at the finer resolution, whose periods are 2-4x as many slots: at p = 16, m = 128 they took
#: 0.7 s of a 2.4 s search (before the layouts stopped early); on the held-out sets they shortened
#: schedules up to p = 12 (above it the coarse ones came within 0.01 %)
COPIES_FINER_MAX_P = 12
#: the longest period searched, in slots
MAX_SLOTS = 400
#: periods tried above the lower bound, as a multiple of it (the search stops at the first fit)
SPAN = 2.0
#: the largest cap searched, as a fraction of 1F1B's memory (above it the other families come within a
#: few per cent of the bounds on the gap grid, figures/optimality-gap.md)
TOP = 0.5
_STEPS = np.array([-2, -1, 1, 2, 3, 5], dtype=np.int64)
_BIG = 1 << 40


@kernel(inline=True)
def _place(occ, d, t, ln, P):  # pragma: no cover - compiled
    """The earliest start ``>= t`` whose slots modulo ``P`` are free on device ``d``; -1 if none
    (also for a pass longer than the period, which would cover its own slots again)."""
    if ln == 0:
        return t
    if ln > P:
        return -1
    # a start whose window meets a taken slot: every later start up to that slot meets it too, so
    # the next candidate is the slot after it (checked from the window's end: the longest skip).
    # A slot is the start's residue plus an offset, below 2P: wrapped by a subtraction, not a modulo
    r = t % P
    skipped = 0
    while skipped < P:
        j = ln - 1
        while j >= 0:
            q = r + j
            if q >= P:
                q -= P
            if occ[d, q] != 0:
                break
            j -= 1
        if j < 0:
            return t + skipped
        skipped += j + 1
        r += j + 1
        if r >= P:
            r -= P
    return -1


@kernel(inline=True)
def _mark(occ, d, t, ln, P, val):  # pragma: no cover - compiled
    q = t % P
    for _ in range(ln):
        occ[d, q] = val
        q += 1
        if q == P:
            q = 0


@kernel(inline=True)
def _peak(d, stages, nst, x, dW, act, P):  # pragma: no cover - compiled
    """Device ``d``'s exact periodic peak: each stage holds ``⌊ℓ/P⌋`` microbatches always and one
    more on the arc ``[F mod P, F mod P + ℓ mod P)``; the most any point of the circle holds."""
    base = 0
    top = 0
    for j in range(nst[d]):
        s = stages[d, j]
        life = x[2, s] + dW[s] - x[0, s]
        base += act[s] * (life // P)
    for j in range(nst[d]):
        s = stages[d, j]
        rem = (x[2, s] + dW[s] - x[0, s]) % P
        if rem == 0:
            continue
        point = x[0, s] % P
        c = 0
        for i in range(nst[d]):
            s2 = stages[d, i]
            rem2 = (x[2, s2] + dW[s2] - x[0, s2]) % P
            if rem2 > 0 and (point - x[0, s2] % P) % P < rem2:
                c += act[s2]
        if c > top:
            top = c
    return base + top


@kernel(inline=True)
def _peak_floor(d, stages, nst, x, dB, dW, act, P):  # pragma: no cover - compiled
    """A lower bound on device ``d``'s exact periodic peak (:func:`_peak`) for every ``W`` placement:
    its stages' lifespans are at least ``B`` end + ``W`` − ``F`` start, and with lifespans no shorter
    the device holds at least their average over the period, and at least the floors plus the
    largest activation whose arc is not empty (a longer lifespan keeps that arc or adds to the floors)."""
    held = 0
    base = 0
    arc = 0
    for j in range(nst[d]):
        s = stages[d, j]
        life = x[1, s] + dB[s] + dW[s] - x[0, s]
        held += act[s] * life
        base += act[s] * (life // P)
        if life % P != 0 and act[s] > arc:
            arc = act[s]
    return max((held + P - 1) // P, base + arc)


@kernel(inline=True)
def _add_peak(res, peak, cap):  # pragma: no cover - compiled
    """Add a device's peak (or a floor of it) to ``res`` (summed excess over ``cap``, summed peaks):
    the key ``res[0]·2⁴⁰ + res[1]`` so far (both sums only grow, device by device)."""
    if peak > cap:
        res[0] += peak - cap
    res[1] += peak
    return res[0] * _BIG + res[1]


@kernel
def _evaluate(delta, dev, stages, nst, dF, dB, dW, comm, act, cap, P, occ, x, res, S0, limit):  # pragma: no cover - compiled
    """Lay the block out with forward delays ``delta`` (see the module docstring) into ``x``
    (``[3, S]``: F, B, W starts); ``res[0]`` the summed excess of the devices' peaks over
    ``cap``, ``res[1]`` their sum; returns 0 when some pass finds no free slots, 2 (``x`` and
    ``res`` incomplete) as soon as the key ``res[0]·2⁴⁰ + res[1]`` is sure to exceed ``limit``
    (both sums only grow device by device; ``-1``: no limit), else 1.

    A block of ``K = S / S0`` microbatches is ``K`` copies of the pipeline's ``S0`` stages
    (copy ``i``'s stage ``s`` at index ``i·S0 + s``, each copy its own chain; ``delta`` of a
    copy's first stage is its start): the forwards are laid out stage by stage, the copies of a
    stage one after another, then the backwards from the last stage back the same way, then each
    device's ``W`` s stage by stage the same way. So a block of one microbatch repeated ``K``
    times, copy ``i`` started ``i·P/K`` later, lays out as that block does."""
    S = dev.shape[0]
    p = occ.shape[0]
    K = S // S0
    occ[:, :] = 0
    for v in range(S):
        s = (v % K) * S0 + v // K
        t = 0
        if s % S0 != 0:
            t = x[0, s - 1] + dF[s - 1] + (comm if dev[s] != dev[s - 1] else 0)
        t = _place(occ, dev[s], t + delta[s], dF[s], P)
        if t < 0:
            return 0
        x[0, s] = t
        _mark(occ, dev[s], t, dF[s], P, 1)
    if limit >= 0:  # the backwards start no earlier than their chain from the copy's last forward
        for i in range(K):
            last = i * S0 + S0 - 1
            t = x[0, last] + dF[last]
            for s in range(last, i * S0 - 1, -1):
                if s < last:
                    t += dB[s + 1] + (comm if dev[s] != dev[s + 1] else 0)
                x[1, s] = t
        res[:] = 0
        key = 0
        for d in range(p):
            key = _add_peak(res, _peak_floor(d, stages, nst, x, dB, dW, act, P), cap)
        if key > limit:
            return 2
    # a device whose backwards are all laid out peaks at least at its floor (each W at its B's end):
    # the key is at least the floors' so far, checked as each device's last backward is laid out
    nb = np.zeros(p, np.int64)
    res[:] = 0
    for v in range(S - 1, -1, -1):
        s = (K - 1 - v % K) * S0 + v // K
        if s % S0 == S0 - 1:
            t = x[0, s] + dF[s]
        else:
            t = x[1, s + 1] + dB[s + 1] + (comm if dev[s] != dev[s + 1] else 0)
        d = dev[s]
        t = _place(occ, d, t, dB[s], P)
        if t < 0:
            return 0
        x[1, s] = t
        _mark(occ, d, t, dB[s], P, 1)
        nb[d] += 1
        if limit >= 0 and nb[d] == nst[d]:
            if _add_peak(res, _peak_floor(d, stages, nst, x, dB, dW, act, P), cap) > limit:
                return 2
    res[:] = 0
    for d in range(p):
        n = nst[d]
        n0 = n // K  # one copy's stages (stages[d] lists them copy by copy): W stage by stage, copies in turn
        best = -1
        best_o = -1
        laid = False  # the chosen order's Ws are still marked in occ: not laid out again
        orders = 2 if n0 == 2 else 1
        floor = _peak_floor(d, stages, nst, x, dB, dW, act, P) if orders == 2 else 0
        for o in range(orders):
            placed = 0
            for jj in range(n):
                j = (jj % K) * n0 + (jj // K if o == 0 else n0 - 1 - jj // K)
                s = stages[d, j]
                t = _place(occ, d, x[1, s] + dB[s], dW[s], P)
                if t < 0:
                    break
                x[2, s] = t
                _mark(occ, d, t, dW[s], P, 1)
                placed += 1
            pk = _peak(d, stages, nst, x, dW, act, P) if placed == n else -1
            better = pk >= 0 and (best < 0 or pk < best)
            # chosen for good: the last order, or one at the floor no W placement goes below (the
            # other order would have to be strictly lower to be chosen)
            final = better and (o == orders - 1 or pk <= floor)
            if not final:
                for jj in range(placed):
                    j = (jj % K) * n0 + (jj // K if o == 0 else n0 - 1 - jj // K)
                    s = stages[d, j]
                    _mark(occ, d, x[2, s], dW[s], P, 0)
            if better:
                best = pk
                best_o = o
            if final:
                laid = True
                break
        if best_o < 0:
            return 0
        if not laid:  # laid out again on the same slots: the same starts
            for jj in range(n):
                j = (jj % K) * n0 + (jj // K if best_o == 0 else n0 - 1 - jj // K)
                s = stages[d, j]
                t = _place(occ, d, x[1, s] + dB[s], dW[s], P)
                x[2, s] = t
                _mark(occ, d, t, dW[s], P, 1)
        key = _add_peak(res, best, cap)
        if limit >= 0 and key > limit:
            return 2
    return 1


@kernel(inline=True)
def _minstd(state):  # pragma: no cover - compiled
    return (state * 48271) % 2147483647


@kernel
def _search(dev, stages, nst, dF, dB, dW, comm, act, cap, P, iters, patience, seed, steps, delta, x_out, S0):  # pragma: no cover - compiled
    """A block of period ``P`` within ``cap`` by local search over the forward delays ``delta``
    (from their values on entry; at most ``iters`` steps, ending ``patience`` steps after the
    last strict improvement); 1, the block in ``x_out`` and its delays in ``delta`` when found."""
    S = dev.shape[0]
    p = stages.shape[0]
    occ = np.zeros((p, P), np.uint8)  # a byte a slot: the layout clears it every step
    x = np.zeros((3, S), np.int64)
    res = np.zeros(2, np.int64)
    if _evaluate(delta, dev, stages, nst, dF, dB, dW, comm, act, cap, P, occ, x, res, S0, -1) == 0:
        return 0
    cur = res[0] * _BIG + res[1]
    excess = res[0]
    state = 1 + seed % 2147483646
    since = 0
    for _ in range(iters):
        if excess == 0 or S < 2 or since >= patience:
            break
        since += 1
        state = _minstd(state)
        i = 1 + state % (S - 1)
        state = _minstd(state)
        old_i = delta[i]
        delta[i] = max(0, old_i + steps[state % steps.shape[0]])
        state = _minstd(state)
        j = -1
        old_j = 0
        if state % 10 < 3:
            state = _minstd(state)
            j = 1 + state % (S - 1)
            old_j = delta[j]
            delta[j] = 0
        if delta[i] == old_i and (j < 0 or delta[j] == old_j):
            continue  # the delays did not change (a delay below 0 is 0): the same layout, kept as it is
        ok = _evaluate(delta, dev, stages, nst, dF, dB, dW, comm, act, cap, P, occ, x, res, S0, cur)
        if ok == 1 and res[0] * _BIG + res[1] <= cur:
            if res[0] * _BIG + res[1] < cur:
                since = 0
            cur = res[0] * _BIG + res[1]
            excess = res[0]
        else:
            if j >= 0:
                delta[j] = old_j
            delta[i] = old_i
    if excess != 0:
        return 0
    # x holds the last accepted layout only if the last evaluation was accepted: lay it out again
    _evaluate(delta, dev, stages, nst, dF, dB, dW, comm, act, cap, P, occ, x, res, S0, -1)
    for k in range(3):
        for s in range(S):
            x_out[k, s] = x[k, s]
    return 1


def quantise(placement: Placement, costs, resolution: int = RESOLUTION) -> tuple[tuple[int, ...], ...] | None:
    """The chunk pass times and ``comm`` as whole slots (the shortest positive pass at
    ``resolution`` slots): ``(dF, dB, dW, (comm,))``, or ``None`` when a pass time is zero for
    every stage (nothing to quantise against)."""
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    positive = [t for t in (*f, *b, *w) if t > 0]
    if not positive:
        return None
    slot = min(positive) / resolution
    q = lambda t: max(1, int(round(t / slot))) if t > 0 else 0  # noqa: E731 - one-line rounding rule
    return (tuple(q(t) for t in f), tuple(q(t) for t in b), tuple(q(t) for t in w),
            (int(round(float(costs.comm) / slot)),))


def quantisation_error(placement: Placement, costs, resolution: int) -> float:
    """How far :func:`quantise`'s slots at ``resolution`` are from the costs: the largest error of a
    chunk pass time relative to that time, and of ``comm`` relative to the shortest pass (a hop
    shorter than half a slot rounds to nothing); ``inf`` when nothing quantises."""
    got = quantise(placement, costs, resolution)
    if got is None:
        return math.inf
    times = [t for ts in costs.stage_times(placement.num_stages, placement.num_devices) for t in ts]
    slots = [n for ns in got[:3] for n in ns]
    shortest = min(t for t in times if t > 0)
    slot = shortest / resolution
    err = max(abs(n * slot - t) / t for n, t in zip(slots, times) if t > 0)
    return max(err, abs(got[3][0] * slot - float(costs.comm)) / shortest)


#: :func:`resolutions` per placement and costs (each search of a sweep asks again)
_RESOLUTIONS = LRU(256)


def resolutions(placement: Placement, costs) -> tuple[int, ...]:
    """The resolutions the family lays blocks out at: :data:`RESOLUTION`, and where its slots are
    not exact (:func:`quantisation_error`), also the one of :data:`FINER` nearest the costs (ties:
    the coarser, whose search is faster)."""
    key = (placement, costs)
    got = _RESOLUTIONS.get(key)
    if got is None:
        if quantisation_error(placement, costs, RESOLUTION) <= 1e-9:
            got = (RESOLUTION,)
        else:
            got = (RESOLUTION, min(FINER, key=lambda r: (quantisation_error(placement, costs, r), r)))
        _RESOLUTIONS.put(key, got)
    return got



def _chain_bounds(placement: Placement, dF, dB, dW, comm, cap: int, copies: int = 1) -> int:
    """The smallest period worth trying (slots) for a block of ``copies`` microbatches: a device's
    work, and its activation held over the shortest lifespans (Little's law: a device holding
    ``cap`` at most holds ``Σ ℓ·act`` over one period of ``P`` only if ``P ≥ Σ ℓ·act / cap``)."""
    S, p = placement.num_stages, placement.num_devices
    dev = placement.stage_device
    work = [0] * p
    for s in range(S):
        work[dev[s]] += dF[s] + dB[s] + dW[s]
    # shortest start of each pass along the chain, from F of stage 0 at 0
    tf = [0] * S
    for s in range(1, S):
        tf[s] = tf[s - 1] + dF[s - 1] + (comm if dev[s] != dev[s - 1] else 0)
    tb = [0] * S
    tb[S - 1] = tf[S - 1] + dF[S - 1]
    for s in range(S - 2, -1, -1):
        tb[s] = tb[s + 1] + dB[s + 1] + (comm if dev[s] != dev[s + 1] else 0)
    held = [0] * p
    for s in range(S):
        held[dev[s]] += tb[s] + dB[s] + dW[s] - tf[s]  # one activation unit per stage
    return max(copies * max(work), max(math.ceil(copies * h / cap) for h in held))


#: :func:`_arrays` per placement and copies (every period of every cap's search asks again)
_ARRAYS = LRU(256)


def _arrays(placement: Placement, copies: int = 1):
    """The kernels' view of a block of ``copies`` microbatches: each stage's device, each device's
    stages copy by copy, and their count (see :func:`_evaluate`; the kernels only read them)."""
    key = (placement, copies)
    got = _ARRAYS.get(key)
    if got is None:
        got = _ARRAYS.put(key, _make_arrays(placement, copies))
    return got


def _make_arrays(placement: Placement, copies: int):
    S, p = placement.num_stages, placement.num_devices
    dev = ints(list(placement.stage_device) * copies)
    nst = ints([sum(1 for s in range(copies * S) if dev[s] == d) for d in range(p)])
    stages = np.zeros((p, max(1, int(nst.max()))), dtype=np.int64)
    for d in range(p):
        mine = [s for s in range(copies * S) if dev[s] == d]
        stages[d, : len(mine)] = mine
    return dev, stages, nst


def _fits(placement: Placement, durations, cap: int, P: int, iters: int, seeds: int, start=None, steps=_STEPS,
          copies: int = 1, failed: set | None = None):
    """A block of period ``P`` within ``cap``: ``(P, x, delays)`` from the first local search that
    finds one — from the delays ``start`` (a longer period's block) if given, then from no delays
    with ``seeds`` fixed seeds (the copies of a block of several microbatches started ``P/copies``
    apart) — or ``None``.

    ``failed``: the restarts of one block search (the same cap, costs, steps and ``iters``) known
    to find nothing, as ``(P, seed, starting delays)``; a restart in it is skipped (the search is
    deterministic: it would fail again) and each one that fails is added."""
    dF, dB, dW, (comm,) = durations
    dev, stages, nst = _arrays(placement, copies)
    S = placement.num_stages
    act = np.ones(copies * S, dtype=np.int64)
    x = np.zeros((3, copies * S), dtype=np.int64)
    dF, dB, dW = ints(list(dF) * copies), ints(list(dB) * copies), ints(list(dW) * copies)
    starts = ([start] if start is not None else []) + [None] * seeds
    for seed, first in enumerate(starts):
        if first is None:
            delta = np.zeros(copies * S, dtype=np.int64)
            delta[S::S] = np.arange(1, copies) * P // copies
        else:
            delta = first.copy()
        key = (P, seed, delta.tobytes())
        if failed is not None and key in failed:
            continue
        if _search(dev, stages, nst, dF, dB, dW, int(comm), act, int(cap), int(P),
                   int(iters), PATIENCE, int(seed), steps, delta, x, S):
            return P, x.copy(), delta
        if failed is not None:
            failed.add(key)
    return None


def _steps(scale: int) -> np.ndarray:
    """The local search's delay changes in slots: :data:`_STEPS`, and at a finer resolution
    (``scale`` slots where :data:`RESOLUTION` has one) the same changes in time as well."""
    return np.unique(np.concatenate([_STEPS, _STEPS * scale]))


def _one_block(placement: Placement, durations, cap: int, iters: int, seeds: int, scale: int):
    """:func:`cyclic_block` with the delays it found: ``(P, x, delays)`` or ``None``."""
    S, p = placement.num_stages, placement.num_devices
    if max(sum(1 for s in range(S) if placement.stage_device[s] == d) for d in range(p)) > 2:
        return None
    dF, dB, dW, (comm,) = durations
    lo = _chain_bounds(placement, dF, dB, dW, comm, cap)
    hi = min(MAX_SLOTS, int(math.ceil(SPAN * lo)))
    steps = _steps(scale)
    failed: set = set()  # the restarts that found nothing: the descent below tries some of them again
    best = _fits(placement, durations, cap, hi, iters, seeds, None, steps, failed=failed) if hi >= lo else None
    if best is None:
        return None
    a = lo  # bisection with one restart a period, from the delays of the shortest block so far ...
    while a < best[0]:
        mid = (a + best[0]) // 2
        got = _fits(placement, durations, cap, mid, iters, 1, best[2], steps, failed=failed)
        if got is None:
            a = mid + 1
        else:
            best = got
    return _shorten(placement, durations, cap, best, lo, iters, seeds, steps, failed=failed)  # ... then every restart


def _shorten(placement: Placement, durations, cap: int, best, lo: int, iters: int, seeds: int, steps,
             copies: int = 1, failed: set | None = None):
    """From the block ``best`` (``(P, x, delays)``), one slot shorter at a time down to the lower
    bound ``lo``, each from the last block's delays and ``seeds`` fresh restarts, until a period
    has none found: the shortest block found (``failed``: see :func:`_fits`)."""
    while best[0] > lo:
        got = _fits(placement, durations, cap, best[0] - 1, iters, seeds, best[2], steps, copies, failed)
        if got is None:
            break
        best = got
    return best


def cyclic_block(placement: Placement, durations, cap: int, iters: int = ITERS, seeds: int = SEEDS, scale: int = 1):
    """The block of the shortest period found within ``cap`` (activation units: one per stage),
    for quantised ``durations`` (:func:`quantise`): ``(P, x)`` with ``x[k, s]`` the start slot of
    pass kind ``k`` (F, B, W) of stage ``s``; ``None`` when none was found.

    The period is bisected between the lower bound and :data:`SPAN` times it (at most
    :data:`MAX_SLOTS`), which must have a block, with one search a period from the delays of the
    shortest block so far and one from none; then, with every restart, shorter periods are tried
    one by one until one has none found. The local search does
    not prove that a period has no block: a period without one found ends the fitting ones."""
    got = _one_block(placement, durations, cap, iters, seeds, scale)
    return None if got is None else got[:2]


def copies_block(placement: Placement, durations, cap: int, one, copies: int = COPIES, iters: int | None = None,
                 seeds: int | None = None, scale: int = 1):
    """A block of ``copies`` microbatches, each with its own layout, shorter than ``copies``
    periods of the one-microbatch block ``one`` (``(P, x, delays)`` of :func:`_one_block`):
    ``(P, x)`` with ``x[k, i·S + s]`` the start of copy ``i``'s pass (microbatch ``j`` runs copy
    ``j mod copies`` shifted by ``⌊j / copies⌋·P``), or ``None`` when none shorter was found.

    The search starts from ``one`` repeated (copy ``i`` started ``i`` periods later: the same
    block, so it fits ``copies`` periods) and tries one slot shorter at a time, each from the
    delays of the last block found and from ``seeds`` fresh restarts, until none is found."""
    S = placement.num_stages
    iters = COPIES_ITERS if iters is None else iters
    seeds = COPIES_SEEDS if seeds is None else seeds
    P1, _, d1 = one
    dF, dB, dW, (comm,) = durations
    lo = _chain_bounds(placement, dF, dB, dW, comm, cap, copies)
    if copies * P1 - 1 < lo:
        return None  # the block is at the bound already: no block of several is shorter
    start = np.concatenate([d1] * copies)
    start[::S] = np.arange(copies) * P1
    steps = _steps(scale)
    best = _fits(placement, durations, cap, copies * P1, iters, 0, start, steps, copies)
    if best is None:  # pragma: no cover - the repeated block lays out as itself (tested)
        return None
    best = _shorten(placement, durations, cap, best, lo, iters, seeds, steps, copies)
    return best[:2] if best[0] < copies * P1 else None


def block_order(placement: Placement, m: int, P: int, x: np.ndarray) -> np.ndarray:
    """The block repeated over ``m`` microbatches, each device's passes in start order, as the
    engine's pass keys (``int64[p, 3·v·m]``): microbatch ``j`` at ``x + j·P`` for a block of one
    microbatch (``x[k, s]``); for a block of ``K`` (``x[k, i·S + s]``, :func:`copies_block`)
    microbatch ``j`` at copy ``j mod K``'s slots plus ``⌊j / K⌋·P``. Ties in time go by key."""
    S, p = placement.num_stages, placement.num_devices
    K = x.shape[1] // S
    j = np.arange(m, dtype=np.int64)
    # times[k, s, j]: copy j mod K's start of pass kind k of stage s, shifted by its repeats; the keys
    # k·S·m + s·m + j are the same array's flat positions
    times = np.asarray(x, dtype=np.int64).reshape(3, K, S)[:, j % K, :].transpose(0, 2, 1) + (j // K) * P
    keys = np.arange(3 * S * m, dtype=np.int64).reshape(3, S, m)
    mine = np.array([[s for s in range(S) if placement.stage_device[s] == d] for d in range(p)], dtype=np.int64)
    t = times[:, mine, :].transpose(1, 0, 2, 3).reshape(p, -1)  # [d, (k, stage of d, j)]
    kk = keys[:, mine, :].transpose(1, 0, 2, 3).reshape(p, -1)
    order = np.lexsort((kk, t), axis=-1)
    return ints(np.take_along_axis(kk, order, axis=-1))


#: a cap's candidate keys: the same block repeated for the same ``m`` at every budget of a sweep
_ORDERS = LRU(1024)


def _cached_order(placement: Placement, m: int, P: int, x: np.ndarray) -> np.ndarray:
    key = (placement, m, P, x.shape, x.tobytes())
    got = _ORDERS.get(key)
    if got is None:
        got = _ORDERS.put(key, block_order(placement, m, P, x))
        got.flags.writeable = False
    return got


#: the one-microbatch blocks (with their delays), shared by the families of one resolution: a block
#: of several microbatches starts from the same search's block
_ONE = LRU(4096)


def _cached_one(placement: Placement, durations, h: int, seeds: int, scale: int):
    key = (placement, durations, h, seeds, scale)
    got = _ONE.get(key)
    if got is None:
        got = _ONE.put(key, _one_block(placement, durations, h, ITERS, seeds, scale) or ())
    return got


class CyclicFamily(Family):
    """See the module docstring. ``finer=False``: blocks at :data:`RESOLUTION` only; ``finer=True``:
    at the finer resolution of :func:`resolutions` only (none where :data:`RESOLUTION` is exact).
    ``copies > 1``: blocks of that many microbatches (:func:`copies_block`), each started from the
    same resolution's one-microbatch block, where one shorter than ``copies`` of its periods is
    found. The searches run the finer one, then the blocks of two microbatches, last, after every
    climb, so what the others find (the climbs start from their best) is unchanged and these only
    ever add a candidate."""

    name = "cyclic"

    def __init__(self, finer: bool = False, copies: int = 1) -> None:
        self.finer = finer
        self.copies = copies
        self.name = "cyclic" + ("-finer" if finer else "") + (f"-x{copies}" if copies > 1 else "")
        self._blocks = LRU(2048) if copies > 1 else None  # the one-microbatch blocks are in _ONE

    def block(self, placement: Placement, durations, h: int, scale: int = 1):
        """The block of cap ``h`` (cached per placement, quantised costs, cap and step scale), or ``()``."""
        seeds = FINER_SEEDS if self.finer else SEEDS
        one = _cached_one(placement, durations, h, seeds, scale)
        if self.copies == 1 or not one:
            return one[:2]
        key = (placement, durations, h, scale)
        got = self._blocks.get(key)
        if got is None:
            got = self._blocks.put(key, copies_block(placement, durations, h, one, self.copies, scale=scale) or ())
        return got

    def sets(self, q: Query, progress: Incumbent):
        P = q.placement
        p = P.num_devices
        if q.fused or P.num_stages > 2 * p:
            return
        if self.copies > 1 and p > (COPIES_FINER_MAX_P if self.finer else COPIES_MAX_P):
            return  # see COPIES_MAX_P
        base = P.num_stages // p
        top = min(int(math.floor(q.cap * base + 1e-9)), int(math.floor(TOP * base * p)))
        seen = set()
        grid = caps(p, top, base)
        if self.finer and p > FINER_ALL_CAPS_P:
            full = caps(p, int(math.floor(TOP * base * p)), base)
            grid = [h for h in grid if (len(full) - 1 - full.index(h)) % 2 == 0]
        r = resolutions(P, q.costs)[-1] if self.finer else RESOLUTION
        if self.finer and r == RESOLUTION:
            return  # two slots a pass are exact: the coarse family has it all
        durations = quantise(P, q.costs, r)
        if durations is None:
            return
        at = "" if r == RESOLUTION else f" at resolution {r}"
        # from the budget down: a smaller cap's candidates peak lower, so once the bound says a cap
        # cannot win, no smaller one can (the bound only grows as the peak falls)
        for h in reversed(grid):
            if progress.hopeless(q, h / base):
                break
            got = self.block(P, durations, h, max(1, round(r / RESOLUTION)))
            if not got:
                continue
            keys = _cached_order(P, q.m, got[0], got[1])
            raw = keys.tobytes()
            if raw in seen:
                continue
            seen.add(raw)
            what = "cyclic block" if self.copies == 1 else f"cyclic block of {self.copies} microbatches"
            # one set a cap, so the search times it now: a better candidate lets the bound stop the caps below
            yield CandidateSet(P, q.m, False, keys[None], (f"{what}, period {got[0]} slots{at}, cap {h}",))
