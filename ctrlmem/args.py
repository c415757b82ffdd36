"""Command-line argument helpers shared by the ``ctrlmem`` subcommands (``simulate``, ``export``,
``draw``, ``run`` ...): the schedule-sizing arguments, ``--param KEY=VALUE`` parsing and the user
error type. Feature modules import these from here, never from :mod:`ctrlmem.cli`."""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from .costs import Costs
from .schedules import build

__all__ = ["CliError", "add_schedule_arguments", "parse_params", "schedule_from_args"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def add_schedule_arguments(parser: argparse.ArgumentParser, name: bool = True) -> None:
    """The arguments that pick and size a schedule, shared by every subcommand."""
    if name:
        parser.add_argument("name", help="schedule name (see `ctrlmem list`)")
    parser.add_argument("-p", "--devices", type=int, default=4, help="number of devices p (default 4)")
    parser.add_argument("-m", "--microbatches", type=int, default=8, help="number of microbatches m (default 8)")
    parser.add_argument(
        "--costs",
        default="1,1,1,0",
        help="F,B,W[,COMM]: pass times of one full device-stage and the hop latency (default 1,1,1,0)",
    )
    parser.add_argument(
        "--memory-limit", type=float, default=None,
        help="activation budget as a fraction of 1F1B's peak (memory-budgeted schedules only)",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="extra generator parameter, e.g. --param num_chunks=4 (repeatable)",
    )


def parse_params(items: Sequence[str]) -> dict[str, object]:
    """``["k=v", ...]`` -> ``{k: v}``, each value parsed as JSON when it is JSON, else kept as text."""
    params: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--param expects KEY=VALUE, got {item!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def schedule_from_args(args: argparse.Namespace, name: str | None = None):
    """Build ``(schedule, costs)`` from parsed arguments; raises ``ValueError`` on bad input."""
    costs = Costs.parse(args.costs)
    schedule = build(
        name or args.name,
        args.devices,
        args.microbatches,
        costs=costs,
        memory_limit=args.memory_limit,
        **parse_params(args.param),
    )
    return schedule, costs
