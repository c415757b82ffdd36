"""How far the cyclic family's block is from the shortest one-microbatch block: CP-SAT decides periods.

    .venv/bin/python benchmarks/check_block_period.py -p 16 --costs 2,1,1 --budget 0.25
    .venv/bin/python benchmarks/check_block_period.py -p 16 --costs 3,4,2 --budget 0.25 --seconds 60
    .venv/bin/python benchmarks/check_block_period.py -p 10 --costs 1.7,1,0.8,0.06 --budget 0.4 --resolution finer
    .venv/bin/python benchmarks/check_block_period.py -p 8 --costs 3,4,2 --budget 0.5 --copies 2

For the V-shape at ``p`` devices, costs ``F,B,W[,comm]`` quantised as the cyclic family quantises
them (:data:`ctrlmem.search.families.cyclic.RESOLUTION` slots for the shortest chunk pass; with
``--resolution finer`` the finer resolution its second family lays blocks out at, where two slots
miss the costs; or a number of slots), and the
cap the family searches at ``budget`` (the largest cap of its grid at that fraction of 1F1B's
memory), it prints the family's period (slots), the lower bound the family starts from (a device's
work and Little's law over the shortest lifespans), and then, from one slot below the family's
period down, what CP-SAT says of each period: a block found (``FEASIBLE``/``OPTIMAL``), none exists
(``INFEASIBLE``: the family's period is then the shortest there is) or undecided in ``--seconds``
(``UNKNOWN``). It stops at the first period proven to have no block.

The model is the family's block without its layout rules (docs/theory.md §12, "Cyclic blocks"):
each pass of one microbatch at a start slot, microbatch ``j`` at that slot plus ``j`` periods; the
chain's order and hops; no two passes of a device overlapping modulo the period (each pass an
interval and its copy one period later, over two periods); and each device's exact periodic peak
within the cap — a stage of lifespan ``ℓ = n·T + r`` holds ``n`` activations all the time and one
more over an arc of ``r`` from its forward's start, so per device the floors ``n`` plus a cumulative
of the arcs (each with its copy one period later) stay within the cap. The window of the second
period counts exactly; the others undercount, and the horizon leaves room for every gap of the
chain to be up to a period long (no block needs more), so nothing is wrongly refused. It is a check for
developers (it solves for seconds to minutes); the search never calls a solver.

With ``--copies K`` the block holds ``K`` microbatches, each with its own layout (microbatch ``j``
runs copy ``j mod K`` shifted by ``⌊j / K⌋`` periods), as the family's blocks of several
(:func:`ctrlmem.search.families.cyclic.copies_block`): the model has ``K`` chains, every one of
them on the devices' periodic slots and in their memory, copy 0 entering at slot 0 and the others
after it within the period. The family's period printed is then its block of ``K``, or ``K``
one-microbatch periods where that finds nothing shorter.
"""

from __future__ import annotations

import argparse
import math
import time

from ortools.sat.python import cp_model

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search.families import cyclic
from ctrlmem.search.families.lists import caps


def period_status(placement: Placement, durations, cap: int, period: int, seconds: float, workers: int = 2,
                  copies: int = 1) -> str:
    """CP-SAT's verdict on a block of ``copies`` microbatches (each its own layout; microbatch ``j``
    runs copy ``j mod copies`` shifted by ``⌊j / copies⌋`` periods, as the cyclic family's blocks of
    several) of ``period`` slots within ``cap`` (activation units, one per stage):
    ``"OPTIMAL"``/``"FEASIBLE"`` (one exists), ``"INFEASIBLE"`` or ``"UNKNOWN"``."""
    S, p, dev = placement.num_stages, placement.num_devices, placement.stage_device
    dF, dB, dW, (comm,) = durations
    model = cp_model.CpModel()
    # a gap of a period or more between two consecutive passes of the chain (or between a B and its
    # W) can lose a period without moving any pass's slot modulo the period and only shortens
    # lifespans, so some block of this period, if any, has every such gap below a period: the
    # chain at its shortest plus one period per gap bounds it (each copy's chain starting within
    # the first period)
    horizon = sum(dF) + sum(dB) + max(dW) + 2 * comm * S + (2 * S + 2) * period
    start, phase = {}, {}
    busy = [[] for _ in range(p)]
    arcs = [[] for _ in range(p)]
    floors = [[] for _ in range(p)]
    for i in range(copies):
        for s in range(S):
            for kind, d in (("F", dF[s]), ("B", dB[s]), ("W", dW[s])):
                t = model.NewIntVar(0, horizon, f"t{kind}{s}c{i}")
                q = model.NewIntVar(0, period - 1, f"q{kind}{s}c{i}")
                laps = model.NewIntVar(0, horizon // period + 1, f"n{kind}{s}c{i}")
                model.Add(t == q + period * laps)
                start[kind, s, i], phase[kind, s, i] = t, q
                later = model.NewIntVar(period, 2 * period - 1, "")
                model.Add(later == q + period)
                busy[dev[s]] += [model.NewFixedSizeIntervalVar(q, d, ""), model.NewFixedSizeIntervalVar(later, d, "")]
        for s in range(S):
            if s + 1 < S:
                hop = comm if dev[s] != dev[s + 1] else 0
                model.Add(start["F", s + 1, i] >= start["F", s, i] + dF[s] + hop)
                model.Add(start["B", s, i] >= start["B", s + 1, i] + dB[s + 1] + hop)
            model.Add(start["W", s, i] >= start["B", s, i] + dB[s])
        model.Add(start["B", S - 1, i] >= start["F", S - 1, i] + dF[S - 1])
        # copy 0 enters at 0, the others in order within the period (any block can be so shifted)
        if i == 0:
            model.Add(start["F", 0, i] == 0)
        else:
            model.Add(start["F", 0, i] >= start["F", 0, i - 1])
            model.Add(start["F", 0, i] <= period - 1)
        for s in range(S):
            life = model.NewIntVar(0, horizon, "")
            model.Add(life == start["W", s, i] + dW[s] - start["F", s, i])
            whole = model.NewIntVar(0, horizon // period + 1, "")
            arc = model.NewIntVar(0, period - 1, "")
            model.Add(life == whole * period + arc)
            floors[dev[s]].append(whole)
            q = phase["F", s, i]
            end = model.NewIntVar(0, 2 * period, "")
            model.Add(end == q + arc)
            arcs[dev[s]].append(model.NewIntervalVar(q, arc, end, ""))
            q2 = model.NewIntVar(period, 2 * period, "")
            model.Add(q2 == q + period)
            end2 = model.NewIntVar(period, 3 * period, "")
            model.Add(end2 == q2 + arc)
            arcs[dev[s]].append(model.NewIntervalVar(q2, arc, end2, ""))
    for d in range(p):
        model.AddNoOverlap(busy[d])
        room = model.NewIntVar(0, cap, "")
        model.Add(room == cap - sum(floors[d]))
        model.AddCumulative(arcs[d], [1] * len(arcs[d]), room)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    return solver.StatusName(solver.Solve(model))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, required=True, help="devices (the V-shape: two stages each)")
    ap.add_argument("--costs", required=True, help="F,B,W[,comm] of one device-stage, e.g. 2,1,1")
    ap.add_argument("--budget", type=float, required=True, help="fraction of 1F1B's activation memory, e.g. 0.25")
    ap.add_argument("--seconds", type=float, default=30.0, help="CP-SAT seconds per period (default 30)")
    ap.add_argument("--copies", type=int, default=1,
                    help="microbatches a block, each its own layout (default 1; 2: the family's blocks of two)")
    ap.add_argument("--resolution", default=str(cyclic.RESOLUTION),
                    help=f"slots for the shortest chunk pass: a number, or 'finer' for the finer family's "
                         f"(default {cyclic.RESOLUTION}, the coarse family's)")
    args = ap.parse_args()
    if args.p < 2:
        ap.error(f"-p must be at least 2, got {args.p}")
    try:
        costs = cm.Costs(*[float(x) for x in args.costs.split(",")])
    except (TypeError, ValueError) as e:
        ap.error(f"--costs must be F,B,W or F,B,W,comm (numbers): {e}")
    if not args.seconds > 0:
        ap.error(f"--seconds must be a positive number of CP-SAT seconds per period, got {args.seconds:g}")
    if args.copies < 1:
        ap.error(f"--copies must be at least 1 microbatch a block, got {args.copies}")
    if not 0 < args.budget <= cyclic.TOP:
        ap.error(f"--budget must be in (0, {cyclic.TOP:g}], the caps the cyclic family searches; got {args.budget:g}")
    placement = Placement.v_shape(args.p)
    if args.resolution == "finer":
        resolution = cyclic.resolutions(placement, costs)[-1]
        if resolution == cyclic.RESOLUTION:
            print(f"{cyclic.RESOLUTION} slots a shortest pass are exact for these costs: the finer family "
                  f"searches nothing; checking {cyclic.RESOLUTION}")
    else:
        try:
            resolution = int(args.resolution)
        except ValueError:
            ap.error(f"--resolution must be a whole number of slots or 'finer', got {args.resolution!r}")
        if resolution < 1:
            ap.error(f"--resolution must be at least 1 slot, got {resolution}")
    finer = resolution != cyclic.RESOLUTION
    durations = cyclic.quantise(placement, costs, resolution)
    if durations is None:
        ap.error("these costs have no pass time to quantise (every chunk pass is 0)")
    base = placement.num_stages // args.p
    grid = caps(args.p, int(math.floor(args.budget * base * args.p + 1e-9)), base)
    if not grid:
        ap.error(f"no cap of the family's grid fits {args.budget:g} of 1F1B's memory at p = {args.p}")
    cap = grid[-1]
    dF, dB, dW, (comm,) = durations
    K = args.copies
    lower = cyclic._chain_bounds(placement, dF, dB, dW, comm, cap, K)
    t = time.process_time()
    # as the family searches this resolution: fewer restarts and its delay changes scaled when finer
    scale = max(1, round(resolution / cyclic.RESOLUTION))
    one = cyclic._one_block(placement, durations, cap, cyclic.ITERS, cyclic.FINER_SEEDS if finer else cyclic.SEEDS,
                            scale)
    found = None if one is None else one[:2]
    if found and K > 1:  # the family's block of K: shorter than K one-microbatch blocks, or those repeated
        several = cyclic.copies_block(placement, durations, cap, one, copies=K, scale=scale)
        found = several if several is not None else (K * one[0], None)
    took = time.process_time() - t
    print(f"p = {args.p}, costs {args.costs}, budget {args.budget:g}: cap {cap} half-activations; "
          f"{resolution} slots a shortest pass, F/B/W/comm {dF[0]}/{dB[0]}/{dW[0]}/{comm}")
    what = "block" if K == 1 else f"block of {K} microbatches"
    print(f"lower bound {lower} slots; the family's {what}: {found[0] if found else 'none'} slots "
          f"({took:.2f} s of CPU)")
    if not found:
        return
    for period in range(found[0] - 1, lower - 1, -1):
        t = time.time()
        verdict = period_status(placement, durations, cap, period, args.seconds, copies=K)
        print(f"  period {period}: {verdict} ({time.time() - t:.1f} s)", flush=True)
        if verdict == "INFEASIBLE":
            break


if __name__ == "__main__":
    main()
