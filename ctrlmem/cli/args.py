"""Command-line argument helpers shared by the ``ctrlmem`` subcommands (``simulate``, ``export``,
``draw``, ``run`` ...): the schedule-sizing arguments, ``--param KEY=VALUE`` parsing and the user
error type. Feature modules import these from here, never from :mod:`ctrlmem.cli`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Sequence

from ctrlmem.model.costs import Costs
from ctrlmem.schedules import build
from ctrlmem.schedules.registry import is_schedule_file
from ctrlmem.util.fileio import describe_os_error
from ctrlmem.util.checks import MAX_MEMORY_LIMIT
from ctrlmem.planner.gb import memory_limit_from_gb
from ctrlmem.planner.model import model_spec
from ctrlmem.model.ir import Schedule
from ctrlmem.model.validate import validate
from ctrlmem.solver.optimal import MAX_TIME_LIMIT
from ctrlmem.solver.improve import improve
import math
from ctrlmem.model.levers import lever_mode, offload_choice
from ctrlmem.schedules.registry import apply_levers
from ctrlmem.util.userfile import MAX_JSON_DEPTH, nesting_depth

__all__ = ["CliError", "Terminated", "Parser", "add_schedule_arguments", "add_memory_gb_arguments",
           "apply_memory_gb", "parse_params", "schedule_from_args", "os_error_message",
           "int_arg", "float_arg", "memory_limit_arg", "add_optimize_argument", "optimize_schedule",
           "optimize_summary"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) turned into an exception, so ``finally`` blocks stop what the command
    started; ``ctrlmem`` exits with 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def os_error_message(exc: OSError) -> str:
    """One line for a file or OS error: what went wrong, where, and the fix (never a bare errno);
    :func:`ctrlmem.util.fileio.describe_os_error`."""

    return describe_os_error(exc)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``ctrlmem CMD: error: ...``, exit status
    2) naming the argument, the problem and where the usage is, instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def int_arg(minimum: int = 1, maximum: int | None = None, what: str = ""):
    """An argparse ``type``: an integer ``>= minimum`` (and ``<= maximum``)."""
    kind = "a positive integer" if minimum == 1 else ("an integer >= 0" if minimum == 0 else f"an integer >= {minimum}")
    extra = f" ({what})" if what else ""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind}{extra}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {kind}{extra}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{extra}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_arg(positive: bool = True, maximum: float | None = None, what: str = "", minimum: float | None = None):
    """An argparse ``type``: a finite number (``> 0`` when ``positive``; ``>= minimum``;
    ``<= maximum``)."""

    extra = f" ({what})" if what else ""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number{extra}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number{extra}, got {text!r}")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0{extra}, got {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}{extra}, got {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}{extra}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def memory_limit_arg(text: str) -> float:
    """``--memory-limit``: a fraction of 1F1B's peak, finite, > 0, at most
    :data:`ctrlmem.util.checks.MAX_MEMORY_LIMIT`."""


    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number (a fraction of 1F1B's peak, e.g. 0.5), got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive fraction of 1F1B's peak (e.g. 0.5), got {text!r}")
    if value > MAX_MEMORY_LIMIT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_MEMORY_LIMIT:g} (a fraction of 1F1B's peak; no "
                                         f"schedule can use more), got {text!r}")
    return value


def add_schedule_arguments(parser: argparse.ArgumentParser, name: bool = True) -> None:
    """The arguments that pick and size a schedule, shared by every subcommand."""
    if name:
        parser.add_argument("name", help="schedule name (see `ctrlmem list`), or a schedule file: a "
                                         "torch / torchtitan pipelining CSV or ctrlmem's text form")
    parser.add_argument("-p", "--devices", type=int_arg(), default=4, action=_Explicit,
                        help="number of devices p (default 4; a schedule file sets its own)")
    parser.add_argument("-m", "--microbatches", type=int_arg(), default=8, action=_Explicit,
                        help="number of microbatches m (default 8; a schedule file sets its own)")
    parser.add_argument(
        "--costs",
        default="1,1,1,0",
        help="F,B,W[,COMM]: pass times of one full device-stage and the hop latency (default 1,1,1,0)",
    )
    parser.add_argument(
        "--fb-overlap", type=float, default=1.0, metavar="X",
        help="time of an overlapped forward + backward pair (DualPipe's F&B) as a fraction of F + B, in (0, 1] "
             "(default 1: no gain; docs/theory.md §14)",
    )
    parser.add_argument(
        "--memory-limit", type=memory_limit_arg, default=None,
        help="activation budget as a fraction of 1F1B's peak (memory-budgeted schedules only)",
    )
    add_memory_gb_arguments(parser)
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="extra generator parameter, e.g. --param num_chunks=4 (repeatable)",
    )
    parser.add_argument(
        "--allow-large", action="store_true",
        help="build schedules of more than 2,000,000 passes (refused by default: slow, several GB)",
    )
    add_lever_arguments(parser)


def add_lever_arguments(parser: argparse.ArgumentParser) -> None:
    """``--recompute``, ``--offload``, ``--offload-cost``: the memory levers (docs/theory.md §13)."""
    group = parser.add_argument_group("memory levers (docs/theory.md §13)")
    group.add_argument("--recompute", choices=("none", "selective", "full", "auto"), default="none",
                       help="activation recomputation: an R of every forward before its backward (full: keep the "
                            "stage input only; selective: keep all but attention's s x s part); auto: chosen by a "
                            "budgeted search under --memory-limit (default none)")
    group.add_argument("--offload", default="none", metavar="none|auto|FRACTION",
                       help="offload this fraction of every forward's activation to host memory (or auto: chosen "
                            "by a budgeted search under --memory-limit; default none)")
    group.add_argument("--offload-cost", type=float_arg(positive=False), default=None, metavar="T",
                       help="time of one a of activation copied between device and host, each direction "
                            "(Costs.offload; default 0)")


def add_memory_gb_arguments(parser: argparse.ArgumentParser) -> None:
    """``--memory-gb`` beside ``--memory-limit``, with the model it needs to convert GB into a
    fraction of 1F1B's peak (:func:`ctrlmem.planner.gb.memory_limit_from_gb`)."""
    group = parser.add_argument_group("memory in GB (instead of --memory-limit)")
    group.add_argument("--memory-gb", type=float_arg(maximum=1e6, what="GB"), default=None,
                       help="activation budget per device in GB for --model (converted to a fraction of 1F1B's peak)")
    group.add_argument("--model", default=None, help="paper model for --memory-gb and GB output: 9.6b, 21b, 38.5b, "
                                                     "98.5b")
    group.add_argument("--microbatch-size", type=int_arg(1, 1_000_000), default=None,
                       help="sequences per microbatch for --model (default: the paper's, 4 / 2 / 1 / 1)")
    group.add_argument("--seq-len", type=int_arg(1, 10_000_000), default=None, help="sequence length for --model (default 1024)")
    group.add_argument("--tp", type=int_arg(1, 1_000_000), default=1, help="tensor-parallel degree for --model (default 1)")


def apply_memory_gb(args: argparse.Namespace, name: str | None = None) -> str | None:
    """Turn ``--memory-gb`` into ``args.memory_limit`` (once) and return the line that says how,
    or ``None`` when no GB budget was given. ``CliError`` names what is missing or clashing."""
    gb = getattr(args, "memory_gb", None)
    if gb is None:
        if getattr(args, "model", None) is None and (getattr(args, "microbatch_size", None) is not None
                                                     or getattr(args, "seq_len", None) is not None):
            raise CliError("--microbatch-size and --seq-len describe --model; give --model too")
        return None
    if getattr(args, "memory_limit", None) is not None:
        raise CliError("give --memory-limit (a fraction of 1F1B's peak) or --memory-gb (GB), not both")
    if not getattr(args, "model", None):
        raise CliError("--memory-gb needs --model (9.6b, 21b, 38.5b or 98.5b) to turn GB into a fraction of 1F1B's "
                       "peak; or give --memory-limit")
    name = name or getattr(args, "name", None)
    if name is not None and is_schedule_file(name):
        raise CliError(f"--memory-gb applies to generators; {name} is a schedule file (its memory is what its "
                       "order gives)")

    try:
        spec = model_spec(args.model, seq_len=args.seq_len)
        limit, text = memory_limit_from_gb(gb, spec, args.devices, args.microbatch_size, args.tp)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    args.memory_limit = limit
    args.memory_gb = None
    args.memory_gb_text = text
    return text


class _Explicit(argparse.Action):
    """Store the value and remember that the user gave it (``namespace.explicit``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        explicit = set(getattr(namespace, "explicit", set()))
        explicit.add(self.dest)
        namespace.explicit = explicit


def parse_params(items: Sequence[str]) -> dict[str, object]:
    """``["k=v", ...]`` -> ``{k: v}``, each value parsed as JSON when it is JSON, else kept as text."""
    params: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--param expects KEY=VALUE, got {item!r}")
        too_deep = CliError(f"--param {key[:40]}: the value nests lists / objects more than {MAX_JSON_DEPTH} deep; "
                            "give a number, text or a short list")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
        except RecursionError:
            raise too_deep from None
        if nesting_depth(params[key]) > MAX_JSON_DEPTH:
            raise too_deep
    return params


def schedule_from_args(args: argparse.Namespace, name: str | None = None):
    """Build ``(schedule, costs)`` from parsed arguments; raises ``ValueError`` on bad input.

    ``name`` (default ``args.name``) is a registered schedule, or a file holding one (torch /
    torchtitan CSV or ctrlmem's text form, see :meth:`ctrlmem.Schedule.load`), which is read,
    validated and simulated as it is: its own p and m; ``-p``/``-m`` given explicitly must
    agree (``-m`` may name more microbatches than a CSV's largest index)."""
    costs = Costs.parse(args.costs)
    if getattr(args, "offload_cost", None) is not None:
        costs = dataclasses.replace(costs, offload=args.offload_cost)
    levers = {"recompute": getattr(args, "recompute", "none"), "offload": getattr(args, "offload", "none")}
    if getattr(args, "fb_overlap", 1.0) != 1.0:
        costs = dataclasses.replace(costs, fb_overlap=args.fb_overlap)
    name = name or args.name
    apply_memory_gb(args, name)
    if is_schedule_file(name):
        if "auto" in levers.values():
            raise CliError(f"--recompute/--offload auto searches a generator's orders; {name} is a schedule file: "
                           "give a fixed lever (none, selective, full; an offload fraction)")

        schedule = _schedule_from_file(args, name)
        return apply_levers(schedule, lever_mode(levers["recompute"]), offload_choice(levers["offload"]), costs), costs
    schedule = build(
        name,
        args.devices,
        args.microbatches,
        costs=costs,
        memory_limit=args.memory_limit,
        allow_large=getattr(args, "allow_large", False),
        **levers,
        **parse_params(args.param),
    )
    return schedule, costs


def _schedule_from_file(args: argparse.Namespace, path: str):

    if not os.path.lexists(path):
        raise CliError(f"{path}: no such file, and not a registered schedule (see `ctrlmem list`)")
    if os.path.isdir(path):
        raise CliError(f"{path} is a folder; give a schedule file (a torch CSV or ctrlmem's text form) or a "
                       f"registered schedule (see `ctrlmem list`)")
    explicit = getattr(args, "explicit", set())
    if args.param:
        raise CliError(f"--param applies to generators; {path} is a schedule file")
    if getattr(args, "memory_limit", None) is not None:
        raise CliError(f"--memory-limit applies to generators; {path} is a schedule file "
                       "(its memory is what its order gives)")
    m = args.microbatches if "microbatches" in explicit else None
    schedule = Schedule.load(path, num_microbatches=m, allow_large=getattr(args, "allow_large", False))
    if "devices" in explicit and args.devices != schedule.num_devices:
        raise CliError(f"-p {args.devices} does not match {path}, which has {schedule.num_devices} ranks")
    if m is not None and m != schedule.num_microbatches:
        raise CliError(f"-m {m} does not match {path}, which has m={schedule.num_microbatches}")
    validate(schedule)
    return schedule


def add_optimize_argument(parser: argparse.ArgumentParser) -> None:
    """``--optimize SECONDS``: improve the schedule with the solver (:func:`ctrlmem.improve`)."""

    parser.add_argument(
        "--optimize", type=float_arg(maximum=MAX_TIME_LIMIT, what="seconds"), default=None, metavar="SECONDS",
        help="improve the schedule with the solver (cm.improve: CP-SAT over windows of the schedule) for this "
             "many seconds, within --memory-limit (default: the schedule's own peak); prints the makespan "
             "before and after, the proven lower bound and the gap")


def optimize_schedule(args: argparse.Namespace, schedule, costs):
    """``(schedule, result)``: ``schedule`` improved for ``args.optimize`` seconds (``result`` the
    :class:`~ctrlmem.solver.optimal.OptimalResult`), or as it is with ``None`` without ``--optimize``.
    Recompute passes are reordered with the rest (the same forwards stay recomputed); offloaded
    forwards stay offloaded, each reload issued after the same pass (:func:`ctrlmem.improve`)."""
    seconds = getattr(args, "optimize", None)
    if seconds is None:
        return schedule, None

    limit = getattr(args, "memory_limit", None)
    res = improve(schedule, costs, memory_limit=limit, time_limit=seconds)
    return res.schedule, res


def optimize_summary(result) -> str:
    """One line: the input's and the improved makespan, the bound and the gap."""
    name, before = result.seed
    change = 100 * (result.makespan / before - 1) if before else 0.0
    return (f"optimize {result.wall_s:.1f} s: {name} makespan {before:g} -> {result.makespan:g} ({change:+.2f} %), "
            f"lower bound {result.lower_bound:.6g}, gap {100 * result.gap:.2f} % ({result.status})")
