"""A lower bound from a solved relaxation: one device alone, every other device free.

Every schedule of ``m`` microbatches on a placement, restricted to one device ``d``, is a
schedule of a smaller problem: ``d``'s passes (``F``, ``B``, ``W`` of its stages for every
microbatch) one at a time on one machine, each microbatch's consecutive passes on ``d`` at
least the chain between them apart (the passes of the other devices and the hops, at their
shortest), its first pass after the chain before it, the makespan at least each pass's end plus
the chain after it, and ``d``'s activations (each allocated at its ``F``'s start, released at its
``W``'s end) within the cap. The other devices are relaxed: their passes may overlap, and their
memory is free. The smallest makespan of that problem is therefore a lower bound on every
schedule's (docs/theory.md §6, bound 7), and so is any lower bound CP-SAT proves on it.

Unlike the closed forms, it sees how the cap *times* a device's work: with the microbatches in
flight all away on the other devices, the device idles, and when they return it is the
bottleneck (V-shape p = 6, m = 12, 3:4:2 at 0.375 of 1F1B's memory: 184.5 where the closed forms
give 150.5; the optimum cm.improve proves is 193).

The microbatches are identical, so the model runs every pass type in microbatch order: any
schedule of the relaxation, its microbatches relabelled per pass type by start time, is again one
(the chains' delays and the memory count hold for the sorted times). In that order the cap
implies precedences (a forward waits for the release the cap needs, :func:`_memory_precedences`),
given to CP-SAT as well: the same optimum, usually proven sooner or bounded higher (where not,
the model without them is solved too). Times are scaled to
integers and rounded down, so the bound stays a bound for costs of any precision.

CP-SAT proves the relaxation's optimum in seconds when the device has up to ~100 passes (the
V-shape with m ≤ 16, one stage per device with m ≤ 32, whatever ``p``: p = 16, m = 16 in about 4 s
a device); beyond it the bound is what the search proved within its time, often below the closed
forms (which :func:`relaxed_bounds` then does not improve) — unless it is asked for windows
(``window``): the relaxations of a few consecutive microbatches, which CP-SAT proves, chained into a
bound for any ``m`` (:func:`_chained_bound`).
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement
from ctrlmem.search.bounds import chains, forward_tails
from ctrlmem.solver.threaded import DET_SECONDS, solve

__all__ = ["DeviceBound", "relaxed_bounds", "MAX_PASSES", "SECONDS"]

log = logging.getLogger(__name__)

MAX_PASSES = 2_000
"""The most passes a device's relaxation takes (one model per device; beyond a few hundred CP-SAT
rarely proves more than the closed forms within seconds)."""
SECONDS = 30.0
"""Solver-seconds per device by default (deterministic; ``ctrlmem bound``'s default too): CP-SAT
proves the relaxation within them up to ~100 passes a device."""


@dataclass(frozen=True)
class DeviceBound:
    """One device's relaxation: ``bound`` (a lower bound on every schedule's makespan), whether
    CP-SAT proved the relaxation's optimum (``proven``), and the model's size (``passes``). With
    ``window`` (not 0) the bound comes from windows of that many microbatches chained, and
    ``proven`` says that every solve the chain used was proven. ``cut_short``: a solve it used
    reached the wall-clock safety limit before its solver-seconds were spent, so the bound (still
    valid) depends on the machine's speed and load, not only on the inputs."""

    device: int
    bound: float
    proven: bool
    passes: int
    window: int = 0
    cut_short: bool = False


def _scale(values: list[float]) -> int:
    """The smallest of a few scales that makes every value an integer; 10 when none does (the
    values are then rounded down at a tenth)."""
    for s in (1, 2, 4):
        if all(abs(v * s - round(v * s)) < 1e-9 * max(1.0, abs(v * s)) for v in values):
            return s
    return 10


def _memory_precedences(model, mbs: list[dict], timed: list[int], st: list[int], k: int, fused: bool) -> None:
    """The cap's consequences as precedences (redundant: they hold in every schedule of the
    relaxation whose pass types run in microbatch order, so the optimum is the same; CP-SAT's
    bound reasoning sees chains where it saw a cumulative).

    Take the device's stages in chain order, ``st[i]`` the ``i``-th from the lowest. When ``F`` of
    ``st[i]`` starts for microbatch ``j``, that microbatch holds its ``i`` lower stages (their
    forwards came first, their releases come after its backward) and takes one more activation.
    So with ``k`` whole activations on the device:

    - of the ``k − i`` microbatches before ``j`` that started ``st[i]``, one has released it: the
      earliest (the releases run in microbatch order): ``F(st[i], j) ≥ release(st[i], j − k + i)``;
    - for a lower stage ``u = st[q]``, ``q < i``: of the microbatches ``j − k + i .. j`` holding
      ``u`` (each started it before ``j`` did), one other than ``j`` has released it, the earliest:
      ``F(st[i], j) ≥ release(u, j − k + i)``.

    Only for the stages in ``timed``, whose forward lasts a (scaled) unit at least: microbatch
    ``j``'s lower stages are then held when ``F(st[i], j)`` starts even with every other pass of
    its chain rounded down to nothing."""
    def release(var, s):
        return var[("B", s)][1] if fused else var[("W", s)][1]

    for j, var in enumerate(mbs):
        at = j - k  # + i below
        for i, s in enumerate(st):
            if s not in timed or at + i < 0 or at + i >= j:
                continue
            before = mbs[at + i]
            for u in st[: i + 1]:
                model.Add(var[("F", s)][0] >= release(before, u))


def relaxed_bounds(placement: Placement, m: int, costs: Costs, cap: float, fused: bool = False,
                   seconds: float = SECONDS, devices: list[int] | None = None, seed: int = 0,
                   wall_factor: float = 4.0, precedences: bool = True, window: int | None = None) -> list[DeviceBound]:
    """The one-device relaxation of every device in ``devices`` (all by default) of ``placement``
    with ``m`` microbatches, ``costs`` and a per-device cap of ``cap`` (``a``; the default memory
    model: each stage's activation ``p/S``, released at its ``W``, or at its fused ``BW`` with
    ``fused``). Each solve is deterministic: ``seconds`` solver-seconds (CP-SAT's deterministic
    time × ``DET_SECONDS``, one worker, ``seed``), never past ``wall_factor × seconds`` of wall
    time (a safety limit: a solve that reaches it returns what it proved, which then depends on
    the machine). ``precedences``: solve each device with the cap's implied precedences
    (:func:`_memory_precedences`: the same optimum, usually proven sooner or bounded higher) and,
    where that solve stops before a proof, without them too, keeping the higher bound (each solve
    ``seconds``); ``False``: without them only.

    ``window``: where ``m`` is larger, the relaxation of ``m`` microbatches is not solved whole but
    bounded from windows of at most ``window`` consecutive microbatches (:func:`_chained_bound`:
    ``2·window − 1`` solves a device, each of ``seconds``); a device's passes then only count per
    window, so any ``m`` is taken."""
    if m < 1:
        raise ValueError(f"relaxed_bounds: m must be at least 1, got {m}")
    if not cap > 0 or not math.isfinite(cap):
        raise ValueError(f"relaxed_bounds: the cap must be a positive number (in a), got {cap}")
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"relaxed_bounds: seconds must be a positive number of solver-seconds, got {seconds}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 2):
        raise ValueError(f"relaxed_bounds: window must be a whole number of microbatches, at least 2; got {window!r}")
    chained = window is not None and m > window
    S, p = placement.num_stages, placement.num_devices
    k = math.floor(cap / (p / S) + 1e-9)  # whole activations the cap holds
    devices = list(range(p) if devices is None else devices)
    for d in devices:  # every device checked before any is solved
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 0 <= d < p:
            raise ValueError(f"relaxed_bounds: device {d!r} is not one of the placement's 0..{p - 1}")
        v = len(placement.stages_of(d))
        passes = (2 if fused else 3) * v * (window if chained else m)
        if passes > MAX_PASSES:
            raise ValueError(f"relaxed_bounds: device {d} has {passes} passes{' a window' if chained else ''}, more "
                             f"than the {MAX_PASSES} a relaxation takes; give fewer microbatches"
                             f"{' a window' if chained else ' (or a window)'}, or use the closed forms alone "
                             f"(ctrlmem.search.bounds.makespan_bounds; `ctrlmem bound --relax 0`)")
        if k < v:  # F of the device's highest stage holds all of a microbatch's activations there
            raise ValueError(f"relaxed_bounds: a cap of {cap:g} a holds {k} whole activations of {p / S:g} a; "
                             f"device {d} needs {v} for one microbatch: give cap >= {v * p / S:g}")
    times = chains(placement, costs, fused)  # every device's chain times, from the whole pipeline
    _, _, tail_b, (f, b, _) = times
    tail_f = forward_tails(placement, costs, f, b, tail_b)
    out = []
    for d in (int(x) for x in devices):  # numpy integers in, plain ints in the results
        dev = _Device(placement, times, tail_f, d, k, fused, seconds, seed, wall_factor, precedences)
        if chained:
            bound, proven = _chained_bound(dev, m, window)
            out.append(DeviceBound(d, bound, proven, dev.passes(m), window, dev.cut_short))
        else:
            value, proven = dev.solve(m, "makespan")
            out.append(DeviceBound(d, value, proven, dev.passes(m), cut_short=dev.cut_short))
    return out


class _Device:
    """One device's relaxation, solved for any number of microbatches (:meth:`solve`)."""

    def __init__(self, placement: Placement, times, tail_f: list[float], d: int, k: int, fused: bool,
                 seconds: float, seed: int, wall_factor: float, precedences: bool) -> None:
        head_f, head_b, tail_b, (f, b, w) = times  # ctrlmem.search.bounds.chains
        self.scale = _scale([*f, *b, *w, *head_f, *head_b, *tail_b, *tail_f])
        self.st = st = sorted(placement.stages_of(d))
        # the device's passes of one microbatch in chain order (F up, B down), then the W s
        self.chain = chain = [("F", s) for s in st] + [("B", s) for s in reversed(st)]
        self.kinds = chain + ([] if fused else [("W", s) for s in st])
        dur = {("F", s): f[s] for s in st} | {("B", s): b[s] for s in st} | {("W", s): w[s] for s in st}
        at = {("F", s): head_f[s] for s in st} | {("B", s): head_b[s] for s in st}
        tail = {("F", s): tail_f[s] for s in st} | {("B", s): tail_b[s] for s in st} | {("W", s): 0.0 for s in st}
        # scaled and rounded down: the bound stays a bound
        self.dur = {x: self.lo(t) for x, t in dur.items()}
        self.tail = {x: self.lo(t) for x, t in tail.items()}
        # the earliest start of the device's first pass of a microbatch, as given and scaled (rounded down)
        self.head = at[chain[0]]
        self.first = self.lo(self.head)
        self.lag = {c: self.lo(at[c] - at[a] - dur[a]) for a, c in zip(chain, chain[1:])}
        # the microbatches one after another, each alone (its passes at their chain times, its W s after):
        # a schedule within any cap that holds one microbatch, so the smallest makespan is below it
        self.alone = max(at[x] + dur[x] + tail[x] for x in chain) + math.fsum(w[s] for s in st)
        self.total = math.fsum(dur.values())
        # the stages whose forward lasts a scaled unit at least (see _memory_precedences)
        self.timed = [s for s in st if self.lo(f[s]) >= 1]
        self.d, self.k, self.fused = d, k, fused
        self.seconds, self.seed, self.wall_factor, self.precedences = seconds, seed, wall_factor, precedences
        self.cut_short = False  # a solve stopped by the wall clock, not by its deterministic budget

    def lo(self, x: float) -> int:
        return math.floor(x * self.scale + 1e-9)

    def passes(self, m: int) -> int:
        return len(self.kinds) * m

    def solve(self, m: int, objective: str) -> tuple[float, bool]:
        """The relaxation of ``m`` microbatches: ``objective`` ``"makespan"`` (its makespan) or
        ``"entry"`` (the start of the last microbatch's first pass on the device); the least value
        CP-SAT found or the bound it proved (in time units), and whether it is proven.

        With the cap's precedences first; where that solve stops short of a proof, the model
        without them as well (on some devices CP-SAT proves that one sooner: V-shape p = 6,
        m = 12, the profiled mix at 0.25, device 5), the higher bound kept."""
        value, proven = -math.inf, False
        for with_precedences in ((True, False) if self.precedences else (False,)):
            got, proven = self._solve_once(m, objective, with_precedences)
            value = max(value, got)  # both models bound the same optimum; a proven one is it
            if proven:
                break
        return value / self.scale, proven

    def _solve_once(self, m: int, objective: str, with_precedences: bool) -> tuple[float, bool]:
        from ortools.sat.python import cp_model  # noqa: PLC0415 - ortools takes ~1 s to import; only the solver needs it

        chain, kinds, dur, st = self.chain, self.kinds, self.dur, self.st
        if objective == "makespan":
            horizon = math.ceil((m * self.alone + self.total) * self.scale) + 10
        else:
            # every schedule's passes, run in their order as early as the lags allow, start no later
            # than they did (the memory only gets freer: a pass's releases are all before it) and end
            # by this: the last microbatch's first pass is as early within it as in any schedule
            most = max([0, *self.lag.values()])
            horizon = self.first + m * sum(dur[x] + most for x in kinds) + 10
        model = cp_model.CpModel()
        T = model.NewIntVar(0, horizon, "T")
        busy, held = [], []
        prev: dict = {}
        mbs = []  # each microbatch's pass variables
        for _ in range(m):
            var = {}
            for x in kinds:
                s0 = model.NewIntVar(0, horizon, "")
                e0 = model.NewIntVar(0, horizon, "")
                busy.append(model.NewIntervalVar(s0, dur[x], e0, ""))
                var[x] = (s0, e0)
                if objective == "makespan":
                    model.Add(T >= e0 + self.tail[x])
                if x in prev:  # identical microbatches: every pass type in microbatch order
                    model.Add(s0 >= prev[x][0])
            model.Add(var[chain[0]][0] >= self.first)
            for a, c in zip(chain, chain[1:]):
                model.Add(var[c][0] >= var[a][1] + self.lag[c])
            for s in st:
                end = var[("B", s)][1] if self.fused else var[("W", s)][1]
                if not self.fused:
                    model.Add(var[("W", s)][0] >= var[("B", s)][1])
                size = model.NewIntVar(0, horizon, "")
                held.append(model.NewIntervalVar(var[("F", s)][0], size, end, ""))
            prev = var
            mbs.append(var)
        if with_precedences:
            _memory_precedences(model, mbs, self.timed, st, self.k, self.fused)
        model.AddNoOverlap(busy)
        model.AddCumulative(held, [1] * len(held), self.k)
        if objective == "entry":
            model.Add(T == mbs[-1][chain[0]][0])
        model.Minimize(T)
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = 1
        prm.random_seed = self.seed
        prm.max_deterministic_time = max(0.002, self.seconds / DET_SECONDS)
        prm.max_time_in_seconds = max(0.05, self.wall_factor * self.seconds)
        code = solve(solver, model)
        if code == cp_model.INFEASIBLE:  # pragma: no cover - the relaxation always has a schedule
            raise RuntimeError(f"relaxed_bounds: device {self.d}'s relaxation has no schedule (cap {self.k} activations)")
        proven = code == cp_model.OPTIMAL
        # unproven with its deterministic budget unspent: only the wall clock stops a one-worker solve so
        if not proven and solver.response_proto.deterministic_time < prm.max_deterministic_time * 0.98:
            self.cut_short = True
            log.warning("relaxed_bounds: device %d's solve stopped at the wall-clock safety limit (%g s) before its "
                        "%g solver-seconds were spent; its bound depends on the machine's speed", self.d,
                        prm.max_time_in_seconds, self.seconds)
        return (solver.ObjectiveValue() if proven else solver.BestObjectiveBound()), proven


def _chained_bound(dev: _Device, m: int, window: int) -> tuple[float, bool]:
    """A lower bound on the relaxation of ``m`` microbatches from windows of at most ``window``.

    Write ``E(n)`` for the least start of the last microbatch's first pass on the device over
    schedules of ``n`` microbatches, ``R(n)`` for their least makespan, and ``r`` for the earliest
    start of a microbatch's first pass. In any schedule of ``m`` microbatches (each pass type in
    microbatch order), the passes of microbatches ``i..j`` alone, moved ``x_i − r`` earlier
    (``x_i`` the start of microbatch ``i``'s first pass), are a schedule of ``j − i + 1``
    microbatches: every pass still starts after ``r`` (no earlier microbatch's is among them), the
    chains, the order and one pass at a time hold, and the device holds a part of what it held.
    So ``x_j ≥ x_i − r + E(j − i + 1)``, and the makespan ``T ≥ x_i − r + R(m − i)``. Chained
    from ``x_0 = r``, with ``E`` and ``R`` solved for ``n ≤ window`` (a bound CP-SAT proves is
    as good as the optimum: it is below it), the best such chain bounds ``T``. Each joint loses
    what the window after it gains by starting with the device's memory empty, little against a
    relaxation that grows by the same amount for every microbatch (docs/theory.md §6, bound 7):
    V-shape p = 6, m = 24, 3:4:2 at 0.375, device 5: windows of 12 give 315.5 (of 14: 331.5), where
    the whole relaxation reaches 292.5 in 30 solver-seconds and the closed forms 296.25.

    Returns the bound and whether every solve it used was proven."""
    n_max = min(window, m)
    R = {n: dev.solve(n, "makespan") for n in range(1, n_max + 1)}
    r = dev.head  # as given: the solves' values are below the real optima (rounded down), r may not be
    E = {1: (r, True)}
    E.update({n: dev.solve(n, "entry") for n in range(2, n_max + 1)})
    # x[j]: a lower bound on the start of microbatch j's first pass; how[j]: whether it used proven solves only
    x = [r] + [-math.inf] * (m - 1)
    how = [True] * m
    for j in range(1, m):
        for n in range(2, min(n_max, j + 1) + 1):
            got = x[j - n + 1] - r + E[n][0]
            if got > x[j]:
                x[j], how[j] = got, how[j - n + 1] and E[n][1]
    best, proven = -math.inf, True
    for n in range(1, n_max + 1):
        i = m - n
        got = x[i] - r + R[n][0]
        if got > best:
            best, proven = got, how[i] and R[n][1]
    return best, proven
