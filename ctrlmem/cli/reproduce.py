"""``ctrlmem reproduce``."""

from __future__ import annotations

import logging

from ctrlmem.reproduce.report import ARTIFACTS, QUICK_OUT, default_out, reproduce
from ctrlmem.cli.args import CliError


def _cmd_reproduce(args) -> int:
    # progress lines from ctrlmem only: kaleido and choreographer log every browser step at INFO
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("ctrlmem").setLevel(logging.INFO)

    out = default_out(args.quick) if args.out is None else args.out
    if args.quick and args.out is None:
        print(f"--quick: writing the smaller grids' results to {QUICK_OUT}/ (the committed full-size figures/ "
              "stay as they are; --out figures replaces them)")
    try:
        path = reproduce(out, quick=args.quick, only=args.only, replay=args.replay, root=args.root)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {path}")
    print(path.read_text())
    return 0


def add_commands(subparsers) -> None:
    """Add ``ctrlmem reproduce``."""
    p = subparsers.add_parser("reproduce", help="regenerate the tables next to the paper's numbers (figures/)")
    p.add_argument("--quick", action="store_true", help="smaller grids (CI-sized)")
    p.add_argument("--only", action="append", metavar="ARTIFACT",
                   help=f"only this artifact (repeatable): {', '.join(ARTIFACTS)}")
    p.add_argument("--out", default=None,
                   help=f"output folder (default figures/; with --quick {QUICK_OUT}/, so that the quick grids never "
                        "replace the committed full-size results)")
    p.add_argument("--replay", metavar="FILE", default=None,
                   help="a rank-replay JSON written by `ctrlmem replay` for the gpu-replay artifact "
                        "(default: the shipped H200 measurement, ctrlmem/data/h200_rank_replay.json)")
    p.add_argument("--root", metavar="DIR", default=None,
                   help="the project folder holding experiments/ and notebooks/ (default: the current directory); "
                        "cpu-real-memory runs its experiments/cpu_real_memory.yaml")
    p.set_defaults(func=_cmd_reproduce)
