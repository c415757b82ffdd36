"""The ``ctrlmem`` command line.

Subcommands here: ``list``, ``simulate``, ``export``. Feature modules add their own (``draw``, ``optimal``,
``run``, ``sweep``, ``reproduce``) by defining ``add_commands(subparsers)``; list them in
``COMMAND_MODULES``. A module that cannot be imported (a missing optional dependency) leaves
its commands out and says why in ``ctrlmem --help``.

Bad input exits with status 2 and one line on stderr, never a traceback. The argument helpers that
several commands share live in :mod:`ctrlmem.cli.args`, so feature modules never import this one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from typing import Callable, Sequence

from ctrlmem import MemoryModel, ScheduleError, build, simulate
from ctrlmem.util.fileio import atomic_write, check_output_path
from ctrlmem.cli.args import CliError, Parser, Terminated, add_optimize_argument, add_schedule_arguments, optimize_schedule, optimize_summary, os_error_message, schedule_from_args
from ctrlmem.schedules import SCHEDULES
from ctrlmem.planner.gb import simulated_gb
from ctrlmem.planner.emit import torchtitan_schedule
from ctrlmem.model.torchnames import check_torch_class, placement_check
from ctrlmem.plots.trace import trace_events, write_trace

__all__ = ["main", "make_parser", "COMMAND_MODULES"]

MAX_ERROR_LINE = 2000
"""Longest error line the command prints."""

# Modules that contribute subcommands through ``add_commands(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = (
    "ctrlmem.cli.sweep", "ctrlmem.cli.run", "ctrlmem.cli.draw", "ctrlmem.cli.reproduce", "ctrlmem.cli.optimal",
    "ctrlmem.cli.plan",
)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(
            {n: {"summary": s.summary, "source": s.source, "uses_costs": s.uses_costs,
                 "memory_limit": s.memory_limit, "params": {k: repr(v) for k, v in s.params.items()}}
             for n, s in SCHEDULES.items()},
            indent=2,
        ))
        return 0
    width = max(len(n) for n in SCHEDULES)
    for name, spec in SCHEDULES.items():
        extras = []
        if spec.memory_limit:
            extras.append("--memory-limit")
        if spec.params:
            extras.append(", ".join(f"{k}={v!r}" for k, v in spec.params.items()))
        tail = f"  [{'; '.join(extras)}]" if extras else ""
        print(f"{name.ljust(width)}  {spec.summary}{tail}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    schedule, costs = schedule_from_args(args)
    if args.optimize is not None and args.release_at_b:
        raise CliError("--optimize improves under the default memory model (activations released at W); "
                       "drop --release-at-b")
    schedule, opt = optimize_schedule(args, schedule, costs)
    memory = MemoryModel(release_at_b=args.release_at_b)
    result = simulate(schedule, costs, memory)
    if args.json:
        out = result.to_dict(include_passes=args.passes)
        if opt is not None:
            out["optimize"] = {"input": opt.seed[0], "input_makespan": opt.seed[1], "makespan": opt.makespan,
                               "lower_bound": opt.lower_bound, "gap": opt.gap, "status": opt.status,
                               "wall_s": round(opt.wall_s, 3), "bounds": dict(opt.bounds)}
        print(json.dumps(out))
        return 0
    one = simulate(build("1f1b", schedule.num_devices, schedule.num_microbatches, allow_large=args.allow_large),
                   costs, memory)
    ref = max(one.peak_memory)
    print(f"{schedule.name}: p={schedule.num_devices} m={schedule.num_microbatches} "
          f"stages={schedule.num_stages} ({schedule.placement.kind}) costs={args.costs}"
          + (f" offload-cost={costs.offload:g}" if costs.offload else "")
          + (f" fb_overlap={costs.fb_overlap:g}" if costs.fb_overlap != 1.0 else "")
          + (f" levers: {_levers_text(schedule)}" if schedule.recomputes or schedule.offloads else ""))
    if opt is not None:
        print(f"  {optimize_summary(opt)}")
    print(f"  makespan      {result.makespan:g}   (1f1b: {one.makespan:g}, speed-up {one.makespan / result.makespan:.3f}x)")
    print(f"  bubble rate   {result.bubble_rate:.4f}   (1f1b: {one.bubble_rate:.4f})")
    print(f"  peak memory   {max(result.peak_memory):g} a = {max(result.peak_memory) / ref:.3f} of 1f1b's {ref:g} a")
    if getattr(args, "memory_gb_text", None):
        print(f"  budget        {args.memory_gb_text}")
    if args.model:

        gb = simulated_gb(schedule, args.model, args.microbatch_size, args.tp)
        print(f"  activation GB {max(gb):.2f} on the fullest device for {args.model} (each stage's own bytes, "
              f"theory without allocator margin; per device {', '.join(f'{x:.2f}' for x in gb)})")
    print("  per device    " + "  ".join(
        f"d{d}: span {s:g} bubble {b:g} peak {pk:g}"
        for d, (s, b, pk) in enumerate(zip(result.device_spans, result.device_bubbles, result.peak_memory))
    ))
    return 0


def _levers_text(schedule) -> str:
    """``recompute full on 64 of 64 forwards, offload on 12`` for the simulate summary."""
    total = schedule.num_stages * schedule.num_microbatches
    parts = []
    if schedule.recomputes:
        n = sum(ps.op.value == "R" for row in schedule.device_passes for ps in row)
        parts.append(f"recompute {schedule.recompute_mode} on {n} of {total} forwards")
    if schedule.offloads:
        n = sum(c.kind == "O" for row in schedule.copies for c in row)
        parts.append(f"offload on {n} of {total} forwards")
    return ", ".join(parts)


def _check_outputs(args: argparse.Namespace) -> None:
    """``export``'s output arguments, checked before any work: none empty, never one file twice."""
    for flag, value in (("--torch-csv", args.torch_csv), ("--text", args.text), ("--trace", args.trace)):
        if value is not None and not value.strip():
            raise CliError(f"{flag} is empty ({value!r}); give a file name, or '-' to print to stdout")
    if args.torch_csv == "-" and args.text == "-":
        raise CliError("--torch-csv - and --text - both ask for stdout; write one of them to a file")
    if args.torch_csv and args.text and "-" not in (args.torch_csv, args.text):
        if os.path.realpath(args.torch_csv) == os.path.realpath(args.text):
            raise CliError(f"--torch-csv {args.torch_csv} and --text {args.text} name the same file; the second "
                           f"would overwrite the first: give two different files")
    if args.trace == "-" and "-" in (args.torch_csv, args.text):
        raise CliError("--trace - and another '-' output both ask for stdout; write one of them to a file")
    files = [os.path.realpath(v) for v in (args.torch_csv, args.text, args.trace) if v and v != "-"]
    if args.trace and args.trace != "-" and files.count(os.path.realpath(args.trace)) > 1:
        raise CliError(f"--trace {args.trace} names the file of another output; give it its own file")
    for value in (args.torch_csv, args.text, args.trace):
        if value and value != "-":
            check_output_path(value)  # a folder, a missing folder: said before the schedule is built


def _levers_note(schedule) -> str | None:
    """What torch's CSV does not carry of a schedule's levers, and how the runtime maps them."""
    if not (schedule.recomputes or schedule.offloads):
        return None
    parts = []
    if schedule.recomputes:
        parts.append(f"its R passes ({schedule.recompute_mode} recompute) map onto torch.utils.checkpoint around the "
                     f"stage's layers, which recomputes inside the backward (ctrlmem run --recompute "
                     f"{schedule.recompute_mode})")
    if schedule.offloads:
        parts.append("its offload copies map onto torch.autograd.graph.saved_tensors_hooks packing saved tensors "
                     "to host memory")
    return ("note: torch's CSV has no recompute or copy action; the CSV keeps the compute order without them: "
            + "; ".join(parts))


def _torchtitan_line(schedule, csv: str, chosen: str | None = None) -> str:
    schedule = schedule.compute_only()
    try:
        name, why = torchtitan_schedule(schedule)
    except ValueError as exc:
        return f"torchtitan: {exc}"
    name = chosen or name
    return (f"torchtitan: pipeline_parallel_schedule = \"{name}\" ({why}) with pipeline_parallel_schedule_csv = "
            f"\"{csv}\"; {placement_check(schedule)}: another name places the stages differently and the run "
            f"hangs or fails (--torch-schedule NAME checks a name)")


def _torch_schedule(args: argparse.Namespace, schedule) -> str | None:
    """``--torch-schedule``: the class name the user will run the CSV under, refused unless torch
    places the stages under it as the schedule does."""
    if args.torch_schedule is None:
        return None

    try:
        return check_torch_class(schedule, args.torch_schedule)
    except ValueError as exc:
        raise CliError(f"--torch-schedule {args.torch_schedule}: {exc}") from None


def _cmd_export(args: argparse.Namespace) -> int:
    _check_outputs(args)
    schedule, costs = schedule_from_args(args)
    if getattr(args, "memory_gb_text", None):
        print(args.memory_gb_text, file=sys.stderr)
    schedule, opt = optimize_schedule(args, schedule, costs)
    if opt is not None:
        print(optimize_summary(opt), file=sys.stderr)
    note = _levers_note(schedule) if args.torch_csv else None
    if note:
        print(note, file=sys.stderr)
    chosen = _torch_schedule(args, schedule)
    if args.torch_csv == "-":
        sys.stdout.write(schedule.to_torch_csv())
        print(_torchtitan_line(schedule, "FILE.csv", chosen), file=sys.stderr)
    elif args.torch_csv:
        schedule.to_torch_csv(args.torch_csv)
        where = sys.stderr if args.text == "-" else sys.stdout
        print(f"wrote {args.torch_csv} ({schedule.compute_only().num_passes} actions on {schedule.num_devices} ranks)", file=where)
        print(_torchtitan_line(schedule, args.torch_csv, chosen), file=where)
    if args.text == "-":
        sys.stdout.write(schedule.to_text())
    elif args.text:
        atomic_write(args.text, schedule.to_text())
        print(f"wrote {args.text}", file=sys.stderr if args.torch_csv == "-" else sys.stdout)
    if args.trace:
        _write_trace(args, schedule, costs)
    if not (args.torch_csv or args.text or args.trace):
        sys.stdout.write(schedule.to_text())
    return 0


def _write_trace(args: argparse.Namespace, schedule, costs) -> None:
    """``--trace``: the simulated timeline as Chrome / Perfetto trace-event JSON."""

    result = simulate(schedule, costs)
    if args.trace == "-":
        sys.stdout.write(json.dumps(trace_events(result)) + "\n")
        return
    write_trace(result, args.trace)
    where = sys.stderr if "-" in (args.torch_csv, args.text) else sys.stdout
    print(f"wrote {args.trace} (Chrome trace-event JSON: {schedule.num_devices} device tracks, "
          f"{len(result.transfers())} transfers, makespan {result.makespan:g}; open it in ui.perfetto.dev "
          f"or chrome://tracing, 1 ms there = 1 time unit)", file=where)


def make_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ctrlmem",
        description="Design, simulate, draw and run pipeline schedules with controllable memory.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_list = sub.add_parser("list", help="list the registered schedules")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_list.set_defaults(func=_cmd_list)

    p_sim = sub.add_parser("simulate", help="simulate a schedule and print its statistics")
    add_schedule_arguments(p_sim)
    add_optimize_argument(p_sim)
    p_sim.add_argument("--release-at-b", type=float, default=0.0,
                       help="fraction of a stage's activation freed at B (default 0)")
    p_sim.add_argument("--json", action="store_true", help="print one JSON object (SimResult fields)")
    p_sim.add_argument("--passes", action="store_true", help="with --json, include every timed pass")
    p_sim.set_defaults(func=_cmd_simulate)

    p_exp = sub.add_parser("export", help="write a schedule as torch CSV or ctrlmem text")
    add_schedule_arguments(p_exp)
    add_optimize_argument(p_exp)
    p_exp.add_argument("--torch-csv", metavar="FILE",
                       help="torch.distributed.pipelining / torchtitan CSV ('-' prints it)")
    p_exp.add_argument("--text", metavar="FILE", help="ctrlmem's text form ('-' prints it)")
    p_exp.add_argument("--torch-schedule", metavar="CLASS",
                       help="the torch / torchtitan schedule class (pipeline_parallel_schedule) the CSV will run "
                            "under; refused, naming the right one, unless it places the stages as the CSV does")
    p_exp.add_argument("--trace", metavar="FILE.json",
                       help="the simulated timeline (under --costs) as Chrome / Perfetto trace-event JSON: a "
                            "track per device, send lanes, flow arrows, memory counters ('-' prints it)")
    p_exp.set_defaults(func=_cmd_export)

    missing = []
    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module} ({exc})")
            continue
        mod.add_commands(sub)
    if missing:
        parser.epilog = "unavailable commands: " + "; ".join(missing)
    return parser


def _raise_terminated(signum, frame) -> None:
    # the first SIGTERM/SIGHUP stops the command; while it cleans up (ending the processes it
    # started), further ones are ignored so the clean-up is not cut short
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signum)


def _interruption(exc: BaseException) -> BaseException | None:
    """The ``KeyboardInterrupt`` or :class:`Terminated` an exception was raised while handling (its
    ``__context__`` / ``__cause__`` chain), if any: a signal that lands inside a C extension's import
    (ortools', on the first solver call) comes out as that import's ``ImportError``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _stopped(command: str, exc: BaseException) -> int:
    """Say that ``command`` was stopped by ``exc`` (a ``KeyboardInterrupt`` or :class:`Terminated`)
    and return its exit status: 130 for SIGINT, 128 + the signal's number otherwise."""
    if isinstance(exc, Terminated):
        print(f"ctrlmem {command}: terminated ({signal.Signals(exc.signum).name}); everything it started has been "
              "stopped", file=sys.stderr)
        return 128 + exc.signum
    print(f"ctrlmem {command}: interrupted (SIGINT); everything it started has been stopped", file=sys.stderr)
    return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2, one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    func: Callable[[argparse.Namespace], int] = args.func
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, _raise_terminated)
        except ValueError:  # not the main thread (main() called from a worker thread)
            pass
    try:
        return func(args) or 0
    except (CliError, ScheduleError, ValueError, KeyError, TypeError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        if isinstance(exc, ScheduleError):
            msg = exc.reason
        first = str(msg).splitlines()[0] if str(msg).strip() else f"{type(exc).__name__} (no message)"
        if len(first) > MAX_ERROR_LINE:  # a huge input is never repeated in full
            first = first[: MAX_ERROR_LINE - 15] + " ... (cut short)"
        print(f"ctrlmem {args.command}: error: {first}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:
        print(f"ctrlmem {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        return _stopped(args.command, exc)
    except Exception as exc:  # e.g. Ctrl-C during a C extension's import surfaces as its ImportError
        cause = _interruption(exc)
        if cause is None:
            raise
        return _stopped(args.command, cause)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())
