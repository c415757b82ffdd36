"""Benchmark: the lever search against the exact optimum with recomputation allowed (issue 26).

    .venv/bin/python benchmarks/bench_levers_gap.py [--quick] [--time-limit 20] [--jobs 2]

For small pipelines (p = 2, 3, 4, m = 2p; ``--quick``: p = 2) at budgets 0.75/p, 1/p and 1.5/p of
1F1B's memory (one microbatch per device is 1/p: reordering alone reaches no lower), under
F:B:W:comm mixes 1:1:1:0 and 3:4:2:0.1, both placements: the lever search
(``cm.build("v-shape" | "zb", ..., recompute="auto")``), 1F1B-R where it fits, the reordering-only
search where it fits, and ``cm.optimal(..., recompute=MODE)`` for ``full`` and ``selective``
(CP-SAT; a schedule recomputes in one mode, so the optimum over schedules that may recompute is
the better of the two, and the best lower bound the smaller of their bounds). Prints each
heuristic's makespan over that optimum (``=`` where both modes were proven, ``≤`` over the bound
otherwise), and the count of lever-search rows within 2 % of it. All simulated.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from concurrent.futures import ProcessPoolExecutor

import ctrlmem as cm
from ctrlmem.solver.optimal import optimal

MIXES = {"1:1:1": cm.Costs(1, 1, 1, 0), "3:4:2:0.1": cm.Costs(3, 4, 2, 0.1)}
SEARCH = {"v-shape": "v-shape", "sequential": "zb"}


def _solve(args):
    p, m, mix, limit, placement, mode, seconds = args
    t = time.perf_counter()
    try:
        r = optimal(p, m, MIXES[mix], limit, placement, time_limit=seconds, workers=1, recompute=mode)
        return args, (r.makespan, r.lower_bound, r.status, time.perf_counter() - t)
    except ValueError as exc:
        return args, (None, None, f"no schedule: {str(exc)[:60]}", time.perf_counter() - t)


def _heuristic(name, p, m, costs, limit, **kw):
    try:
        s = cm.build(name, p, m, costs=costs, **kw)
    except ValueError:
        return None
    r = cm.simulate(s, costs)
    return r.makespan if r.max_peak_memory <= limit * p + 1e-9 else None


def _cell(x: float | None, best: float) -> str:
    return "-" if x is None else f"{x / best:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver seconds per run (default 20)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    sizes = [2] if args.quick else [2, 3, 4]
    cases = [(p, 2 * p, mix, round(f / p, 6), pl) for p, mix, f, pl in
             itertools.product(sizes, MIXES, (0.75, 1.0, 1.5), SEARCH)]
    tasks = [(*c, mode, args.time_limit) for c in cases for mode in ("full", "selective")]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        solved = dict(pool.map(_solve, tasks))
    print("makespan over the solver's best (its proven optimum where both modes were proven, '='); the bound's")
    print("column is the best lower bound over the solver's best (1 where proven)")
    print(f"{'instance':<34} {'best':>10} {'bound':>6} {'levers':>7} {'1f1b-r':>7} {'reorder':>7}  status (full / selective)")
    within = counted = 0
    for p, m, mix, limit, pl in cases:
        costs = MIXES[mix]
        runs = [solved[(p, m, mix, limit, pl, mode, args.time_limit)] for mode in ("full", "selective")]
        made = [r[0] for r in runs if r[0] is not None]
        if not made:
            continue
        best = min(made)
        bound = min(r[1] if r[1] is not None else 0.0 for r in runs)
        proven = all(r[2] == "optimal" for r in runs)
        name = SEARCH[pl]
        lev = _heuristic(name, p, m, costs, limit, memory_limit=limit, recompute="auto")
        rr = _heuristic("1f1b-r", p, m, costs, limit) if pl == "sequential" else None
        plain = _heuristic(name, p, m, costs, limit, memory_limit=limit)

        if lev is not None:
            counted += 1
            within += lev <= 1.02 * best
        label = f"{pl} p={p} m={m} {mix} @{limit:g}"
        print(f"{label:<34} {('=' if proven else '') + f'{best:g}':>10} {bound / best:>6.3f} {_cell(lev, best):>7} "
              f"{_cell(rr, best):>7} {_cell(plain, best):>7}  {runs[0][2][:40]} {runs[0][3]:.0f}s / {runs[1][2][:40]} "
              f"{runs[1][3]:.0f}s")
    print(f"\nlever search within 2 % of the solver's best: {within} of {counted} instances where it fits")
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
