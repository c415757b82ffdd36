"""Build + simulate time of the core schedules at paper scale (issue 2 benchmark).

Usage: .venv/bin/python benchmarks/bench_core.py [--repeat N]

Prints, for 1f1b and zb-v at p=32, m=512 (and the other core schedules for reference), the
best-of-N wall time of build and of simulate, and passes simulated per second. Target on the
2-core dev machine: build + simulate under 0.5 s for 1f1b and zb-v. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import time

import ctrlmem as cm


def best_of(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-p", type=int, default=32)
    ap.add_argument("-m", type=int, default=512)
    args = ap.parse_args()
    costs = cm.Costs(1, 1, 1, 0.05)
    print(f"p={args.p} m={args.m} best of {args.repeat}")
    print(f"{'schedule':18} {'passes':>7} {'build s':>8} {'simulate s':>10} {'total s':>8} {'passes/s':>10}")
    for name in ["1f1b", "zb-v", "zb-h1", "interleaved-1f1b", "gpipe", "zb-h2"]:
        tb, s = best_of(lambda: cm.build(name, args.p, args.m), args.repeat)
        ts, r = best_of(lambda: cm.simulate(s, costs), args.repeat)
        target = "  (target < 0.5 s)" if name in ("1f1b", "zb-v") else ""
        print(f"{name:18} {s.num_passes:7d} {tb:8.3f} {ts:10.3f} {tb + ts:8.3f} {s.num_passes / ts:10.0f}{target}")


if __name__ == "__main__":
    main()
