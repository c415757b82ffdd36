"""Benchmark: build + simulate the V schedules and the v-shape search (issue 3).

    .venv/bin/python benchmarks/bench_v_shape.py            # the issue's sizes
    .venv/bin/python benchmarks/bench_v_shape.py --quick    # small sizes, a few seconds

Prints wall-clock seconds (best of ``--repeat`` runs for the fixed schedules; the search runs
once cold, its result cache cleared first, then once warm) and the machine's load average,
since timings on a shared machine move with it. Targets from the issue: under 1 s per fixed
schedule at p=32, m=512; under 10 s for the search at p=16, m=64 with unequal costs.
"""

from __future__ import annotations

import argparse
import os
import time

import ctrlmem as cm
from ctrlmem.schedules import adaptive


def _time(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p=8, m=64 and a p=8, m=32 search")
    ap.add_argument("--repeat", type=int, default=3, help="runs per fixed schedule (best is shown)")
    args = ap.parse_args()
    p_fixed, m_fixed = (8, 64) if args.quick else (32, 512)
    p_search, m_search = (8, 32) if args.quick else (16, 64)
    unit = cm.Costs(1, 1, 1, 0)
    costs = cm.Costs(3, 4, 2, 0.1)

    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(f"fixed schedules, p={p_fixed}, m={m_fixed}, costs F=B=W=1 comm=0")
    print(f"{'schedule':<10} {'build s':>8} {'simulate s':>10} {'passes':>7} {'peak a':>7} {'bubble tau':>10} {'bubble rate':>11}")
    for name in ("v-min", "v-half", "v-zb"):
        t_build, sched = _time(lambda: cm.build(name, p_fixed, m_fixed), args.repeat)
        t_sim, res = _time(lambda: cm.simulate(sched, unit), args.repeat)
        print(
            f"{name:<10} {t_build:>8.3f} {t_sim:>10.3f} {sched.num_passes:>7} {max(res.peak_memory):>7g} "
            f"{2 * max(res.device_bubbles):>10g} {res.bubble_rate:>11.4f}"
        )

    print(f"\nv-shape search, p={p_search}, m={m_search}, costs F,B,W,comm = 3,4,2,0.1")
    adaptive._evaluate.cache_clear()
    t0 = time.perf_counter()
    cands = adaptive.v_shape_candidates(p_search, m_search, costs)
    t_cold = time.perf_counter() - t0
    print(f"cold search: {t_cold:.2f} s over {len(cands)} candidates")
    print(f"{'limit':>6} {'build s':>8} {'peak a':>7} {'makespan':>9} {'bubble rate':>11}  block")
    for limit in (0.375, 0.4375, 0.5, 0.5625, 0.75, 1.0):
        try:
            t_build, sched = _time(lambda: cm.build("v-shape", p_search, m_search, costs=costs, memory_limit=limit), 1)
        except ValueError as exc:
            print(f"{limit:>6g}  {exc}")
            continue
        r = cm.simulate(sched, costs)
        print(
            f"{limit:>6g} {t_build:>8.3f} {max(r.peak_memory):>7g} {r.makespan:>9g} {r.bubble_rate:>11.4f}  "
            f"{dict(sched.params)['block']}"
        )


if __name__ == "__main__":
    main()
