"""Budgeted search with the memory levers: ``recompute="auto"`` / ``offload="auto"`` on a
memory-budgeted schedule (``v-shape``, ``zb``; docs/theory.md §13).

A greedy on top of the budgeted search. Reordering alone pays a growing bubble below V-Min's
memory; the levers pay a recompute or a copy instead. The seeds are the search's schedules at
looser budgets ``L' = L·2^j`` (below 1F1B's memory; the first looser one that fits no more ends
them once one did) and the placement's fixed patterns whose ``W`` follows its ``B`` (1F1B; V-Min
and V-Half: ``registry.LEVER_SEEDS``). On every device of a seed still above the budget ``L``,
levers are put on its forwards in order of their lifespan (the time from the forward's end to
its backward's start: the longest hide a copy best, PipeOffload's insight) until the device fits
(:func:`fit_with_levers`: with offload allowed, each round takes just the forwards whose saving
spans the stretches of the memory curve above the budget; recompute alone an eighth of them a
round). A forward is offloaded when offload is allowed and its lifespan covers the copy out and
back (``2 · Costs.offload`` per ``a``), else recomputed when recompute is allowed; when the
offloads stop lowering the memory (the copy lanes are full), recomputes take over. With both
allowed, recompute alone is fitted too. The fastest schedule within the budget wins, the
reordering-only one at ``L`` included, so the levers are used only when they are faster.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterable

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.model.levers import apply_levers, with_offload, with_recompute
from ctrlmem.model.simulate import SimResult, simulate

__all__ = ["search_with_levers", "fit_with_levers", "w_after_b", "held_for_w"]

_EPS = 1e-9


def search_with_levers(generate: Callable[[float], Schedule], memory_limit: float, costs: Costs,
                       recompute: str, offload: object,
                       patterns: Callable[[], Iterable[Schedule]] = tuple) -> Schedule:
    """The fastest schedule within ``memory_limit`` (a fraction of 1F1B's peak ``p·a``) among the
    budgeted search's own (``generate(limit)``), its schedules at looser budgets brought under
    the limit with levers, and the fixed ``patterns()`` of its placement brought under it the same
    way (1F1B for the sequential placement: at 0.3 of 1F1B's memory, p = 6, m = 12, costs
    2,3,1,0.2, it gives 1F1B-R's 128 where the looser seeds gave nothing and reordering 396).
    ``recompute`` is ``none``, ``selective``, ``full`` or ``auto`` (both modes tried); ``offload``
    ``none``, a fraction or ``auto`` (fraction 1)."""
    # full first: where offloads and full recomputes together cannot fit, selective ones (which
    # keep more) are not tried (each such failed fit took 0.5 s at p = 16, m = 64)
    modes = {"auto": ("full", "selective"), "none": (None,)}.get(recompute, (recompute,))
    fraction = None if offload == "none" else 1.0 if offload == "auto" else float(offload)
    best: tuple[float, float, Schedule] | None = None
    try:
        plain = generate(memory_limit)
    except ValueError:  # below what reordering alone reaches: the levers must do it
        plain = None
    if plain is not None:
        r = simulate(plain, costs)
        best = (r.makespan, r.max_peak_memory, plain)
    # with both levers allowed, recompute alone too: offloads first fill the copy lanes and then
    # leave recomputes less to do than they would have done alone (worse on 47 of 114 cases,
    # p = 4-16, budgets 1/p-0.4, three cost mixes), so both together must not be all that is tried
    combos = [(mode, fraction) for mode in modes]
    if fraction is not None:
        combos += [(mode, None) for mode in modes if mode is not None]

    spans: dict[int, tuple[Schedule, float]] = {}  # id -> (the seed, kept alive, its own makespan)

    def own_makespan(seed: Schedule) -> float:
        if id(seed) not in spans:
            spans[id(seed)] = (seed, simulate(seed, costs).makespan)
        return spans[id(seed)][1]

    def consider(seed: Schedule) -> bool:
        """Fit ``seed`` with each lever choice; whether one fitted."""
        nonlocal best
        cap = memory_limit * seed.num_devices
        # levers only add work and waits to fixed orders, so nothing fitted from a seed is faster
        # than the seed itself: one no faster than the best so far cannot win
        own = own_makespan(seed)
        if best is not None and own >= best[0]:
            return True
        any_fit, done, failed = False, set(), set()
        for mode, share in combos:
            if best is not None and best[0] <= own + _EPS:
                break  # a fit as fast as the seed itself: no other lever choice beats it
            if share in done:
                continue  # this share's fit needed no recompute: the other mode gives the same
            if share is not None and mode == "selective" and share in failed:
                continue
            fitted = fit_with_levers(seed, cap, costs, mode, share)
            if fitted is None:
                if mode == "full":
                    failed.add(share)
                continue
            any_fit = True
            if not fitted.recomputes:
                done.add(share)
            r = simulate(fitted, costs)
            if best is None or (r.makespan, r.max_peak_memory) < best[:2]:
                best = (r.makespan, r.max_peak_memory, fitted)
        return any_fit

    _over_seeds(consider, generate, memory_limit, patterns, tighten=recompute != "none", patterns_by=own_makespan)
    if best is None:
        raise ValueError(f"no schedule fits memory_limit={memory_limit:g} of 1F1B's peak even with the levers "
                         f"(recompute={recompute}, offload={offload}); raise the limit"
                         + (" or allow recompute (recompute='auto')" if recompute == "none" else ""))
    return best[2]


def every_forward_levered(generate: Callable[[float], Schedule], memory_limit: float, costs: Costs,
                          recompute: str, offload: object,
                          patterns: Callable[[], Iterable[Schedule]] = tuple) -> Schedule:
    """A budgeted search asked for a fixed lever on every forward (``recompute`` ``full`` or
    ``selective``, ``offload`` ``none`` or a fraction): the fastest, with the lever on every
    forward, of the order the search builds at ``memory_limit``, its orders at looser budgets and
    the fixed ``patterns()``, each as it is and with every ``W`` right after its ``B`` (a
    deferred ``W`` keeps a recomputed stage whole: ZB's order at 0.75, p = 4, m = 6, F = B = W,
    with every forward selectively recomputed peaks at 3 a as it is and 1.6 a so), that then fit
    ``memory_limit``. The lever frees memory, so the order built for the budget alone wastes
    it: zb at p = 4, m = 8, costs 3,4,2,0.1 and 0.375 of 1F1B's memory runs one microbatch at a time
    (268.8 with every forward recomputed) where 1F1B with every forward recomputed (1F1B-R) fits
    and takes 123.6 (``recompute="auto"``, recomputing 22 of the 32 forwards: 117.6).
    ``ValueError`` when none fits."""
    best: tuple[float, float, Schedule] | None = None

    def consider(order: Schedule) -> bool:
        nonlocal best
        levered = apply_levers(order, recompute, offload, costs)
        r = simulate(levered, costs)
        if r.max_peak_memory > memory_limit * order.num_devices + _EPS:
            return False
        if best is None or (r.makespan, r.max_peak_memory) < best[:2]:
            best = (r.makespan, r.max_peak_memory, levered)
        return True

    _over_seeds(consider, generate, memory_limit, patterns, tighten=True, at_limit=True)
    if best is None:
        raise ValueError(f"no schedule fits memory_limit={memory_limit:g} of 1F1B's peak with recompute={recompute} "
                         f"and offload={offload} on every forward; raise the limit, or let the search choose "
                         "(recompute='auto', offload='auto')")
    return best[2]


def _over_seeds(consider: Callable[[Schedule], bool], generate: Callable[[float], Schedule], memory_limit: float,
                patterns: Callable[[], Iterable[Schedule]], tighten: bool, at_limit: bool = False,
                patterns_by: Callable[[Schedule], float] | None = None) -> None:
    """``consider`` (whether its seed fitted) on the search's order at ``memory_limit`` (with
    ``at_limit``; skipped where reordering alone reaches no such order), on ``patterns()`` (they
    take no search and often win, so later seeds are cut) and on the search's orders at looser
    budgets, each as it is and, with ``tighten``, with every ``W`` right after its ``B``. A looser
    seed needs more levers: once one fitted, the looser ones stop at the first that does not
    (each seed is a whole search). ``patterns_by``: the patterns (and their tightened forms) are
    considered in its ascending order (their own makespan: the fastest first, whose fit then cuts
    the slower ones; V-Half's 688.4 before V-Min's 908.3 at p = 16, m = 64, 3:4:2:0.1)."""

    def both(seed: Schedule) -> bool:
        fits = consider(seed)
        tight = w_after_b(seed) if tighten else seed
        if tight is not seed:
            fits = consider(tight) or fits
        return fits

    if at_limit:
        try:
            both(generate(memory_limit))
        except ValueError:  # below what reordering alone reaches: a looser order or a pattern may fit
            pass
    if patterns_by is None:
        for seed in patterns():
            both(seed)
    else:
        seeds = []
        for seed in patterns():
            seeds.append(seed)
            tight = w_after_b(seed) if tighten else seed
            if tight is not seed:
                seeds.append(tight)
        for seed in sorted(seeds, key=patterns_by):
            consider(seed)
    fitted_before = last_fitted = False
    for loose in _looser(memory_limit):
        if fitted_before and not last_fitted:
            break
        last_fitted = both(generate(loose))
        fitted_before = fitted_before or last_fitted


def w_after_b(schedule: Schedule) -> Schedule:
    """``schedule`` with every ``W`` moved right after its ``B`` on its device (``schedule`` itself
    when every ``W`` is there already, or it has none). A ``W`` needs only its ``B`` and nothing
    needs a ``W``, so the order stays valid. A recomputed forward holds its whole activation from
    its ``R`` to its ``W``: with ``R``, ``B``, ``W`` back to back a device holds one stage's whole
    activation at a time, beside the inputs the others keep. That reaches below one microbatch per
    device on the V placement, where the V patterns as they are (their ``W`` deferred) fit nothing:
    at p = 16, m = 64, F = B = W, 1/16 of 1F1B's memory, V-Half so with every forward recomputed
    runs 284.5 where reordering alone takes 1166.5 (1F1B-R needs 0.118 and takes 301)."""
    rows, changed = [], False
    for row in schedule.device_passes:
        ws = {(ps.stage, ps.microbatch): ps for ps in row if ps.op is Op.W}
        out: list = []
        for ps in row:
            if ps.op is Op.W:
                continue
            out.append(ps)
            if ps.op is Op.B and (ps.stage, ps.microbatch) in ws:
                out.append(ws[ps.stage, ps.microbatch])
        changed = changed or tuple(out) != row
        rows.append(tuple(out))
    if not changed:
        return schedule
    return replace(schedule, name=schedule.name, device_passes=tuple(rows))


def _looser(limit: float) -> list[float]:
    """``L·2^j`` for ``j >= 1`` below 1F1B's memory. Not 1F1B's memory itself: there the budgeted
    searches defer their ``W`` passes, and what waits for a ``W`` is beyond every lever (they act
    between a forward and its ``B``; the seed at 1.0 with every forward recomputed keeps its peak
    of ``p·a`` at p = 16), so it never fitted: 0 of 390 cases (v-shape and zb, p = 2-16, budgets
    1/8-3/4, three cost mixes with copy costs 0.5-4 per a, recompute and offload each alone and
    together)."""
    out, x = [], limit * 2
    while x < 1.0 - _EPS:
        out.append(x)
        x *= 2
    return out


def fit_with_levers(schedule: Schedule, cap: float, costs: Costs, mode: str | None,
                    fraction: float | None) -> Schedule | None:
    """``schedule`` with levers on its longest-lived forwards until every device's peak is at
    most ``cap`` (in ``a``), or ``None`` when the allowed levers cannot get there. Each round
    with offload allowed takes the forwards that cover the memory above the cap
    (:func:`_next_picks`); after ``k`` rounds in a row that left it no lower (a copy that waits
    for a full copy lane frees nothing yet), the next takes ``2^(k-1)/8`` of each device's
    forwards; after ``_PATIENCE`` such rounds the offloads stop (recompute from then on, or the
    end when recompute is not allowed), and the recomputes that follow are chosen the same way.
    Recompute alone takes an eighth of each device's forwards a round, longest lifespan first,
    until every forward has one (fewer recomputes, chosen by coverage, gave longer makespans on
    most of a grid at p = 6-16)."""
    if mode is None and fraction is None:
        return None
    if max(held_for_w(schedule)) > cap + _EPS:
        return None  # what waits between a backward and its W is beyond every lever
    if fraction is None and _excess(simulate(with_recompute(schedule, mode), costs), cap) > _EPS:
        return None  # every forward recomputed does not fit: no subset does (recompute alone only lowers memory)
    r = simulate(schedule, costs)
    excess = _excess(r, cap)
    stalled, switched = 0, False
    while excess > _EPS:
        picks = _next_picks(r, cap, costs, mode, fraction, broad=stalled if fraction is not None or switched else 1)
        if not picks:
            return None
        offs = [k for k, lever in picks if lever == "O"]
        recs = [k for k, lever in picks if lever == "R"]
        if recs and mode is None:
            return None
        if offs:
            schedule = with_offload(schedule, fraction, which=offs, costs=costs)
        if recs:
            schedule = with_recompute(schedule, mode, which=recs)
        r = simulate(schedule, costs)
        now = _excess(r, cap)
        stalled = stalled + 1 if now >= excess - _EPS else 0
        if stalled >= _PATIENCE:
            if fraction is not None and mode is not None:
                fraction, stalled, switched = None, 0, True  # offloads stopped paying: recompute from now on
            elif fraction is not None:
                return None  # offloads only, and they stopped paying
            elif switched:
                stalled = _PATIENCE  # then every forward left at once, until none is
            else:
                stalled = 0  # recompute alone: an eighth a round, until every forward has one
        excess = now
    return schedule


_PATIENCE = 4
"""Rounds in a row without progress before :func:`fit_with_levers` changes lever or gives up."""


def held_for_w(schedule: Schedule) -> list[float]:
    """Per device, in ``a``, the most its order keeps of the forwards whose backward has started
    and whose ``W`` has not ended (a ``B`` or ``BW`` counting its own): a lower bound of its peak
    with any levers, which act only between a forward and its backward (a recompute's ``R`` and
    an offload's reload both come before the ``B``, which then sees the whole activation, and
    with ``B`` releasing nothing the whole stays until ``W``; the simulator's default memory
    model). Order alone decides it, not timing: a seed above the budget here fits with no lever
    (at p = 16, m = 64 the looser seeds of V-shape at 0.2 and 0.375 hold 12 a so, and each
    failed fit had taken 0.5 s)."""
    act = schedule.num_devices / schedule.num_stages
    out = []
    for row in schedule.device_passes:
        level = peak = 0.0
        for ps in row:
            if ps.op is Op.B:
                level += act
                peak = max(peak, level)
            elif ps.op is Op.BW:
                peak = max(peak, level + act)
            elif ps.op is Op.W:
                level -= act
        out.append(peak)
    return out


def _excess(r: SimResult, cap: float) -> float:
    """How far the devices' peaks are above ``cap``, summed."""
    return sum(max(0.0, peak - cap) for peak in r.peak_memory)


def _next_picks(r: SimResult, cap: float, costs: Costs, mode: str | None,
                fraction: float | None, broad: int = 0) -> list[tuple[tuple[int, int], str]]:
    """On every device above ``cap``: forwards without a lever yet, longest lifespan first, each
    with its lever (``O`` offload when its lifespan covers the copy out and back, else ``R``
    recompute), as many as cover the excess: a forward counts for the stretches of the memory
    curve above ``cap`` its lever's saving spans (an offload's from its copy out to its reload, a
    recompute's from its forward to its ``R``), and the picks stop once every stretch is
    covered. With ``broad = k > 0`` the picks are ``2^(k-1)/8`` of its forwards (at least one),
    longest lifespan first, and an eighth on a device where no forward spans a stretch, so the
    fitting always moves."""
    s = r.schedule
    taken = {(ps.stage, ps.microbatch) for row in s.device_passes for ps in row if ps.op is Op.R}
    taken |= {(c.stage, c.microbatch) for row in s.copies for c in row}
    lives: list[list[tuple[float, float, tuple[int, int]]]] = [[] for _ in range(s.num_devices)]
    for dev, stage, mb, end, b_start in r.forward_windows():
        if (stage, mb) not in taken:
            lives[dev].append((b_start - end, end, (stage, mb)))
    act = s.num_devices / s.num_stages
    one_way = float(costs.offload) * act * (fraction or 0.0)
    saves = {"O": act * (fraction or 0.0), "R": act * (1.0 - costs.kept_fraction(mode)) if mode else 0.0}
    redo = costs.recompute_times(s.num_stages, s.num_devices, mode) if mode else [0.0] * s.num_stages
    picks = []
    for d, peak in enumerate(r.peak_memory):
        if peak <= cap + _EPS:
            continue
        free = sorted(lives[d], reverse=True)
        times, values = r.memory_curve(d)
        stretches = [[times[i], times[i + 1], values[i] - cap] for i in range(len(times) - 1)
                     if values[i] > cap + _EPS]
        chosen = []
        for life, end, key in ([] if broad else free):
            lever = "O" if fraction is not None and life >= 2 * one_way else "R"
            lo, hi = (end + one_way, end + life - one_way) if lever == "O" else (end, end + life - redo[key[0]])
            covered = [st for st in stretches if st[2] > _EPS and lo <= st[0] and st[1] <= hi]
            if not covered or saves[lever] <= 0:
                continue
            chosen.append((key, lever))
            for st in covered:
                st[2] -= saves[lever]
            if all(st[2] <= _EPS for st in stretches):
                break
        if not chosen:
            share = min(1.0, 2 ** (broad - 1) / 8) if broad else 1 / 8
            chosen = [(key, "O" if fraction is not None and life >= 2 * one_way else "R")
                      for life, _, key in free[: max(1, math.ceil(len(free) * share))]]
        picks += chosen
    return picks
