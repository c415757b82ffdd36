"""Explorer updates, Python side and end to end in a real browser, with the machine's load.

Python side (default): a cost edit at p=8/m=32, p=16/m=64 and p=32/m=256 → the instant answer
(every shown schedule re-simulated with the order it has, stats, both figures encoded for the
browser), and how long the cost-adapted builds then take in the background until the adapted
state is drawn; then the bubble-vs-budget panel at p=16, m=64 opened on a running event loop
(as in a kernel): its first budget point and its last.

``--gil``: why the background builds run in a process. A cost-adapted build (``v-min`` at
p=32, m=256, F=2) runs in a thread of the explorer's process, then in the worker process, while
the explorer answers cost edits; the edits' times are printed next to the idle ones. Run it
without ``nice``: the worker lowers its own priority, as it does next to a kernel.

End to end (``--browser``): the explorer notebook in JupyterLab, driven by headless Chromium
(``benchmarks/lab_browser.py``): type a new value into a widget and time from the Enter key that
commits it until both new plots are painted (the page's own clock), with the explorer's own
split (computed and sent by the kernel, each plot drawn by the browser); then how long until
the adapted state is painted. The
first ``v-min`` at p=32, m=256 is ticked, and while it is searched another edit is made and
timed: the widgets must answer meanwhile. Last, the F&B overlap control with DualPipeV shown,
a Hugging Face config.json typed into the model path field, the step grid comparison clicked and a
measured run (a trace-measured.json) loaded (p=16, m=64).

    .venv/bin/python benchmarks/bench_explorer.py [--schedules 1f1b,v-half,v-min] [--repeats 5]
    .venv/bin/python benchmarks/bench_explorer.py --gil
    .venv/bin/python benchmarks/bench_explorer.py --browser-only [--sizes 32x256]

Targets (printed, not asserted): a cost edit at p=32, m=256 with 1F1B, V-Half and V-Min
ticked answers in < 0.5 s on the Python side and is painted in < 0.5 s end to end. Prints
medians and the load average (1 min) next to each line: on a shared 2-core machine the load
decides, so read the numbers with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

from ctrlmem import SCHEDULES, Costs, build
from ctrlmem.explorer import ui

SIZES = ((8, 32), (16, 64), (32, 256))
SEARCHES = 8  # v-min searches queued next to the edits of --gil (each for new costs)
BIG = (32, 256)
TARGET_PY, TARGET_E2E = 0.5, 0.5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}/{os.cpu_count()} cores"


def _figure_bytes(explorer) -> int:
    return sum(len(json.dumps(explorer.shown(w))) for w in ("diagram", "memory") if explorer.shown(w) is not None)


def python_side(names, repeats: int) -> None:
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms"  # noqa: E731
    explorer = ui.explorer(schedules=names, num_devices=SIZES[0][0], num_microbatches=SIZES[0][1])
    try:
        for p, m in SIZES:
            t0 = time.perf_counter()
            explorer.devices.value = p
            explorer.microbatches.value = m
            explorer.wait(None)
            cold = time.perf_counter() - t0
            passes = sum(r.schedule.num_passes for r in explorer.view.results.values())
            totals, computes, renders, adapted = [], [], [], []
            for i in range(repeats):  # a cost edit: the instant answer, then the adapted state
                t0 = time.perf_counter()
                explorer.comm.value = round(0.05 * (i + 1), 2)
                totals.append(time.perf_counter() - t0)
                computes.append(explorer.view.seconds)
                renders.append(explorer.last_render_seconds)
                assert not explorer.view.messages, explorer.view.messages
                t1 = time.perf_counter()
                explorer.wait(None)
                adapted.append(time.perf_counter() - t1)
            target = f"; target < {TARGET_PY * 1e3:.0f} ms" if (p, m) == BIG else ""
            print(f"python  p={p:<3d} m={m:<4d} {passes:6d} passes: cost edit answered in {ms(totals)} "
                  f"(simulate+table {ms(computes)}, figures {ms(renders)}); adapted state after {ms(adapted)} "
                  f"more; new p/m until adapted {cold:.1f} s; figure JSON {_figure_bytes(explorer) / 1e6:.2f} MB"
                  f"{target} [{load()}]", flush=True)
    finally:
        explorer.close()


def sweep_panel(p: int = 16, m: int = 64) -> None:
    """The bubble-vs-budget panel opened as in a kernel (the explorer on a running event loop,
    its own ticks): until its first budget point is drawn and until every budget is."""
    import asyncio

    async def run() -> None:
        explorer = ui.explorer(schedules=["1f1b", "v-half", "v-shape"], num_devices=p, num_microbatches=m,
                               memory_limit=0.5, export_dir=None)
        try:
            while not explorer.background.idle:
                await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            explorer.compare.value = "bubble vs budget"
            first = None
            draws = set()
            while True:
                await asyncio.sleep(0.02)
                title = ((explorer.shown("compare-a") or {}).get("layout", {}).get("title") or {}).get("text", "")
                draws.add(title)
                if first is None and "budget builds done" in title and " 0 of " not in title:
                    first = time.perf_counter() - t0
                if explorer.background.idle and "all budget builds done" in title:
                    break
            print(f"python  p={p:<3d} m={m:<4d} bubble vs budget: first budget point drawn {first:.2f} s, all "
                  f"{len(draws)} states drawn, complete {time.perf_counter() - t0:.2f} s; target < 2 s [{load()}]",
                  flush=True)
        finally:
            explorer.close()

    asyncio.run(run())


def gil(repeats: int, rounds: int = 3) -> None:
    """Edits answered next to a cost-adapted build in a thread, in the worker process, or alone;
    the three interleaved for ``rounds`` rounds so that the machine's load drifts alike."""
    from ctrlmem.explorer.background import BackgroundBuilds, Job

    p, m = BIG
    # cost-free schedules: an edit is the instant answer alone, nothing of the explorer's own is searched
    explorer = ui.explorer(schedules=["1f1b", "zb-v"], num_devices=p, num_microbatches=m, background=False)
    values = iter(round(0.01 * k, 2) for k in range(1, 10_000))

    def edits(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            explorer.comm.value = next(values)
            out.append(time.perf_counter() - t0)
            time.sleep(0.2)
        return out

    times: dict[str, list[float]] = {"alone": [], "thread": [], "process": []}
    ran_out = {"thread": 0, "process": 0}  # rounds whose searches ended before the edits did
    try:
        edits(1)
        from ctrlmem.search.kernels import jit_enabled

        searches = SEARCHES if jit_enabled() else 1  # as Python, one search outlasts the edits
        for k in range(rounds):
            # searches for new costs each time (none is served from a cache), enough to outlast the edits
            thread_costs = [Costs(2 + 0.01 * (100 * k + i), 1, 1, 0) for i in range(searches)]
            process_costs = [Costs(2 + 0.01 * (100 * k + 50 + i), 1, 1, 0) for i in range(searches)]
            times["alone"] += edits(repeats)
            thread = threading.Thread(target=lambda cs=thread_costs: [build("v-min", p, m, costs=c) for c in cs],
                                      daemon=True)
            thread.start()
            time.sleep(0.5)
            times["thread"] += edits(repeats)
            ran_out["thread"] += not thread.is_alive()
            thread.join()  # a thread cannot be stopped: wait for its searches to end
            builds = BackgroundBuilds()
            builds.submit([Job("v-min", p, m, c) for c in process_costs])
            time.sleep(0.5)
            times["process"] += edits(repeats)
            builds.poll()
            ran_out["process"] += builds.idle
            builds.close()  # a process is stopped at once
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"gil     p={p} m={m}, an edit of 1F1B + ZB-V (simulate, table, figures) while v-min is searched "
              f"for new costs ({searches} queued, search kernels {'compiled' if jit_enabled() else 'as Python'}), "
              f"{rounds} interleaved rounds of {repeats}: alone {med['alone']:.0f} ms; search in a thread "
              f"{med['thread']:.0f} ms (x{med['thread'] / med['alone']:.1f}); search in the worker process "
              f"{med['process']:.0f} ms (x{med['process'] / med['alone']:.1f}); rounds whose searches ended "
              f"before the edits: thread {ran_out['thread']}, process {ran_out['process']} [{load()}]", flush=True)
    finally:
        explorer.close()


def _adapted(page, timeout_s: float = 900) -> float:
    """Seconds until the stats table says every shown schedule is adapted and that state is drawn."""
    t0 = time.monotonic()
    page.wait_for_function(
        "() => { const t = document.querySelector('.ctrlmem-stats');"
        " const shell = document.querySelector('.ctrlmem-explorer');"
        " return t && !/not adapted|building/.test(t.innerText) && !shell.classList.contains('ctrlmem-pending'); }",
        timeout=timeout_s * 1000, polling=100)
    return time.monotonic() - t0


def _browser(notebook: str | None):
    """``(lab_browser, notebook path)``, or ``(None, None)`` after printing why no browser runs."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lab_browser as lb

    why = lb.available()
    if why:
        print(f"browser: skipped ({why})")
        return None, None
    return lb, notebook or os.path.join(ROOT, "notebooks", "01_explore_schedules.ipynb")


def end_to_end(names, repeats: int, notebook: str | None = None, sizes=SIZES, first_v_min: bool = True) -> None:
    lb, nb = _browser(notebook)
    if lb is None:
        return
    p0, m0 = sizes[0]
    comm = iter(round(0.05 * k, 2) for k in range(1, 1000))  # every edit a new value
    with lb.lab_page(nb, schedules=list(names), num_devices=p0, num_microbatches=m0) as page:
        _adapted(page)
        for p, m in sizes:
            new = []
            if (p, m) != (p0, m0):
                new.append(lb.timed_change(page, lb.set_slider(p, "p (devices)"), expect_tick=f"d{p - 1}"))
                new.append(lb.timed_change(page, lb.set_slider(m, "m (microbatches)"), expect_tick=f"d{p - 1}"))
                _adapted(page)
            edits, adapted = [], []
            for _ in range(repeats):
                edits.append(lb.timed_change(page, lb.set_number(next(comm), "comm"), expect_tick=f"d{p - 1}"))
                adapted.append(edits[-1]["painted"] + _adapted(page))
            med = lambda k, xs: statistics.median(x[k] for x in xs)  # noqa: E731
            tail = f"; target < {TARGET_E2E:g} s" if (p, m) == BIG else ""
            news = (" ; new p/m painted " + ", ".join(f"{x['painted']:.2f} s" for x in new)) if new else ""
            each = ", ".join(f"{x['painted']:.2f}" for x in edits)
            print(f"browser p={p:<3d} m={m:<4d} cost edit: both plots painted median {med('painted', edits):.2f} s "
                  f"after the Enter key ({each}), adapted state painted "
                  f"{statistics.median(adapted):.1f} s after the edit (explorer's timer, last edit: "
                  f"{edits[-1]['python'] or 'n/a'}){news}{tail} [{load()}]", flush=True)
    if not first_v_min:
        return
    # the first v-min at p=32, m=256 (F=2): ticked, then another edit while it is searched; with
    # the compiled search engine, and with its plain-Python form (what runs without numba)
    p, m = BIG
    for label, env in (("compiled search", {}), ("CTRLMEM_JIT=0, the search as Python", {"CTRLMEM_JIT": "0"})):
        with lb.lab_page(nb, schedules=["1f1b"], num_devices=p, num_microbatches=m, f=2.0, env=env) as page:
            _adapted(page)
            tick = lb.timed_change(page, _tick("v-min"), expect_tick=f"d{p - 1}")
            searching = page.locator(".ctrlmem-progress").inner_text()
            other = lb.timed_change(page, lb.set_number(0.1, "comm"), expect_tick=f"d{p - 1}")
            still = page.locator(".ctrlmem-progress").inner_text()
            rest = _adapted(page)
            print(f"browser p={p} m={m} first v-min (F=2; {label}): tick painted {tick['painted']:.2f} s "
                  f"(still searching then: {'v-min' in searching}); another edit painted {other['painted']:.2f} s "
                  f"(still searching then: {'v-min' in still}); v-min adapted {rest:.1f} s after that edit "
                  f"[{load()}]", flush=True)


def new_controls(repeats: int, notebook: str | None = None) -> None:
    """The controls this round added, timed as the cost edits are: an F&B overlap edit with
    DualPipeV shown (p=16, m=64; its pairs re-timed), and a Hugging Face config.json typed into
    the model path field (the memory panel's GB axis painted)."""
    lb, nb = _browser(notebook)
    if lb is None:
        return
    p, m = 16, 64
    config = os.path.join(ROOT, "tests", "data", "hf_configs", "llama-3-8b.json")
    with lb.lab_page(nb, schedules=["1f1b", "dualpipe-v"], num_devices=p, num_microbatches=m) as page:
        _adapted(page)
        edits = [lb.timed_change(page, lb.set_number(x, "F&B overlap"), expect_tick=f"d{p - 1}")
                 for x in (0.9, 0.8, 0.7, 0.6, 0.5)[:max(1, repeats)]]

        def type_config(page):
            lb._commit(page, page.locator("input[placeholder^='or a Hugging Face']"), config)
            page.keyboard.press("Enter")

        gb = lb.timed_change(page, type_config, expect_tick=f"d{p - 1}")
        page.wait_for_selector(".ctrlmem-memory text:has-text('Llama')", timeout=30_000)
        grid = _comparison_painted(page, "step grid", "arrows: the sends")
        run = lb.timed_change(page, _load_run(_measured_file(p, m)), expect_tick=f"d{p - 1}")
        print(f"browser p={p} m={m} 1f1b + dualpipe-v: F&B overlap edit painted median "
              f"{statistics.median(x['painted'] for x in edits):.2f} s over {len(edits)} edits; a Hugging Face "
              f"config.json typed: GB axis painted {gb['painted']:.2f} s; 'step grid' clicked: grid painted "
              f"{grid:.2f} s; a measured 1F1B run loaded: its panel painted {run['painted']:.2f} s [{load()}]",
              flush=True)


def _measured_file(p: int, m: int) -> str:
    """A trace-measured.json as `ctrlmem run` writes it, of 1F1B at p, m (its passes the simulator's
    at F=1, B=1.2, W=0.8 ms, stretched 10 %: a stand-in for a run, which needs torch and minutes)."""
    import tempfile

    from ctrlmem.plots.trace import measured_trace_events
    from ctrlmem import simulate

    r = simulate(build("1f1b", p, m), Costs(1, 1.2, 0.8, 0.1))
    ranks = [{"rank": d, "pp_rank": d, "dp_rank": 0, "step_end_s": r.makespan * 1.1e-3,
              "passes": [{"op": tp.op.value, "stage": tp.stage, "microbatch": tp.microbatch,
                          "start_s": tp.start * 1.1e-3, "end_s": tp.end * 1.1e-3} for tp in r.passes if tp.device == d]}
             for d in range(p)]
    path = os.path.join(tempfile.mkdtemp(prefix="ctrlmem-bench-"), "trace-measured.json")
    with open(path, "w") as fh:
        json.dump(measured_trace_events(r.schedule, {"ranks": ranks, "step": 1}), fh)
    return path


def _load_run(path: str):
    """An action for ``timed_change``: type a file's path into 'load schedule', click load."""
    def act(page):
        field = page.locator(".widget-text", has=page.locator(".widget-label", has_text="load schedule")).locator("input")
        lb_commit = field.first
        lb_commit.fill(path)
        page.locator(".ctrlmem-explorer").get_by_role("button", name="load", exact=True).click()
    return act


def _comparison_painted(page, button: str, title_has: str) -> float:
    """Seconds (the page's clock) from clicking the comparison ``button`` to its figure drawn
    (its title holding ``title_has``)."""
    t0 = page.evaluate("() => performance.now()")
    page.locator(".ctrlmem-compare").get_by_role("button", name=button, exact=True).click()
    page.wait_for_function("text => { const t = document.querySelector('.ctrlmem-compare-a .gtitle');"
                           " return t && t.textContent.includes(text); }", arg=title_has, polling="raf",
                           timeout=120_000)
    return (page.evaluate("() => performance.now()") - t0) / 1e3


def _tick(name: str):
    """An action for ``timed_change``: tick schedule ``name``'s checkbox."""
    def act(page):
        page.locator(".ctrlmem-explorer").get_by_role("checkbox", name=name, exact=True).click()
    return act


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="1f1b,v-half,v-min")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gil", action="store_true", help="also: edits next to a build in a thread vs a process")
    parser.add_argument("--browser", action="store_true", help="also time updates end to end in JupyterLab")
    parser.add_argument("--browser-only", action="store_true", help="only the browser timings")
    parser.add_argument("--notebook", default=None,
                        help="explorer notebook to drive (default notebooks/01_explore_schedules.ipynb)")
    parser.add_argument("--sizes", default=None,
                        help="browser cost edits at these PxM only, e.g. 32x256 (default 8x32,16x64,32x256 and "
                             "then the first v-min and the new controls)")
    args = parser.parse_args()
    sizes = SIZES
    if args.sizes:
        try:
            sizes = tuple(tuple(int(x) for x in part.lower().split("x")) for part in args.sizes.split(","))
        except ValueError:
            raise SystemExit(f"--sizes: give PxM pairs such as 32x256,16x64, got {args.sizes!r}") from None
        if any(len(x) != 2 or min(x) < 1 for x in sizes):
            raise SystemExit(f"--sizes: give PxM pairs such as 32x256,16x64, got {args.sizes!r}")
    names = [n for n in args.schedules.split(",") if n]
    missing = [n for n in names if n not in SCHEDULES]
    if missing:
        raise SystemExit(f"not registered: {missing}; available: {', '.join(SCHEDULES)}")
    print(f"machine: {os.cpu_count()} cores; {load()} at start", flush=True)
    if not args.browser_only:
        python_side(names, args.repeats)
        sweep_panel()
        if args.gil:
            gil(args.repeats)
    if args.browser or args.browser_only:
        reps = max(1, args.repeats) if args.sizes else max(1, min(args.repeats, 3))
        end_to_end(names, reps, args.notebook, sizes, first_v_min=not args.sizes)
        if not args.sizes:
            new_controls(max(1, min(args.repeats, 3)), args.notebook)


if __name__ == "__main__":
    main()
