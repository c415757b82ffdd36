"""Explorer updates, Python side and end to end in a real browser.

Python side (default): a widget change → simulate every selected schedule and 1F1B → stats
table → both figures encoded into the Output widgets (what the browser gets), at p=8/m=32,
p=16/m=64 and p=32/m=256; with the figure JSON size of one update.

End to end (``--browser``): the explorer notebook in JupyterLab, driven by headless Chromium
(``benchmarks/lab_browser.py``): type a new value into a widget, and time until both new plots
are painted and until the page is responsive again (no long task for 1.5 s).

    .venv/bin/python benchmarks/bench_explorer.py [--schedules 1f1b,v-half] [--repeats 5]
    .venv/bin/python benchmarks/bench_explorer.py --browser

Targets (printed, not asserted): Python side < 200 ms per update at p=16, m=64; end to end
< 1 s at p=16, m=64 and < 3 s at p=32, m=256. Prints medians; on a shared 2-core machine the
median is the honest number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from ctrlmem import SCHEDULES, ui

SIZES = ((8, 32), (16, 64), (32, 256))
TARGET_E2E = {(16, 64): 1.0, (32, 256): 3.0}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _figure_bytes(explorer) -> int:
    total = 0
    for which in ("diagram", "memory"):
        fig = explorer.shown(which)
        total += len(json.dumps(fig)) if fig is not None else 0
    return total


def python_side(names, repeats: int) -> None:
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms"  # noqa: E731
    explorer = ui.explorer(schedules=names, num_devices=SIZES[0][0], num_microbatches=SIZES[0][1])
    for p, m in SIZES:
        t0 = time.perf_counter()
        explorer.devices.value = p
        explorer.microbatches.value = m
        cold = time.perf_counter() - t0
        passes = sum(r.schedule.num_passes for r in explorer.view.results.values())
        totals, computes, renders = [], [], []
        for i in range(repeats):  # a cost edit: simulate + table + figures (schedules cached)
            t0 = time.perf_counter()
            explorer.comm.value = 0.01 * ((i + 1) % 2)
            totals.append(time.perf_counter() - t0)
            computes.append(explorer.view.seconds)
            renders.append(explorer.last_render_seconds)
            assert not explorer.view.messages, explorer.view.messages
        target = "; target < 200 ms" if (p, m) == (16, 64) else ""
        print(f"python  p={p:<3d} m={m:<4d} {passes:6d} passes: cost edit median {ms(totals)} "
              f"(simulate+table {ms(computes)}, figures {ms(renders)}), new p/m with generators "
              f"{cold * 1e3:.0f} ms; figure JSON {_figure_bytes(explorer) / 1e6:.2f} MB{target}")
    explorer.close() if hasattr(explorer, "close") else None


def end_to_end(names, repeats: int, notebook: str | None = None) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lab_browser as lb  # noqa: PLC0415

    why = lb.available()
    if why:
        print(f"browser: skipped ({why})")
        return
    nb = notebook or os.path.join(ROOT, "notebooks", "01_explore_schedules.ipynb")
    p0, m0 = SIZES[0]
    comm = iter(round(0.05 * k, 2) for k in range(1, 1000))  # every edit a new value
    with lb.lab_page(nb, schedules=list(names), num_devices=p0, num_microbatches=m0) as page:
        for p, m in SIZES:
            new = []
            if (p, m) != (p0, m0):
                new.append(lb.timed_change(page, lb.set_slider(p, "p (devices)"), expect_tick=f"d{p - 1}"))
                new.append(lb.timed_change(page, lb.set_slider(m, "m (microbatches)"), expect_tick=f"d{p - 1}"))
            edits = [lb.timed_change(page, lb.set_number(next(comm), "comm"), expect_tick=f"d{p - 1}")
                     for _ in range(repeats)]
            med = lambda k, xs: statistics.median(x[k] for x in xs)  # noqa: E731
            target = TARGET_E2E.get((p, m))
            tail = f"; target < {target:g} s" if target else ""
            news = (" ; new p/m: " + ", ".join(f"painted {x['painted']:.2f} s settled {x['settled']:.2f} s"
                                               for x in new)) if new else ""
            print(f"browser p={p:<3d} m={m:<4d} cost edit: painted median {med('painted', edits):.2f} s, "
                  f"settled {med('settled', edits):.2f} s over {len(edits)} edits "
                  f"(explorer's timer: {edits[-1]['python'] or 'n/a'}){news}{tail}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default=",".join(ui.default_schedules()))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--browser", action="store_true", help="also time updates end to end in JupyterLab")
    parser.add_argument("--browser-only", action="store_true", help="only the browser timings")
    parser.add_argument("--notebook", default=None,
                        help="explorer notebook to drive (default notebooks/01_explore_schedules.ipynb; "
                             "an older copy to time an older ctrlmem on PYTHONPATH)")
    args = parser.parse_args()
    names = [n for n in args.schedules.split(",") if n]
    missing = [n for n in names if n not in SCHEDULES]
    if missing:
        raise SystemExit(f"not registered: {missing}; available: {', '.join(SCHEDULES)}")
    if not args.browser_only:
        python_side(names, args.repeats)
    if args.browser or args.browser_only:
        end_to_end(names, max(1, min(args.repeats, 3)), args.notebook)


if __name__ == "__main__":
    main()
