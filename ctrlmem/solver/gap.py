"""The optimality gap at real sizes: each heuristic against ``cm.improve`` and the best proven
lower bound (the ``optimality-gap`` artifact, ``benchmarks/bench_optimality_gap.py``).

For each instance (``p``, ``m``, costs, budget) and placement (V-shape: ``v-shape``, ``v-min``,
``v-half``, ``v-zb``; one stage per device: ``zb``, ``zb-h1``, ``1f1b``), :func:`measure`
simulates every heuristic (the budgeted searches ``v-shape`` / ``zb`` built with
``objective="makespan"``: the bound and the solver measure makespans), runs
:func:`ctrlmem.improve` from the budgeted one with a deterministic budget and reads its best makespan at each checkpoint (10 and 60
solver-seconds), and takes the best lower bound (the closed forms of
:func:`ctrlmem.search.bounds.makespan_bounds`, on small instances the whole CP-SAT model's, and
where :func:`relax_runs` says so the one-device relaxation's, :mod:`ctrlmem.solver.relax`, and where
:func:`window_runs` says so that relaxation bounded from chained windows of a few microbatches).
A heuristic's *certified gap* is its makespan over that bound, minus one: the true distance to
the optimum is at most that; where the solver proved the optimum, it is exact.

Grids (:func:`instances`): ``"quick"`` (CI) p ∈ {2, 3}, m = p, mixes 1:1:1 and 3:4:2, budgets
smallest feasible / 0.5 / 1.0, checkpoints 2 and 5 s; ``"full"`` (committed) —
p ∈ {2, 3, 4, 6, 8, 16}, m ∈ {p, 2p, 4p}, budgets smallest feasible / 0.5 / 0.75 / 1.0 / 1.5 (and at
p ≥ 6 also 0.25 / 0.375),
mixes 1:1:1, 3:4:2, 2:1:1, 1:2:2 and the profiled H200 mix with its hop — with ``cm.improve`` on
every instance at p ≤ 4 and, at p ≥ 6, on m ∈ {2p, 4p}, mixes 3:4:2 and profiled, budgets
smallest / 0.5 / 1.0 and at p = 6, 8 also 0.25 / 0.375, and at p = 6, 8 with m = p on every mix and
budget up to 0.5, where the whole model (at most 384 passes) proves most of them in seconds; the bound
and the heuristics on every instance. docs/reproduce.md gives the sizes and times.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement
from ctrlmem.model import paper
from ctrlmem.schedules.registry import build
from ctrlmem.model.simulate import simulate
from ctrlmem.solver.improve import improve
from ctrlmem.model.ir import Schedule
from ctrlmem.search.bounds import makespan_bounds
from ctrlmem.search.encoding import passes_per_device
from ctrlmem.solver.relax import relaxed_bounds
from importlib.resources import files
import hashlib
from concurrent.futures import ProcessPoolExecutor

__all__ = ["Instance", "MIXES", "BUDGETS", "LOW_BUDGETS", "ALL_BUDGETS", "HEURISTICS", "instances", "measure", "measure_all", "profiled_costs",
           "summary", "window_runs", "windowed"]

log = logging.getLogger(__name__)

#: heuristics per placement: (name, takes the budget?); the first is the one ``cm.improve`` starts from
HEURISTICS: dict[str, tuple[tuple[str, bool], ...]] = {
    "v-shape": (("v-shape", True), ("v-min", False), ("v-half", False), ("v-zb", False)),
    "sequential": (("zb", True), ("zb-h1", False), ("1f1b", False)),
}
BUDGETS = ("min", 0.5, 0.75, 1.0, 1.5)
"""Memory budgets, fractions of 1F1B's ``p·a``; ``"min"`` is the smallest feasible, ``1/p`` (one
microbatch's activation per device)."""
LOW_BUDGETS = (0.25, 0.375)
"""Budgets between the smallest and V-Min's added at ``p ≥ 6``, so every budget from ``1/p`` to 0.5
has rows there (heuristics and bounds everywhere; ``cm.improve`` at p = 6 and 8, where its whole
model, up to 1,500 passes, proves optima or a bound at m = p and 2p)."""
ALL_BUDGETS = ("min", *LOW_BUDGETS, *BUDGETS[1:])


def profiled_costs() -> Costs:
    """F, B, W of one full device-stage and the hop, in ms, from measurements: the pass times of
    the shipped H200 rank replay (``ctrlmem/data/h200_rank_replay.json``: 9.6B, p = 16, microbatch
    4, V-Half, the middle devices 1 and 8: each device's two chunks summed, averaged over the two
    devices) and the paper's hop model for that microbatch (2·b·s·h bytes at 25 GB/s,
    :func:`ctrlmem.model.paper.paper_costs`), rounded to 0.01 ms."""


    data = json.loads((files("ctrlmem") / "data" / "h200_rank_replay.json").read_text())
    f = b = w = 0.0
    n = 0
    for row in data["rows"]:
        if (row.get("model"), row.get("schedule"), row.get("tag")) == ("9.6b", "v-half", "paper-p") \
                and row.get("device") in (1, 8):
            times = row["pass_times_s"]
            f += sum(times[s]["F"]["median"] for s in times)
            b += sum(times[s]["B"]["median"] for s in times)
            w += sum(times[s]["W"]["median"] for s in times)
            n += 1
    if n != 2:  # pragma: no cover - the shipped file has both
        raise ValueError("the shipped rank replay lacks the 9.6B V-Half rows of devices 1 and 8")
    comm = paper.paper_costs("9.6B", 16, 4).comm
    return Costs(round(1e3 * f / n, 2), round(1e3 * b / n, 2), round(1e3 * w / n, 2), round(comm, 2))


def _mixes() -> dict[str, Costs]:
    return {"1:1:1": Costs(1, 1, 1), "3:4:2": Costs(3, 4, 2), "2:1:1": Costs(2, 1, 1), "1:2:2": Costs(1, 2, 2),
            "profiled": profiled_costs()}


MIXES = _mixes()
"""F:B:W:comm mixes: four ratios without a hop, and the profiled H200 mix with its hop."""


@dataclass(frozen=True)
class Instance:
    """One instance of the grid: ``improve`` says whether ``cm.improve`` runs on it."""

    p: int
    m: int
    mix: str
    budget: object  # "min" or a fraction
    improve: bool

    @property
    def costs(self) -> Costs:
        return MIXES[self.mix]

    @property
    def limit(self) -> float:
        return 1.0 / self.p if self.budget == "min" else float(self.budget)

    @property
    def label(self) -> str:
        b = "min (1/p)" if self.budget == "min" else f"{self.budget:g}"
        return f"m={self.m} {self.mix} budget {b}"


def _placement(inst: Instance, placement: str) -> Placement:
    """The placement named ``placement`` (``"v-shape"`` or ``"sequential"``) at ``inst.p`` devices."""
    return Placement.v_shape(inst.p) if placement == "v-shape" else Placement.sequential(inst.p)


def instances(size: str = "full") -> list[Instance]:
    """The grid (see the module docstring); a budget equal to the smallest feasible one (0.5 at
    p = 2) is listed once, as ``"min"``."""
    if size not in ("quick", "full"):
        raise ValueError(f"size must be 'quick' or 'full', got {size!r}")
    out = []
    if size == "quick":
        for p in (2, 3):
            for mix in ("1:1:1", "3:4:2"):
                for budget in ("min", 0.5, 1.0):
                    if budget != "min" and abs(budget - 1 / p) < 1e-12:
                        continue
                    out.append(Instance(p, p, mix, budget, True))
        return out
    for p in (2, 3, 4, 6, 8, 16):
        for m in (p, 2 * p, 4 * p):
            for mix in MIXES:
                for budget in (ALL_BUDGETS if p >= 6 else BUDGETS):
                    if budget != "min" and abs(budget - 1 / p) < 1e-12:
                        continue
                    run = p <= 4 or (m > p and mix in ("3:4:2", "profiled") and (
                        budget in ("min", 0.5, 1.0) or (p <= 8 and budget in LOW_BUDGETS))) or (
                        m == p and p <= 8 and budget in ("min", *LOW_BUDGETS, 0.5))
                    out.append(Instance(p, m, mix, budget, run))
    return out


def _round(x: float | None) -> float | None:  # stable JSON: 6 decimals, no -0.0
    return None if x is None else round(float(x), 6) + 0.0


def heuristics(inst: Instance, placement: str) -> tuple[dict, str | None]:
    """Every heuristic of ``placement`` on ``inst``, simulated: ``{name: {makespan, span, peak,
    fits}}`` (``None`` values when it cannot be built), and the budgeted one's schedule text (what
    :func:`ctrlmem.improve` starts from)."""

    p, m, costs, limit = inst.p, inst.m, inst.costs, inst.limit
    heur: dict[str, dict] = {}
    seed = None
    for name, budgeted in HEURISTICS[placement]:
        try:
            s = build(name, p, m, costs=costs, **({"memory_limit": limit, "objective": "makespan"} if budgeted else {}))
        except ValueError:
            heur[name] = {"makespan": None, "span": None, "peak": None, "fits": False}
            continue
        r = simulate(s, costs)
        heur[name] = {"makespan": _round(r.makespan), "span": _round(max(r.device_spans)),
                      "peak": _round(max(r.peak_memory)), "fits": max(r.peak_memory) <= limit * p + 1e-9}
        if budgeted:
            seed = s.to_text()
    return heur, seed


def solve(inst: Instance, seed_text: str, checkpoints: tuple[float, ...]) -> dict:
    """:func:`ctrlmem.improve` from ``seed_text`` (deterministic, one worker, ``max(checkpoints)``
    solver-seconds): its best makespan at each checkpoint, its bounds, status and lower bound."""

    seed = Schedule.from_text(seed_text)
    res = improve(seed, inst.costs, inst.limit, time_limit=max(checkpoints), workers=1, deterministic=True)
    at = {f"{c:g}": _round(min(mk for t, mk in res.trace if t <= c + 1e-9)) for c in checkpoints}
    at[f"{max(checkpoints):g}"] = _round(res.makespan)
    return {"improve": at, "solver_bounds": {k: _round(v) for k, v in dict(res.bounds).items()},
            "status": res.status, "lower_bound": _round(res.lower_bound),
            "optimum": _round(res.makespan) if res.status == "optimal" else None, **cut_mark(res.cut_short)}


def measure(inst: Instance, placement: str, checkpoints: tuple[float, ...] = (10.0, 60.0),
            solved: dict | None = None, built: tuple[dict, str | None] | None = None,
            relax: dict | None = None, windows: dict | None = None) -> dict:
    """One instance on one placement (see the module docstring). Returns a JSON-ready dict:
    ``heuristics`` {name: {makespan, span, peak, fits}}, ``bounds`` (the closed forms by name),
    ``improve`` {checkpoint: makespan} (when it ran), ``lower_bound`` (the best), ``status``
    (``"optimal"`` when proven, else ``"bound"``), ``optimum`` (or ``None``). ``solved``: the
    result of :func:`solve` for this instance, when already computed; ``built``: that of
    :func:`heuristics`; ``relax``: that of :func:`relaxed` (its bound joins ``bounds`` as ``"one device"``);
    ``windows``: that of :func:`windowed` (its bound joins ``bounds`` as ``"windows"``)."""

    p, m, costs, cap = inst.p, inst.m, inst.costs, inst.limit * inst.p
    heur, seed = built if built is not None else heuristics(inst, placement)
    bounds = {k: _round(v) for k, v in makespan_bounds(_placement(inst, placement), m, costs, cap).items()}
    out = {"p": p, "m": m, "mix": inst.mix, "budget": inst.budget, "placement": placement,
           "heuristics": heur, "bounds": bounds, "improve": None, "status": "bound", "optimum": None,
           "lower_bound": _round(max(bounds.values()))}
    if relax is not None:
        out["bounds"]["one device"] = relax["relaxed"]
        out["lower_bound"] = max(out["lower_bound"], relax["relaxed"])
    if windows is not None:
        out["bounds"]["windows"] = windows["windows"]
        out["lower_bound"] = max(out["lower_bound"], windows["windows"])
    if inst.improve and seed is not None:
        got = solved if solved is not None else solve(inst, seed, checkpoints)
        out["improve"] = got["improve"]
        out["bounds"] = {**out["bounds"], **{k: v for k, v in got["solver_bounds"].items() if k == "solver"}}
        out["lower_bound"] = max(out["lower_bound"], got["lower_bound"])
        if got["status"] == "optimal":
            out["status"], out["optimum"], out["lower_bound"] = "optimal", got["optimum"], got["optimum"]
    return out


RELAX_VERSION = "relax-1"
"""Part of the cache key of the one-device relaxations (:func:`relaxed`)."""
RELAX_SECONDS = 30.0
"""Solver-seconds per device of :func:`relaxed` (deterministic, one worker)."""


RELAX_PASSES = 96
"""The most passes a device may have for the grid to solve its one-device relaxation (:func:`relax_runs`)."""


def relax_runs(inst: Instance, placement: str) -> bool:
    """Whether the grid solves the one-device relaxation (:mod:`ctrlmem.solver.relax`) of ``inst``
    on ``placement``: at p ≥ 6, budgets 0.25, 0.375 and 0.5, every mix, wherever a device has at
    most :data:`RELAX_PASSES` passes (V-shape: m = p, 2p at p = 6, 8 and m = p at p = 16; one stage
    per device: m = p, 2p, 4p at p = 6, 8 and m = p, 2p at p = 16), where CP-SAT proves the
    relaxation's optimum in seconds (p = 16, m = 16, 2:1:1 at 0.25: 140 on the V-shape, every device
    proven in about 4 s, where the closed forms give 119). Not at the smallest budget, where the
    closed forms' one-at-a-time bound is already tight (and CP-SAT slow)."""
    if inst.p < 6 or inst.budget == "min" or float(inst.budget) > 0.5:
        return False
    return passes_per_device(_placement(inst, placement), inst.m, False) <= RELAX_PASSES


def relaxed(inst: Instance, placement: str, seconds: float = RELAX_SECONDS) -> dict:
    """The one-device relaxation of every device of ``inst`` on ``placement``: the best bound, and
    on how many devices CP-SAT proved the relaxation's optimum."""
    # the plain model, as the recorded grid was solved (RELAX_VERSION relax-1): of the 122 of its 195
    # relaxations solved again with the cap's precedences, two rose (V-shape p = 8, m = 16, 3:4:2 at
    # 0.25: 292.5 -> 296; at 0.375: 204.5 -> 206) and the rest were equal; solving the grid with them
    # is for a regeneration that bumps RELAX_VERSION
    got = relaxed_bounds(_placement(inst, placement), inst.m, inst.costs, inst.limit * inst.p, seconds=seconds,
                         precedences=False)
    best = max(got, key=lambda r: r.bound)
    return {"relaxed": _round(best.bound), "device": best.device, "proven": sum(r.proven for r in got),
            "devices": len(got), **cut_mark(any(r.cut_short for r in got))}


WINDOW = 12
"""Microbatches a window of :func:`windowed` (the chained one-device relaxation)."""
WINDOW_SECONDS = 10.0
"""Solver-seconds of each of a window's solves in :func:`windowed` (deterministic, one worker)."""
WINDOW_VERSION = "window-1"
"""Part of the cache key of :func:`windowed`."""


def window_runs(inst: Instance, placement: str) -> bool:
    """Whether the grid bounds ``inst`` on ``placement`` from chained windows of the one-device
    relaxation (:func:`windowed`): on the V-shape at p = 6 and 8, budgets 0.25, 0.375 and 0.5, where
    ``m`` is more than a window: m = 4p, where the whole relaxation does not run (:func:`relax_runs`),
    and p = 8, m = 16, where it runs but CP-SAT does not always prove it in its 30 seconds (profiled
    at 0.25: 861.8 from the closed forms, windows 886.1, the whole relaxation less). There a window of
    :data:`WINDOW` microbatches is long against what a device holds (3–8 activations, 1.5–4 of
    each of its two stages), so the cold start each joint loses is small; at p = 16 (4–8 of each)
    windows of 12 raised none of the fourteen rows over 15 % they were tried on (with this
    module's settings), and the one-stage-per-device rows' heuristics are already within 17 % of
    their bounds there."""
    if placement != "v-shape" or inst.p not in (6, 8) or inst.budget == "min" or float(inst.budget) > 0.5:
        return False
    return inst.m > WINDOW


def windowed(inst: Instance, placement: str, window: int = WINDOW, seconds: float = WINDOW_SECONDS) -> dict:
    """The one-device relaxation of ``inst``'s bottom device (``p − 1``, the V's turn: on seven
    p = 6, m = 24 rows its bound was the best of all six devices') on ``placement``, bounded from
    chained windows of ``window`` microbatches (:func:`ctrlmem.solver.relax.relaxed_bounds` with
    ``window``; the cap's precedences on, each solve ``seconds``): the bound, and whether every
    solve it used was proven."""
    got = relaxed_bounds(_placement(inst, placement), inst.m, inst.costs, inst.limit * inst.p,
                         devices=[inst.p - 1], seconds=seconds, window=window)[0]
    return {"windows": _round(got.bound), "device": got.device, "window": got.window, "proven": bool(got.proven),
            **cut_mark(got.cut_short)}


def cut_mark(cut_short: bool) -> dict:
    """``{"cut_short": True}`` for a solver run its wall-clock safety limit stopped (what it found
    depends on the machine: :func:`cache_run` leaves it out), else nothing: the records of runs that
    ended as planned stay as they were."""
    return {"cut_short": True} if cut_short else {}


def cache_run(cache: str | Path | None, key: str, rec: dict, what: str) -> None:
    """Append a finished solver run ``rec`` under ``key`` to the JSON-lines ``cache`` (none:
    nothing) — unless it was cut short (:func:`cut_mark`): then a warning naming ``what`` and no
    line, so that a quieter run solves it again instead of replaying one machine's result into an
    artifact that must regenerate byte for byte."""
    if rec.get("cut_short"):
        log.warning("%s: stopped by its wall-clock safety limit before its solver-seconds were spent (a slow or busy "
                    "machine); used in this run but not cached, and the artifact may not regenerate byte for byte: "
                    "run again on a quieter machine", what)
        return
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        with open(cache, "a") as fh:
            fh.write(json.dumps({"_key": key, **rec}, sort_keys=True) + "\n")


SOLVER_VERSION = "improve-3"  # 2: the levels bound (a stronger floor for the whole model); 3: the one-at-a-time window
"""Part of the cache key of :func:`measure_all`: change it when :func:`ctrlmem.improve` changes."""


def _solve_task(args):
    if args[0] == "relax":
        return relaxed(args[1], args[2])
    if args[0] == "windows":
        return windowed(args[1], args[2])
    inst, seed, checkpoints = args
    return solve(inst, seed, checkpoints)


def measure_all(size: str = "full", jobs: int = 1, checkpoints: tuple[float, ...] | None = None,
                cache: str | Path | None = None) -> list[dict]:
    """:func:`measure` for every instance of :func:`instances` on both placements, in grid order.
    The solver runs ``jobs`` processes at a time (each run is deterministic: the order and the
    number of processes change nothing). ``cache``: a JSON-lines file of finished solver runs,
    keyed by the instance, the starting schedule, the checkpoints and :data:`SOLVER_VERSION`; read
    first and appended to, so a long run resumes where it stopped and a changed heuristic
    re-runs only its own instances."""

    checkpoints = checkpoints or ((2.0, 5.0) if size == "quick" else (10.0, 60.0))
    tasks = [(inst, pl) for inst in instances(size) for pl in HEURISTICS]
    built = {t: heuristics(*t) for t in tasks}
    seeds = {t: built[t][1] for t in tasks}

    def key(inst, pl):
        digest = hashlib.sha1((seeds.get((inst, pl)) or "").encode()).hexdigest()
        return json.dumps([inst.p, inst.m, inst.mix, inst.budget, pl, list(checkpoints), digest, SOLVER_VERSION])

    done: dict[str, dict] = {}
    if cache is not None and Path(cache).exists():
        for line in Path(cache).read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec.pop("_key")] = rec
    def rkey(inst, pl):
        return json.dumps([inst.p, inst.m, inst.mix, inst.budget, pl, "relax", RELAX_SECONDS, RELAX_VERSION])

    def wkey(inst, pl):
        return json.dumps([inst.p, inst.m, inst.mix, inst.budget, pl, "windows", WINDOW, WINDOW_SECONDS,
                           WINDOW_VERSION])

    todo = [(inst, pl) for inst, pl in tasks if inst.improve and seeds[(inst, pl)] and key(inst, pl) not in done]
    todo_r = [(inst, pl) for inst, pl in tasks if relax_runs(inst, pl) and rkey(inst, pl) not in done]
    todo_w = [(inst, pl) for inst, pl in tasks if window_runs(inst, pl) and wkey(inst, pl) not in done]
    log.info("optimality gap: %d measurements, %d solver runs, %d relaxations and %d windowed relaxations to do, "
             "%d processes", len(tasks), len(todo), len(todo_r), len(todo_w), jobs)
    keys = [key(*t) for t in todo] + [rkey(*t) for t in todo_r] + [wkey(*t) for t in todo_w]
    names = [*todo, *todo_r, *todo_w]

    def keep(i, rec):
        done[keys[i]] = rec
        t = names[i]
        cache_run(cache, keys[i], rec, f"optimality gap: p={t[0].p} {t[0].label} {t[1]}: "
                  + ("cm.improve" if i < len(todo) else "a one-device relaxation"))
        log.info("optimality gap: p=%d %s %s: %s (%d to go)", t[0].p, t[0].label, t[1],
                 rec.get("status", f"one-device bound {rec.get('relaxed', rec.get('windows'))}"),
                 sum(1 for x in keys if x not in done))

    args = ([(inst, seeds[(inst, pl)], checkpoints) for inst, pl in todo] + [("relax", inst, pl) for inst, pl in todo_r]
            + [("windows", inst, pl) for inst, pl in todo_w])
    if jobs > 1 and len(args) > 1:

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for i, rec in enumerate(pool.map(_solve_task, args)):
                keep(i, rec)
    else:
        for i, a in enumerate(args):
            keep(i, _solve_task(a))
    return [measure(inst, pl, checkpoints, done.get(key(inst, pl)) if inst.improve else None, built[(inst, pl)],
                    done.get(rkey(inst, pl)) if relax_runs(inst, pl) else None,
                    done.get(wkey(inst, pl)) if window_runs(inst, pl) else None)
            for inst, pl in tasks]


def default_jobs() -> int:
    """Processes for the full grid: two where there are two CPUs or more (each solve uses one)."""
    return max(1, min(2, os.cpu_count() or 1))


def summary(rows: list[dict]) -> dict:
    """The headline numbers: per placement's budgeted heuristic, at p ≤ 4 how many rows are within
    2 % of the proven optimum (of those proven), at p = 8 and 16 the certified gaps, and what
    ``cm.improve`` gains at each checkpoint."""
    out: dict = {}
    for placement, names in HEURISTICS.items():
        main = names[0][0]
        rs = [r for r in rows if r["placement"] == placement]
        small = [r for r in rs if r["p"] <= 4]
        proven = [r for r in small if r["status"] == "optimal"]
        within = [r for r in proven if r["heuristics"][main]["makespan"] <= 1.02 * r["optimum"] + 1e-9]
        d = {"heuristic": main, "small_rows": len(small), "small_proven": len(proven), "small_within_2pct": len(within),
             "small_worst": None}
        if proven:
            worst = max(proven, key=lambda r: r["heuristics"][main]["makespan"] / r["optimum"])
            d["small_worst"] = {"ratio": _round(worst["heuristics"][main]["makespan"] / worst["optimum"]),
                                "where": f"p={worst['p']} m={worst['m']} {worst['mix']} budget {worst['budget']}"}
        for p in sorted({r["p"] for r in rs if r["p"] > 4}):
            gaps = sorted(r["heuristics"][main]["makespan"] / r["lower_bound"] - 1 for r in rs if r["p"] == p)
            d[f"p{p}"] = {"instances": len(gaps), "median_gap": _round(gaps[len(gaps) // 2]),
                          "max_gap": _round(gaps[-1]), "min_gap": _round(gaps[0])}
        low = [r for r in rs if r["p"] > 4 and (r["budget"] == "min" or float(r["budget"]) <= 0.5)]
        if low:  # where memory binds: the budgeted heuristic's certified gaps at budgets up to ½
            gaps = sorted(r["heuristics"][main]["makespan"] / r["lower_bound"] - 1 for r in low)
            d["low_budgets"] = {"instances": len(gaps), "median_gap": _round(gaps[len(gaps) // 2]),
                                "max_gap": _round(gaps[-1]), "within_15pct": sum(g <= 0.15 + 1e-9 for g in gaps)}
        gains: dict[str, list[float]] = {}
        for r in rs:
            if r["improve"]:
                h = r["heuristics"][main]["makespan"]
                for c, mk in r["improve"].items():
                    gains.setdefault(c, []).append(1 - mk / h)
        d["improve"] = {c: {"runs": len(g), "median_gain": _round(sorted(g)[len(g) // 2]), "max_gain": _round(max(g)),
                            "never_worse": all(x >= -1e-12 for x in g)} for c, g in gains.items()}
        large = [r for r in rs if r["improve"] and r["p"] > 4]
        for c in (list(large[0]["improve"]) if large else []):
            g = sorted(1 - r["improve"][c] / r["heuristics"][main]["makespan"] for r in large)
            d["improve"][c]["large_median_gain"] = _round(g[len(g) // 2])
            d["improve"][c]["large_max_gain"] = _round(g[-1])
        out[placement] = d
    return out


def figure(rows: list[dict]):
    """Gap against p per budget (plotly): per placement, the budgeted heuristic's largest
    certified gap over the instances of each p (makespan / best lower bound − 1, in %), one line
    per budget; dotted, the same after ``cm.improve``'s longest run where it ran."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help
    from plotly.subplots import make_subplots  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    names = {pl: hs[0][0] for pl, hs in HEURISTICS.items()}
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[f"{names[pl]} ({'V-shape' if pl == 'v-shape' else 'one stage per device'})"
                                        for pl in HEURISTICS])
    colors = ["#1f77b4", "#8c564b", "#e377c2", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    for col, pl in enumerate(HEURISTICS, start=1):
        rs = [r for r in rows if r["placement"] == pl]
        ps = sorted({r["p"] for r in rs})
        for i, budget in enumerate(ALL_BUDGETS):
            label = "smallest (1/p)" if budget == "min" else f"{budget:g}"
            ys, yi = [], []
            for p in ps:
                sel = [r for r in rs if r["p"] == p and r["budget"] == budget]
                ys.append(round(100 * max(r["heuristics"][names[pl]]["makespan"] / r["lower_bound"] - 1 for r in sel), 3)
                          if sel else None)
                imp = [r for r in sel if r["improve"]]
                last = max(imp[0]["improve"], key=float) if imp else None
                yi.append(round(100 * max(r["improve"][last] / r["lower_bound"] - 1 for r in imp), 3) if imp else None)
            fig.add_trace(go.Scatter(x=ps, y=ys, mode="lines+markers", name=f"budget {label}",
                                     legendgroup=label, showlegend=col == 1, line=dict(color=colors[i])),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=ps, y=yi, mode="markers", name=f"after cm.improve, budget {label}",
                                     legendgroup=label, showlegend=col == 1,
                                     marker=dict(color=colors[i], symbol="circle-open", size=9)),
                          row=1, col=col)
        fig.update_xaxes(title_text="p (devices)", type="log", tickvals=ps, ticktext=[str(p) for p in ps], row=1, col=col)
    fig.update_yaxes(title_text="largest certified gap, % (makespan / best lower bound − 1)", row=1, col=1)
    fig.update_layout(width=1100, height=480, template="plotly_white",
                      title="Optimality gap against p: the budgeted heuristic over the best proven lower bound "
                            "(0 where the optimum is proven and met)",
                      legend=dict(font=dict(size=10)))
    return fig
