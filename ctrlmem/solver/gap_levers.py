"""The optimality gap with memory levers (the ``optimality-gap-levers`` artifact,
docs/theory.md §12-13): on small pipelines, what the lever search, the fixed patterns with every
forward levered, ``cm.improve`` and ``cm.optimal`` reach when forwards may be recomputed or
offloaded, against the best lower bound that holds for every schedule using that lever.

For each instance (``p``, ``m``, cost mix, budget), placement (V-shape: ``v-shape``; one stage per
device: ``zb``) and lever (:data:`LEVERS`: full recomputation, or offload with a copy of one ``a``
taking ½ F or 2 F each way), :func:`measure` simulates

* the **lever search**: the budgeted search choosing what to lever
  (:func:`ctrlmem.solver.optimal.lever_search`: ``cm.build(..., recompute="auto")`` restricted to
  full recomputation, or ``cm.build(..., offload="auto")``), the makespan asked for;
* **reordering only**: the same search without levers (nothing where the budget is below one
  microbatch per device);
* **every forward levered**: 1F1B-R, or 1F1B with every forward offloaded (one stage per device),
  V-Min with every forward recomputed or offloaded (V-shape);

and runs :func:`ctrlmem.improve` from the lever search's schedule and :func:`ctrlmem.optimal` with
the lever allowed, both deterministic (CP-SAT's deterministic time, one worker, fixed seeds), and
takes the best lower bound: the closed forms of :func:`ctrlmem.search.bounds.makespan_bounds`
with the lever (``recompute="full"`` or ``offload=1.0``) and ``cm.optimal``'s own (``cm.improve``'s
holds only for the levers its input uses, so it is not taken). Every value holds
for the row's lever space: schedules whose forwards may be recomputed in full mode, or offloaded
(whole activations, as ``offload="auto"`` copies them).
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Op, Placement, Schedule
from ctrlmem.model.simulate import simulate
from ctrlmem.schedules.registry import build
from ctrlmem.search.bounds import makespan_bounds
from ctrlmem.solver.gap import cache_run, cut_mark
from ctrlmem.solver.improve import improve
from ctrlmem.solver.optimal import lever_search, optimal

__all__ = ["Instance", "LEVERS", "MIXES", "SEARCH", "instances", "measure", "measure_all", "summary",
           "VERSIONS"]

log = logging.getLogger(__name__)

MIXES: dict[str, Costs] = {"1:1:1": Costs(1, 1, 1), "3:4:2:0.1": Costs(3, 4, 2, 0.1)}
"""F:B:W:comm mixes."""

LEVERS: dict[str, dict] = {
    "recompute full": {"recompute": "full", "offload": "none", "copy": 0.0},
    "offload, copy ½ F": {"recompute": "none", "offload": "auto", "copy": 0.5},
    "offload, copy 2 F": {"recompute": "none", "offload": "auto", "copy": 2.0},
}
"""The levers of the grid: ``copy`` is the time of one ``a`` copied, each way, in units of the mix's F."""

SEARCH = {"v-shape": "v-shape", "sequential": "zb"}
"""The budgeted search of each placement."""

FIXED = {"v-shape": "v-min", "sequential": "1f1b"}
"""The fixed pattern of each placement levered on every forward (1F1B recomputed is 1F1B-R)."""

@dataclass(frozen=True)
class Instance:
    """One row of the grid."""

    p: int
    m: int
    mix: str
    budget: float
    lever: str

    @property
    def costs(self) -> Costs:
        c = MIXES[self.mix]
        return replace(c, offload=LEVERS[self.lever]["copy"] * c.f)

    @property
    def label(self) -> str:
        return f"m={self.m} {self.mix} budget {self.budget:.4g}{' (1/p)' if abs(self.budget - 1 / self.p) < 1e-9 else ''}"


def budgets(p: int) -> tuple[float, ...]:
    """The budgets of a ``p``: one microbatch per device (1/p) and 0.5; at p = 2, where they are one,
    0.375 (below one microbatch per device: only levers reach it) and 0.5."""
    return (0.375, 0.5) if p == 2 else (1 / p, 0.5)


def instances(size: str = "full") -> list[Instance]:
    """``"quick"``: p = 2, m = 2, 1:1:1, budget 0.5, every lever; ``"full"``: p ∈ {2, 3, 4}, m ∈ {p,
    2p}, both mixes, :func:`budgets`, every lever."""
    if size not in ("quick", "full"):
        raise ValueError(f"size must be 'quick' or 'full', got {size!r}")
    if size == "quick":
        return [Instance(2, 2, "1:1:1", 0.5, lever) for lever in LEVERS]
    return [Instance(p, m, mix, b, lever) for p in (2, 3, 4) for m in (p, 2 * p) for mix in MIXES
            for b in budgets(p) for lever in LEVERS]


def _round(x: float | None) -> float | None:  # stable JSON: 6 decimals, no -0.0
    return None if x is None else round(float(x), 6) + 0.0


def _levers_used(s: Schedule) -> tuple[int, int]:
    return (sum(1 for row in s.device_passes for ps in row if ps.op is Op.R),
            sum(1 for row in s.copies for c in row if c.kind == "O"))


def _point(s: Schedule | None, costs: Costs, cap: float, why: str = "") -> dict:
    """Makespan, peak, fits and the levers used of a schedule (``None`` values and ``why`` when none)."""
    if s is None:
        return {"makespan": None, "peak": None, "fits": False, "why": why}
    r = simulate(s, costs)
    rec, off = _levers_used(s)
    return {"makespan": _round(r.makespan), "peak": _round(r.max_peak_memory), "fits": r.max_peak_memory <= cap + 1e-9,
            "recomputed": rec, "offloaded": off}


def _try(make):
    try:
        return make(), ""
    except ValueError as exc:
        return None, str(exc).split(";")[0][:120]


def heuristics(inst: Instance, placement: str) -> tuple[dict, str | None]:
    """The three heuristics of a row, simulated (``{name: point}``), and the lever search's
    schedule text (what :func:`ctrlmem.improve` starts from)."""
    p, m, costs, limit = inst.p, inst.m, inst.costs, inst.budget
    lev = LEVERS[inst.lever]
    name = SEARCH[placement]
    cap = limit * p

    def searched() -> Schedule:
        return lever_search(name, p, m, costs, limit, lev["recompute"], lev["offload"])

    search, why = _try(searched)
    plain, why_plain = _try(lambda: build(name, p, m, costs=costs, memory_limit=limit, objective="makespan"))
    fixed = FIXED[placement]
    levered, why_fixed = _try(lambda: build(fixed, p, m, costs=costs, recompute=lev["recompute"],
                                            offload=1.0 if lev["offload"] != "none" else "none"))
    out = {"lever search": _point(search, costs, cap, why), "reordering only": _point(plain, costs, cap, why_plain),
           "every forward levered": _point(levered, costs, cap, why_fixed)}
    seed = search.to_text() if search is not None and out["lever search"]["fits"] else None
    return out, seed


def solve(inst: Instance, placement: str, run: str, seed_text: str | None, seconds: float) -> dict:
    """One solver run of a row (deterministic, one worker, ``seconds`` solver-seconds): ``run``
    ``"improve"`` (:func:`ctrlmem.improve` from ``seed_text``) or ``"optimal"``
    (:func:`ctrlmem.optimal` with the lever allowed)."""
    p, m, costs, limit = inst.p, inst.m, inst.costs, inst.budget
    lev = LEVERS[inst.lever]
    if run == "improve":
        if seed_text is None:
            return {"why": "no lever-search schedule to start from"}
        try:
            res = improve(Schedule.from_text(seed_text), costs, limit, time_limit=seconds, workers=1, deterministic=True)
        except ValueError as exc:
            return {"why": "refused: " + str(exc).split(";")[0][:160]}
        return {"makespan": _round(res.makespan), "status": res.status, "lower_bound": _round(res.lower_bound),
                **cut_mark(res.cut_short)}
    try:
        res = optimal(p, m, costs, limit, placement, time_limit=seconds, workers=1, recompute=lev["recompute"],
                      offload=lev["offload"], deterministic=True)
    except ValueError as exc:
        return {"why": str(exc).split(";")[0][:160]}
    rec, off = _levers_used(res.schedule)
    return {"makespan": _round(res.makespan), "status": res.status, "lower_bound": _round(res.lower_bound),
            "recomputed": rec, "offloaded": off, **cut_mark(res.cut_short)}


def measure(inst: Instance, placement: str, solved: dict, built: tuple[dict, str | None]) -> dict:
    """One row (JSON-ready): the heuristics, the solver runs, the closed-form bounds by name and
    the best lower bound (``None`` where nothing fits and no bound is finite)."""
    p, m, costs = inst.p, inst.m, inst.costs
    lev = LEVERS[inst.lever]
    heur, _ = built
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    bounds = makespan_bounds(P, m, costs, inst.budget * p, recompute=lev["recompute"],
                             offload=1.0 if lev["offload"] != "none" else None)
    bounds = {k: _round(v) for k, v in bounds.items()}
    lower = max(bounds.values())
    # cm.optimal's bound holds for every schedule that may use the lever; cm.improve's only for
    # those using the levers its input uses (none, when the lever search levers nothing)
    got = solved.get("optimal", {})
    if got.get("lower_bound") is not None and got.get("status") in ("optimal", "feasible"):
        lower = max(lower, got["lower_bound"])
    made = [h["makespan"] for h in heur.values() if h["fits"]]
    made += [solved[r]["makespan"] for r in ("improve", "optimal") if solved.get(r, {}).get("makespan") is not None]
    best = min(made) if made else None
    proven = solved.get("optimal", {}).get("status") == "optimal"
    return {"p": p, "m": m, "mix": inst.mix, "budget": inst.budget, "lever": inst.lever, "placement": placement,
            "copy_cost": _round(costs.offload), "heuristics": heur, **solved, "bounds": bounds,
            "lower_bound": _round(lower), "best": best, "proven": proven}


def _solve_task(args):
    return solve(*args)


VERSIONS = {"improve": "improve-offload-2", "optimal": "optimal-offload-2"}  # improve 2: the levels bound
"""Part of the cache keys of :func:`measure_all`, per solver: change one when that solver changes
(only its runs are redone)."""


def measure_all(size: str = "full", jobs: int = 1, seconds: float | None = None,
                cache: str | Path | None = None) -> list[dict]:
    """:func:`measure` for every instance and placement, in grid order. The solver runs go to
    ``jobs`` processes (each is deterministic: their number changes nothing). ``cache``: a
    JSON-lines file of finished solver runs keyed by the row, the solver, its starting schedule,
    the solver seconds and its :data:`VERSIONS` entry, read first and appended to."""
    seconds = seconds or (2.0 if size == "quick" else 10.0)
    rows = [(inst, pl) for inst in instances(size) for pl in SEARCH]
    built = {t: heuristics(*t) for t in rows}
    tasks = [(inst, pl, run) for inst, pl in rows for run in VERSIONS]

    def key(inst, pl, run):
        digest = hashlib.sha1((built[(inst, pl)][1] or "").encode()).hexdigest() if run == "improve" else ""
        return json.dumps([inst.p, inst.m, inst.mix, inst.budget, inst.lever, pl, run, seconds, digest, VERSIONS[run]])

    done: dict[str, dict] = {}
    if cache is not None and Path(cache).exists():
        for line in Path(cache).read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by an interrupted run: solved again
                continue
            done[rec.pop("_key")] = rec
    todo = [t for t in tasks if key(*t) not in done]
    log.info("optimality gap with levers: %d rows, %d solver runs to do, %d processes", len(rows), len(todo), jobs)

    def keep(t, rec):
        done[key(*t)] = rec
        cache_run(cache, key(*t), rec, f"optimality gap with levers: p={t[0].p} {t[0].label} {t[0].lever} {t[1]} {t[2]}")
        log.info("optimality gap with levers: p=%d %s %s %s %s: %s (%d to go)", t[0].p, t[0].label, t[0].lever, t[1],
                 t[2], rec.get("status", rec.get("why", "-")), sum(1 for x in todo if key(*x) not in done))

    args = [(inst, pl, run, built[(inst, pl)][1], seconds) for inst, pl, run in todo]
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for t, rec in zip(todo, pool.map(_solve_task, args)):
                keep(t, rec)
    else:
        for t, a in zip(todo, args):
            keep(t, _solve_task(a))
    return [measure(inst, pl, {run: done[key(inst, pl, run)] for run in VERSIONS}, built[(inst, pl)])
            for inst, pl in rows]


def summary(rows: list[dict]) -> dict:
    """Per lever and placement: rows, where the lever search fits, how many of those are within
    2 % of the best lower bound (of the proven optimum where proven), the largest certified gap,
    and what ``cm.improve`` and ``cm.optimal`` shorten the lever search by."""
    out: dict = {}
    for lever in LEVERS:
        for pl in SEARCH:
            rs = [r for r in rows if r["lever"] == lever and r["placement"] == pl]
            fit = [r for r in rs if r["heuristics"]["lever search"]["fits"] and r["lower_bound"]]
            gaps = sorted(r["heuristics"]["lever search"]["makespan"] / r["lower_bound"] - 1 for r in fit)
            gains = []
            for r in fit:
                h = r["heuristics"]["lever search"]["makespan"]
                for run in ("improve", "optimal"):
                    mk = r.get(run, {}).get("makespan")
                    if mk is not None:
                        gains.append((run, 1 - mk / h))
            d = {"rows": len(rs), "search_fits": len(fit), "proven": sum(r["proven"] for r in rs),
                 "search_within_2pct": sum(1 for g in gaps if g <= 0.02 + 1e-12),
                 "search_max_gap": _round(gaps[-1]) if gaps else None,
                 "search_median_gap": _round(gaps[len(gaps) // 2]) if gaps else None}
            for run in ("improve", "optimal"):
                g = sorted(x for r_, x in gains if r_ == run)
                d[f"{run}_runs"] = len(g)
                d[f"{run}_shorter"] = sum(1 for x in g if x > 1e-9)
                d[f"{run}_max_gain"] = _round(g[-1]) if g else None
            d["improve_refused"] = sum(1 for r in rs if str(r.get("improve", {}).get("why", "")).startswith("refused"))
            out[f"{lever} / {pl}"] = d
    return out
