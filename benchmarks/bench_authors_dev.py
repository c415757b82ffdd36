"""Benchmark: ctrlmem's schedules against the authors' scheduler outputs on the development grid.

    .venv/bin/python benchmarks/bench_authors_dev.py [--data PATH] [--only V-Auto,ZB-V] [--detail]

For every record of the data file (default ``../shared/data/authors_dev.json`` beside the
repository) builds our schedule for the same p, m, F, B, W, comm (and memory budget), simulates
it, and prints per reference schedule: cases, worse (> 1 % longer span, or over the memory),
better (< 1 % shorter), geometric-mean ratio of our longest span over theirs, the worst ratio,
and the wall-clock seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ctrlmem.schedules.compare import compare_record, summarize

REPO = Path(__file__).resolve().parents[1]


def default_data() -> Path:
    """``<repo>/../shared/data/authors_dev.json``; in a git worktree also the main checkout's."""
    cands = [REPO.parent / "shared" / "data" / "authors_dev.json"]
    git = REPO / ".git"
    if git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(git.read_text().split(":", 1)[1].strip())
        cands.append(gitdir.parents[2].parent / "shared" / "data" / "authors_dev.json")
    return next((c for c in cands if c.exists()), cands[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--only", default="", help="comma-separated reference schedule names")
    ap.add_argument("--detail", action="store_true", help="print every record that is worse")
    args = ap.parse_args()
    args.data = args.data or default_data()
    if not args.data.exists():
        raise SystemExit(f"data file not found: {args.data}; pass --data PATH")
    records = json.loads(args.data.read_text())["records"]
    only = {x for x in args.only.split(",") if x}
    if only:
        records = [r for r in records if r["schedule"] in only]
    t0 = time.perf_counter()
    comps = []
    for r in records:
        c = compare_record(r)
        comps.append(c)
        if args.detail and (c.ratio > 1.01 or not c.fits):
            print(f"  worse {r['schedule']:<7} p={r['p']} m={r['m']} {r['F']:g}:{r['B']:g}:{r['W']:g}:{r['C']:g} "
                  f"limit={r['memory_limit']} ratio={c.ratio:.4f} peak={c.peak:g}/{c.allowed:g}")
    took = time.perf_counter() - t0
    summary = summarize(comps)
    print(f"{'reference':<8} {'ours':<8} {'cases':>5} {'worse':>5} {'better':>6} {'geomean':>8} {'worst':>6}  worst case")
    for name, s in summary.items():
        print(f"{name:<8} {s['ours']:<8} {s['cases']:>5} {s['worse']:>5} {s['better']:>6} {s['geomean']:>8.4f} "
              f"{s['worst']:>6.3f}  {s['worst_case']}")
    print(f"{len(comps)} records in {took:.1f} s (simulated with ctrlmem.simulate)")


if __name__ == "__main__":
    main()
