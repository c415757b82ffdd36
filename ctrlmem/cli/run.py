"""``ctrlmem run``: execute a schedule for real (see :mod:`ctrlmem.runtime.launch`);
``ctrlmem replay``: one pipeline device's passes at full size on one device (:mod:`ctrlmem.runtime.replay`).

Imports torch only when the command runs, so ``ctrlmem --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ctrlmem.runtime.launch import schedule_folder
from ctrlmem.cli.args import float_arg, int_arg
from ctrlmem.runtime.launch import MAX_TIMEOUT_S
from ctrlmem.cli.args import CliError
from ctrlmem.cli.args import parse_params
from ctrlmem.runtime.launch import RunConfig
from ctrlmem.runtime.launch import emit_sbatch, run_many
from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Schedule
from ctrlmem.model.simulate import simulate
from ctrlmem.plots.trace import write_measured_trace, write_trace

__all__ = ["add_commands"]


def add_commands(subparsers) -> None:


    seconds = float_arg(maximum=MAX_TIMEOUT_S, what="seconds")
    p = subparsers.add_parser(
        "run", help="run a schedule for real on torch.distributed.pipelining (gloo/CPU or NCCL/GPU)",
        description="Launch `python -m torch.distributed.run` locally (or write a Slurm script) and "
                    "write DIR/result.json: exactness vs a non-pipelined step, step and pass times, "
                    "measured and theoretical activation memory, the simulator's predicted step time; "
                    "beside it trace-measured.json (the last timed step, per rank) and trace-simulated.json "
                    "(the same schedule at the measured pass times): Chrome / Perfetto trace-event JSON.",
    )
    p.add_argument("--schedule", required=True, action="append",
                   help="schedule name (see `ctrlmem list`), or a schedule file: a torch / torchtitan CSV (e.g. the "
                        "schedule.csv of `ctrlmem plan --emit`) or ctrlmem's text form; repeat it to run several "
                        "schedules one after the other in one launch (each process starts once): each result goes "
                        "to OUT/<schedule>/result.json")
    p.add_argument("-p", "--devices", type=int_arg(), default=2, help="number of ranks p (default 2)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation recomputation in every stage: torch.utils.checkpoint around the stage's layers "
                        "(full) or each layer's attention core (selective); adds an R before every backward to the "
                        "schedule; with a split backward B recomputes and W reuses what B kept (default none)")
    p.add_argument("--offload", type=float, default=0.0, metavar="FRACTION",
                   help="activation offload: that share (0-1] of what every forward stores is copied to host memory "
                        "by saved-tensor hooks (pinned on CUDA) and back at its backward; the schedule gets an "
                        "offload and a reload of each forward. On CPU the copy is a memcpy: the run shows exact "
                        "gradients and the resident activation falling, not a host link's cost. Not with --recompute "
                        "(a forward is recomputed or offloaded, not both; a schedule file may mix them per forward) "
                        "(default 0: none)")
    p.add_argument("-m", "--microbatches", type=int_arg(), default=4, help="number of microbatches m (default 4)")
    p.add_argument("--dp", type=int_arg(), default=1,
                   help="data-parallel replicas of the pipeline (dp x p ranks; batch split, gradients averaged)")
    p.add_argument("--model", default="tiny", help="model preset: tiny, small, medium, 9.6b, 21b, 38.5b, 98.5b")
    p.add_argument("--layers", type=int_arg(), default=None, help="override the preset's number of layers")
    p.add_argument("--dtype", default=None, help="override the preset's dtype (float32, bfloat16, float16)")
    p.add_argument("--microbatch-size", type=int_arg(), default=None, help="override the preset's microbatch size")
    p.add_argument("--seq-len", type=int_arg(), default=None, help="override the preset's sequence length")
    p.add_argument("--steps", type=int_arg(0), default=3, help="timed steps after the check and memory steps (default 3)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo on CPU (default), nccl on GPUs")
    p.add_argument("--out", default="build/runs/latest",
                   help="output folder for result.json (default build/runs/latest, git-ignored)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="extra schedule generator parameter, e.g. --param num_chunks=2 (repeatable)")
    p.add_argument("--seed", type=int_arg(0), default=0)
    p.add_argument("--threads", type=int_arg(1, 1024), default=1, help="intra-op threads per rank on CPU (default 1)")
    p.add_argument("--pin", action="store_true", help="pin each rank to its own core(s) (timing runs)")
    p.add_argument("--timeout", type=seconds, default=600.0, help="wall-clock limit of the run in s (default 600)")
    p.add_argument("--comm-timeout", type=seconds, default=120.0, help="init_process_group timeout in s (default 120)")
    p.add_argument("--hang-timeout", type=seconds, default=60.0,
                   help="a rank that starts no pass for this long reports where it is and exits (default 60)")
    p.add_argument("--torch-memory", action="store_true",
                   help="keep torch's own memory behaviour (no early release at B, sends kept to the end) "
                        "to compare with the default, which follows the schedule")
    p.add_argument("--audit-p2p", action="store_true",
                   help="count every point-to-point operation per rank (result.json p2p_audit: operations, "
                        "ones addressed to the rank itself, shape/metadata exchanges)")
    p.add_argument("--emit-sbatch", metavar="FILE", default=None,
                   help="write a Slurm script (srun + torchrun, c10d rendezvous) instead of running")
    p.add_argument("--nodes", type=int_arg(), default=1, help="with --emit-sbatch: number of nodes")
    p.add_argument("--gpus-per-node", type=int_arg(), default=None,
                   help="with --emit-sbatch: ranks per node (default p/nodes)")
    p.add_argument("--partition", default=None, help="with --emit-sbatch: Slurm partition")
    p.add_argument("--time-limit", default="00:30:00", help="with --emit-sbatch: Slurm time limit")
    p.add_argument("--allow-large", action="store_true",
                   help="launch on CPU even when the memory preflight finds the run needs more memory than is "
                        "available here (the model, the reference check and the schedule's activations)")
    p.add_argument("--json", action="store_true", help="print the whole result.json")
    p.set_defaults(func=_cmd_run)
    _add_replay(subparsers)


def _add_replay(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="replay single pipeline devices' passes at full size on one GPU (or CPU)",
        description="For each schedule and each pipeline device in --devices, run that device's passes in "
                    "one process on its real stage shapes (weights made on the target device, stand-in "
                    "tensors for its neighbours) and write DIR/replay.json: per-stage pass times and the "
                    "saved-tensor / allocator / theory activation peaks. Rows merge into an existing file.",
    )
    p.add_argument("--model", required=True, help="model preset: tiny, small, medium, 9.6b, 21b, 38.5b, 98.5b")
    p.add_argument("-p", "--pipeline", type=int_arg(), required=True, help="pipeline size p")
    p.add_argument("-m", "--microbatches", type=int_arg(), default=None, help="microbatches m (default 2p)")
    p.add_argument("--schedules", default="1f1b,v-half,v-min,v-zb", help="comma-separated schedule names")
    p.add_argument("--devices", default="0,1", help="comma-separated pipeline devices to replay (default 0,1)")
    p.add_argument("--device", default=None, help="torch device to run on (default cuda if available, else cpu)")
    p.add_argument("--layers", type=int_arg(), default=None, help="override the preset's number of layers")
    p.add_argument("--microbatch-size", type=int_arg(), default=None, help="override the preset's microbatch size")
    p.add_argument("--dtype", default=None, help="override the preset's dtype (float32, bfloat16, float16)")
    p.add_argument("--tag", default="", help="free label stored in every row")
    p.add_argument("--out", default="build/replay", help="output folder for replay.json (default build/replay)")
    p.set_defaults(func=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415 - torch takes seconds to import; only real runs need it

    from ctrlmem.runtime.adapter import UnsupportedTorch, check_torch_version  # noqa: PLC0415 - imports torch (seconds); only real runs need it
    from ctrlmem.runtime.replay import REPLAY_FILE, run_replay  # noqa: PLC0415 - imports torch (seconds); only real runs need it

    try:
        check_torch_version()
    except UnsupportedTorch as exc:
        raise ValueError(str(exc)) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    m = args.microbatches if args.microbatches is not None else 2 * args.pipeline

    def show(row: dict) -> None:
        times = " ".join(f"{st}{op} {v['median'] * 1e3:.2f}" for st, kinds in row["pass_times_s"].items()
                         for op, v in kinds.items())
        print(f"{row['model']} {row['schedule']:9s} device {row['device']:>3}: saved {row['peak_saved_bytes'] / 2**30:.3f} GiB, "
              f"allocator {row['peak_alloc_bytes'] / 2**30:.3f} GiB, theory {row['theory_peak_bytes'] / 2**30:.3f} GiB; "
              f"pass ms {times}", flush=True)

    run_replay(args.model, args.pipeline, m, args.schedules, args.devices, device=device, out=args.out,
               num_layers=args.layers, microbatch_size=args.microbatch_size, dtype=args.dtype, tag=args.tag,
               progress=show)
    print(f"wrote {args.out}/{REPLAY_FILE}")
    return 0


def _configs(args: argparse.Namespace) -> list:
    """One run configuration per ``--schedule``; with several, each gets its own sub-folder of
    ``--out`` (:func:`schedule_folder`)."""

    names = list(args.schedule)
    if len(names) == 1:
        return [_config(args, names[0], args.out)]
    folders = [schedule_folder(n) for n in names]
    dup = sorted({f for f in folders if folders.count(f) > 1})
    if dup:
        raise CliError(f"--schedule given twice for {', '.join(dup)}: each schedule of one launch writes to "
                       f"OUT/<schedule>/; give each once")
    if args.emit_sbatch:
        raise CliError("--emit-sbatch writes one run per Slurm script; give one --schedule (a sweep grid over "
                       "schedules submits one job each)")
    return [_config(args, n, str(Path(args.out) / f)) for n, f in zip(names, folders)]


def _config(args: argparse.Namespace, schedule: str, out: str):

    overrides = {}
    if args.layers is not None:
        overrides["num_layers"] = args.layers
    if args.dtype is not None:
        overrides["dtype"] = args.dtype
    if args.microbatch_size is not None:
        overrides["microbatch_size"] = args.microbatch_size
    if args.seq_len is not None:
        overrides["seq_len"] = args.seq_len
    return RunConfig(
        schedule=schedule, num_devices=args.devices, num_microbatches=args.microbatches,
        model=args.model, steps=args.steps, backend=args.backend, out=out,
        model_overrides=overrides, schedule_params=parse_params(args.param), seed=args.seed,
        threads_per_rank=args.threads, pin_cores=args.pin, timeout_s=args.timeout,
        comm_timeout_s=args.comm_timeout, hang_timeout_s=args.hang_timeout,
        memory_fidelity=not args.torch_memory, dp=args.dp, audit_p2p=args.audit_p2p, allow_large=args.allow_large,
        recompute=args.recompute, offload=args.offload,
    )


def _fmt_bytes(x: float) -> str:
    return f"{x / 2**20:.2f} MiB"


def _cmd_run(args: argparse.Namespace) -> int:

    configs = _configs(args)
    if args.emit_sbatch:
        config = configs[0]
        gpn = args.gpus_per_node or max(1, config.world_size // max(1, args.nodes))
        emit_sbatch(config, args.nodes, gpn, args.emit_sbatch, partition=args.partition, time_limit=args.time_limit)
        print(f"wrote {args.emit_sbatch}: sbatch it; the result lands in {config.out}/result.json")
        return 0
    results = run_many(configs)
    traces = [_write_traces(config, result) for config, result in zip(configs, results)]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for config, result, written in zip(configs, results, traces):
            _show(config, result)
            if written:
                print(f"  traces: {', '.join(written)} (Chrome trace-event JSON: open both in ui.perfetto.dev "
                      f"or chrome://tracing, 1 ms there = 1 ms)")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def _write_traces(config, result: dict) -> list[str]:
    """Beside a successful ``result.json``: ``trace-measured.json``, the last timed step as each
    rank ran it, and ``trace-simulated.json``, the simulator's timeline of the same schedule with
    the measured median wall time of each pass kind per stage (unit costs without timed steps,
    1 ms per unit). Returns the paths written."""
    if result.get("status") != "ok" or "schedule_text" not in result:
        return []
    schedule = Schedule.from_text(result["schedule_text"], allow_large=True)
    out = Path(config.out)
    written = []
    if result.get("measured_trace"):
        write_measured_trace(schedule, result["measured_trace"], out / "trace-measured.json")
        written.append(str(out / "trace-measured.json"))
    wall = result.get("measured_wall_costs")
    costs = Costs(f=wall["f"], b=wall["b"], w=wall["w"], comm=wall["comm"]) if wall else None
    write_trace(simulate(schedule, costs), out / "trace-simulated.json", us_per_unit=1e6 if wall else 1000.0)
    written.append(str(out / "trace-simulated.json"))
    return written


def _show(config, result: dict) -> None:
    if result["status"] != "ok":
        print(f"{config.schedule}: run failed: {result['failure']}")
        print(f"  log: {result['log']}")
    else:
        st = result["step_time_s"]
        print(f"{config.schedule}: p={config.num_devices} m={config.num_microbatches} model={config.model} "
              f"backend={config.backend} -> {config.out}/result.json")
        print(f"  loss {result['loss']:.6f}  |loss - ref| {result['loss_abs_diff']:.2e}  "
              f"max|grad - ref| {result['grad_max_abs_diff']:.2e} ({result['grad_rel_diff']:.2e} of grad scale)")
        if st["n"]:
            print(f"  step time median {st['median'] * 1e3:.1f} ms (min {st['min'] * 1e3:.1f}, max {st['max'] * 1e3:.1f}); "
                  f"simulated from measured pass costs {result['predicted_step_s'] * 1e3:.1f} ms; "
                  f"{result['tokens_per_s']:.0f} tokens/s")
        for r, (sv, al, th) in enumerate(zip(result["peak_saved_bytes"], result["peak_alloc_bytes"],
                                             result["theory_peak_bytes"])):
            print(f"  rank {r}: peak saved {_fmt_bytes(sv)}, allocator {_fmt_bytes(al)}, theory {_fmt_bytes(th)}"
                  f" (saved/theory {sv / th:.3f}, allocator/theory {al / th:.3f})")
        rec = result.get("recompute")
        if rec:
            for r, (n, k) in enumerate(zip(rec["recomputes"], rec["regions"])):
                print(f"  rank {r}: {rec['mode']} recompute: {k} checkpointed region(s) in the step, recomputed {n} "
                      f"time(s){f' ({n / k:g} per region)' if k else ''}")
        off = result.get("offload")
        if off:
            for r, (hp, ht, moved) in enumerate(zip(off["peak_host_bytes"], off["theory_host_peak_bytes"],
                                                    off["offloaded_bytes"])):
                print(f"  rank {r}: offloaded {_fmt_bytes(moved)} in the step, host peak {_fmt_bytes(hp)}, "
                      f"theory {_fmt_bytes(ht)}")
        elif config.offload:
            print(f"  offload {config.offload:g}: no forward of this schedule is offloaded (one whose backward comes "
                  "next on its device is left alone: docs/theory.md §13)")
