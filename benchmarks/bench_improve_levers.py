"""Benchmark: what cm.improve's reordering buys a schedule with recompute passes (issue 26).

    .venv/bin/python benchmarks/bench_improve_levers.py [--quick] [--seconds 10] [--jobs 2]

For p = 4, 8, 16 (``--quick``: p = 4), m = 2p (and 4p with ``--long``), F:B:W:comm mixes 1:1:1:0 and 3:4:2:0.1,
budgets 0.125, 0.25 and 0.375 of 1F1B's memory, both budgeted searches (``v-shape``, ``zb``) and
both ways of asking for recompute: ``recompute="auto"`` (the lever search chooses what to
recompute) and ``recompute="full"`` (the order built for the budget, every forward then
recomputed). Each schedule is improved with ``cm.improve`` for ``--seconds`` deterministic
solver-seconds (one worker, fixed seed: the same on any machine) within the same budget, which
keeps its recomputed forwards and reorders every pass. Prints each makespan before and after, the
gain, the lower bound of docs/theory.md §6/§13 (every schedule that may recompute in that mode) and
the certified gap after; the last lines count the instances improve shortened and the median and
largest gains per way of asking. All simulated.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

MIXES = {"1:1:1": (1, 1, 1, 0), "3:4:2:0.1": (3, 4, 2, 0.1)}


def _run(args):
    import ctrlmem as cm

    name, p, m, mix, limit, mode, seconds = args
    costs = cm.Costs(*MIXES[mix])
    t = time.process_time()
    try:
        s = cm.build(name, p, m, costs=costs, memory_limit=limit, recompute=mode)
    except ValueError as exc:
        return args, None, str(exc)[:70]
    if not s.recomputes:
        return args, None, "fits without recompute"
    before = cm.simulate(s, costs).makespan
    res = cm.improve(s, costs, memory_limit=limit, time_limit=seconds, deterministic=True, workers=1)
    after = cm.simulate(cm.validate(res.schedule), costs)
    assert after.max_peak_memory <= limit * p + 1e-9
    return args, (before, after.makespan, res.lower_bound, time.process_time() - t), s.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--long", action="store_true", help="m = 4p too")
    ap.add_argument("--seconds", type=float, default=10.0, help="deterministic solver-seconds per improve (default 10)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    sizes = [4] if args.quick else [4, 8, 16]
    tasks = [(name, p, k * p, mix, limit, mode, args.seconds)
             for name, p, k, mix, limit, mode in itertools.product(
                 ("v-shape", "zb"), sizes, (2, 4) if args.long else (2,), MIXES, (0.125, 0.25, 0.375), ("auto", "full"))]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        done = list(pool.map(_run, tasks))
    print(f"{'instance':<40} {'built as':<10} {'before':>9} {'improved':>9} {'gain':>7} {'bound':>9} {'gap':>7} {'CPU s':>6}")
    gains: dict[str, list[float]] = {"auto": [], "full": []}
    for (name, p, m, mix, limit, mode, _), got, note in done:
        label = f"{name} p={p} m={m} {mix} @{limit:g} {mode}"
        if got is None:
            print(f"{label:<40} - ({note})")
            continue
        before, after, bound, cpu = got
        gain = 1 - after / before
        gains[mode].append(gain)
        print(f"{label:<40} {note:<10} {before:>9.6g} {after:>9.6g} {100 * gain:>6.1f}% {bound:>9.6g} "
              f"{100 * (after / bound - 1):>6.1f}% {cpu:>6.1f}")
    for mode, g in gains.items():
        if g:
            print(f"recompute={mode}: improve shortened {sum(x > 1e-9 for x in g)} of {len(g)}; gain median "
                  f"{100 * statistics.median(g):.1f} %, largest {100 * max(g):.1f} %")
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
