"""Benchmark: every heuristic against ``cm.improve`` and the best proven lower bound, at real sizes.

    .venv/bin/python benchmarks/bench_optimality_gap.py [--quick] [--jobs 2] [--cache FILE]

Grid (:func:`ctrlmem.solver.gap.instances`): full — p ∈ {2, 3, 4, 6, 8, 16}, m ∈ {p, 2p, 4p}, budgets
smallest feasible / 0.5 / 0.75 / 1.0 / 1.5 of 1F1B's memory, F:B:W:comm mixes 1:1:1, 3:4:2,
2:1:1, 1:2:2 and the profiled H200 mix (7.98:9.32:8.37 ms, hop 1.68 ms); ``--quick`` — p ∈ {2, 3},
m = p, two mixes, three budgets. Per instance and placement (V-shape, one stage per device): each
heuristic's simulated makespan over the best lower bound (``=`` where the solver proved the
optimum, ``≤`` otherwise: the certified gap), ``cm.improve`` from the budgeted heuristic after 10
and 60 solver-seconds (deterministic CP-SAT time on one worker; 2 and 5 with ``--quick``), and
the bound. Then the headline: at p ≤ 4 how many budgeted-heuristic rows are within 2 % of the
proven optimum, at p = 8 and 16 the certified gaps, what ``cm.improve`` gains; and the wall time.

``--jobs``: solver processes (each deterministic, so the numbers do not depend on it);
``--cache``: a JSON-lines file of finished solver runs (resumes an interrupted run).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from ctrlmem.solver.gap import HEURISTICS, default_jobs, measure_all, summary


def _cell(mk, ref, fits=True) -> str:
    if mk is None:
        return "-"
    if not fits:
        return "over"
    return f"{mk / ref:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=None, help="solver processes (default: 2 where 2 CPUs)")
    ap.add_argument("--cache", default=None, help="JSON-lines file of finished solver runs (resumable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each solver run")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("ctrlmem.solver.gap").setLevel(logging.INFO if args.verbose else logging.WARNING)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    t0 = time.perf_counter()
    size = "quick" if args.quick else "full"
    rows = measure_all(size, jobs=args.jobs or default_jobs(), cache=args.cache)
    for placement, names in HEURISTICS.items():
        cols = [n for n, _ in names]
        marks = list(rows[0]["improve"] or {"10": 0, "60": 0}) if rows else []
        print(f"\n{placement} placement: makespan / best lower bound ('=': proven optimum)")
        print(f"{'instance':<40} {'bound':>10} " + " ".join(f"{c:>8}" for c in cols)
              + " " + " ".join(f"{'imp ' + c + 's':>9}" for c in marks))
        for r in rows:
            if r["placement"] != placement:
                continue
            lb = r["lower_bound"]
            label = f"p={r['p']} m={r['m']} {r['mix']} @{r['budget']}"
            cells = [_cell(r["heuristics"][c]["makespan"], lb, r["heuristics"][c]["fits"]) for c in cols]
            imp = [f"{r['improve'][c] / lb:.3f}" if r["improve"] else "-" for c in marks]
            tag = "=" if r["status"] == "optimal" else "≤"
            print(f"{label:<40} {tag}{lb:>9.6g} " + " ".join(f"{c:>8}" for c in cells) + " " + " ".join(f"{c:>9}" for c in imp))
    s = summary(rows)
    print()
    for d in s.values():
        main_name = d["heuristic"]
        worst = d["small_worst"]
        print(f"{main_name}: at p <= 4 within 2 % of the proven optimum on {d['small_within_2pct']} of "
              f"{d['small_proven']} proven instances ({d['small_rows']} in all)"
              + (f"; worst {worst['ratio']:.3f} at {worst['where']}" if worst else ""))
        for key in sorted(k for k in d if k.startswith("p") and k[1:].isdigit()):
            g = d[key]
            print(f"  p={key[1:]}: certified gap (makespan / best bound − 1) median {100 * g['median_gap']:.1f} %, "
                  f"max {100 * g['max_gap']:.1f} % over {g['instances']} instances")
        for c, g in d["improve"].items():
            extra = (f"; at p > 4 median {100 * g['large_median_gain']:.1f} %, max {100 * g['large_max_gain']:.1f} %"
                     if "large_median_gain" in g else "")
            print(f"  cm.improve {c} s: shorter by median {100 * g['median_gain']:.2f} %, max {100 * g['max_gain']:.1f} % "
                  f"over {g['runs']} runs{extra}; never longer: {g['never_worse']}")
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
