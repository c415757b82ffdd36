"""The exact optimum for small pipelines: a CP-SAT model of the whole schedule (OR-Tools).

Every heuristic of :mod:`ctrlmem.schedules` is measured against this physical limit: the
shortest makespan any order of the passes reaches on the given devices under the given costs and
activation budget. :func:`optimal` builds the model, seeds it with the heuristics' best
schedule, and returns the solver's schedule with its makespan, the proven lower bound and the
status (``"optimal"`` when the two meet).

The model (integer-scaled costs; one interval per pass):

* each pass ``F``, ``B``, ``W`` of each stage and microbatch is an interval of fixed length on
  its stage's device; a device's intervals do not overlap;
* ``F`` of stage ``s`` starts after ``F`` of ``s−1`` ends plus ``comm`` across devices;
  ``B`` of ``s`` after ``B`` of ``s+1`` (the last stage's ``B`` after its ``F``) plus ``comm``;
  ``W`` after its ``B``;
* activation memory is a reservoir per device, in half-``a`` units: ``+act`` at each ``F``'s
  start, ``−act`` at its ``W``'s end, never above ``⌊2p · memory_limit⌋`` (releases count first
  at equal times, as in :func:`ctrlmem.simulate`);
* the makespan is the last end over all passes (all devices start at 0), minimised;
* with ``recompute`` allowed (``"full"`` or ``"selective"``, docs/theory.md §13), each forward
  may be recomputed, the solver's choice: a Boolean per stage and microbatch makes an optional
  ``R`` interval on the stage's device, after its ``F`` and before its ``B``; the forward gives
  back all but ``Costs.kept_fraction`` of its activation at its start and the ``R`` takes it again
  at its start (:func:`ctrlmem.simulate`'s accounting). Memory is then counted in ``a / 2K``
  units, ``K`` the kept fraction's denominator (17 for the default 2/34).

Symmetry breaking: microbatches are identical, so each (stage, pass type) runs them in order
(relabelling microbatches from the first stage where two overtake turns any schedule into one
of this form with the same times and memory). With recompute allowed microbatches differ by their
choices, so only the whole relabelling is used: the first stage's forwards run in order. Redundant
bounds: every device needs at least the time for the first forward to reach it plus its work
(recomputes only add to it). Importing ``ortools`` happens on the first call only.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from fractions import Fraction

from ctrlmem.util import checks
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import RECOMPUTE_MODES, Op, Pass, Placement, Schedule
from ctrlmem.model.levers import apply_levers, offload_choice
from ctrlmem.schedules.auto_levers import search_with_levers
from ctrlmem.schedules.registry import LEVER_SEEDS, SCHEDULES, register
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules.registry import build
from ctrlmem.solver.copies import CopyModel, share_units
from ctrlmem.solver.threaded import DET_SECONDS, solve

__all__ = ["OptimalResult", "optimal", "lever_search", "MAX_PASSES", "MAX_OFFLOAD_PASSES", "MAX_TIME_LIMIT",
           "PLACEMENTS"]

log = logging.getLogger(__name__)

PLACEMENTS = ("v-shape", "sequential")
"""The stage placements :func:`optimal` models."""


@dataclass(frozen=True)
class OptimalResult:
    """What :func:`optimal` found.

    Attributes:
        schedule: the best schedule found (the solver's, or the seed heuristic's if the solver
            found nothing better in time).
        makespan: its simulated makespan under the given costs.
        lower_bound: a proven lower bound on every schedule's makespan for these inputs.
        status: ``"optimal"`` (makespan equals the bound: proven), ``"feasible"`` (time ran out
            with a gap), or ``"timeout"`` (the time limit ran out before the solver had any
            schedule: while building the model, or solving; the result is the seed heuristic's,
            and ``lower_bound`` is 0 when the solver never ran).
        seed: the heuristic the search started from and its makespan.
        wall_s: seconds spent in the solver (for a ``"timeout"`` before the solver started: in
            the whole call).
        scale: the integer factor the costs were multiplied by for the model.
        trace: ``(seconds, makespan)`` at the start and at each improvement
            (:func:`ctrlmem.improve`; empty from :func:`optimal`).
        bounds: each lower bound by name, ``(name, value)`` (:func:`ctrlmem.improve`: the closed
            forms of :func:`ctrlmem.search.bounds.makespan_bounds` and ``"solver"``).
        cut_short: a ``deterministic`` run that the wall-clock safety limit stopped before its
            solver-seconds were spent: what it found depends on the machine's speed and load (a
            slow or busy machine stops it sooner), so it is not the reproducible result; run it
            again on a quieter machine, or with a larger limit.
    """

    schedule: Schedule
    makespan: float
    lower_bound: float
    status: str
    seed: tuple[str, float]
    wall_s: float
    scale: int
    trace: tuple = ()
    bounds: tuple = ()
    cut_short: bool = False

    @property
    def gap(self) -> float:
        """``makespan / lower_bound − 1`` (0 when proven optimal; never negative: a bound met up to
        rounding of inexact costs is a gap of 0)."""
        return max(0.0, self.makespan / self.lower_bound - 1) if self.lower_bound > 0 else 0.0


def integer_scale(values: list[float], most: int = 1000) -> tuple[int, bool]:
    """The smallest integer factor (≤ ``most``) that makes every value whole; else ``most``
    (values then rounded: ``exact`` False)."""
    for k in range(1, most + 1):
        if all(abs(v * k - round(v * k)) < 1e-9 for v in values):
            return k, True
    return most, False


MAX_PASSES = 20_000
"""Largest instance :func:`optimal` takes: ``3 · S · m`` passes (``S = 2p`` stages for the V-shape
placement, ``p`` for the sequential one), e.g. p = 16, m = 208 V-shape or p = 32, m = 208
sequential. The CP-SAT model has one interval per pass; beyond this size building it alone
takes longer than any sensible time limit, and the solver proves nothing. Larger instances are
refused with a ``ValueError``."""

SEARCH_SEED_PASSES = 1_500
"""Up to this many passes the solver's hint comes from every heuristic (the ``v-shape`` / ``zb``
searches and the cost-adapted V schedules included); above it only from the fixed patterns
(``v-min``, ``v-half``, ``v-zb`` / ``1f1b``, ``zb-h1``, ``zb-h2`` without costs), which take
milliseconds, so that the time limit also holds for the hint search."""


def _seed(p: int, m: int, costs: Costs, limit: float | None, placement: str,
          deadline: float, recompute: str = "none",
          fraction: float | None = None) -> tuple[str, Schedule, float] | None:
    """The fastest heuristic schedule within the budget (the solver's hint and fallback) and its
    makespan. The fixed patterns come first; the searches (slow at large sizes) only on
    instances of at most :data:`SEARCH_SEED_PASSES` passes, and no search starts after ``deadline``
    (nor a fixed pattern once one fits). With ``recompute`` allowed the fixed patterns also come fully recomputed, and
    the searches choose what to recompute (``recompute="auto"``); with an offload ``fraction``
    the fixed patterns also come with every forward offloaded, and the searches choose what to
    offload (``offload="auto"`` at a fraction of 1, else that fraction on every forward). A
    candidate whose levers the model cannot express (another recompute mode, another fraction)
    is skipped."""

    if placement == "v-shape":
        fixed, searched = ["v-min", "v-half", "v-zb"], ["v-shape", "v-min", "v-half", "v-zb"]
        stages = 2 * p
    else:
        fixed, searched = ["1f1b", "zb-h1", "zb-h2"], ["zb"]
        stages = p
    off = "none" if fraction is None else fraction
    candidates = [(name, False, "none", "none") for name in fixed]
    if recompute != "none":
        candidates += [(name, False, recompute, "none") for name in fixed]
    if fraction is not None:
        candidates += [(name, False, "none", off) for name in fixed]
    if 3 * stages * m <= SEARCH_SEED_PASSES:
        candidates += [(name, True, "none", "none") for name in searched]
        if limit is not None and (recompute != "none" or fraction is not None):
            auto_off = "none" if fraction is None else "auto" if fraction == 1 else fraction
            candidates += [(name, "levers", recompute, auto_off) for name in searched if name in ("v-shape", "zb")]
    best = None
    cap = None if limit is None else limit * p + 1e-9
    for name, adapted, lever, copies in candidates:
        # the fixed patterns take milliseconds: they are tried past the deadline until one fits, so
        # a short time limit on a loaded machine still has a fallback; the searches are not
        if deadline is not None and time.monotonic() >= deadline and (best is not None or adapted):
            log.info("optimal: hint search stopped at the time limit (before %s)", name)
            break
        try:
            kw = {"memory_limit": limit if limit is not None else 2.0} if name in ("v-shape", "zb") else {}
            if adapted == "levers":  # the lever search, recompute in the model's mode only
                s = lever_search(name, p, m, costs, limit, lever, copies)
            elif adapted or copies == "none":
                s = build(name, p, m, costs=costs if adapted else None, recompute=lever, offload=copies, **kw)
            else:  # a fixed pattern: its reloads issued for the real pass times
                s = apply_levers(build(name, p, m, **kw), lever, copies, costs)
        except ValueError:
            continue
        if s.recomputes and s.recompute_mode != recompute:
            continue  # "auto" may choose the other mode; the model allows one
        if any(c.kind == "O" and c.fraction != fraction for row in s.copies for c in row):
            continue  # the model copies one fraction
        r = simulate(s, costs)
        if cap is not None and max(r.peak_memory) > cap:
            continue
        if best is None or r.makespan < best[2]:
            best = (name, s, r.makespan)
    return best


def lever_search(name: str, num_devices: int, num_microbatches: int, costs: Costs, memory_limit: float,
                 recompute: str = "none", offload: object = "none") -> Schedule:
    """The budgeted search ``name`` (``"v-shape"`` or ``"zb"``) at ``memory_limit`` with levers
    chosen on top, as ``cm.build(name, ..., recompute="auto", offload=...)`` chooses them
    (:func:`ctrlmem.schedules.auto_levers.search_with_levers`, the placement's fixed patterns
    cost-adapted where they adapt), but recomputing in ``recompute``'s mode only (``"full"``,
    ``"selective"``; ``"auto"`` both; ``"none"`` no recompute) and asking the search for the
    shortest makespan (what the solver and the bounds measure). Raises ``ValueError`` when
    nothing fits."""
    p, m = num_devices, num_microbatches

    def generate(limit: float) -> Schedule:
        return build(name, p, m, costs=costs, memory_limit=limit, objective="makespan")

    def patterns():
        return (build(other, p, m, costs=costs if SCHEDULES[other].uses_costs else None)
                for other in LEVER_SEEDS[name])

    return search_with_levers(generate, memory_limit, costs, recompute, offload, patterns=patterns)


def _check_arguments(num_devices, num_microbatches, costs, memory_limit, placement, time_limit, workers,
                     recompute="none", offload="none", deterministic=False):
    """The arguments as plain values, checked as :func:`ctrlmem.build` checks its own (numpy
    numbers and costs text accepted; errors name the argument)."""
    if recompute not in ("none", *RECOMPUTE_MODES):
        raise ValueError(f"recompute must be none, {' or '.join(RECOMPUTE_MODES)} (the solver chooses which "
                         f"forwards to recompute in that mode), got {checks.short_repr(recompute)}")
    try:
        off = offload_choice(offload)
    except ValueError:
        raise ValueError(f"offload must be none, auto (offload whole activations) or a fraction in (0, 1] (the "
                         f"solver chooses which forwards to offload, that share of each), got "
                         f"{checks.short_repr(offload)}") from None
    fraction = None if off == "none" else 1.0 if off == "auto" else float(off)
    p = checks.integer("num_devices", num_devices)
    m = checks.integer("num_microbatches", num_microbatches)
    if not isinstance(placement, str) or placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {checks.short_repr(placement)}")
    if placement == "v-shape" and p < 2:
        raise ValueError("placement='v-shape' needs num_devices >= 2; use placement='sequential' for one device")
    limit = None if memory_limit is None else checks.memory_fraction("memory_limit", memory_limit)
    seconds = checks.number("time_limit", time_limit, positive=True, maximum=MAX_TIME_LIMIT, what="seconds")
    threads = checks.integer("workers", workers, maximum=256, what="solver threads")
    deterministic = checks.flag("deterministic", deterministic)
    costs = Costs.coerce(costs, "costs")
    stages = 2 * p if placement == "v-shape" else p
    passes = 3 * stages * m
    if passes > MAX_PASSES:
        raise ValueError(
            f"optimal: p={p}, m={m} ({placement}) has {passes} passes, more than the {MAX_PASSES} the exact solver "
            f"takes (ctrlmem.solver.optimal.MAX_PASSES: its model has one interval per pass); use smaller p and m, or a "
            f"heuristic: ctrlmem.build('v-shape' or 'zb', p, m, costs=..., memory_limit=...)")
    if fraction is not None and 4 * stages * m > MAX_OFFLOAD_PASSES:
        raise ValueError(
            f"optimal: offload={offload!r} at p={p}, m={m} ({placement}): {stages * m} forwards, each with a possible "
            f"copy out and back, more than the exact solver models with copies ({MAX_OFFLOAD_PASSES // 4} forwards, "
            f"ctrlmem.solver.optimal.MAX_OFFLOAD_PASSES: its timing constraints grow with the square of a device's "
            f"passes); use smaller p and m, or the lever search: ctrlmem.build('v-shape' or 'zb', p, m, costs=..., "
            f"memory_limit=..., offload='auto')")
    return p, m, costs, limit, seconds, threads, fraction, deterministic


def kept_units(fraction: float) -> tuple[int, int, bool]:
    """``fraction`` as ``(N, K, exact)`` with ``N / K`` it (``K`` ≤ 1000), rounded up when no such
    ``K`` is exact: the model then keeps a little more than the truth, so its schedules fit."""
    q = Fraction(fraction).limit_denominator(1000)
    if abs(float(q) - fraction) < 1e-12:
        return q.numerator, q.denominator, True
    k = 1000
    return min(k, math.ceil(fraction * k - 1e-12)), k, False


MAX_TIME_LIMIT = 7 * 24 * 3600.0
"""Largest ``time_limit`` accepted (a week, in seconds)."""

DET_WALL_FACTOR = 10
"""With ``deterministic=True`` the wall-clock safety limit is ``DET_WALL_FACTOR × time_limit + 60``
seconds: building a large model (offload allowed) takes wall time that CP-SAT's deterministic
time does not count, and a run cut by the wall clock depends on the machine's speed."""

MAX_OFFLOAD_PASSES = 1_024
"""Largest instance :func:`optimal` takes with offload allowed, counted as four passes per forward
(its F, B, W and a copy pair): 256 forwards, e.g. p = 4, m = 32 V-shape. The copies' timing
constraints (:mod:`ctrlmem.solver.copies`) grow with the square of a device's passes."""


def optimal(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    placement: str = "v-shape",
    time_limit: float = 60.0,
    workers: int = 2,
    recompute: str = "none",
    offload: object = "none",
    deterministic: bool = False,
    *,
    keep_levers: Schedule | None = None,
) -> OptimalResult:
    """The shortest-makespan schedule for ``num_devices`` × ``num_microbatches`` under ``costs``
    within ``memory_limit`` (fraction of 1F1B's ``p·a``; ``None``: unlimited), by CP-SAT.

    ``placement``: ``"v-shape"`` (device ``i`` holds stages ``i`` and ``2p−1−i``, the V family's
    placement) or ``"sequential"`` (one stage per device, as 1F1B and ZB). The backward is
    split (``B`` and ``W``). ``costs``: as :func:`ctrlmem.build` takes them (a ``Costs``, text
    ``"F,B,W[,COMM]"``, a tuple). ``workers``: the solver's threads. ``recompute`` ``"full"`` or
    ``"selective"`` lets the solver recompute any forward in that mode (an ``R`` pass of
    ``Costs.recompute_times``, keeping ``Costs.kept_fraction`` until it): the schedule says which,
    and the bound is then a lower bound over every schedule that may recompute.

    ``offload`` (a fraction φ in (0, 1], or ``"auto"``: φ = 1) lets the solver offload any
    forward (not one it recomputes): φ of its activation goes to host memory after it on the
    device's copy lanes and comes back before its backward, each copy taking
    ``φ · Costs.offload`` per ``a`` (docs/theory.md §13). The model then times every pass as
    :func:`ctrlmem.simulate` does (:mod:`ctrlmem.solver.copies`), so the schedule returned (with
    its ``Schedule.copies``) simulates to the solver's makespan, and the bound holds for every
    schedule whose offloads copy φ. It needs positive pass times and at most
    :data:`MAX_OFFLOAD_PASSES`.

    ``time_limit`` (seconds) bounds the whole call: the heuristic hint, building the model and
    solving. When it runs out first the result is the best heuristic schedule with status
    ``"timeout"``. ``deterministic=True`` counts the solver's deterministic time instead
    (``time_limit`` / :data:`ctrlmem.solver.threaded.DET_SECONDS` units, one worker, a fixed seed,
    the hint search run to its end): the same inputs give the same result on any machine and load,
    within a wall-clock safety limit (:data:`DET_WALL_FACTOR`). Meant for small
    pipelines: at most :data:`MAX_PASSES` passes (``3 · S · m``); larger instances are refused.

    ``keep_levers`` (:func:`ctrlmem.improve`'s whole model): a schedule of this instance whose
    choices the model keeps — the same forwards recomputed and offloaded, only the order and the
    copies' timing free — and which is the hint and the fallback instead of the heuristics. The
    bound is then one over those choices only.

    Raises ``TypeError`` / ``ValueError`` naming the argument for bad arguments, a budget that
    cannot hold one microbatch, an instance above the size limit, and a time limit that ran out
    before any schedule fitting the budget was found (raise ``time_limit``).
    """
    t_start = time.monotonic()
    p, m, costs, limit, seconds, threads, fraction, deterministic = _check_arguments(
        num_devices, num_microbatches, costs, memory_limit, placement, time_limit, workers, recompute, offload,
        deterministic)
    rec_on = recompute != "none"
    copies_on = fraction is not None
    levers = rec_on or copies_on
    wall = DET_WALL_FACTOR * seconds + 60 if deterministic else seconds
    deadline = t_start + wall
    from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    S = P.num_stages
    f, b, w = costs.stage_times(S, p)
    act_a = MemoryModel().stage_activation(S, p)
    # memory units: a / (2 K D): half-a units, K the kept share's denominator (recompute), D the
    # offloaded share's (a recomputed forward keeps N / K, an offload copies N' / D)
    keep_n, keep_k, keep_exact = kept_units(costs.kept_fraction(recompute)) if rec_on else (1, 1, True)
    share_n, share_d, share_exact = share_units(fraction) if copies_on else (0, 1, True)
    unit = keep_k * share_d
    half = [int(round(2 * x)) for x in act_a]
    act = [h * unit for h in half]
    kept = [h * keep_n * share_d for h in half]
    share = [h * keep_k * share_n for h in half]
    cap = None
    if limit is not None:
        cap = math.floor(2 * unit * p * limit + 1e-9)
        # without levers a device holds one microbatch of each of its stages; with them, at least
        # one stage's whole activation (its F, R or B running) beside what the others keep
        least = [min([act[s]] + ([kept[s]] if rec_on else []) + ([act[s] - share[s]] if copies_on else []))
                 for s in range(S)]
        need = max(max(act[s] + sum(least[t] for t in P.stages_of(d) if t != s) for s in P.stages_of(d))
                   if levers else sum(act[s] for s in P.stages_of(d)) for d in range(p))
        if cap < need:
            raise ValueError(
                f"memory_limit={limit:g} cannot hold one microbatch on a device (p={p}, {placement}); "
                f"the smallest feasible limit is {need / (2 * unit * p):.6g}"
                + ("" if levers else "; recompute='full' (--recompute full) lets forwards keep only their input, "
                                     "offload='auto' (--offload auto) moves them to host memory")
            )
    rec = costs.recompute_times(S, p, recompute) if rec_on else []
    copy_t = [float(costs.offload) * fraction * x for x in act_a] if copies_on else []
    if copies_on and min(list(f) + list(b) + list(w) + list(rec)) <= 0:
        raise ValueError(f"optimal: offload needs positive pass times (costs {costs.f}, {costs.b}, {costs.w}"
                         + (f", recompute {min(rec):g}" if rec_on else "") + "): the model times passes as soon as "
                         "possible, which a pass of no time leaves ambiguous; give every F, B, W (and R) a time > 0")
    k, exact = integer_scale(list(f) + list(b) + list(w) + list(rec) + copy_t + [float(costs.comm)])
    exact = exact and keep_exact and share_exact
    Rt = [int(round(x * k)) for x in rec]
    F = [int(round(x * k)) for x in f]
    B = [int(round(x * k)) for x in b]
    Wt = [int(round(x * k)) for x in w]
    D = [int(round(x * k)) for x in copy_t]
    C = int(round(float(costs.comm) * k))
    dev = [P.device_of(s) for s in range(S)]

    # the hint search may use at most half of the time: the solver needs the rest (a
    # deterministic run lets it finish: its result must not depend on the machine's speed)
    if keep_levers is not None:
        seed = (keep_levers.name, keep_levers, simulate(keep_levers, costs).makespan)
    else:
        seed = _seed(p, m, costs, limit, placement, None if deterministic else t_start + 0.5 * seconds, recompute,
                     fraction)
    seed_make = seed[2] if seed else math.inf

    def out_of_time(where: str) -> OptimalResult:
        if not seed:
            raise ValueError(f"optimal: the time limit of {seconds:g} s ran out {where}, and no heuristic schedule "
                             f"fits memory_limit={limit} for p={p}, m={m} ({placement}); raise time_limit")
        log.info("optimal: time limit of %g s reached %s; returning the heuristic %s", seconds, where, seed[0])
        return OptimalResult(seed[1], seed_make, 0.0, "timeout", (seed[0], seed_make),
                             time.monotonic() - t_start, k)

    work = [sum(F[s] + B[s] + Wt[s] + (Rt[s] if rec_on else 0) for s in P.stages_of(d)) * m for d in range(p)]
    horizon = int(math.ceil(seed_make * k)) if seed else sum(work) + 2 * S * C * m + 2 * sum(D) * m + 1
    if not exact and seed:
        horizon = int(horizon * 1.01) + sum(F) + sum(B) + 2 * sum(D)

    model = cp_model.CpModel()
    st: dict[tuple[int, int, int], object] = {}
    en: dict[tuple[int, int, int], object] = {}
    per_dev: list[list] = [[] for _ in range(p)]
    use: dict[tuple[int, int], object] = {}
    dur = (F, B, Wt)
    for s in range(S):
        if time.monotonic() >= deadline:
            return out_of_time("while building the model")
        for mb in range(m):
            for o in range(3):
                a = model.NewIntVar(0, horizon, f"s{o}_{s}_{mb}")
                e = model.NewIntVar(0, horizon, f"e{o}_{s}_{mb}")
                iv = model.NewIntervalVar(a, dur[o][s], e, f"i{o}_{s}_{mb}")
                st[o, s, mb], en[o, s, mb] = a, e
                per_dev[dev[s]].append(iv)
            if rec_on:  # an optional R: present when the forward is recomputed
                on = model.NewBoolVar(f"r_{s}_{mb}")
                a = model.NewIntVar(0, horizon, f"s3_{s}_{mb}")
                e = model.NewIntVar(0, horizon, f"e3_{s}_{mb}")
                per_dev[dev[s]].append(model.NewOptionalIntervalVar(a, Rt[s], e, on, f"i3_{s}_{mb}"))
                st[3, s, mb], en[3, s, mb], use[s, mb] = a, e, on
                model.Add(a >= en[0, s, mb]).OnlyEnforceIf(on)
                model.Add(st[1, s, mb] >= e).OnlyEnforceIf(on)
                if copies_on:  # an absent R sits at 0 (the timing rules look at it only when present)
                    model.Add(a == 0).OnlyEnforceIf(on.Not())
    for d in range(p):
        model.AddNoOverlap(per_dev[d])
    for s in range(S):
        if time.monotonic() >= deadline:
            return out_of_time("while building the model")
        cf = C if s > 0 and dev[s - 1] != dev[s] else 0
        cb = C if s < S - 1 and dev[s + 1] != dev[s] else 0
        for mb in range(m):
            if s > 0:
                model.Add(st[0, s, mb] >= en[0, s - 1, mb] + cf)
            if s < S - 1:
                model.Add(st[1, s, mb] >= en[1, s + 1, mb] + cb)
            else:
                model.Add(st[1, s, mb] >= en[0, s, mb])
            model.Add(st[2, s, mb] >= en[1, s, mb])
            if mb > 0 and not levers:  # symmetry breaking: identical microbatches run in order
                for o in range(3):
                    model.Add(st[o, s, mb] >= en[o, s, mb - 1])
            elif mb > 0 and s == 0 and keep_levers is None:
                # microbatches differ by their choices: relabel by the first forwards (not with the
                # choices fixed per microbatch: a relabelling would move them)
                model.Add(st[0, s, mb] >= en[0, s, mb - 1])
    lanes = None
    if copies_on:
        lanes = CopyModel(fraction=fraction)
        lanes.add(model, P=P, m=m, copy_len=D, comm=C, st=st, en=en, use=use, horizon=horizon)
    if keep_levers is not None:  # the input's choices, fixed
        chosen_r = {(ps.stage, ps.microbatch) for row in keep_levers.device_passes for ps in row if ps.op is Op.R}
        chosen_o = {(c.stage, c.microbatch) for row in keep_levers.copies for c in row if c.kind == "O"}
        for key, on in use.items():
            model.Add(on == int(key in chosen_r))
        for key, on in (lanes.off.items() if lanes is not None else ()):
            model.Add(on == int(key in chosen_o))
        if time.monotonic() >= deadline:
            return out_of_time("while building the model")
    if cap is not None:
        for d in range(p):
            if time.monotonic() >= deadline:
                return out_of_time("while building the model")
            times, deltas, active = [], [], []
            for s in P.stages_of(d):
                for mb in range(m):
                    times += [st[0, s, mb], en[2, s, mb]]
                    deltas += [act[s], -act[s]]
                    active += [model.NewConstant(1)] * 2
                    if rec_on:  # a recomputed forward gives back all it does not keep; its R takes it again
                        times += [st[0, s, mb], st[3, s, mb]]
                        deltas += [kept[s] - act[s], act[s] - kept[s]]
                        active += [use[s, mb]] * 2
                    if copies_on:  # the offloaded share leaves when its copy ends, returns when its reload starts
                        times += [lanes.o_en[s, mb], lanes.l_st[s, mb]]
                        deltas += [-share[s], share[s]]
                        active += [lanes.off[s, mb]] * 2
            if levers:
                model.AddReservoirConstraintWithActive(times, deltas, active, 0, cap)
                continue
            model.AddReservoirConstraint(times, deltas, 0, cap)
            # redundant: at most cap // act activations of one stage live at once, and Fs and Ws
            # run in microbatch order, so F of microbatch k + j waits for W of microbatch k
            for s in P.stages_of(d):
                j = cap // act[s]
                for mb in range(m - j):
                    model.Add(st[0, s, mb + j] >= en[2, s, mb])
    makespan = model.NewIntVar(0, horizon, "makespan")
    for s in range(S):  # every pass ends by its W's end, and Ws run in order: the last W ends last
        for mb in range(m) if levers else (m - 1,):
            model.Add(makespan >= en[2, s, mb])
    # redundant bound: the first forward reaches device d, then the device does its work
    head = [0] * S
    for s in range(1, S):
        head[s] = head[s - 1] + F[s - 1] + (C if dev[s - 1] != dev[s] else 0)
    for d in range(p):
        first = min(head[s] for s in P.stages_of(d))
        model.Add(makespan >= first + sum(F[s] + B[s] + Wt[s] for s in P.stages_of(d)) * m)
    model.Minimize(makespan)
    if seed:
        _hint(model, seed[1], costs, k, B, st, en, use, lanes, C)
        model.AddHint(makespan, int(round(seed_make * k)))
    # what is left of the time limit, less a margin for reading the solution back
    left = deadline - time.monotonic() - min(0.5, 0.05 * seconds)
    if left <= 0.01:
        return out_of_time("before the solver started")

    solver = cp_model.CpSolver()
    if deterministic:
        solver.parameters.max_deterministic_time = seconds / DET_SECONDS
        solver.parameters.max_time_in_seconds = float(left)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
    else:
        solver.parameters.max_time_in_seconds = float(left)
        solver.parameters.num_workers = threads
    # the reservoir's default expansion into precedence literals is quadratic in a device's passes
    # (a million Booleans at p = 16, m = 64) and ignores the time limit; the native propagator
    # proved every instance of the tests faster (p = 4, m = 8, 6:8:4, budget 0.5: 2.8 s, not 12.8 s)
    solver.parameters.expand_reservoir_constraints = False
    t0 = time.perf_counter()
    code = solve(solver, model)  # in a thread: Ctrl-C / SIGTERM stop it at once (ctrlmem.solver.threaded)
    wall_s = time.perf_counter() - t0
    cut_short = deterministic and time.monotonic() > deadline - 1
    if cut_short:
        log.warning("optimal: stopped by the wall-clock safety limit (%g s) before its deterministic budget of %g "
                    "solver-seconds was spent; this result depends on the machine's speed", wall, seconds)
    bound = solver.BestObjectiveBound() / k if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0.0
    if code == cp_model.INFEASIBLE:
        raise ValueError(f"no schedule fits memory_limit={limit} for p={p}, m={m} ({placement})")
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        orders = []
        for d in range(p):
            row = []
            for s in P.stages_of(d):
                for mb in range(m):
                    for o, op in enumerate((Op.F, Op.B, Op.W)):
                        row.append((solver.Value(st[o, s, mb]), o, Pass(op, s, mb)))
                    if rec_on and solver.Value(use[s, mb]):
                        row.append((solver.Value(st[3, s, mb]), 0.5, Pass(Op.R, s, mb)))
            row.sort(key=lambda x: (x[0], x[1]))
            orders.append([x[2] for x in row])
        params = {"placement": placement, "memory_limit": limit,
                  "status": "optimal" if code == cp_model.OPTIMAL else "feasible"}
        if rec_on:
            params["recompute"] = recompute
        if copies_on:
            params["offload"] = fraction
        sched = Schedule.from_orders("optimal", P, m, orders, params)
        if sched.recomputes:
            sched = replace(sched, recompute_mode=recompute)
        if copies_on:
            kinds = {Op.F: 0, Op.B: 1, Op.W: 2, Op.R: 3}
            position = {(kinds[ps.op], ps.stage, ps.microbatch): (d, i)
                        for d, row in enumerate(orders) for i, ps in enumerate(row)}
            rows = lanes.read(solver, position)
            if rows:
                sched = replace(sched, copies=tuple(tuple(rows.get(d, ())) for d in range(p)))
        sim = simulate(sched, costs)
        make = sim.makespan
        if copies_on and exact and (abs(make * k - solver.ObjectiveValue()) > 1e-6 * max(1, k * make)
                                    or (cap is not None and max(sim.peak_memory) > limit * p + 1e-9)):
            # pragma: no cover - the model times what the simulator times; a mismatch is a bug to report
            log.error("optimal: the solver's schedule simulates to makespan %g, peak %g (the model: %g within %s); "
                      "returning the heuristic", make, max(sim.peak_memory), solver.ObjectiveValue() / k, limit)
            if seed:
                sched, make = seed[1], seed_make
        if seed and seed_make < make:  # rounding of inexact costs: keep the better one
            sched, make = seed[1], seed_make
        status = "optimal" if code == cp_model.OPTIMAL and exact else "feasible"
    else:
        if not seed:
            raise ValueError(f"the solver found no schedule in {seconds:g} s for p={p}, m={m}; raise time_limit")
        sched, make, status = seed[1], seed_make, "timeout"
    lower = min(bound, make)
    if status == "optimal":
        lower = make
    return OptimalResult(sched, make, lower, status, (seed[0], seed_make) if seed else ("", math.inf), wall_s, k,
                         cut_short=cut_short)


def _hint(model, seed: Schedule, costs: Costs, k: int, B: list[int], st: dict, en: dict, use: dict, lanes,
          comm: int) -> None:
    """Hint the model with the seed schedule's simulated timeline (scaled by ``k``): every pass's
    start and end, the recompute choices and, with copies, every copy variable and Boolean (a
    complete hint: CP-SAT checks it at once and starts from it)."""
    r = simulate(seed, costs)
    rec = costs.recompute_times(seed.num_stages, seed.num_devices, seed.recompute_mode)
    times: dict = {}
    for tp in r.passes:
        t, e = int(round(tp.start * k)), int(round(tp.end * k))
        if tp.op is Op.BW:  # a fused backward: its B, then its W
            times[1, tp.stage, tp.microbatch] = (t, t + B[tp.stage])
            times[2, tp.stage, tp.microbatch] = (t + B[tp.stage], e)
            continue
        times[{Op.F: 0, Op.B: 1, Op.W: 2, Op.R: 3}[tp.op], tp.stage, tp.microbatch] = (t, e)
    for key, (t, e) in times.items():
        if key in st:
            model.AddHint(st[key], t)
            model.AddHint(en[key], e)
    for (s, mb), on in use.items():
        model.AddHint(on, (3, s, mb) in times)
        if lanes is not None and (3, s, mb) not in times:
            model.AddHint(st[3, s, mb], 0)
            model.AddHint(en[3, s, mb], int(round(rec[s] * k)))
    if lanes is None:
        return
    for c in r.copies:
        times[c.op, c.stage, c.microbatch] = (int(round(c.start * k)), int(round(c.end * k)))
    kinds = {Op.F: 0, Op.B: 1, Op.W: 2, Op.R: 3, Op.BW: 1}
    for d, row in enumerate(seed.copies):
        for c in row:
            if c.kind == "L":
                ps = seed.device_passes[d][c.after]
                times["I", c.stage, c.microbatch] = {"after": (kinds[ps.op], ps.stage, ps.microbatch)}
    lanes.hint(model, times, comm)


@register("optimal", source="CP-SAT model of the whole schedule (OR-Tools); the physical limit the heuristics are measured against")
def optimal_schedule(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    placement: str = "v-shape",
    time_limit: float = 60.0,
) -> Schedule:
    """The exact optimum for small pipelines (:func:`ctrlmem.optimal`): shortest makespan within
    ``memory_limit`` (default: unlimited) under ``costs``, V-shape or sequential placement, B/W
    split; solved by OR-Tools CP-SAT within ``time_limit`` seconds (the schedule's params say
    whether optimality was proven). A proven optimum is kept for the rest of the process (the
    last :data:`_PROVEN_KEPT`): building the same instance again returns it at once."""
    try:
        key = (int(num_devices), int(num_microbatches), costs, memory_limit, placement)
        hit = _PROVEN.get(key)
    except TypeError:  # unhashable costs: solve every time
        key, hit = None, None
    if hit is not None:
        _PROVEN.move_to_end(key)
        return hit
    res = optimal(num_devices, num_microbatches, costs, memory_limit, placement, time_limit)
    if key is not None and res.status == "optimal":
        _PROVEN[key] = res.schedule
        while len(_PROVEN) > _PROVEN_KEPT:
            _PROVEN.popitem(last=False)
    return res.schedule


_PROVEN_KEPT = 64
_PROVEN: "OrderedDict[tuple, Schedule]" = OrderedDict()
