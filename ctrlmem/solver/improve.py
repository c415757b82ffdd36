"""Improve any schedule with the solver, and certify how far from optimal it is.

:func:`improve` takes a schedule (a heuristic's, a file's), its costs and a memory budget, and
returns what :func:`ctrlmem.optimal` returns (:class:`~ctrlmem.solver.optimal.OptimalResult`): a
schedule never longer than the input and within the budget, its makespan, the best proven lower
bound on every schedule's makespan, the status and the gap.

How (docs/theory.md §12):

* **bounds first**: the closed-form lower bounds of :func:`ctrlmem.search.bounds.makespan_bounds`
  (per device; memory × time; the idle forced around the first backward and after the last
  forward under the memory cap). When the input meets one, it is proven optimal at once.
* **the whole model** (instances of at most :data:`WHOLE_MODEL_PASSES` passes): the CP-SAT model
  of :func:`ctrlmem.optimal`, hinted with the input, for up to half of the time. It proves small
  pipelines and gives the solver's own bound.
* **large-neighbourhood search**: the rest of the time, repeatedly *free a window* of the
  current schedule — the passes that start in a time interval, on all devices, on a range of
  devices, or of a range of microbatches — keep everything else in its order, and let CP-SAT
  reorder the window for the shortest makespan. Passes before the window keep their times; the
  passes after it keep their order, so their effect on the makespan is a longest path computed
  once per window; the memory after the window is what it was (the window runs the same passes).
  A window's result is kept when the simulated makespan gets shorter (or stays and the devices
  end earlier in sum). Window sizes adapt to what the solver proves within its time slice.

Recompute passes (docs/theory.md §13) are passes like the others: an ``R`` runs on its
forward's device after it and before its backward, a recomputed forward takes the kept share of
its activation and its ``R`` the rest (memory in ``1/K`` of a stage's activation). The set of
recomputed forwards stays the input's; only the order changes. A schedule with activation copies
keeps its offloaded forwards, their shares and each reload's issue pass; its whole model is
:func:`ctrlmem.optimal`'s exact one with those choices fixed, its windows approximate the copies
(:func:`_improve_copies` says how), and every candidate is simulated with its copies.

Every schedule kept is simulated exactly (:func:`ctrlmem.simulate`'s as-soon-as-possible run,
with the real costs) and checked against the budget, so the result is valid, within the budget,
and never longer than the input, whatever the solver does.

``time_limit`` bounds the whole call (wall-clock seconds). With ``deterministic=True`` the solver's
*deterministic time* (CP-SAT's work measure, about a second of one core each) is counted instead,
with one fixed-seed search per window, so the same inputs give the same result on any machine
and load (what ``ctrlmem reproduce`` uses); a wall-clock safety limit of ``3 × time_limit + 10``
seconds still applies. Ctrl-C (``KeyboardInterrupt``) or a termination signal stops the solver
thread before the exception propagates.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass

from ctrlmem.util import checks
from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Copy, Op, Pass, Placement, Schedule
from ctrlmem.solver.threaded import DET_SECONDS, solve
from ctrlmem.solver.copies import share_units
from ctrlmem.solver.optimal import MAX_OFFLOAD_PASSES, MAX_TIME_LIMIT, OptimalResult, integer_scale, kept_units, optimal
from ctrlmem.search.bounds import makespan_bounds
from ctrlmem.model.simulate import simulate
from ctrlmem.model.validate import index_schedule

__all__ = ["improve", "WHOLE_MODEL_PASSES", "MAX_IMPROVE_PASSES"]

log = logging.getLogger(__name__)

WHOLE_MODEL_PASSES = 1_500
"""Instances of at most this many passes first get the whole CP-SAT model (hinted with the
input) for up to half of the time limit; larger ones only the windows (the whole model's proof
and bound do not move within minutes there)."""

MAX_IMPROVE_PASSES = 60_000
"""Largest schedule :func:`improve` takes (each window step simulates the whole schedule)."""

_WINDOW_START = 120      # passes freed in the first window
_WINDOW_MIN, _WINDOW_MAX = 16, 2_500
_SLICE_S = 2.0            # solver seconds per window
_WINDOW_SPREAD = 3        # a window's interval holds at most this many times its free passes
_WINDOW_CHARGE_S = 0.01   # deterministic seconds a window counts at least

# ---------------------------------------------------------------------------------------------
# the problem as integer arrays


@dataclass
class _Problem:
    """A schedule's passes by key (``(kind·S + stage)·m + mb``; kind 3 an ``R``), with what the
    models need."""

    schedule: Schedule
    n: int
    keys: list[int]            # the keys present
    dev: list[int]             # per key: its device
    dur: list[int]             # per key: scaled duration
    durf: list[float]          # per key: real duration
    ins: list[tuple[tuple[int, int, float], ...]]  # per key: (input key, scaled, real hop latency)
    succ: list[list[tuple[int, int, float]]]       # per key: (key taking it as input, latencies)
    delta: list[int]           # per key: memory units taken at its start (> 0) or given at its end (< 0)
    rank: list[int]            # per key: a topological rank of the data dependencies
    mb: list[int]
    release_of: list[int]      # per F key: the key that releases its activation
    cap: int                   # memory units a device may hold at once
    scale: int
    exact: bool
    levers: bool               # R passes or copies present: microbatches differ, units are a / K
    copy_events: dict = dataclasses.field(default_factory=dict)  # key -> [(offset after its end, units)]
    copies: list = dataclasses.field(default_factory=list)       # (F key, issue key, fraction) per offload


def _problem(schedule: Schedule, costs: Costs, cap_a: float) -> _Problem:
    """The integer problem of ``schedule`` within ``cap_a`` (``a`` per device). Memory units:
    one stage's activation without ``R`` passes; with them ``1 / K`` of it, a recomputed forward
    taking the kept ``N / K`` (``Costs.kept_fraction``) at its start and its ``R`` the rest at its
    start (the simulator's model, docs/theory.md §13)."""
    idx = index_schedule(dataclasses.replace(schedule, copies=()) if schedule.offloads else schedule)
    S, m, p = schedule.num_stages, schedule.num_microbatches, schedule.num_devices
    sm = S * m
    levers = schedule.recomputes
    n = (4 if levers else 3) * sm
    f, b, w = costs.stage_times(S, p)
    act = p / S
    rec = costs.recompute_times(S, p, schedule.recompute_mode) if levers else []
    offs = [(d, c) for d, row in enumerate(schedule.copies) for c in row if c.kind == "O"]
    copy_t = [float(costs.offload) * c.fraction * act for _, c in offs]
    scale, exact = integer_scale(list(f) + list(b) + list(w) + list(rec) + copy_t + [float(costs.comm)])
    if levers:
        keep_n, unit, keep_exact = kept_units(costs.kept_fraction(schedule.recompute_mode))
        exact = exact and keep_exact
    else:
        keep_n, unit = 1, 1
    if offs:  # memory in a / (K D), D the offloaded shares' common denominator
        denoms = [share_units(c.fraction) for _, c in offs]
        share_d = math.lcm(*(dd for _, dd, _ in denoms))
        exact = exact and all(ok for _, _, ok in denoms)
        keep_n, unit = keep_n * share_d, unit * share_d
    cap_units = math.floor(cap_a / act * unit + 1e-9)
    fi = [int(round(x * scale)) for x in f]
    bi = [int(round(x * scale)) for x in b]
    wi = [int(round(x * scale)) for x in w]
    ri = [int(round(x * scale)) for x in rec]
    ci = int(round(float(costs.comm) * scale))
    dev, dur, durf = [-1] * n, [0] * n, [0.0] * n
    delta, rank, mbs, release_of = [0] * n, [0] * n, [0] * n, [-1] * n
    ins: list[tuple[tuple[int, int, float], ...]] = [()] * n
    succ: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]
    keys = []
    for d, row in enumerate(idx.device_keys):
        for key in row:
            keys.append(key)
            dev[key] = d
    recomputed = [bool(levers) and dev[3 * sm + r] >= 0 for r in range(sm)]
    for key in keys:
        kind, r = divmod(key, sm)
        s, k = divmod(r, m)
        mbs[key] = k
        fused = bool(idx.fused[r])
        # ranks: F(s) < F(s + 1) ... < B(s + 1) < R(s) < B(s) ... < W(s)
        if kind == 0:
            dur[key], durf[key], rank[key] = fi[s], f[s], 2 * s
            delta[key] = keep_n if recomputed[r] else unit
            release_of[key] = sm + r if fused else 2 * sm + r
        elif kind == 1:
            dur[key] = bi[s] + (wi[s] if fused else 0)
            durf[key] = b[s] + (w[s] if fused else 0.0)
            delta[key] = -unit if fused else 0
            rank[key] = 2 * (2 * S - 1 - s) + 1
        elif kind == 2:
            dur[key], durf[key], delta[key], rank[key] = wi[s], w[s], -unit, 2 * (2 * S + s) + 1
        else:  # an R: after its F, before its B, on the same device
            dur[key], durf[key], delta[key], rank[key] = ri[s], rec[s], unit - keep_n, 2 * (2 * S - 1 - s)
        need = idx.dep[key]
        edges = []
        if need >= 0:
            edges.append((need, ci, float(costs.comm)) if dev[need] != dev[key] else (need, 0, 0.0))
        if kind == 1 and recomputed[r]:
            edges.append((3 * sm + r, 0, 0.0))
        ins[key] = tuple(edges)
    copy_events: dict[int, list[tuple[int, int]]] = {}
    copies = []
    loads = {(c.stage, c.microbatch): c.after for row in schedule.copies for c in row if c.kind == "L"}
    for (d, c), t_real in zip(offs, copy_t):
        # the copies, approximated for the windows: the share leaves one copy time after its
        # forward ends and comes back when the pass its reload is issued after ends; the backward
        # waits for both copies after its forward and for the reload after that pass
        r = c.stage * m + c.microbatch
        issue = idx.device_keys[d][loads[(c.stage, c.microbatch)]]
        share = int(c.fraction * (keep_n if recomputed[r] else unit) + 1e-9)
        t = int(round(t_real * scale))
        copy_events.setdefault(r, []).append((t, -share))
        copy_events.setdefault(issue, []).append((0, share))
        extra = [(r, 2 * t, 2 * t_real)]
        if issue != r:
            extra.append((issue, t, t_real))
            ins[issue] += ((r, 0, 0.0),)
        ins[sm + r] += tuple(extra)
        copies.append((r, issue, c.fraction))
    for key in keys:
        for x, li, lf in ins[key]:
            succ[x].append((key, li, lf))
    return _Problem(schedule, n, keys, dev, dur, durf, ins, succ, delta, rank, mbs, release_of,
                    cap_units, scale, exact, levers or bool(offs), copy_events, copies)


def _asap(pb: _Problem, orders: list[list[int]], real: bool = False):
    """As-soon-as-possible times of ``orders`` (per key; integer scaled, or real with ``real``):
    ``(start, end)``, ``None`` on a deadlock."""
    dur = pb.durf if real else pb.dur
    li = 2 if real else 1
    n = pb.n
    zero = 0.0 if real else 0
    start = [zero] * n
    end = [zero] * n
    indeg = [0] * n
    nxt = [-1] * n
    for row in orders:
        for i, key in enumerate(row):
            if i:
                indeg[key] += 1
                nxt[row[i - 1]] = key
            indeg[key] += len(pb.ins[key])
    ready = [row[0] for row in orders if row and indeg[row[0]] == 0]
    ready_t = [zero] * n
    done = 0
    while ready:
        key = ready.pop()
        st = ready_t[key]
        start[key] = st
        e = st + dur[key]
        end[key] = e
        done += 1
        y = nxt[key]
        if y >= 0:
            if e > ready_t[y]:
                ready_t[y] = e
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
        for edge in pb.succ[key]:
            y = edge[0]
            t = e + edge[li]
            if t > ready_t[y]:
                ready_t[y] = t
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    if done != len(pb.keys):
        return None
    return start, end


def _score(pb: _Problem, orders, real: bool = True):
    """``(makespan, sum of the devices' end times)`` of ``orders`` (``None``: deadlock)."""
    got = _asap(pb, orders, real)
    if got is None:
        return None
    _, end = got
    ends = [max(end[k] for k in row) if row else 0 for row in orders]
    return max(ends), math.fsum(ends) if real else sum(ends)


def _peak_ok(pb: _Problem, orders) -> bool:
    for row in orders:
        level = 0
        for key in row:
            level += pb.delta[key]
            if level > pb.cap:
                return False
    return True


# ---------------------------------------------------------------------------------------------
# the solver, in a thread that Ctrl-C stops


class _Stopped(Exception):
    pass


def _solve(model, seconds: float, workers: int, deterministic: bool, seed: int, wall_cap: float):
    """Solve ``model`` within ``seconds`` (deterministic time with ``deterministic``; never past
    ``wall_cap`` wall seconds). Returns ``(solver, status code)``. A ``KeyboardInterrupt`` (or
    any exception) while waiting stops the search and joins the thread before it propagates."""
    from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.expand_reservoir_constraints = False
    prm.random_seed = seed
    if deterministic:
        prm.max_deterministic_time = max(0.002, seconds / DET_SECONDS)
        prm.max_time_in_seconds = max(0.05, wall_cap)
        prm.num_workers = 1
    else:
        prm.max_time_in_seconds = max(0.01, min(seconds, wall_cap))
        prm.num_workers = workers
    return solver, solve(solver, model)


# ---------------------------------------------------------------------------------------------
# one CP-SAT model: a window of free passes, the rest fixed before or ordered after


def _model(pb: _Problem, orders, start, end, window: list[int], free: set[int], horizon: int, whole: bool,
           floor: int = 0):
    """The CP-SAT model of ``window`` (keys; a contiguous segment of each device's order), where
    the passes in ``free`` may be reordered among the window's passes of their device and the
    others keep their order. Returns ``(model, start vars, makespan var)``."""
    from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

    win = set(window)
    model = cp_model.CpModel()
    pos: dict[int, tuple[int, int]] = {}
    for d, row in enumerate(orders):
        for i, key in enumerate(row):
            pos[key] = (d, i)
    # per device: the window segment [lo, hi) of its order
    seg = []
    for row in orders:
        idx = [i for i, key in enumerate(row) if key in win]
        seg.append((idx[0], idx[-1] + 1) if idx else (len(row), len(row)))
    # tails of the passes after the window (longest chain to the end through fixed orders)
    after_keys = [key for d, row in enumerate(orders) for key in row[seg[d][1]:]]
    after_keys.sort(key=lambda k: (start[k], pb.rank[k], pb.mb[k]), reverse=True)
    q: dict[int, int] = {}
    for key in after_keys:
        d, i = pos[key]
        best = 0
        if i + 1 < len(orders[d]):
            best = q[orders[d][i + 1]]
        for y, lat, _ in pb.succ[key]:
            if y in q:
                best = max(best, lat + q[y])
        q[key] = pb.dur[key] + best
    T = model.NewIntVar(0, horizon, "makespan")
    const = 0
    for d, row in enumerate(orders):  # the passes before the window end where they end
        lo, hi = seg[d]
        if lo:
            const = max(const, end[row[lo - 1]])
    for key in after_keys:  # a pass after the window whose inputs all ran before it
        d, i = pos[key]
        pre = [(orders[d][i - 1], 0)] if i else []
        pre += [(x, lat) for x, lat, _ in pb.ins[key]]
        for x, lat in pre:
            if x not in win and x not in q:
                const = max(const, end[x] + lat + q[key])
    if max(const, floor) > horizon:
        return None
    model.Add(T >= max(const, floor))
    sv: dict[int, object] = {}
    ev: dict[int, object] = {}
    for key in window:
        d, i = pos[key]
        lo = seg[d][0]
        lb = end[orders[d][lo - 1]] if lo else 0
        for x, lat, _ in pb.ins[key]:
            if x not in win:
                lb = max(lb, end[x] + lat)
        # the chain after it: the first pass after the window on its device, its successors
        tail = 0
        hi = seg[d][1]
        if hi < len(orders[d]):
            tail = q[orders[d][hi]]
        for y, lat, _ in pb.succ[key]:
            if y in q:
                tail = max(tail, lat + q[y])
        ub = horizon - tail - pb.dur[key]
        if ub < lb:
            return None
        s = model.NewIntVar(lb, ub, f"s{key}")
        sv[key] = s
        ev[key] = s + pb.dur[key]
        model.Add(T >= s + (pb.dur[key] + tail))
    for key in window:
        for x, lat, _ in pb.ins[key]:
            if x in win:
                model.Add(sv[key] >= ev[x] + lat)
    for d, row in enumerate(orders):
        lo, hi = seg[d]
        part = row[lo:hi]
        if not part:
            continue
        movable = [k for k in part if k in free]
        fixed = [k for k in part if k not in free]
        for a, b in zip(fixed, fixed[1:]):
            model.Add(sv[b] >= ev[a])
        if not movable:
            continue
        model.AddNoOverlap([model.NewIntervalVar(sv[k], pb.dur[k], ev[k], f"i{k}") for k in part])
        if pb.cap >= 0:
            level = 0
            for k in row[:lo]:
                level += pb.delta[k] + sum(u for _, u in pb.copy_events.get(k, ()))
            times, deltas = [], []
            if level:
                times.append(0)
                deltas.append(level)
            for k in part:
                if pb.delta[k] > 0:
                    times.append(sv[k])
                    deltas.append(pb.delta[k])
                elif pb.delta[k] < 0:
                    times.append(ev[k])
                    deltas.append(pb.delta[k])
                for off, units in pb.copy_events.get(k, ()):
                    times.append(ev[k] + off)
                    deltas.append(units)
            if len(deltas) > (1 if level else 0):
                model.AddReservoirConstraint(times, deltas, 0, pb.cap)
    if whole and not pb.levers:  # with R passes the microbatches differ and deltas are not unit
        _whole_extras(pb, model, sv, ev, T, orders, start)
    model.Minimize(T)
    for key in window:
        model.AddHint(sv[key], start[key])
    model.AddHint(T, max(end[k] for row in orders for k in row[-1:]))
    return model, sv, T


def _whole_extras(pb: _Problem, model, sv, ev, T, orders, start) -> None:
    """Redundant constraints of the whole model (all passes free): identical microbatches in
    order per (stage, kind) when the input already runs them so (the relabelling argument of
    :mod:`ctrlmem.optimal`; otherwise the input, the hint, would be cut off), then each stage's
    forward waits for the release ``cap`` microbatches earlier."""
    sch = pb.schedule
    S, m = sch.num_stages, sch.num_microbatches
    sm = S * m
    groups: dict[tuple[int, int], list[int]] = {}
    for key in sv:
        kind, r = divmod(key, sm)
        groups.setdefault((kind, r // m), []).append(key)
    for g in groups.values():
        g.sort(key=lambda k: pb.mb[k])
    if not all(start[a] <= start[b] for g in groups.values() for a, b in zip(g, g[1:])):
        return
    for g in groups.values():
        for a, b in zip(g, g[1:]):
            model.Add(sv[b] >= ev[a])
    if 0 < pb.cap:
        for (kind, _s), g in groups.items():
            if kind != 0:
                continue
            for j in range(len(g) - pb.cap):
                rel = pb.release_of[g[j]]
                model.Add(sv[g[j + pb.cap]] >= ev[rel])


def _orders_from(pb: _Problem, orders, window: list[int], solver, sv) -> list[list[int]]:
    win = set(window)
    out = []
    for row in orders:
        idx = [i for i, key in enumerate(row) if key in win]
        if not idx:
            out.append(row)
            continue
        lo, hi = idx[0], idx[-1] + 1
        part = sorted(row[lo:hi], key=lambda k: (solver.Value(sv[k]), pb.rank[k], pb.mb[k]))
        out.append(row[:lo] + part + row[hi:])
    return out


# ---------------------------------------------------------------------------------------------
# the driver


def _check(schedule, costs, memory_limit, time_limit, workers, seed, deterministic):
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a ctrlmem Schedule (from cm.build or Schedule.load), got "
                        f"{type(schedule).__name__} {checks.short_repr(schedule)}")
    costs = Costs.coerce(costs, "costs")
    limit = None if memory_limit is None else checks.memory_fraction("memory_limit", memory_limit)
    seconds = checks.number("time_limit", time_limit, positive=True, maximum=MAX_TIME_LIMIT, what="seconds")
    threads = checks.integer("workers", workers, maximum=256, what="solver threads")
    seed = checks.integer("seed", seed, minimum=0)
    deterministic = checks.flag("deterministic", deterministic)
    if schedule.num_passes > MAX_IMPROVE_PASSES:
        raise ValueError(f"improve: the schedule has {schedule.num_passes} passes, more than the {MAX_IMPROVE_PASSES} "
                         f"improve takes (ctrlmem.solver.improve.MAX_IMPROVE_PASSES); use fewer microbatches or devices")
    return costs, limit, seconds, threads, seed, deterministic


def _check_plain(schedule: Schedule) -> None:
    """The search times plain orders of one model copy: ``ValueError`` for overlapped F&B pairs or
    two copies (DualPipe), which it would time wrongly."""
    what = ("overlapped forward + backward pairs" if schedule.overlaps else
            f"{schedule.model_copies} model copies" if schedule.model_copies != 1 else None)
    if what:
        raise ValueError(f"improve: schedule {schedule.name!r} has {what}, which the search does not model; "
                         "simulate it as it is (drop --optimize)")


def improve(
    schedule: Schedule,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    time_limit: float = 60.0,
    workers: int = 2,
    seed: int = 0,
    deterministic: bool = False,
) -> OptimalResult:
    """A schedule at least as good as ``schedule`` under ``costs`` within ``memory_limit``
    (fraction of 1F1B's ``p·a``; ``None``: the input's own peak), found by the solver within
    ``time_limit`` seconds, with the best proven lower bound (see the module docstring).

    Returns an :class:`~ctrlmem.solver.optimal.OptimalResult` (as :func:`ctrlmem.optimal`):
    ``schedule`` (named ``<input name>+improved``; the input itself when nothing better was
    found), ``makespan`` (simulated), ``lower_bound`` (on every schedule of this placement, ``m``,
    costs and budget), ``status`` (``"optimal"`` when the makespan meets the bound, else
    ``"feasible"``), ``gap``, ``seed`` (the input's name and makespan), ``wall_s``, ``scale``,
    ``trace`` (seconds, makespan) at the start and at each improvement, and ``bounds`` (each
    lower bound by name; ``"solver"`` when the whole model ran).

    Any placement, fused or split backward; the default memory model (each stage's activation
    ``p/S`` of ``a``, released at its ``W``). A schedule with recompute passes (``R``,
    docs/theory.md §13) has them reordered with the rest, the same forwards recomputed in the
    same mode (what to recompute is the lever search's choice: ``cm.build(...,
    recompute="auto")``); its lower bound then holds for every schedule that may recompute any
    forward in that mode (the whole model, which keeps the input's ``R`` passes, searches but
    bounds nothing). A schedule with activation copies keeps the same forwards offloaded, their
    shares and each reload's issue pass (:func:`_improve_copies`); its bound holds for every
    schedule whose offloads copy at most its largest share. ``workers``: the solver's threads
    (one with ``deterministic``). ``seed``: the windows' random choice.

    Raises ``TypeError`` / ``ValueError`` naming the argument for bad arguments, an input that
    deadlocks (:class:`ctrlmem.ScheduleError`), or an input above ``memory_limit`` (the message
    gives its peak).
    """
    t0 = time.monotonic()
    costs, limit, seconds, threads, seed, deterministic = _check(
        schedule, costs, memory_limit, time_limit, workers, seed, deterministic)
    sim = simulate(schedule, costs)  # raises ScheduleError for a malformed or deadlocking input
    _check_plain(schedule)
    p, m = schedule.num_devices, schedule.num_microbatches
    peak = max(sim.peak_memory)
    if limit is None:
        limit = peak / p
    elif peak > limit * p + 1e-9:
        raise ValueError(f"improve: the input schedule {schedule.name!r} peaks at {peak:g} a = {peak / p:.4g} of 1F1B's "
                         f"p·a, above memory_limit={limit:g}; give memory_limit >= {peak / p:.4g}, or None to keep "
                         f"the input's own peak")
    cap_a = limit * p
    fused = not schedule.split_backward
    # with R passes: bounds on every schedule that may recompute any forward in that mode
    mode = schedule.recompute_mode if schedule.recomputes else "none"
    # with copies: bounds on every schedule whose offloads copy at most the input's largest share
    share = max((c.fraction for row in schedule.copies for c in row if c.kind == "O"), default=None)
    bounds = makespan_bounds(schedule.placement, m, costs, cap_a, fused=fused, recompute=mode, offload=share)
    mixed = any(ps.op is Op.BW for row in schedule.device_passes for ps in row) and not fused
    if mixed:  # a schedule mixing BW with B/W: only the bounds that do not depend on it
        bounds = {"device": makespan_bounds(schedule.placement, m, costs, None, fused=True, recompute=mode,
                                            offload=share)["device"]}
    lower = max(bounds.values()) * (1 - 1e-12)
    # the floor the models get: the closed forms but the ramps bound, which holds too but would move
    # every solver run it binds (the optimality-gap artifact's recorded runs; a follow-up)
    model_lower = max((v for k, v in bounds.items() if k != "ramps"), default=0.0) * (1 - 1e-12)
    best_make = sim.makespan
    trace = [(0.0, best_make)]
    name = schedule.name

    def result(orders, make, status_bound, solver_wall, pb):
        lb = min(status_bound, make)
        status = "optimal" if make <= lb * (1 + 1e-9) + 1e-12 else "feasible"
        if orders is None:
            out = schedule
        else:
            out = Schedule.from_orders(
                f"{name}+improved", schedule.placement, m,
                [[_pass(pb, k) for k in row] for row in orders],
                {**dict(schedule.params), "improved_from": name})
            if schedule.recomputes:
                out = dataclasses.replace(out, recompute_mode=schedule.recompute_mode)
        return OptimalResult(out, make, make if status == "optimal" else lb, status, (name, sim.makespan),
                             time.monotonic() - t0, pb.scale if pb else 1,
                             tuple(trace), tuple(sorted(bounds.items())))

    if best_make <= lower * (1 + 1e-9) + 1e-12:
        log.info("improve: %s meets the lower bound %g already", name, lower)
        return result(None, best_make, lower, 0.0, None)

    if schedule.offloads:
        return _improve_copies(schedule, sim, costs, limit, seconds, threads, seed, deterministic, t0, bounds, lower)
    pb = _problem(schedule, costs, cap_a)
    orders = [list(row) for row in index_schedule(schedule).device_keys]
    cur = _score(pb, orders, real=True)
    assert cur is not None
    wall_cap = 3 * seconds + 10 if deterministic else seconds
    clock = {"det": 0.0}

    def used() -> float:
        return clock["det"] if deterministic else time.monotonic() - t0

    def left() -> float:
        if time.monotonic() - t0 > wall_cap:
            return 0.0
        return seconds - used()

    def wall_left() -> float:
        return t0 + wall_cap - time.monotonic() - min(0.3, 0.05 * seconds)

    def floor() -> int:  # the proven bound, scaled (exact costs only)
        return math.ceil(model_lower * pb.scale - 1e-6) if pb.exact else 0

    changed = False
    rng = random.Random(seed)
    solver_bound = None
    best = (orders, cur)

    def consider(new_orders, label) -> bool:
        nonlocal best, changed
        if not _peak_ok(pb, new_orders):
            return False
        sc = _score(pb, new_orders, real=True)
        if sc is None:
            return False
        old = best[1]
        if sc[0] < old[0] - 1e-9 or (sc[0] <= old[0] + 1e-9 and sc[1] < old[1] - 1e-9):
            best = (new_orders, sc)
            changed = True
            if sc[0] < old[0] - 1e-9:
                trace.append((round(used(), 3), round(sc[0], 9) + 0.0))
                log.info("improve: %s makespan %g (%s, %.1f s)", name, sc[0], label, used())
            return True
        return False

    settled = False
    # 1. the whole model, for up to half of the time, on small instances
    if len(pb.keys) <= WHOLE_MODEL_PASSES:
        budget = 0.5 * left()
        if budget > 0.05:
            start, end = _asap(pb, best[0])
            horizon = max(end)
            built = _model(pb, best[0], start, end, list(pb.keys), set(pb.keys), horizon, whole=True,
                           floor=floor())
            if built is not None and wall_left() > 0.05:
                model, sv, T = built
                solver, code = _solve(model, min(budget, wall_left()) if not deterministic else budget,
                                      threads, deterministic, seed, max(0.05, wall_left()))
                clock["det"] += solver.response_proto.deterministic_time * DET_SECONDS
                from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

                if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                    consider(_orders_from(pb, best[0], list(pb.keys), solver, sv), "whole model")
                # every pass was free: no window can beat what the solver proved the best order
                settled = code == cp_model.OPTIMAL and pb.exact
                # with R passes the model keeps the input's choice of them: its bound is not every schedule's
                if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) and pb.exact and not pb.levers:
                    solver_bound = solver.BestObjectiveBound() / pb.scale
                    if code == cp_model.OPTIMAL:
                        solver_bound = solver.ObjectiveValue() / pb.scale
                elif code == cp_model.INFEASIBLE and pb.exact and not pb.levers:
                    solver_bound = best[1][0]  # nothing below the input's own makespan
                if solver_bound is not None:
                    bounds["solver"] = solver_bound
                    lower = max(lower, solver_bound * (1 - 1e-12))
                    model_lower = max(model_lower, solver_bound * (1 - 1e-12))
    # 2. windows
    size = min(_WINDOW_START, len(pb.keys))
    steps = 0
    while not settled and left() > 0.05 and wall_left() > 0.05 and best[1][0] > lower * (1 + 1e-9) + 1e-12:
        steps += 1
        orders = best[0]
        start, end = _asap(pb, orders)
        horizon = max(end)
        window, free, label = _pick(pb, orders, start, size, rng)
        built = _model(pb, orders, start, end, window, free, horizon, whole=False, floor=floor())
        if built is None:
            continue
        model, sv, T = built
        slice_s = min(_SLICE_S, left())
        solver, code = _solve(model, slice_s, threads, deterministic, seed + steps,
                              max(0.01, min(wall_left(), slice_s if not deterministic else wall_left())))
        # a window costs at least _WINDOW_CHARGE_S: windows the solver settles at once would
        # otherwise spin a deterministic run to its wall-clock limit
        clock["det"] += max(_WINDOW_CHARGE_S, solver.response_proto.deterministic_time * DET_SECONDS)
        from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            consider(_orders_from(pb, orders, window, solver, sv), label)
        # a window of every pass, proven: no order of these passes is shorter (a settled run ends
        # here rather than spin to its limit: 1F1B-R at p = 16, m = 32 took 40 s for 10 solver-s)
        settled = code == cp_model.OPTIMAL and pb.exact and len(free) == len(pb.keys)
        if code == cp_model.OPTIMAL:
            size = min(_WINDOW_MAX, len(pb.keys), int(size * 1.25) + 1)
        else:
            size = max(_WINDOW_MIN, int(size * 0.8))
    cut = _cut_short(deterministic, t0, wall_cap, name, seconds)
    log.info("improve: %s %d windows, makespan %g -> %g (bound %g) in %.1f s", name, steps, sim.makespan,
             best[1][0], lower, time.monotonic() - t0)
    if not changed:
        return dataclasses.replace(result(None, sim.makespan, lower, 0.0, pb), cut_short=cut)
    final = result(best[0], best[1][0], lower, 0.0, pb)
    check = simulate(final.schedule, costs)  # the result as the simulator times it
    if check.makespan > sim.makespan + 1e-9 or max(check.peak_memory) > cap_a + 1e-9:  # pragma: no cover - a bug
        log.error("improve: the improved schedule failed its final check; returning the input")
        return dataclasses.replace(result(None, sim.makespan, lower, 0.0, pb), cut_short=cut)
    return OptimalResult(final.schedule, check.makespan, final.lower_bound, final.status, final.seed,
                         final.wall_s, final.scale, final.trace, final.bounds, cut_short=cut)


def _cut_short(deterministic: bool, t0: float, wall_cap: float, name: str, seconds: float) -> bool:
    """Whether a deterministic run ended at the wall-clock safety limit (``OptimalResult.cut_short``),
    with a warning: its result then depends on the machine's speed and load."""
    if not (deterministic and time.monotonic() - t0 > wall_cap - 0.5):
        return False
    log.warning("improve: %s stopped by the wall-clock safety limit (%g s) before its deterministic budget of %g "
                "solver-seconds was spent; this result depends on the machine's speed", name, wall_cap, seconds)
    return True


# ---------------------------------------------------------------------------------------------
# schedules with activation copies


def _with_copies(pb: _Problem, orders, name: str) -> Schedule:
    """``orders`` (keys) as a schedule with ``pb``'s offloads: the same forwards and shares, each
    reload issued after the same pass as before, at that pass's new step."""
    sch = pb.schedule
    m = sch.num_microbatches
    step = {key: i for row in orders for i, key in enumerate(row)}
    lanes: list[list[Copy]] = [[] for _ in orders]
    for r, issue, fraction in pb.copies:
        s, k = divmod(r, m)
        d = pb.dev[r]
        lanes[d] += [Copy("O", s, k, fraction), Copy("L", s, k, after=step[issue])]
    out = Schedule.from_orders(name, sch.placement, m, [[_pass(pb, k) for k in row] for row in orders],
                               {**dict(sch.params), "improved_from": sch.name})
    return dataclasses.replace(out, recompute_mode=sch.recompute_mode, copies=tuple(tuple(x) for x in lanes))


def _whole_copies_model(schedule: Schedule) -> tuple[str, float] | None:
    """``(placement, share)`` when :func:`ctrlmem.optimal`'s exact model with copies takes
    ``schedule`` (V-shape or one stage per device, split backward, one offloaded share, within
    :data:`~ctrlmem.solver.optimal.MAX_OFFLOAD_PASSES`); else ``None``."""
    p, m, S = schedule.num_devices, schedule.num_microbatches, schedule.num_stages
    shares = {c.fraction for row in schedule.copies for c in row if c.kind == "O"}
    if len(shares) != 1 or 4 * S * m > MAX_OFFLOAD_PASSES or not schedule.split_backward \
            or any(ps.op is Op.BW for row in schedule.device_passes for ps in row):
        return None
    for name, placement in (("v-shape", Placement.v_shape(p) if p >= 2 else None), ("sequential", Placement.sequential(p))):
        if placement is not None and schedule.placement.stage_device == placement.stage_device:
            return name, shares.pop()
    return None


def _improve_copies(schedule: Schedule, sim, costs: Costs, limit: float, seconds: float, threads: int, seed: int,
                    deterministic: bool, t0: float, bounds: dict, lower: float) -> OptimalResult:
    """:func:`improve` for a schedule with activation copies (docs/theory.md §12-13): the same
    forwards offloaded (and recomputed), the same shares, each reload issued after the same pass.

    1. *The whole model*, where :func:`ctrlmem.optimal`'s exact model takes the schedule: that
       model with the input's choices fixed, hinted with it, for up to half of the time. It times
       passes and copies as the simulator does, so what it finds is exact; proven optimal, it
       settles the run (no order of these passes with these copies is shorter).
    2. *Windows*, as for schedules without copies, with the copies approximated: an offloaded
       share leaves one copy time after its forward ends, comes back when the pass its reload is
       issued after ends, and the backward waits two copy times after its forward and one after
       that pass (the lanes' queueing is not modelled). Every window's result is rebuilt with its
       copies and simulated exactly, and kept only when it is shorter (or as long with the devices
       ending earlier in sum) and within the budget.
    """
    p, m = schedule.num_devices, schedule.num_microbatches
    cap_a = limit * p
    trace = [(0.0, sim.makespan)]
    name = schedule.name
    wall_cap = 3 * seconds + 10 if deterministic else seconds
    clock = {"det": 0.0}

    def used() -> float:
        return clock["det"] if deterministic else time.monotonic() - t0

    def left() -> float:
        return 0.0 if time.monotonic() - t0 > wall_cap else seconds - used()

    def wall_left() -> float:
        return t0 + wall_cap - time.monotonic() - min(0.3, 0.05 * seconds)

    def score(r) -> tuple[float, float]:
        ends = [0.0] * p
        for tp in r.passes:
            ends[tp.device] = max(ends[tp.device], tp.end)
        return r.makespan, math.fsum(ends)

    best = (schedule, sim, score(sim))

    def consider(cand: Schedule, label: str) -> bool:
        nonlocal best
        try:
            r = simulate(cand, costs)
        except ValueError:  # a rebuilt order the copies cannot follow (ScheduleError is a ValueError)
            return False
        if max(r.peak_memory) > cap_a + 1e-9:
            return False
        sc = score(r)
        old = best[2]
        if sc[0] < old[0] - 1e-9 or (sc[0] <= old[0] + 1e-9 and sc[1] < old[1] - 1e-9):
            best = (cand, r, sc)
            if sc[0] < old[0] - 1e-9:
                trace.append((round(used(), 3), round(sc[0], 9) + 0.0))
                log.info("improve: %s makespan %g (%s, %.1f s)", name, sc[0], label, used())
            return True
        return False

    settled = False
    whole = _whole_copies_model(schedule)
    pb = _problem(schedule, costs, cap_a)
    if whole is not None and pb.exact and len(pb.keys) <= WHOLE_MODEL_PASSES:
        budget = 0.5 * left()
        if budget > 0.05:
            mode = schedule.recompute_mode if schedule.recomputes else "none"
            try:
                res = optimal(p, m, costs, limit, whole[0], time_limit=budget, workers=threads, recompute=mode,
                              offload=whole[1], deterministic=deterministic, keep_levers=schedule)
                consider(dataclasses.replace(res.schedule, name=f"{name}+improved",
                                             params=tuple(sorted({**dict(schedule.params),
                                                                       "improved_from": name}.items()))),
                         "whole model")
                settled = res.status == "optimal"
            except ValueError as exc:  # the time ran out before the solver had anything
                log.info("improve: whole model with copies gave nothing (%s)", exc)
            clock["det"] += budget
    size = min(_WINDOW_START, len(pb.keys))
    steps = 0
    rng = random.Random(seed)
    while not settled and left() > 0.05 and wall_left() > 0.05 and best[2][0] > lower * (1 + 1e-9) + 1e-12:
        steps += 1
        pb = _problem(best[0], costs, cap_a)
        orders = [list(row) for row in index_schedule(dataclasses.replace(best[0], copies=())).device_keys]
        start, end = [0] * pb.n, [0] * pb.n
        kinds = {Op.F: 0, Op.B: 1, Op.BW: 1, Op.W: 2, Op.R: 3}
        S = best[0].num_stages
        for tp in best[1].passes:
            key = (kinds[tp.op] * S + tp.stage) * m + tp.microbatch
            start[key], end[key] = int(round(tp.start * pb.scale)), int(round(tp.end * pb.scale))
        horizon = max(end)
        window, free, label = _pick(pb, orders, start, size, rng)
        built = _model(pb, orders, start, end, window, free, horizon, whole=False)
        if built is None:
            continue
        model, sv, _ = built
        slice_s = min(_SLICE_S, left())
        solver, code = _solve(model, slice_s, threads, deterministic, seed + steps,
                              max(0.01, min(wall_left(), slice_s if not deterministic else wall_left())))
        clock["det"] += max(_WINDOW_CHARGE_S, solver.response_proto.deterministic_time * DET_SECONDS)
        from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            consider(_with_copies(pb, _orders_from(pb, orders, window, solver, sv), f"{name}+improved"), label)
        if code == cp_model.OPTIMAL:
            size = min(_WINDOW_MAX, len(pb.keys), int(size * 1.25) + 1)
        else:
            size = max(_WINDOW_MIN, int(size * 0.8))
    log.info("improve: %s (copies) %d windows, makespan %g -> %g (bound %g) in %.1f s", name, steps, sim.makespan,
             best[2][0], lower, time.monotonic() - t0)
    make = best[2][0]
    status = "optimal" if make <= lower * (1 + 1e-9) + 1e-12 else "feasible"
    return OptimalResult(best[0], make, make if status == "optimal" else min(lower, make), status,
                         (name, sim.makespan), time.monotonic() - t0, pb.scale, tuple(trace),
                         tuple(sorted(bounds.items())), cut_short=_cut_short(deterministic, t0, wall_cap, name, seconds))


def _pass(pb: _Problem, key: int) -> Pass:
    sch = pb.schedule
    S, m = sch.num_stages, sch.num_microbatches
    sm = S * m
    kind, r = divmod(key, sm)
    s, k = divmod(r, m)
    if kind == 0:
        return Pass(Op.F, s, k)
    if kind == 2:
        return Pass(Op.W, s, k)
    if kind == 3:
        return Pass(Op.R, s, k)
    return Pass(Op.BW if pb.release_of[r] == key else Op.B, s, k)


def _pick(pb: _Problem, orders, start, size: int, rng: random.Random):
    """A window of about ``size`` free passes: the passes starting in a time interval, all free
    (``"time"``), only those of a range of devices (``"devices"``) or of microbatches
    (``"microbatches"``) free, the others in the interval keeping their order."""
    keys = sorted(pb.keys, key=lambda k: (start[k], pb.rank[k], pb.mb[k]))
    n = len(keys)
    p = len(orders)
    m = pb.schedule.num_microbatches
    kind = rng.choice(("time", "time", "devices", "microbatches"))
    devs = set(range(p))
    mbs = None
    width = size
    if kind == "devices" and p > 2:
        lo = rng.randrange(p)
        span = rng.randint(2, max(2, p // 2))
        devs = {(lo + i) % p for i in range(span)}
        width = min(_WINDOW_SPREAD * size, int(size * p / len(devs)))
    elif kind == "microbatches" and m > 2:
        lo = rng.randrange(m)
        span = rng.randint(1, max(1, m // 3))
        mbs = set(range(lo, min(m, lo + span)))
        width = min(_WINDOW_SPREAD * size, int(size * m / len(mbs)))
    else:
        kind = "time"
    width = max(2, min(n, width))
    i = rng.randrange(max(1, n - width + 1))
    t1 = start[keys[i]]
    t2 = start[keys[i + width]] if i + width < n else math.inf
    if t2 <= t1:  # many passes start at t1: the window is those
        t2 = next((start[k] for k in keys[i:] if start[k] > t1), math.inf)
    window = [k for k in keys if t1 <= start[k] < t2]
    free = {k for k in window if pb.dev[k] in devs and (mbs is None or pb.mb[k] in mbs)}
    return window, free, kind
