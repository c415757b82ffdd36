"""``ctrlmem optimal``: the exact shortest schedule of a small pipeline (:func:`ctrlmem.solver.optimal.optimal`);
``ctrlmem bound``: the lower bounds on every schedule's makespan within a budget, at any size
(:func:`ctrlmem.search.bounds.makespan_bounds` and :func:`ctrlmem.solver.relax.relaxed_bounds`)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ctrlmem.cli.args import float_arg, int_arg, memory_limit_arg
from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Op, Placement
from ctrlmem.search.bounds import makespan_bounds
from ctrlmem.solver.relax import SECONDS as RELAX_SECONDS, relaxed_bounds
from ctrlmem.model.simulate import simulate
from ctrlmem.solver.optimal import MAX_TIME_LIMIT, PLACEMENTS, optimal
from ctrlmem.util.fileio import atomic_write, check_output_path

__all__ = ["add_commands", "MAX_BOUND_DEVICES", "MAX_BOUND_MICROBATCHES"]

MAX_BOUND_DEVICES = 10_000
"""``ctrlmem bound``'s largest ``p``: the closed forms take about a second at p = 4,096 (they grow
with ``p``, not with ``m``)."""
MAX_BOUND_MICROBATCHES = 10**9
"""``ctrlmem bound``'s largest ``m`` (a multiplier in the closed forms; beyond it a float overflows)."""


def _cmd_optimal(args: argparse.Namespace) -> int:
    if args.text:
        check_output_path(args.text)  # before the solver runs, not after
    costs = Costs.parse(args.costs)  # a ValueError naming the bad part: one line, exit status 2
    if args.offload_cost is not None:
        costs = dataclasses.replace(costs, offload=args.offload_cost)
    r = optimal(args.devices, args.microbatches, costs, args.memory_limit, args.placement, args.time_limit, args.workers,
                recompute=args.recompute, offload=args.offload, deterministic=args.deterministic)
    sim = simulate(r.schedule, costs)
    recomputed = sum(1 for row in r.schedule.device_passes for ps in row if ps.op is Op.R)
    offloaded = sum(1 for row in r.schedule.copies for c in row if c.kind == "O")
    if args.json:
        print(json.dumps({
            "num_devices": args.devices, "num_microbatches": args.microbatches, "costs": costs.to_dict(),
            "memory_limit": args.memory_limit, "placement": args.placement, "status": r.status,
            "makespan": r.makespan, "lower_bound": r.lower_bound, "gap": r.gap, "seed": list(r.seed),
            "wall_s": round(r.wall_s, 3), "peak_memory": sim.peak_memory, "bubble_rate": sim.bubble_rate,
            "max_span": max(sim.device_spans), "schedule": r.schedule.to_text(),
            "recompute": args.recompute, "recomputed_forwards": recomputed,
            "offload": args.offload, "offload_cost": costs.offload, "offloaded_forwards": offloaded,
            "cut_short": r.cut_short,
        }))
    else:
        lim = "none" if args.memory_limit is None else f"{args.memory_limit:g}"
        print(f"optimal: p={args.devices} m={args.microbatches} costs={args.costs} memory_limit={lim} "
              f"placement={args.placement}")
        print(f"  status {r.status} after {r.wall_s:.1f} s; makespan {r.makespan:g}, lower bound "
              f"{r.lower_bound:g} (gap {100 * r.gap:.2f} %)")
        if r.cut_short:
            print("  stopped by the wall-clock safety limit before its deterministic budget was spent: this result "
                  "depends on this machine's speed and load (run again on a quieter machine for the reproducible one)")
        if r.seed[0]:
            print(f"  heuristic seed {r.seed[0]}: makespan {r.seed[1]:g} ({r.seed[1] / r.makespan:.4f}x the solver's)")
        else:
            print("  heuristic seed: none fits the budget (the solver started from nothing)")
        print(f"  peak {max(sim.peak_memory):g} a, longest span {max(sim.device_spans):g}, bubble rate "
              f"{sim.bubble_rate:.4f}")
        total = r.schedule.num_stages * args.microbatches
        if args.recompute != "none":
            print(f"  recompute {args.recompute} allowed: the solver recomputes {recomputed} of {total} forwards")
        if args.offload != "none":
            print(f"  offload {args.offload} allowed (a copy of one a takes {costs.offload:g}): the solver offloads "
                  f"{offloaded} of {total} forwards")
    if args.text:
        atomic_write(args.text, r.schedule.to_text() + "\n")
    return 0


def _cmd_bound(args: argparse.Namespace) -> int:
    costs = Costs.parse(args.costs)
    p, m = args.devices, args.microbatches
    P = Placement.v_shape(p) if args.placement == "v-shape" else Placement.sequential(p)
    cap = None if args.memory_limit is None else args.memory_limit * p
    closed = makespan_bounds(P, m, costs, cap, fused=args.fused)
    devices = []
    relax = args.relax if args.relax is not None else (RELAX_SECONDS if cap is not None else 0.0)
    if args.window is not None and cap is None:
        raise ValueError("bound: --window chains the one-device relaxation, which needs --memory-limit (without a "
                         "cap there is nothing to chain); give --memory-limit or leave --window out")
    if relax > 0:
        if cap is None:
            raise ValueError("bound: --relax needs --memory-limit (without a cap the relaxation is the per-device "
                             "bound); give --memory-limit or --relax 0")
        if cap < 1 - 1e-9:  # both placements: one microbatch's activations on a device are 1 a
            raise ValueError(f"bound: --memory-limit {args.memory_limit:g} holds less than one microbatch's activations "
                             f"on a device; the smallest budget is 1/p = {1 / p:.4g}")
        devices = relaxed_bounds(P, m, costs, cap, fused=args.fused, seconds=relax, window=args.window)
    elif args.window is not None:
        raise ValueError("bound: --window chains the one-device relaxation, which --relax 0 turns off; "
                         "give --relax SECONDS or leave --window out")
    best_name, best = max(closed.items(), key=lambda kv: kv[1])
    if devices and max(r.bound for r in devices) > best:
        top = max(devices, key=lambda r: r.bound)
        best_name, best = f"one device ({top.device})", top.bound
    if args.json:
        print(json.dumps({"num_devices": p, "num_microbatches": m, "costs": costs.to_dict(),
                          "memory_limit": args.memory_limit, "placement": args.placement, "fused": args.fused,
                          "closed_forms": closed, "one_device": [dataclasses.asdict(r) for r in devices],
                          "relax_seconds": relax, "window": args.window, "lower_bound": best, "best": best_name}))
        return 0
    lim = "none" if args.memory_limit is None else f"{args.memory_limit:g}"
    print(f"bound: p={p} m={m} costs={args.costs} memory_limit={lim} placement={args.placement}"
          f"{' fused backward' if args.fused else ''}")
    print("  closed forms (docs/theory.md §6): " + ", ".join(f"{k} {v:g}" for k, v in closed.items()))
    if devices:
        w = devices[0].window
        how = (f", windows of {w} microbatches chained ({relax:g} solver-seconds a solve; * = every window's solve "
               f"proven)" if w else f" ({relax:g} solver-seconds a device; * = its optimum proven)")
        print(f"  one-device relaxation{how}: "
              + ", ".join(f"{r.device}: {r.bound:g}{'*' if r.proven else ''}" for r in devices))
    print(f"  every schedule within the budget takes at least {best:g} ({best_name})")
    return 0


def add_commands(subparsers) -> None:
    """Add ``optimal`` and ``bound`` to the ``ctrlmem`` command line."""
    b = subparsers.add_parser(
        "bound", help="lower bounds on every schedule's makespan within a budget, at any size (closed forms, and "
                      "each device's relaxation solved by CP-SAT)")
    b.add_argument("-p", "--devices", type=int_arg(maximum=MAX_BOUND_DEVICES, what="devices"), default=4,
                   help=f"number of devices p (default 4; at most {MAX_BOUND_DEVICES:,})")
    b.add_argument("-m", "--microbatches", type=int_arg(maximum=MAX_BOUND_MICROBATCHES, what="microbatches"), default=8,
                   help=f"number of microbatches m (default 8; at most {MAX_BOUND_MICROBATCHES:,})")
    b.add_argument("--costs", default="1,1,1,0",
                   help="F,B,W[,COMM]: pass times of one full device-stage and the hop latency (default 1,1,1,0)")
    b.add_argument("--memory-limit", type=memory_limit_arg, default=None,
                   help="activation budget as a fraction of 1F1B's peak (default: unlimited)")
    b.add_argument("--placement", choices=PLACEMENTS, default="v-shape", help="stage placement (default v-shape)")
    b.add_argument("--fused", action="store_true", help="schedules with a fused backward (BW, no B/W split)")
    b.add_argument("--relax", type=float_arg(maximum=MAX_TIME_LIMIT, positive=False, minimum=0.0, what="seconds"), default=None,
                   metavar="SECONDS",
                   help="solver-seconds per device for the one-device relaxation (deterministic; 0: closed forms "
                        f"only; default {RELAX_SECONDS:g} with --memory-limit, else 0)")
    b.add_argument("--window", type=int_arg(minimum=2, what="microbatches"), default=None, metavar="N",
                   help="where m is larger, bound each device's relaxation from windows of at most N microbatches "
                        "chained (2N - 1 solves a device, --relax seconds each; V-shape: about 12-14 is where "
                        "CP-SAT still proves a window in seconds) instead of solving all m at once")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=_cmd_bound)
    p = subparsers.add_parser(
        "optimal", help="exact shortest schedule for a small pipeline (CP-SAT), with its proven lower bound")
    p.add_argument("-p", "--devices", type=int_arg(), default=4, help="number of devices p (default 4)")
    p.add_argument("-m", "--microbatches", type=int_arg(), default=8, help="number of microbatches m (default 8)")
    p.add_argument("--costs", default="1,1,1,0",
                   help="F,B,W[,COMM]: pass times of one full device-stage and the hop latency (default 1,1,1,0)")
    p.add_argument("--memory-limit", type=memory_limit_arg, default=None,
                   help="activation budget as a fraction of 1F1B's peak (default: unlimited)")
    p.add_argument("--placement", choices=PLACEMENTS, default="v-shape", help="stage placement (default v-shape)")
    p.add_argument("--time-limit", type=float_arg(maximum=MAX_TIME_LIMIT, what="seconds"), default=60.0,
                   help="seconds for the whole search: heuristic hint, model, solver (default 60)")
    p.add_argument("--workers", type=int_arg(1, 256), default=2, help="solver threads (default 2)")
    p.add_argument("--recompute", choices=("none", "full", "selective"), default="none",
                   help="let the solver recompute any forward in this mode, its choice per stage and microbatch "
                        "(an R pass before its B; docs/theory.md §13); the bound then covers such schedules too")
    p.add_argument("--offload", default="none", metavar="none|auto|FRACTION",
                   help="let the solver offload any forward it does not recompute: this share of its activation "
                        "(auto: all of it) to host memory after it and back before its backward, on the device's "
                        "copy lanes (docs/theory.md §13); the bound then covers such schedules too")
    p.add_argument("--offload-cost", type=float_arg(positive=False), default=None, metavar="T",
                   help="time of one a of activation copied between device and host, each direction "
                        "(Costs.offload; default 0)")
    p.add_argument("--deterministic", action="store_true",
                   help="count the solver's deterministic time (one worker, fixed seed): the same result on any "
                        "machine and load")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--text", metavar="FILE", help="also write the schedule in ctrlmem's text form")
    p.set_defaults(func=_cmd_optimal)
