"""``ctrlmem sweep``."""

from __future__ import annotations

import json
import logging
import sys

from ctrlmem.experiments.config import CONFIRM_POINTS, load_config, plan_runs, resolve_root
from ctrlmem.experiments.papermill_cli import without_iri_grammars
from ctrlmem.experiments.slurm import SlurmError
from ctrlmem.experiments.sweep import run_sweep
from ctrlmem.cli.args import float_arg, int_arg


def _cmd_sweep(args) -> int:
    without_iri_grammars()  # before papermill is imported (the parameters check): 1.7 s of CPU less
    root = resolve_root(args.root)
    config = load_config(args.config, root=args.root)
    extra = {"quick": True} if args.quick else None
    if args.list:
        for run in plan_runs(config):
            print(run.run_id, json.dumps(dict(run.params), sort_keys=True))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    n = len(args.only) if args.only else config.num_points
    print(f"{config.name}: {n} point(s); notebook {config.notebook}; running in {root}", flush=True)

    def say(message: str) -> None:
        print(f"ctrlmem sweep: {message}", file=sys.stderr, flush=True)

    slurm = {}  # --- Slurm launcher hook ---
    if (args.launcher or config.launcher) == "slurm":
        slurm = {k: v for k, v in (("wait", not args.no_wait), ("poll_s", args.poll), ("partition", args.partition),
                                   ("account", args.account), ("time_limit", args.time_limit),
                                   ("nodes", args.nodes)) if v is not None}
    try:
        summary = run_sweep(config, results_dir=args.results, build_dir=args.build, force=args.force,
                            only=args.only or None, progress=not args.no_progress, extra_params=extra, root=root,
                            yes=args.yes, lock_wait=None if args.wait_for_lock else 0.0, on_message=say,
                            launcher=args.launcher, **slurm)
    except SlurmError as exc:  # no Slurm here, or it refused a command: one line, exit 2
        print(f"ctrlmem sweep: error: {exc}", file=sys.stderr)
        return 2
    print(f"{config.name}: {len(summary.executed)} executed, {len(summary.reused)} already done; "
          f"ok {summary.count('ok')}, skipped {summary.count('skipped')}, failed {summary.count('failed')}"
          + (f", still on Slurm {summary.count('submitted')}" if summary.count("submitted") else ""))
    if summary.table is not None:
        print(f"table: {summary.table} (+ results.parquet); runs: {summary.results_dir / 'runs'}")
    return 1 if summary.count("failed") else 0


def add_commands(subparsers) -> None:
    """Add ``ctrlmem sweep``."""

    p = subparsers.add_parser(
        "sweep", help="execute an experiment config's notebook once per point (papermill)",
        description="Relative paths (the config, its notebook, --results, --build) mean the current directory, "
                    "or --root. One sweep at a time per results folder (a lock names the holder); Ctrl-C or "
                    "SIGTERM stop the run in flight and everything it started, keeping every finished record.")
    p.add_argument("config", help="experiment config, e.g. experiments/table4_pure_pp_cpu.yaml")
    p.add_argument("--root", default=None, metavar="DIR",
                   help="folder that relative paths mean and the notebooks run in (default: the current directory)")
    p.add_argument("--force", action="store_true", help="rerun points that already finished ok")
    p.add_argument("--quick", action="store_true", help="pass quick=True to every run (CI-sized)")
    p.add_argument("--only", action="append", metavar="RUN_ID", help="run only this run id (repeatable)")
    p.add_argument("--list", action="store_true", help="list the run ids and parameters, run nothing")
    p.add_argument("--results", default=None,
                   help="results folder (default ROOT/experiments/results/NAME)")
    p.add_argument("--build", default=None, help="folder for executed notebooks (default ROOT/build/notebooks/NAME)")
    p.add_argument("--yes", action="store_true",
                   help=f"run a sweep of more than {CONFIRM_POINTS} points (refused without it)")
    p.add_argument("--wait-for-lock", action="store_true",
                   help="if another sweep holds the results folder, wait for it instead of refusing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # --- Slurm launcher hook (ctrlmem/experiments/slurm.py) ---
    p.add_argument("--launcher", choices=("local", "slurm"), default=None,
                   help="where real-run points run: local (default) or slurm (one sbatch job per point; "
                        "default: the config's 'launcher' key)")
    p.add_argument("--no-wait", action="store_true", help="slurm: submit and return; a later sweep collects")
    p.add_argument("--poll", type=float_arg(maximum=3600, what="seconds"), default=None,
                   help="slurm: seconds between job state polls (default 5)")
    p.add_argument("--partition", default=None, help="slurm: partition")
    p.add_argument("--account", default=None, help="slurm: account")
    p.add_argument("--time-limit", default=None, help="slurm: job time limit (default: the config's timeout_s + 2 min)")
    p.add_argument("--nodes", type=int_arg(), default=None, help="slurm: nodes per job (default 1)")
    p.set_defaults(func=_cmd_sweep)
