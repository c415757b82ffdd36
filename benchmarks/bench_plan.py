"""How long `cm.plan` takes on the issue's two settings, cold and repeated in one process.

Usage: .venv/bin/python benchmarks/bench_plan.py [--only 98.5b|9.6b]

Prints, per setting, the planner's search seconds (``df.attrs["seconds"]``), its schedule builds
and reuses, the seconds spent in ``cm.build`` and the winner, then the same plan again in the same
process (every build cached). Run it before and after a change to the search engine: the planner
calls only ``cm.build`` / ``cm.simulate``. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import time

import ctrlmem as cm
from ctrlmem.planner import cache_info

SETTINGS = {
    "98.5b": dict(model="98.5b", gpus=40, gpu_memory_gb=80.0, global_batch=160, seq_len=1024),
    "9.6b": dict(model="9.6b", gpus=16, gpu_memory_gb=141.0, costs="h200"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(SETTINGS), default=None)
    args = ap.parse_args()
    for name, kw in SETTINGS.items():
        if args.only and name != args.only:
            continue
        for label in ("cold", "again"):
            before = cache_info()
            t0 = time.perf_counter()
            df = cm.plan(progress=False, **kw)
            wall = time.perf_counter() - t0
            after = cache_info()
            w = df.iloc[0]
            print(f"{name} {label:5s}: {len(df)} rows, search {df.attrs['seconds']:.1f} s (wall {wall:.1f} s), "
                  f"{after['builds'] - before['builds']} builds in {after['build_s'] - before['build_s']:.1f} s, "
                  f"{after['hits'] - before['hits']} reused; winner {w['schedule']} DP {w['dp']} TP {w['tp']} "
                  f"PP {w['pp']} mb {w['microbatch_size']}: {w['samples_per_s']:.4g} samples/s", flush=True)


if __name__ == "__main__":
    main()
