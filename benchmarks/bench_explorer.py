"""One explorer update at p=16, m=64: a widget change → simulate every selected schedule and
1F1B → stats table → both figures encoded into the Output widgets (what the browser gets).
Schedules are built once per (name, p, m, limit) and cached; the second line shows an update
that also has to run the generators (a new p or m).

    .venv/bin/python benchmarks/bench_explorer.py [--schedules 1f1b,v-half] [--repeats 7]

Target (issue 5): under 200 ms per update. Prints the median and the best of the repeats; on the
shared 2-core machine the median is the honest number.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ctrlmem import SCHEDULES, ui


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default=",".join(ui.default_schedules()))
    parser.add_argument("-p", type=int, default=16)
    parser.add_argument("-m", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    names = [n for n in args.schedules.split(",") if n]
    missing = [n for n in names if n not in SCHEDULES]
    if missing:
        raise SystemExit(f"not registered: {missing}; available: {', '.join(SCHEDULES)}")
    explorer = ui.explorer(schedules=names, num_devices=args.p, num_microbatches=args.m)
    passes = sum(r.schedule.num_passes for r in explorer.view.results.values())
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms"  # noqa: E731

    # 1. the update the issue asks about: a cost edit → simulate every schedule + 1F1B → table →
    #    both figures into the Output widgets (schedules already built for this p, m)
    totals, computes, renders = [], [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        explorer.comm.value = 0.01 * ((i + 1) % 2)  # observer → compute → render
        totals.append(time.perf_counter() - t0)
        computes.append(explorer.view.seconds)
        renders.append(explorer.last_render_seconds)
        assert not explorer.view.messages, explorer.view.messages
    print(f"explorer update p={args.p} m={args.m} schedules={','.join(names)} ({passes} passes drawn): "
          f"median {ms(totals)} (best {min(totals) * 1e3:.0f} ms) over {args.repeats} updates; "
          f"simulate+table {ms(computes)}, figures {ms(renders)}; target < 200 ms")

    # 2. a new p or m also runs the generators (not cached yet): what that costs on top
    cold = []
    for i in range(min(args.repeats, 3)):
        t0 = time.perf_counter()
        explorer.microbatches.value = args.m + 1 + i  # never built before
        cold.append(time.perf_counter() - t0)
    builds = {}
    for name in names:
        t0 = time.perf_counter()
        ui.build(name, args.p, args.m)
        builds[name] = f"{(time.perf_counter() - t0) * 1e3:.0f} ms"
    print(f"  with a new m (generators run, uncached): median {ms(cold)}; generator time at p={args.p} "
          f"m={args.m}: " + ", ".join(f"{k} {v}" for k, v in builds.items()))

if __name__ == "__main__":
    main()
