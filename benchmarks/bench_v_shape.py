"""Benchmark: the schedule searches, each in a cold process, against a baseline commit in the same run.

    .venv/bin/python benchmarks/bench_v_shape.py                   # the issue's cases, baseline b9ca453
    .venv/bin/python benchmarks/bench_v_shape.py --quick           # three small cases, a minute
    .venv/bin/python benchmarks/bench_v_shape.py --baseline none   # this checkout only
    .venv/bin/python benchmarks/bench_v_shape.py --jit-compare     # also the kernels as plain Python
    .venv/bin/python benchmarks/bench_v_shape.py --levers          # the search with levers against without
    .venv/bin/python benchmarks/bench_v_shape.py --levers-survey --baseline COMMIT  # 62 lever cases, both trees
    .venv/bin/python benchmarks/bench_v_shape.py --low-memory --baseline COMMIT     # 40 held-out low-memory cases

Every measurement is a fresh interpreter (nothing cached in memory; numba's compiled kernels are
loaded from its on-disk cache, as for any user after set-up) that builds one schedule. It prints
the CPU seconds (user + sys, so that other load on a shared machine matters less than for wall
time) of the build call alone, the median of ``--repeat`` processes, and of the whole process
(interpreter start and imports included), with the longest device span and peak of the result.
The baseline (default: commit ``b9ca453``, before the search engine) is extracted with
``git archive`` into a temporary folder and run the same way (once per case by default: it takes
up to a minute per case); the ratio column is baseline / ours. The machine's load average is
printed with each block, since CPU time moves with it too.

Costs F:B:W:comm = 3:4:2:0.1 (full device-stage times), as in the issue.

``--levers`` (issue 26): each budgeted case built twice in cold processes, reordering only and with
``recompute="auto", offload="auto"`` (a copy of one ``a`` taking ½ F = 1.5 each way), printing both
CPU times, the levers' over the plain one (target: within 2×) and both makespans.

``--levers-survey``: the lever search on 62 cases (v-shape and zb, p = 4, 8, 16, m = 2p, budgets 1/p,
0.2, 0.4, mixes 1:1:1 / 3:4:2:0.1 / 2:3:1:0.2 with copies ½ / 1.5 / 4 per ``a``, the lever choices
auto/auto, recompute auto and offload auto in turn, and the eight p = 16, m = 64 cases of
``--levers``), all in one process per tree, for this checkout and ``--baseline``: the makespans and
peaks that differ, and both trees' total CPU time of the build calls (a change that is meant to
be only faster must change nothing).

``--low-memory`` (issue 30's held-out set): 40 instances no reference file or artifact grid has
(seeded: p = 5, 7, 10, 12, 20, 24; m = 2p–4p; mixes 2:3:1:0.2, 1:1.5:1:0.05, 4:5:3:0.3, 1:2:1:0.1,
3:3:2:0.5, 2:2.5:1.5:0; budgets 0.25–0.5 of 1F1B's memory; ``v-shape`` twice as often as ``zb``),
built with the makespan objective in one process per tree, this checkout and ``--baseline``: each
makespan that differs, how many are shorter and longer, the median and best ratio, both trees'
CPU time of the build calls, and each tree's certified gaps (makespan over that tree's best lower
bound, ``makespan_bound``, and with ``--relax SECONDS`` the one-device relaxation where a device has
at most 100 passes: median, worst, how many within 15 %). ``--held-out 2``: a second set, drawn after
the finer cyclic blocks were written (20 ``v-shape`` instances, p = 9, 11, 14, 18, m = 2p–4p, F of 1–4
with B 1–1.6 F, W 0.5–1 F and a hop of 2–25 % of F, budgets 0.25–0.5); ``--held-out 3``: a third, of
forward-heavy costs (24 ``v-shape`` instances, p = 10–24, m = 2p–3p, B of 1–2 with F 1.4–2.4 B, W
0.6–1.1 B and a hop of up to 10 % of B, budgets 0.2–0.4), drawn after the block search was seen to
miss the shortest block at F = 2B = 2W (docs/theory.md §12); ``--held-out 4``: small pipelines on many
devices (16 ``v-shape`` instances, p = 5–8, m = p or 2p with p·m ≤ 64, F 1–3, B 0.6–1.8 F, W 0.4–1 B,
a hop up to 15 % of F, budgets 0.25–0.5); ``--held-out 5``: medium pipelines (16 ``v-shape``
instances with 64 < p·m ≤ 256, p = 5–10, the same cost ranges), drawn for the patient climb
(docs/theory.md §12, "A patient climb"). ``--improve SECONDS`` (needs a
baseline): also ``cm.improve`` for that long (deterministic, one worker) from each of the baseline's
schedules, and how many of each tree's schedules are within 2 % of what it finds, with the median and
worst excess (issue 30's measure; 60 s takes about 40 minutes for set 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0 = cpu()
import ctrlmem as cm
name, p, m, lim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lim = None if lim == "-" else float(lim)
levers = sys.argv[5:] == ["levers"]
costs = cm.Costs(3, 4, 2, 0.1, offload=1.5) if levers else cm.Costs(3, 4, 2, 0.1)
kw = {"recompute": "auto", "offload": "auto"} if levers else {}
try:  # load the compiled kernels (from numba's cache) outside the timed call, as imports are
    from ctrlmem.search import kernels
    kernels._prepare()
except ImportError:  # the baseline has no engine
    pass
c1 = cpu()
s = cm.build(name, p, m, costs=costs, memory_limit=lim, **kw)
c2 = cpu()
r = cm.simulate(s, costs)
print(json.dumps({"search": c2 - c1, "process": cpu(), "span": max(r.device_spans), "peak": max(r.peak_memory)}))
"""


def cases(quick: bool) -> list[tuple[str, int, int, float | None, float | None]]:
    """(schedule, p, m, budget, target CPU s)."""
    if quick:
        return [("v-shape", 8, 32, 0.5, None), ("v-shape", 8, 32, 1.0, None), ("v-min", 16, 64, None, None)]
    out: list[tuple[str, int, int, float | None, float | None]] = []
    for lim in (1 / 16, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 1.0, 1.25, 1.5, 2.0):
        out.append(("v-shape", 16, 128, lim, 1.5))
    for lim in (0.5, 1.0, 2.0):
        out.append(("v-shape", 32, 256, lim, 6.0))
    for name in ("v-min", "v-half", "v-zb", "1f1b-v"):
        out.append((name, 32, 256, None, 1.0))
    out.append(("zb", 32, 256, 1.0, None))
    out.append(("zb", 32, 256, 2.0, None))
    return out


def run_case(root: Path, case, env_extra: dict | None = None, levers: bool = False) -> dict:
    name, p, m, lim, _ = case
    env = dict(os.environ, PYTHONPATH=str(root), **(env_extra or {}))
    extra = ["levers"] if levers else []
    proc = subprocess.run([sys.executable, "-c", _CHILD, name, str(p), str(m), "-" if lim is None else repr(lim), *extra],
                          capture_output=True, text=True, env=env, cwd=root, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{name} p={p} m={m} failed under {root}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


LEVER_TARGET = 2.0
"""The search with levers over the one without, CPU time (issue 26)."""


def lever_cases(quick: bool) -> list[tuple[str, int, int, float | None, float | None]]:
    """Budgeted cases below V-Min's memory, where the levers have work to do."""
    if quick:
        return [("v-shape", 8, 32, 0.25, None)]
    return [("v-shape", 16, 64, lim, None) for lim in (0.125, 0.2, 0.25, 0.375)] + [("zb", 16, 64, 0.25, None)]


def lever_compare(quick: bool, repeat: int) -> None:
    """Print the levers' search against the plain one for :func:`lever_cases`."""
    print(f"{'schedule':<8} {'p':>3} {'m':>4} {'budget':>7} {'plain s':>8} {'levers s':>9} {'ratio':>6} "
          f"{'plain span':>10} {'lever span':>10}")
    misses = 0
    for case in lever_cases(quick):
        name, p, m, lim, _ = case
        plain = [run_case(REPO, case) for _ in range(repeat)]
        lev = [run_case(REPO, case, levers=True) for _ in range(repeat)]
        a, b = (statistics.median(r["search"] for r in x) for x in (plain, lev))
        ratio = b / a if a > 0 else float("inf")
        over = ratio > LEVER_TARGET
        misses += over
        print(f"{name:<8} {p:>3} {m:>4} {lim:>7.4g} {a:>8.2f} {b:>9.2f} {ratio:>6.1f} {plain[0]['span']:>10g} "
              f"{lev[0]['span']:>10g}" + (f" (over {LEVER_TARGET:g}×)" if over else ""), flush=True)
    print(f"{misses} case(s) over the {LEVER_TARGET:g}× target")


_SURVEY_CHILD = r"""
import json, resource
import ctrlmem as cm
from ctrlmem.search import kernels
kernels._prepare()
MIXES = [((1, 1, 1, 0), 0.5), ((3, 4, 2, 0.1), 1.5), ((2, 3, 1, 0.2), 4.0)]
LEVERS = [("auto", "auto"), ("auto", "none"), ("none", "auto")]
cases = []
for name in ("v-shape", "zb"):
    for p in (4, 8, 16):
        for lim in sorted({1 / p, 0.2, 0.4}):
            for mix in range(3):
                cases.append((name, p, 2 * p, lim, mix, LEVERS[len(cases) % 3]))
for lim in (0.125, 0.2, 0.25, 0.375):
    for name in ("v-shape", "zb"):
        cases.append((name, 16, 64, lim, 1, ("auto", "auto")))
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out = []
for name, p, m, lim, mix, (rc, off) in cases:
    c, copy = MIXES[mix]
    costs = cm.Costs(*c, offload=copy)
    t = cpu()
    try:
        r = cm.simulate(cm.build(name, p, m, costs=costs, memory_limit=lim, recompute=rc, offload=off), costs)
        res = {"makespan": r.makespan, "peak": max(r.peak_memory)}
    except ValueError:
        res = {"makespan": None, "peak": None}
    out.append({"case": [name, p, m, lim, mix, rc, off], "cpu": cpu() - t, **res})
print(json.dumps(out))
"""


def survey_trees(baseline: str, child: str, what: str) -> list[list[dict]]:
    """Run the ``child`` script (it prints one JSON list of cases with ``cpu`` and ``makespan``) once
    in this checkout and, unless ``baseline`` is ``'none'``, once in that commit's tree; print each
    tree's totals. Returns the result lists, this checkout's first."""
    trees = {"this checkout": REPO}
    if baseline != "none":
        trees["baseline " + baseline] = baseline_tree(baseline)
    try:
        results = []
        for i, (label, root) in enumerate(trees.items()):
            env = dict(os.environ, PYTHONPATH=str(root))
            if i != len(trees) - 1:  # cm.improve (--improve) from the last tree's schedules only: the baseline's
                env.pop("CTRLMEM_BENCH_IMPROVE", None)
            proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=root,
                                  timeout=7200)
            if proc.returncode != 0:
                raise RuntimeError(f"{label}: {what} failed:\n{proc.stderr[-2000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(res)
            print(f"{label}: {len(res)} cases, build CPU {sum(c['cpu'] for c in res):.1f} s, "
                  f"{sum(c['makespan'] is None for c in res)} fit nothing", flush=True)
        return results
    finally:
        for root in trees.values():
            if root != REPO:
                shutil.rmtree(root, ignore_errors=True)


def both_fit(ours: list[dict], base: list[dict]):
    """The case pairs that fit in both trees (a case that fits in one only is printed)."""
    for a, b in zip(ours, base):
        if a["makespan"] is None or b["makespan"] is None:
            if a["makespan"] != b["makespan"]:
                print(f"  fits in one tree only: {a['case']}: {b['makespan']} -> {a['makespan']}")
            continue
        yield a, b


def lever_survey(baseline: str) -> None:
    """Print where this checkout's lever search differs from ``baseline``'s on the survey's cases."""
    results = survey_trees(baseline, _SURVEY_CHILD, "survey")
    if len(results) == 2:
        counts = {"shorter": 0, "longer": 0, "peak differs": 0}
        for a, b in both_fit(*results):
            if abs(a["makespan"] - b["makespan"]) > 1e-9:
                counts["shorter" if a["makespan"] < b["makespan"] else "longer"] += 1
                print(f"  {a['case']}: makespan {b['makespan']} -> {a['makespan']}")
            elif abs(a["peak"] - b["peak"]) > 1e-9:
                counts["peak differs"] += 1
                print(f"  {a['case']}: peak {b['peak']} -> {a['peak']}")
        print("against the baseline: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


_LOW_CHILD = r"""
import json, os, random, resource
import ctrlmem as cm
from ctrlmem.search.engine import clear_caches
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def first_set():  # the held-out set of issue 30 (seed 30): both searches, six cost mixes
    rnd = random.Random(30)
    mixes = [(2, 3, 1, 0.2), (1, 1.5, 1, 0.05), (4, 5, 3, 0.3), (1, 2, 1, 0.1), (3, 3, 2, 0.5), (2, 2.5, 1.5, 0.0)]
    for _ in range(40):
        p = rnd.choice([5, 7, 10, 12, 20, 24])
        m = rnd.choice([2 * p, 3 * p, 4 * p]) if p <= 12 else rnd.choice([2 * p, 3 * p])
        mix = rnd.choice(mixes)
        lim = rnd.choice([0.34, 0.4, 0.45, 0.5, 0.25, 0.3])
        yield rnd.choice(["v-shape", "v-shape", "zb"]), p, m, mix, lim
def second_set():  # drawn after the finer cyclic blocks were written (seed 4545): v-shape, random costs
    rnd = random.Random(4545)
    for _ in range(20):
        p = rnd.choice([9, 11, 14, 18]); m = rnd.choice([2 * p, 3 * p, 4 * p])
        f = rnd.choice([1, 2, 3, 4]); b = round(f * rnd.uniform(1.0, 1.6), 1); w = round(f * rnd.uniform(0.5, 1.0), 1)
        c = round(f * rnd.uniform(0.02, 0.25), 2)
        yield "v-shape", p, m, (f, b, w, c), rnd.choice([0.25, 0.3, 0.34, 0.4, 0.45, 0.5])
def third_set():  # F-heavy (seed 51), drawn after the block search's miss at F = 2B = 2W was found
    rnd = random.Random(51)
    for _ in range(24):
        p = rnd.choice([10, 12, 14, 16, 20, 24]); m = rnd.choice([2 * p, 3 * p])
        b = rnd.choice([1, 1.5, 2]); f = round(b * rnd.uniform(1.4, 2.4), 1); w = round(b * rnd.uniform(0.6, 1.1), 1)
        c = round(b * rnd.uniform(0, 0.1), 2)
        yield "v-shape", p, m, (f, b, w, c), rnd.choice([0.2, 0.25, 0.3, 0.34, 0.4])
def random_costs(rnd):  # sets 4 and 5: F 1-3, B 0.6-1.8 F, W 0.4-1 B, a hop up to 15 % of F
    f = round(rnd.uniform(1, 3), 1); b = round(f * rnd.uniform(0.6, 1.8), 1); w = round(b * rnd.uniform(0.4, 1.0), 1)
    return f, b, w, round(f * rnd.uniform(0, 0.15), 2)
def fourth_set():  # small pipelines on many devices (seed 54): p = 5-8, p*m <= 64, v-shape
    rnd = random.Random(54)
    for _ in range(16):
        p = rnd.choice([5, 7, 6, 8]); m = rnd.choice([p, 2 * p]) if 2 * p * p <= 64 else p
        yield "v-shape", p, m, random_costs(rnd), rnd.choice([0.25, 0.3, 0.375, 0.45, 0.5])
def fifth_set():  # medium pipelines (seed 55): 64 < p*m <= 256, v-shape
    rnd = random.Random(55)
    n = 0
    while n < 16:
        p = rnd.choice([5, 6, 7, 8, 9, 10, 12, 16]); m = rnd.choice([2 * p, 3 * p, 4 * p, 24, 32])
        if not 64 < p * m <= 256:
            continue
        n += 1
        yield "v-shape", p, m, random_costs(rnd), rnd.choice([0.25, 0.3, 0.375, 0.45, 0.5])
improve_s = float(os.environ.get("CTRLMEM_BENCH_IMPROVE", "0"))
out = []
which = os.environ.get("CTRLMEM_BENCH_SET", "1")
for name, p, m, mix, lim in {"1": first_set, "2": second_set, "3": third_set, "4": fourth_set, "5": fifth_set}[which]():
    costs = cm.Costs(*mix)
    clear_caches()
    t = cpu()
    try:
        s = cm.build(name, p, m, costs=costs, memory_limit=lim, objective="makespan")
        r = cm.simulate(s, costs)
        res = {"makespan": r.makespan, "peak": max(r.peak_memory)}
    except ValueError:
        res = {"makespan": None, "peak": None}
    t_build = cpu() - t
    if res["makespan"] is not None:  # the best lower bound of that tree on every schedule within the budget
        from ctrlmem.search.bounds import makespan_bound
        res["bound"] = makespan_bound(s.placement, m, costs, lim * p)
        relax = float(os.environ.get("CTRLMEM_BENCH_RELAX", "0"))
        v = s.placement.num_stages // p
        if relax > 0 and 3 * v * m <= 100:  # the one-device relaxation where CP-SAT proves it (trees that have it)
            try:
                from ctrlmem.solver.relax import relaxed_bounds
            except ImportError:
                relaxed_bounds = None
            if relaxed_bounds is not None:
                got = max(r.bound for r in relaxed_bounds(s.placement, m, costs, lim * p, seconds=relax))
                res["relaxed"] = got
                res["bound"] = max(res["bound"], got)
        if improve_s > 0:  # cm.improve from this tree's schedule (deterministic, one worker)
            got = cm.improve(s, costs, lim, time_limit=improve_s, workers=1, deterministic=True)
            res["improve"] = got.makespan
    out.append({"case": [name, p, m, ":".join(f"{x:g}" for x in mix), lim], "cpu": t_build, **res})
print(json.dumps(out))
"""


def low_memory_survey(baseline: str) -> None:
    """The held-out low-memory set in this checkout and in ``baseline``: makespans that differ."""
    results = survey_trees(baseline, _LOW_CHILD, "held-out set")
    if len(results) == 2:
        ratios, longer = [], 0
        fit = list(both_fit(*results))
        for a, b in fit:
            if abs(a["makespan"] - b["makespan"]) > 1e-9:
                print(f"  {a['case']}: makespan {b['makespan']:g} -> {a['makespan']:g} "
                      f"({a['makespan'] / b['makespan']:.3f}x)")
                if a["makespan"] < b["makespan"]:
                    ratios.append(a["makespan"] / b["makespan"])
                else:
                    longer += 1
        line = f"against the baseline: shorter {len(ratios)}, longer {longer}"
        if ratios:
            line += f" (shorter ones: median {statistics.median(ratios):.3f}x, best {min(ratios):.3f}x)"
        print(line)
        # the certified gap (makespan over the tree's best lower bound), where both trees give a bound
        pairs = [(a, b) for a, b in fit if a.get("bound") and b.get("bound")]
        for label, rows in (("this checkout", [a for a, _ in pairs]), ("baseline", [b for _, b in pairs])):
            gaps = sorted(100 * (x["makespan"] / x["bound"] - 1) for x in rows)
            if gaps:
                print(f"certified gap, {label}: median {statistics.median(gaps):.1f} %, worst {gaps[-1]:.1f} %, "
                      f"at most 15 %: {sum(g <= 15 for g in gaps)} of {len(gaps)}")
        imp = [(a, b) for a, b in fit if b.get("improve") is not None]
        if imp:  # the measure: within 2 % of what cm.improve finds from the baseline's schedule
            for label, k in (("this checkout", 0), ("baseline", 1)):
                over = [pair[k]["makespan"] / pair[1]["improve"] for pair in imp]
                print(f"within 2 % of cm.improve ({len(imp)} cases), {label}: {sum(r <= 1.02 + 1e-9 for r in over)}; "
                      f"over it: median {100 * (statistics.median(over) - 1):.1f} %, worst {100 * (max(over) - 1):.1f} %")
            for a, b in imp:
                print(f"  {a['case']}: {a['makespan']:g} (baseline {b['makespan']:g}, cm.improve {b['improve']:g})")
        for a in results[0]:
            if "relaxed" in a:
                print(f"  one-device relaxation {a['case']}: {a['relaxed']:g} (best bound {a['bound']:g}, "
                      f"makespan {a['makespan']:g})")


def baseline_tree(commit: str) -> Path:
    """``commit``'s ``ctrlmem`` extracted into a temporary folder, its kernels compiled there once
    (numba caches them beside the sources), so no timed call of the baseline compiles any."""
    tmp = Path(tempfile.mkdtemp(prefix="ctrlmem-baseline-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "ctrlmem"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    # the warm-up lives in schedules/warmup.py (compile_all) since f318630, in search/warmup.py (run)
    # before it, and nowhere before the compiled kernels
    warm = ("try:\n    from ctrlmem.schedules.warmup import compile_all\n"
            "except ImportError:\n"
            "    try:\n        from ctrlmem.search.warmup import run as compile_all\n"
            "    except ImportError:\n        compile_all = None  # a commit before the compiled kernels\n"
            "if compile_all is not None:\n    compile_all()\n")
    subprocess.run([sys.executable, "-c", warm], env=dict(os.environ, PYTHONPATH=str(tmp)), cwd=tmp, check=True,
                   capture_output=True)
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three small cases")
    ap.add_argument("--repeat", type=int, default=3, help="cold processes per case for this checkout (median)")
    ap.add_argument("--baseline", default="b9ca453", help="commit to compare with, or 'none'")
    ap.add_argument("--baseline-repeat", type=int, default=1, help="cold processes per case for the baseline")
    ap.add_argument("--jit-compare", action="store_true", help="also run each case with CTRLMEM_JIT=0 (plain Python)")
    ap.add_argument("--levers", action="store_true",
                    help="the search with recompute/offload auto against without (issue 26's 2× target)")
    ap.add_argument("--levers-survey", action="store_true",
                    help="the lever search on 62 cases against --baseline: makespans and peaks that differ, CPU totals")
    ap.add_argument("--low-memory", action="store_true",
                    help="the held-out low-memory set (40 instances, budgets 0.25-0.5) against --baseline")
    ap.add_argument("--held-out", type=int, choices=(1, 2, 3, 4, 5), default=1,
                    help="with --low-memory: set 1 (issue 30's, 40 instances, both searches), set 2 (20 v-shape "
                         "instances with random costs, drawn later), set 3 (24 v-shape instances, forward-heavy costs), "
                         "set 4 (16 small pipelines, p = 5-8) or set 5 (16 medium pipelines, 64 < p*m <= 256)")
    ap.add_argument("--improve", type=float, default=0.0, metavar="SECONDS",
                    help="with --low-memory and a baseline: also cm.improve for SECONDS from each of the baseline's "
                         "schedules, and how many of each tree's are within 2 %% of it")
    ap.add_argument("--relax", type=float, default=0.0, metavar="SECONDS",
                    help="with --low-memory: also the one-device relaxation (solver-seconds a device) where a device "
                         "has at most 100 passes, in the trees that have it")
    args = ap.parse_args()
    if (args.held_out != 1 or args.improve > 0 or args.relax > 0) and not args.low_memory:
        ap.error("--held-out, --improve and --relax belong to the held-out survey: add --low-memory")
    if args.improve > 0 and args.baseline == "none":
        ap.error("--improve runs cm.improve from the baseline's schedules: give --baseline COMMIT, not 'none'")
    if args.low_memory:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
        os.environ["CTRLMEM_BENCH_RELAX"] = str(args.relax)
        os.environ["CTRLMEM_BENCH_SET"] = str(args.held_out)
        os.environ["CTRLMEM_BENCH_IMPROVE"] = str(args.improve)
        low_memory_survey(args.baseline)
        return
    if args.levers_survey:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
        lever_survey(args.baseline)
        return
    if args.levers:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); costs "
              f"3:4:2:0.1, copy 1.5 per a; CPU s = user + sys of the build call, median of {args.repeat} cold processes")
        lever_compare(args.quick, args.repeat)
        return
    base = None
    if args.baseline != "none":
        try:
            base = baseline_tree(args.baseline)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            print(f"(no baseline: cannot extract {args.baseline!r} with git archive: {exc})")
    try:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); costs 3:4:2:0.1; "
              f"CPU s = user + sys of the build call, median of {args.repeat} cold processes")
        head = f"{'schedule':<8} {'p':>3} {'m':>4} {'budget':>7} {'search s':>9} {'process s':>10} {'target':>7} {'span':>9} {'peak':>5}"
        if base is not None:
            head += f" | {'base s':>7} {'base span':>9} {'ratio':>6}"
        if args.jit_compare:
            head += f" | {'python s':>8}"
        print(head)
        misses = 0
        for case in cases(args.quick):
            name, p, m, lim, target = case
            runs = [run_case(REPO, case) for _ in range(args.repeat)]
            search = statistics.median(r["search"] for r in runs)
            process = statistics.median(r["process"] for r in runs)
            r0 = runs[0]
            line = (f"{name:<8} {p:>3} {m:>4} {'-' if lim is None else format(lim, '.4g'):>7} {search:>9.2f} {process:>10.2f} "
                    f"{'-' if target is None else format(target, 'g'):>7} {r0['span']:>9g} {r0['peak']:>5g}")
            if target is not None and search > target:
                misses += 1
                line += " (over target)"
            if base is not None:
                b = [run_case(base, case) for _ in range(args.baseline_repeat)]
                bs = statistics.median(x["search"] for x in b)
                line += f" | {bs:>7.2f} {b[0]['span']:>9g} {bs / search:>6.1f}"
                if r0["span"] > b[0]["span"] + 1e-9:
                    line += " SLOWER SCHEDULE"
            if args.jit_compare:
                py = run_case(REPO, case, {"CTRLMEM_JIT": "0"})
                line += f" | {py['search']:>8.2f}"
            print(line, flush=True)
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {misses} case(s) over target")
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
