"""How long `cm.plan` takes, cold and repeated in one process: the paper's two settings and three
models read from Hugging Face configs (the test data in tests/data/hf_configs), whose plans add the
balanced layer split, expert parallelism (Mixtral) and recomputation (none, full) as dimensions.

Usage: .venv/bin/python benchmarks/bench_plan.py [--only NAME]

Prints, per setting, the planner's search seconds (``df.attrs["seconds"]``), its schedule builds
and reuses, the seconds spent in ``cm.build`` and the winner, then the same plan again in the same
process (every build cached). Run it before and after a change to the search engine: the planner
calls only ``cm.build`` / ``cm.simulate``. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ctrlmem as cm
from ctrlmem.planner import cache_info

_HF = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_configs"

SETTINGS = {
    "98.5b": dict(model="98.5b", gpus=40, gpu_memory_gb=80.0, global_batch=160, seq_len=1024),
    "9.6b": dict(model="9.6b", gpus=16, gpu_memory_gb=141.0, costs="h200"),
    "llama-3-8b": dict(model=_HF / "llama-3-8b.json", gpus=8, gpu_memory_gb=80.0, global_batch=64),
    "llama-3-70b": dict(model=_HF / "llama-3-70b.json", gpus=64, gpu_memory_gb=80.0, global_batch=256),
    "mixtral-8x7b": dict(model=_HF / "mixtral-8x7b.json", gpus=32, gpu_memory_gb=80.0, global_batch=256),
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
            t0, c0 = time.perf_counter(), time.process_time()
            df = cm.plan(progress=False, **kw)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            after = cache_info()
            w = df.iloc[0]
            counts = df["status"].value_counts().to_dict()
            print(f"{name} {label:5s}: {len(df)} rows ({counts.get('ok', 0)} simulated and fit, "
                  f"{counts.get('bounded', 0)} bounded, {counts.get('does not fit', 0)} do not fit), search {df.attrs['seconds']:.1f} s (wall {wall:.1f} s, CPU {cpu:.1f} s), "
                  f"{after['builds'] - before['builds']} builds in {after['build_s'] - before['build_s']:.1f} s, "
                  f"{after['hits'] - before['hits']} reused; winner {w['schedule']} DP {w['dp']} TP {w['tp']} "
                  f"PP {w['pp']} EP {w['ep']} mb {w['microbatch_size']} recompute {w['recompute']}: "
                  f"{w['samples_per_s']:.4g} samples/s", flush=True)


if __name__ == "__main__":
    main()
