"""Benchmark: every heuristic's makespan over the exact optimum (CP-SAT) on small pipelines.

    .venv/bin/python benchmarks/bench_optimality_gap.py [--quick] [--time-limit 60] [--workers 2]

Grid (:func:`ctrlmem.optimal.gap_grid`): p ∈ {2, 3, 4}, m ∈ {p, 2p}, F:B:W:comm ∈ {1:1:1:0,
3:4:2:0, 2:1:1:0, 1:2:1:0.1}, budgets 0.5 / 0.75 / 1.0 of 1F1B's memory. For each instance and
placement (V-shape, sequential) the solver runs once; each heuristic's simulated makespan is
divided by the proven optimum, or by the proven lower bound when the solver ran out of time
(marked ``≤``: then the true gap is at most that). Prints one line per instance, the worst case
per heuristic, the solver's proof count and the wall-clock time. ``--quick``: p ∈ {2, 3},
m = p, two mixes.
"""

from __future__ import annotations

import argparse
import os
import time

from ctrlmem.optimal import GAP_HEURISTICS, gap_grid, optimality_gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per instance and placement")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    names = [n for ns in GAP_HEURISTICS.values() for n, _ in ns]
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(f"{'instance':<34} {'V opt':>8} {'seq opt':>8}  " + " ".join(f"{n:>8}" for n in names))
    worst: dict[str, tuple[float, str]] = {}
    proved = total = 0
    t0 = time.perf_counter()
    for p, m, c, limit in gap_grid(args.quick):
        g = optimality_gap(p, m, c, limit, args.time_limit, args.workers)
        label = f"p={p} m={m} {c.f:g}:{c.b:g}:{c.w:g}:{c.comm:g} @{limit:g}"
        opts = []
        for pl in ("v-shape", "sequential"):
            o = g["optimum"].get(pl)
            total += o is not None
            proved += o is not None and o.status == "optimal"
            opts.append("-" if o is None else f"{o.makespan:g}{'' if o.status == 'optimal' else '?'}")
        cells = {}
        for row in g["rows"]:
            r = row["ratio"]
            if r is None:
                cells[row["schedule"]] = "over mem"
                continue
            cells[row["schedule"]] = f"{'≤' if row['over'] == 'bound' else ''}{r:.3f}"
            if r > worst.get(row["schedule"], (0.0, ""))[0]:
                worst[row["schedule"]] = (r, label + ("" if row["over"] == "optimum" else " (over the bound)"))
        print(f"{label:<34} {opts[0]:>8} {opts[1]:>8}  " + " ".join(f"{cells.get(n, '-'):>8}" for n in names))
    print(f"\nsolver proved {proved} of {total} optima ('?': not proved in {args.time_limit:g} s) in "
          f"{time.perf_counter() - t0:.0f} s")
    print("worst makespan / optimum per heuristic (simulated):")
    for n in names:
        if n in worst:
            print(f"  {n:<8} {worst[n][0]:.4f}  {worst[n][1]}")


if __name__ == "__main__":
    main()
