"""The local launcher: papermill runs one notebook per point in its own process group; records go
to the result store (:mod:`.store`), the table is rebuilt from the records. :func:`run_sweep` is
the entry point of both launchers: it takes the results folder's lock, checks its layout, deals
with what an earlier sweep left in flight, and runs the points here or hands the real-run points
to the Slurm launcher (:mod:`.slurm`, which never imports this module)."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ctrlmem.util import proctree
from ctrlmem.util.fileio import make_output_folder
from ctrlmem.experiments.config import CONFIRM_POINTS, ConfigError, ExperimentConfig, Run, make_run_id, check_parameters, check_points, load_config, plan_runs, resolve_root
from ctrlmem.experiments.store import STATUSES, SweepLock, SweepLocked, SweepSummary, check_layout, default_results_dir, keep_history, read_record, read_records, reap_stale_runs, record_problem, write_json_atomic, write_marker, write_table
from ctrlmem.experiments.slurm import check_slurm
from ctrlmem.experiments.slurm import run_slurm

log = logging.getLogger(__name__)

__all__ = ["RESULT_FILE", "RunOutcome", "Executor", "execute_with_papermill", "select_runs", "run_sweep",
           # the store's names, kept importable from here
           "STATUSES", "SweepLock", "SweepLocked", "SweepSummary", "default_results_dir", "read_record",
           "read_records", "reap_stale_runs", "record_problem", "write_json_atomic", "write_table"]


RESULT_FILE = "result.json"


"""Name of the file a notebook writes into its ``out_dir``."""


@dataclass(frozen=True)
class RunOutcome:
    """What executing one notebook gave: ``status`` ``ok`` / ``skipped`` / ``failed``."""

    status: str
    result: Mapping[str, Any] | None = None
    error: str | None = None


Executor = Callable[[Path, Path, Mapping[str, Any], Path, float], RunOutcome]


"""``(notebook, executed_notebook_path, params, out_dir, timeout_s) -> RunOutcome``."""


def _notebook_error(executed: Path) -> str | None:
    """``ename: evalue`` of the first error output in an executed notebook, if any."""
    try:
        nb = json.loads(executed.read_text())
    except (OSError, ValueError):
        return None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def execute_with_papermill(notebook: Path, executed: Path, params: Mapping[str, Any], out_dir: Path,
                           timeout_s: float, tag: str | None = None, cwd: str | Path | None = None) -> RunOutcome:
    """Run ``notebook`` with papermill (its command line, started by :mod:`.papermill_cli`) in its
    own session; after ``timeout_s``, or when this process is interrupted, end papermill, its
    kernel and everything they started (the process tree and every process carrying ``tag``,
    :mod:`ctrlmem.util.proctree`) before returning.

    The notebook runs in ``cwd`` (default: the current directory) and must write
    ``out_dir/result.json``; a ``status`` key in it (``"skipped"``) is passed on."""
    import yaml  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    executed.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / RESULT_FILE
    if result_path.exists():
        result_path.unlink()
    cmd = [
        sys.executable, "-m", "ctrlmem.experiments.papermill_cli", str(notebook), str(executed),
        "-y", yaml.safe_dump({**params, "out_dir": str(out_dir)}),
        "--cwd", str(Path(cwd) if cwd is not None else Path.cwd()), "--no-progress-bar", "--log-level", "WARNING",
        "-k", "python3",
    ]
    tag = tag or proctree.new_tag("ctrlmem-sweep-run")
    proc = proctree.start(cmd, tag, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proctree.kill_tree(proc, tag)
        return RunOutcome("failed", error=f"timeout: the run exceeded timeout_s={timeout_s:g} s; it and every "
                                          f"process it started were stopped")
    finally:  # normal end, or interrupted (Ctrl-C, SIGTERM): nothing it started outlives it
        with proctree.no_interrupts():
            proctree.kill_tree(proc, tag)
    if proc.returncode != 0:
        error = _notebook_error(executed)
        if error is None:
            tail = (output or "").strip().splitlines()[-3:]
            error = f"papermill exited with status {proc.returncode}: {' | '.join(tail)}"
        return RunOutcome("failed", error=error)
    if not result_path.is_file():
        return RunOutcome("failed", error=f"the notebook finished but wrote no {RESULT_FILE} to out_dir")
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        return RunOutcome("failed", error=f"the notebook wrote an unreadable {result_path}: {exc}")
    if not isinstance(result, dict):
        return RunOutcome("failed", error=f"the notebook wrote {result_path} holding a {type(result).__name__}, "
                                          f"not a JSON object")
    status = result.get("status", "ok")
    if status not in ("ok", "skipped"):
        return RunOutcome("failed", result=result, error=str(result.get("reason") or f"status {status!r}"))
    return RunOutcome(status, result=result, error=result.get("reason") if status == "skipped" else None)


def select_runs(config: ExperimentConfig, extra_params: Mapping[str, Any] | None = None,
                only: Sequence[str] | None = None, check: bool = True) -> list[Run]:
    """The points a sweep runs (either launcher): the config's points with ``extra_params`` merged
    in (their run ids follow), restricted to ``only``; with ``check``, every parameter name is
    checked against the notebook's ``parameters`` cell. ``ConfigError`` on a duplicate point or an
    unknown ``--only`` id."""
    runs = plan_runs(config)
    if config.num_points > CONFIRM_POINTS:
        check_points(config, runs)
    if extra_params:
        runs = [Run(make_run_id({**r.params, **extra_params}), {**r.params, **extra_params}) for r in runs]
    if only:
        missing = sorted(set(only) - {r.run_id for r in runs})
        if missing:
            raise ConfigError(f"--only names unknown run id(s) {missing}; see `ctrlmem sweep {config.path} --list`")
        runs = [r for r in runs if r.run_id in set(only)]
    if check:
        names = set().union(*(r.params for r in runs)) if runs else set()
        check_parameters(config.notebook, names | {"out_dir"})
    return runs


def run_sweep(
    config: ExperimentConfig | str | Path,
    results_dir: str | Path | None = None,
    build_dir: str | Path | None = None,
    force: bool = False,
    only: Sequence[str] | None = None,
    progress: bool = False,
    executor: Executor | None = None,
    check: bool = True,
    extra_params: Mapping[str, Any] | None = None,
    launcher: str | None = None,
    root: str | Path | None = None,
    yes: bool = False,
    lock_wait: float | None = 0.0,
    on_message: Callable[[str], None] | None = None,
    **slurm_options: Any,
) -> SweepSummary:
    """Execute ``config``'s notebook once per point; see the module docstring.

    Args:
        results_dir: where run records and the table go (default ``<root>/experiments/results/<name>``).
        build_dir: where executed notebooks go (default ``<root>/build/notebooks/<name>``).
        force: rerun points whose record says ``ok``.
        only: run ids to run (default all).
        progress: show a tqdm progress bar on stderr.
        executor: runs one notebook (default :func:`execute_with_papermill`; tests inject one).
        check: check parameter names against the notebook before running anything.
        extra_params: parameters added to every point (e.g. ``{"quick": True}``); part of the
            run id.
        launcher: ``"local"`` or ``"slurm"`` (default: the config's ``launcher``); ``"slurm"``
            hands the real-run points to :func:`ctrlmem.experiments.slurm.run_slurm`, which takes
            ``slurm_options`` (``wait``, ``poll_s``, ``partition``, ``account``, ``time_limit``, ``nodes``).
            Either launcher takes the results folder's lock first.
        root: the folder relative paths mean (default: the current directory); the notebook runs
            there.
        yes: run a sweep of more than :data:`CONFIRM_POINTS` points.
        lock_wait: seconds to wait for another sweep holding the results folder (``None``: no limit;
            default ``0``: refuse at once with :class:`SweepLocked` naming the holder).
        on_message: called with one line per notice (stale runs stopped, waiting for a lock);
            default: the log.

    Before the first point runs, the results and build folders' layout is checked
    (:func:`~ctrlmem.experiments.store.check_layout`). A record that cannot be written (a full
    disk) stops the sweep with an ``OSError`` naming it; every record finished before it is kept.
    """
    say = on_message or log.warning
    base = resolve_root(root)
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, root=root)
    if config.num_points > CONFIRM_POINTS and not yes:
        raise ConfigError(f"{config.name} defines {config.num_points} points (more than {CONFIRM_POINTS}); check the "
                          f"grid, then pass --yes (yes=True) to run them all, or --only RUN_ID for some")
    kind = launcher or config.launcher
    if kind not in ("local", "slurm"):
        raise ConfigError(f"launcher must be 'local' or 'slurm', got {launcher!r}")
    if slurm_options and kind != "slurm":
        raise TypeError(f"run_sweep got Slurm options {sorted(slurm_options)} without launcher='slurm'")
    if kind == "slurm":

        check_slurm(**slurm_options)  # Slurm missing, or a bad option: refused before the lock is taken
    runs = select_runs(config, extra_params=extra_params, only=only, check=check)
    results = (base / results_dir if results_dir is not None else default_results_dir(config, base)).absolute()
    build = (base / build_dir if build_dir is not None else base / "build" / "notebooks" / config.name).absolute()
    check_layout(results, build)

    lock = SweepLock(results)  # creates the results folder (git-ignored when it creates it)
    lock.acquire(wait=lock_wait, on_wait=say)
    try:
        make_output_folder(build)  # executed notebooks and run folders: git-ignored when created here
        for message in reap_stale_runs(results):
            say(message)
        local = functools.partial(_run_local, config, results=results, build=build, executor=executor, base=base,
                                  say=say)
        if kind == "slurm":

            return run_slurm(config, runs, results, build, run_local=local, force=force, progress=progress,
                             **slurm_options)
        return local(runs, force=force, progress=progress)
    finally:
        lock.release()


def _run_local(config: ExperimentConfig, runs: Sequence[Run], *, results: Path, build: Path,
               executor: Executor | None, base: Path, say: Callable[[str], None], force: bool = False,
               progress: bool = False, table: bool = True) -> SweepSummary:
    """Run ``runs`` here, one after the other (the results folder's lock is held by the caller);
    rewrite the table at the end (``table``), also when interrupted."""
    executor = executor or execute_with_papermill
    try:
        accepted = inspect.signature(executor).parameters
    except (TypeError, ValueError):
        accepted = {}
    runs_dir = results / "runs"
    summary = SweepSummary(results_dir=results)
    bar = None
    failed: BaseException | None = None
    try:
        if progress:
            from tqdm import tqdm  # noqa: PLC0415 - optional dependency: the core installs with numpy only

            bar = tqdm(total=len(runs), desc=config.name, unit="run", file=sys.stderr)
        for run in runs:
            record_path = runs_dir / f"{run.run_id}.json"
            if record_path.is_file() and not force:
                old, problem = read_record(record_path)
                if problem:
                    say(f"{problem}; running that point again (the file is kept in runs/history/)")
                elif old.get("status") == "ok":
                    summary.reused.append(run.run_id)
                    summary.statuses[run.run_id] = "ok"
                    if bar is not None:
                        bar.update(1)
                    continue
            if bar is not None:
                bar.set_postfix_str(run.run_id, refresh=True)
            started = time.time()
            out_dir = build / run.run_id
            tag = proctree.new_tag("ctrlmem-sweep-run")
            marker = write_marker(results, run.run_id, tag, started)
            kwargs: dict[str, Any] = {}
            if "tag" in accepted:
                kwargs["tag"] = tag
            if "cwd" in accepted:
                kwargs["cwd"] = base
            try:
                outcome = executor(config.notebook, build / f"{run.run_id}.ipynb", dict(run.params), out_dir,
                                   config.timeout_s, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a broken executor must not stop the sweep
                outcome = RunOutcome("failed", error=f"{type(exc).__name__}: {exc}")
            finally:  # also on Ctrl-C / SIGTERM: the executor has stopped everything the run started
                marker.unlink(missing_ok=True)
            record = {
                "run_id": run.run_id,
                "config": config.name,
                "config_path": str(config.path) if config.path else None,
                "notebook": str(config.notebook),
                "executed_notebook": str(build / f"{run.run_id}.ipynb"),
                "params": dict(run.params),
                "status": outcome.status,
                "error": outcome.error,
                "result": dict(outcome.result) if outcome.result is not None else None,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "duration_s": round(time.time() - started, 3),
            }
            if outcome.status == "ok" and record["result"] is None:
                record["status"], record["error"] = "failed", "the executor reported ok but returned no result"
            keep_history(record_path)  # --force or a retry: keep the previous record, never lose it
            write_json_atomic(record_path, record)
            summary.executed.append(run.run_id)
            summary.statuses[run.run_id] = record["status"]
            if record["status"] == "failed":
                log.warning("run %s failed: %s", run.run_id, record["error"])
            elif record["status"] == "skipped":
                log.info("run %s skipped: %s", run.run_id, record["error"])
            if bar is not None:
                bar.update(1)
    except BaseException as exc:
        failed = exc
        raise
    finally:
        if bar is not None:
            bar.close()
        if table and runs_dir.is_dir():
            try:
                summary.table, _ = write_table(results)
            except OSError as exc:
                if failed is None:
                    raise
                # the first error (a full disk writing a record, Ctrl-C) is the one to report
                log.warning("results table not rewritten: %s", exc)
    return summary
