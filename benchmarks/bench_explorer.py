"""One explorer update at p=16, m=64: a widget change → build + simulate every selected schedule
and 1F1B → stats table → both figures encoded into the Output widgets (what the browser gets).

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
    totals, computes, renders = [], [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        explorer.comm.value = 0.01 * ((i + 1) % 2)  # a user edit: observer → compute → render
        totals.append(time.perf_counter() - t0)
        computes.append(explorer.view.seconds)
        renders.append(explorer.last_render_seconds)
        assert not explorer.view.messages, explorer.view.messages
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms"  # noqa: E731
    print(f"explorer update p={args.p} m={args.m} schedules={','.join(names)} ({passes} passes drawn): "
          f"median {ms(totals)} (best {min(totals) * 1e3:.0f} ms) over {args.repeats} updates; "
          f"compute {ms(computes)}, render {ms(renders)}; target < 200 ms")


if __name__ == "__main__":
    main()
