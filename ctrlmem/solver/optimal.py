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
* the makespan is the last end over all passes (all devices start at 0), minimised.

Symmetry breaking: microbatches are identical, so each (stage, pass type) runs them in order
(relabelling microbatches from the first stage where two overtake turns any schedule into one
of this form with the same times and memory). Redundant bounds: every device needs at least the
time for the first forward to reach it plus its work. Importing ``ortools`` happens on the first
call only.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from ctrlmem.util import checks
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.schedules.registry import register
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules.registry import build
from ctrlmem.solver.threaded import solve

__all__ = ["OptimalResult", "optimal", "MAX_PASSES", "MAX_TIME_LIMIT",
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
          deadline: float) -> tuple[str, Schedule, float] | None:
    """The fastest heuristic schedule within the budget (the solver's hint and fallback) and its
    makespan. The fixed patterns come first; the searches (slow at large sizes) only on
    instances of at most :data:`SEARCH_SEED_PASSES` passes, and no candidate starts after
    ``deadline``."""

    if placement == "v-shape":
        fixed, searched = ["v-min", "v-half", "v-zb"], ["v-shape", "v-min", "v-half", "v-zb"]
        stages = 2 * p
    else:
        fixed, searched = ["1f1b", "zb-h1", "zb-h2"], ["zb"]
        stages = p
    candidates = [(name, False) for name in fixed]
    if 3 * stages * m <= SEARCH_SEED_PASSES:
        candidates += [(name, True) for name in searched]
    best = None
    cap = None if limit is None else limit * p + 1e-9
    for name, adapted in candidates:
        if time.monotonic() >= deadline:
            log.info("optimal: hint search stopped at the time limit (before %s)", name)
            break
        try:
            kw = {"memory_limit": limit if limit is not None else 2.0} if name in ("v-shape", "zb") else {}
            s = build(name, p, m, costs=costs if adapted else None, **kw)
        except ValueError:
            continue
        r = simulate(s, costs)
        if cap is not None and max(r.peak_memory) > cap:
            continue
        if best is None or r.makespan < best[2]:
            best = (name, s, r.makespan)
    return best


def _check_arguments(num_devices, num_microbatches, costs, memory_limit, placement, time_limit, workers):
    """The arguments as plain values, checked as :func:`ctrlmem.build` checks its own (numpy
    numbers and costs text accepted; errors name the argument)."""
    p = checks.integer("num_devices", num_devices)
    m = checks.integer("num_microbatches", num_microbatches)
    if not isinstance(placement, str) or placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {checks.short_repr(placement)}")
    if placement == "v-shape" and p < 2:
        raise ValueError("placement='v-shape' needs num_devices >= 2; use placement='sequential' for one device")
    limit = None if memory_limit is None else checks.memory_fraction("memory_limit", memory_limit)
    seconds = checks.number("time_limit", time_limit, positive=True, maximum=MAX_TIME_LIMIT, what="seconds")
    threads = checks.integer("workers", workers, maximum=256, what="solver threads")
    costs = Costs.coerce(costs, "costs")
    stages = 2 * p if placement == "v-shape" else p
    passes = 3 * stages * m
    if passes > MAX_PASSES:
        raise ValueError(
            f"optimal: p={p}, m={m} ({placement}) has {passes} passes, more than the {MAX_PASSES} the exact solver "
            f"takes (ctrlmem.solver.optimal.MAX_PASSES: its model has one interval per pass); use smaller p and m, or a "
            f"heuristic: ctrlmem.build('v-shape' or 'zb', p, m, costs=..., memory_limit=...)")
    return p, m, costs, limit, seconds, threads


MAX_TIME_LIMIT = 7 * 24 * 3600.0
"""Largest ``time_limit`` accepted (a week, in seconds)."""


def optimal(
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    placement: str = "v-shape",
    time_limit: float = 60.0,
    workers: int = 2,
) -> OptimalResult:
    """The shortest-makespan schedule for ``num_devices`` × ``num_microbatches`` under ``costs``
    within ``memory_limit`` (fraction of 1F1B's ``p·a``; ``None``: unlimited), by CP-SAT.

    ``placement``: ``"v-shape"`` (device ``i`` holds stages ``i`` and ``2p−1−i``, the V family's
    placement) or ``"sequential"`` (one stage per device, as 1F1B and ZB). The backward is
    split (``B`` and ``W``). ``costs``: as :func:`ctrlmem.build` takes them (a ``Costs``, text
    ``"F,B,W[,COMM]"``, a tuple). ``workers``: the solver's threads.

    ``time_limit`` (seconds) bounds the whole call: the heuristic hint, building the model and
    solving. When it runs out first the result is the best heuristic schedule with status
    ``"timeout"``. Meant for small pipelines: at most :data:`MAX_PASSES` passes (``3 · S · m``);
    larger instances are refused.

    Raises ``TypeError`` / ``ValueError`` naming the argument for bad arguments, a budget that
    cannot hold one microbatch, an instance above the size limit, and a time limit that ran out
    before any schedule fitting the budget was found (raise ``time_limit``).
    """
    t_start = time.monotonic()
    p, m, costs, limit, seconds, threads = _check_arguments(
        num_devices, num_microbatches, costs, memory_limit, placement, time_limit, workers)
    deadline = t_start + seconds
    from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    S = P.num_stages
    f, b, w = costs.stage_times(S, p)
    act_a = MemoryModel().stage_activation(S, p)
    act = [int(round(2 * x)) for x in act_a]  # half-a units
    cap = None
    if limit is not None:
        cap = math.floor(2 * p * limit + 1e-9)
        need = max(sum(act[s] for s in P.stages_of(d)) for d in range(p))
        if cap < need:
            raise ValueError(
                f"memory_limit={limit:g} cannot hold one microbatch on a device (p={p}, {placement}); "
                f"the smallest feasible limit is {need / (2 * p):.6g}"
            )
    k, exact = integer_scale(list(f) + list(b) + list(w) + [float(costs.comm)])
    F = [int(round(x * k)) for x in f]
    B = [int(round(x * k)) for x in b]
    Wt = [int(round(x * k)) for x in w]
    C = int(round(float(costs.comm) * k))
    dev = [P.device_of(s) for s in range(S)]

    # the hint search may use at most half of the time: the solver needs the rest
    seed = _seed(p, m, costs, limit, placement, t_start + 0.5 * seconds)
    seed_make = seed[2] if seed else math.inf

    def out_of_time(where: str) -> OptimalResult:
        if not seed:
            raise ValueError(f"optimal: the time limit of {seconds:g} s ran out {where}, and no heuristic schedule "
                             f"fits memory_limit={limit} for p={p}, m={m} ({placement}); raise time_limit")
        log.info("optimal: time limit of %g s reached %s; returning the heuristic %s", seconds, where, seed[0])
        return OptimalResult(seed[1], seed_make, 0.0, "timeout", (seed[0], seed_make),
                             time.monotonic() - t_start, k)

    work = [sum(F[s] + B[s] + Wt[s] for s in P.stages_of(d)) * m for d in range(p)]
    horizon = int(math.ceil(seed_make * k)) if seed else sum(work) + 2 * S * C * m + 1
    if not exact and seed:
        horizon = int(horizon * 1.01) + sum(F) + sum(B)

    model = cp_model.CpModel()
    st: dict[tuple[int, int, int], object] = {}
    en: dict[tuple[int, int, int], object] = {}
    per_dev: list[list] = [[] for _ in range(p)]
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
            if mb > 0:  # symmetry breaking: identical microbatches run in order
                for o in range(3):
                    model.Add(st[o, s, mb] >= en[o, s, mb - 1])
    if cap is not None:
        for d in range(p):
            if time.monotonic() >= deadline:
                return out_of_time("while building the model")
            times, deltas = [], []
            for s in P.stages_of(d):
                for mb in range(m):
                    times += [st[0, s, mb], en[2, s, mb]]
                    deltas += [act[s], -act[s]]
            model.AddReservoirConstraint(times, deltas, 0, cap)
            # redundant: at most cap // act activations of one stage live at once, and Fs and Ws
            # run in microbatch order, so F of microbatch k + j waits for W of microbatch k
            for s in P.stages_of(d):
                j = cap // act[s]
                for mb in range(m - j):
                    model.Add(st[0, s, mb + j] >= en[2, s, mb])
    makespan = model.NewIntVar(0, horizon, "makespan")
    for s in range(S):  # every pass ends by its W's end, and Ws run in order: the last W ends last
        model.Add(makespan >= en[2, s, m - 1])
    # redundant bound: the first forward reaches device d, then the device does its work
    head = [0] * S
    for s in range(1, S):
        head[s] = head[s - 1] + F[s - 1] + (C if dev[s - 1] != dev[s] else 0)
    for d in range(p):
        first = min(head[s] for s in P.stages_of(d))
        model.Add(makespan >= first + work[d])
    model.Minimize(makespan)
    if seed:
        r = simulate(seed[1], costs)
        for tp in r.passes:
            o = {Op.F: 0, Op.B: 1, Op.W: 2}[tp.op]
            model.AddHint(st[o, tp.stage, tp.microbatch], int(round(tp.start * k)))
    # what is left of the time limit, less a margin for reading the solution back
    left = deadline - time.monotonic() - min(0.5, 0.05 * seconds)
    if left <= 0.01:
        return out_of_time("before the solver started")

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(left)
    solver.parameters.num_workers = threads
    # the reservoir's default expansion into precedence literals is quadratic in a device's passes
    # (a million Booleans at p = 16, m = 64) and ignores the time limit; the native propagator
    # proved every instance of the tests faster (p = 4, m = 8, 6:8:4, budget 0.5: 2.8 s, not 12.8 s)
    solver.parameters.expand_reservoir_constraints = False
    t0 = time.perf_counter()
    code = solve(solver, model)  # in a thread: Ctrl-C / SIGTERM stop it at once (ctrlmem.solver.threaded)
    wall = time.perf_counter() - t0
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
            row.sort(key=lambda x: (x[0], x[1]))
            orders.append([x[2] for x in row])
        sched = Schedule.from_orders(
            "optimal", P, m, orders,
            {"placement": placement, "memory_limit": limit, "status": "optimal" if code == cp_model.OPTIMAL else "feasible"},
        )
        make = simulate(sched, costs).makespan
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
    return OptimalResult(sched, make, lower, status, (seed[0], seed_make) if seed else ("", math.inf), wall, k)


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
