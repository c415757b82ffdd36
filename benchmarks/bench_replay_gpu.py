"""Rank replay of the paper's 9.6B, 21B and 38.5B stage shapes on one GPU (prepared device check).

For each model of Table 2 at its paper pipeline size (p = 16 / 24 / 32, layers 2p − 2, bf16,
seq 1024, microbatch 4 / 2 / 1) and each schedule (1F1B, V-Half, V-Min, V-ZB; ZB-V stands in
while the V-shape family is not registered), replays the passes of devices 0 and 1 with
m = 2p and prints per-pass times (CUDA events) and peak activation memory (saved tensors, CUDA
allocator, theory). Usage on a GPU machine:

    .venv/bin/python benchmarks/bench_replay_gpu.py --json replay_gpu.json

``--models tiny --device cpu`` runs the same script on a CPU in seconds (used to check it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import ctrlmem as cm
from ctrlmem.runtime.models import get_preset
from ctrlmem.runtime.replay import replay_device

PAPER_P = {"9.6b": 16, "21b": 24, "38.5b": 32, "tiny": 4}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="9.6b,21b,38.5b")
    ap.add_argument("--schedules", default="1f1b,v-half,v-min,v-zb")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", default="0,1", help="devices of the pipeline to replay")
    ap.add_argument("--json", help="write all numbers here")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    wanted = args.schedules.split(",")
    names = [n for n in wanted if n in cm.SCHEDULES]
    missing = [n for n in wanted if n not in cm.SCHEDULES]
    if missing and "zb-v" not in names:
        names.append("zb-v")
        print(f"not registered: {', '.join(missing)}; replaying zb-v in their place", flush=True)
    rows = []
    for model in args.models.split(","):
        p = PAPER_P[model]
        cfg = get_preset(model, num_layers=2 * p - 2)
        for name in names:
            s = cm.build(name, p, 2 * p)
            for d in (int(x) for x in args.ranks.split(",")):
                t0 = time.perf_counter()
                r = replay_device(s, d, cfg, device=args.device)
                row = {"model": model, "p": p, "m": 2 * p, **r.to_dict(), "elapsed_s": time.perf_counter() - t0}
                rows.append(row)
                times = {f"{st}{op}": round(v["median"] * 1e3, 2) for st, kinds in r.pass_times_s.items()
                         for op, v in kinds.items()}
                print(f"{model:6s} {name:9s} dev {d}: saved {r.peak_saved_bytes / 2**30:7.2f} GiB  "
                      f"alloc {r.peak_alloc_bytes / 2**30:7.2f} GiB  theory {r.theory_peak_bytes / 2**30:7.2f} GiB  "
                      f"pass ms {times}", flush=True)
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
