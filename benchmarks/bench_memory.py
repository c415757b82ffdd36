"""Peak activation memory of each schedule divided by 1F1B's: measured next to theory.

* p=4: real runs, 4 processes on gloo (CPU), tiny model (8 layers), m = 2p; per schedule the
  largest per-rank peak; once as ctrlmem runs it (memory follows the schedule) and once with
  torch's own memory behaviour (``--torch-memory``) for comparison.
* p=8 and p=16: rank replay (ctrlmem.runtime.replay) of the device with the largest theoretical
  peak, tiny model with the paper's 2p − 2 layers (first and last stage padded), m = 2p.

Columns are ratios to 1F1B's peak; "alloc/th" is the allocator ratio divided by the theory
ratio (1.0 = the allocator follows the schedule's theory exactly). "saved" counts autograd saved tensors plus the tensors kept for W; "alloc" is the allocator's
peak (profiler memory events on CPU); "theory" replays the schedule's order with per-stage
activation bytes probed from one microbatch. Usage:

    .venv/bin/python benchmarks/bench_memory.py [--quick] [--json FILE]

--quick skips the 4-process part. Takes about 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile

import torch

import ctrlmem as cm
from ctrlmem.runtime.launch import RunConfig, run_many
from ctrlmem.runtime.models import get_preset
from ctrlmem.runtime.replay import replay_device, theory_per_device


def processes(p: int, names: list[str], out: str, fidelity: bool = True) -> dict[str, dict]:
    results = run_many([RunConfig(n, p, 2 * p, steps=0, out=f"{out}/{n}", timeout_s=600, memory_fidelity=fidelity)
                        for n in names])
    rows = {}
    for n, r in zip(names, results):
        if r["status"] != "ok":
            rows[n] = {"error": r["failure"]}
            continue
        rows[n] = {"saved": max(r["peak_saved_bytes"]), "alloc": max(r["peak_alloc_bytes"]),
                   "theory": max(r["theory_peak_bytes"]),
                   "alloc_over_theory": [round(x, 3) for x in r["alloc_over_theory"]]}
    return rows


def replays(p: int, names: list[str]) -> dict[str, dict]:
    cfg = get_preset("tiny", num_layers=2 * p - 2)
    rows = {}
    for n in names:
        s = cm.build(n, p, 2 * p)
        theory = theory_per_device(s, cfg)
        d = max(range(p), key=lambda i: theory[i])
        r = replay_device(s, d, cfg)
        rows[n] = {"saved": r.peak_saved_bytes, "alloc": r.peak_alloc_bytes, "theory": r.theory_peak_bytes,
                   "device": d, "alloc_over_theory": [round(r.peak_alloc_bytes / r.theory_peak_bytes, 3)]}
    return rows


def table(title: str, rows: dict[str, dict]) -> list[str]:
    ref = rows["1f1b"]
    lines = [title, f"  {'schedule':18s} {'saved':>7s} {'alloc':>7s} {'theory':>7s} {'alloc/th':>8s}   "
                    "alloc/theory per rank (bytes)"]
    for n, r in rows.items():
        if "error" in r:
            lines.append(f"  {n:18s} failed: {r['error']}")
            continue
        a, t = r["alloc"] / ref["alloc"], r["theory"] / ref["theory"]
        lines.append(f"  {n:18s} {r['saved'] / ref['saved']:7.3f} {a:7.3f} {t:7.3f} {a / t:8.3f}   "
                     f"{r['alloc_over_theory']}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 4-process runs")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    names = list(cm.SCHEDULES)
    data = {}
    print("peak activation memory / 1F1B's (max over devices); measured: saved tensors, allocator; theory")
    if not args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            data["p4_processes"] = processes(4, names, tmp)
            data["p4_processes_torch_memory"] = processes(4, names, tmp + "/torch", fidelity=False)
        print("\n".join(table("p=4, 4 processes (gloo, CPU), tiny model (8 layers), m=8", data["p4_processes"])))
        print("\n".join(table("p=4, same, torch's own memory behaviour (--torch-memory: no release at B, "
                              "sends kept to step end)", data["p4_processes_torch_memory"])))
    for p in (8, 16):
        data[f"p{p}_replay"] = replays(p, names)
        print("\n".join(table(f"p={p}, rank replay of the peak device, tiny model ({2 * p - 2} layers), m={2 * p}",
                              data[f"p{p}_replay"])))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(data, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
