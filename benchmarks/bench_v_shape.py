"""Benchmark: build + simulate the V schedules and the v-shape search (issue 3).

    .venv/bin/python benchmarks/bench_v_shape.py            # the issues' sizes
    .venv/bin/python benchmarks/bench_v_shape.py --quick    # small sizes, a few seconds

Prints wall-clock seconds (best of ``--repeat`` runs for the fixed schedules; the search runs
once cold, its result cache cleared first, then once warm) and the machine's load average,
since timings on a shared machine move with it. Targets from the issue: under 1 s per fixed
schedule at p=32, m=512; the v-shape search (cold, at budgets 0.5, 1.0, 2.0 with unequal costs)
under 10 s at p=16, m=128 and under 60 s at p=32, m=256.
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

    print("\nv-shape search, cold (caches cleared before each call), costs F,B,W,comm = 3,4,2,0.1")
    print(f"{'p':>3} {'m':>4} {'limit':>6} {'wall s':>7} {'cpu s':>6} {'peak a':>7} {'bubble rate':>11}  chosen")
    sizes = [(p_search, m_search)] if args.quick else [(16, 128), (32, 256)]
    for p, m in sizes:
        for limit in (0.5, 1.0, 2.0):
            adaptive.clear_caches()
            w0, c0 = time.perf_counter(), time.process_time()
            sched = cm.build("v-shape", p, m, costs=costs, memory_limit=limit)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            r = cm.simulate(sched, costs)
            print(f"{p:>3} {m:>4} {limit:>6g} {wall:>7.2f} {cpu:>6.2f} {max(r.peak_memory):>7g} {r.bubble_rate:>11.4f}  "
                  f"{dict(sched.params)['block']}")
    print("targets: p=16, m=128 under 10 s; p=32, m=256 under 60 s (wall on an idle machine; cpu s is the "
          "process's own time, what the wall time would be without other load)")


if __name__ == "__main__":
    main()
