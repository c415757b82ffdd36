"""The sweep runner and the result store: papermill runs one notebook per point in its own process
group, records are written atomically, the table is rebuilt from the records."""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import proctree
from .config import (CONFIRM_POINTS, ConfigError, ExperimentConfig, Run, _run_id, check_parameters, check_points,
                     load_config, plan_runs, resolve_root)

log = logging.getLogger(__name__)


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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; records are ordinary files
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    """Run ``notebook`` with papermill in its own session; after ``timeout_s``, or when this
    process is interrupted, end papermill, its kernel and everything they started (the process
    tree and every process carrying ``tag``, :mod:`ctrlmem.proctree`) before returning.

    The notebook runs in ``cwd`` (default: the current directory) and must write
    ``out_dir/result.json``; a ``status`` key in it (``"skipped"``) is passed on."""
    import yaml

    executed.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / RESULT_FILE
    if result_path.exists():
        result_path.unlink()
    cmd = [
        sys.executable, "-m", "papermill", str(notebook), str(executed),
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


def default_results_dir(config: ExperimentConfig, root: str | Path | None = None) -> Path:
    """``<root>/experiments/results/<name>`` (root: the current directory unless given)."""
    return resolve_root(root) / "experiments" / "results" / config.name


STATUSES = ("ok", "skipped", "failed", "submitted")  # submitted: a job the Slurm launcher tracks


def record_problem(data: Any, expected_id: str | None = None) -> str | None:
    """Why ``data`` is not a valid run record (``None`` when it is one)."""
    if not isinstance(data, dict):
        return f"holds a {type(data).__name__} ({json.dumps(data)[:40]}), not a run record object"
    missing = [k for k in ("run_id", "status", "params") if k not in data]
    if missing:
        return f"misses key(s) {missing}"
    if not isinstance(data["run_id"], str) or (expected_id is not None and data["run_id"] != expected_id):
        return f"has run_id {data['run_id']!r}, not {expected_id!r} (its file name)"
    if data["status"] not in STATUSES:
        return f"has status {data['status']!r}, not one of {list(STATUSES)}"
    if not isinstance(data["params"], dict):
        return "has 'params' that is not a mapping"
    if data["status"] == "ok" and not isinstance(data.get("result"), dict):
        return "says 'ok' but holds no result"
    return None


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """``(record, None)``, or ``(None, "PATH: why it is not a valid record")``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"{path}: not valid JSON (truncated or corrupt: {str(exc).splitlines()[0]})"
    problem = record_problem(data, Path(path).stem)
    return (None, f"{path}: {problem}") if problem else (data, None)


def read_records(results_dir: Path, problems: list[str] | None = None) -> list[dict]:
    """Every valid run record under ``results_dir/runs``, sorted by run id. An invalid file (not
    JSON, truncated, not a record, ``{"status": "ok"}`` with nothing else) is left out with a
    warning naming it; pass ``problems=[]`` to collect those messages."""
    runs = Path(results_dir) / "runs"
    if not runs.is_dir():
        return []
    out = []
    for p in sorted(runs.glob("*.json")):
        record, problem = read_record(p)
        if problem:
            log.warning("%s; left out of the table (rerun the sweep to redo that point)", problem)
            if problems is not None:
                problems.append(problem)
            continue
        out.append(record)
    return out


def _flatten(record: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {k: record.get(k) for k in ("run_id", "config", "status", "error", "duration_s",
                                                      "finished_at")}
    for k, v in (record.get("params") or {}).items():
        row[f"param.{k}"] = v
    for k, v in (record.get("result") or {}).items():
        if v is None or isinstance(v, (bool, int, float, str)):
            row[k] = v
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            row[f"{k}_max"] = max(v)
    return row


def write_table(results_dir: Path) -> tuple[Path, Path | None]:
    """Rewrite ``results.csv`` and ``results.parquet`` from the run records (atomically).

    Returns the two paths (parquet ``None`` when pyarrow is missing)."""
    import pandas as pd

    results_dir = Path(results_dir)
    rows = [_flatten(r) for r in read_records(results_dir)]
    frame = pd.DataFrame(rows)
    results_dir.mkdir(parents=True, exist_ok=True)
    csv_path = results_dir / "results.csv"
    tmp = results_dir / ".results.csv.tmp"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, csv_path)
    parquet_path: Path | None = results_dir / "results.parquet"
    try:
        tmp = results_dir / ".results.parquet.tmp"
        frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object}).to_parquet(tmp, index=False)
        os.replace(tmp, parquet_path)
    except ImportError as exc:
        log.warning("results.parquet not written: %s", exc)
        parquet_path = None
    return csv_path, parquet_path


@dataclass
class SweepSummary:
    """Counts of one sweep: ``executed`` (run now), ``reused`` (already ok), and statuses."""

    results_dir: Path
    executed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    table: Path | None = None

    def count(self, status: str) -> int:
        return sum(1 for s in self.statuses.values() if s == status)


class SweepLocked(ConfigError):
    """Another sweep holds the results folder's lock."""


class SweepLock:
    """An exclusive ``flock`` on ``<results>/.sweep.lock``: one sweep per results folder. The file
    names its holder (pid, host, start time, command); the kernel releases the lock when the holder
    dies, even by SIGKILL, so a stale lock never blocks."""

    def __init__(self, results_dir: Path) -> None:
        self.path = Path(results_dir) / ".sweep.lock"
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text())
            return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                    f"{info.get('command')}")
        except (OSError, ValueError, AttributeError):
            return "an unknown process"

    def acquire(self, wait: float | None = 0.0, on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lock; ``wait`` seconds at most (``None``: as long as it takes; ``0``: not at all)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = None if wait is None else time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    os.close(fd)
                    raise SweepLocked(
                        f"results folder {self.path.parent} is in use by another sweep ({self.holder()}); "
                        f"wait for it to end, pass --wait-for-lock to queue behind it, or give another --results") from None
                if not told and on_wait is not None:
                    on_wait(f"waiting for the sweep that holds {self.path.parent} ({self.holder()})")
                    told = True
                time.sleep(0.2)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "SweepLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reap_stale_runs(results_dir: Path) -> list[str]:
    """End what a dead sweep left in flight (its papermill, kernel, torchrun...: every process
    carrying the run's tag) and forget the in-flight marker. Call it holding the lock: then no
    live sweep owns a marker. Returns one message per stale run."""
    messages = []
    inflight = Path(results_dir) / ".inflight"
    if not inflight.is_dir():
        return messages
    for marker in sorted(inflight.glob("*.json")):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        tag = info.get("tag") if isinstance(info, dict) else None
        killed = proctree.kill_tagged(tag) if tag else []
        messages.append(f"run {marker.stem} was left in flight by sweep pid {info.get('sweep_pid', '?')}, which died; "
                        + (f"stopped its {len(killed)} remaining process(es) {killed}; " if killed else "")
                        + "it will be run again")
        marker.unlink(missing_ok=True)
    return messages


def _check_folder(flag: str, path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder; give a folder (it is created if missing)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
            break


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
        runs = [Run(_run_id({**r.params, **extra_params}), {**r.params, **extra_params}) for r in runs]
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
            hands the sweep to :func:`ctrlmem.experiments.slurm.run_sweep_slurm`, which takes
            ``slurm_options`` (``wait``, ``poll_s``, ``partition``, ``account``, ``time_limit``, ``nodes``).
        root: the folder relative paths mean (default: the current directory); the notebook runs
            there.
        yes: run a sweep of more than :data:`CONFIRM_POINTS` points.
        lock_wait: seconds to wait for another sweep holding the results folder (``None``: no limit;
            default ``0``: refuse at once with :class:`SweepLocked` naming the holder).
        on_message: called with one line per notice (stale runs stopped, waiting for a lock);
            default: the log.
    """
    say = on_message or log.warning
    base = resolve_root(root)
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, root=root)
    if config.num_points > CONFIRM_POINTS and not yes:
        raise ConfigError(f"{config.name} defines {config.num_points} points (more than {CONFIRM_POINTS}); check the "
                          f"grid, then pass --yes (yes=True) to run them all, or --only RUN_ID for some")
    # --- Slurm launcher hook ---
    if (launcher or config.launcher) == "slurm":
        from .slurm import run_sweep_slurm

        return run_sweep_slurm(config, results_dir=base / results_dir if results_dir is not None
                               else default_results_dir(config, base),
                               build_dir=base / build_dir if build_dir is not None
                               else base / "build" / "notebooks" / config.name,
                               force=force, only=only, progress=progress, extra_params=extra_params, check=check,
                               **slurm_options)
    if launcher not in (None, "local"):
        raise ConfigError(f"launcher must be 'local' or 'slurm', got {launcher!r}")
    if slurm_options:
        raise TypeError(f"run_sweep got Slurm options {sorted(slurm_options)} without launcher='slurm'")
    # --- end of the Slurm launcher hook ---
    runs = select_runs(config, extra_params=extra_params, only=only, check=check)
    executor = executor or execute_with_papermill
    kwargs: dict[str, Any] = {}
    try:
        accepted = inspect.signature(executor).parameters
    except (TypeError, ValueError):
        accepted = {}
    results = (base / results_dir if results_dir is not None else default_results_dir(config, base)).absolute()
    build = (base / build_dir if build_dir is not None else base / "build" / "notebooks" / config.name).absolute()
    _check_folder("--results", results)
    _check_folder("--build", build)
    runs_dir = results / "runs"
    inflight = results / ".inflight"
    summary = SweepSummary(results_dir=results)

    lock = SweepLock(results)
    lock.acquire(wait=lock_wait, on_wait=say)
    bar = None
    try:
        for message in reap_stale_runs(results):
            say(message)
        if progress:
            from tqdm import tqdm

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
            marker = inflight / f"{run.run_id}.json"
            write_json_atomic(marker, {"run_id": run.run_id, "tag": tag, "sweep_pid": os.getpid(),
                                       "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))})
            kwargs = {}
            if "tag" in accepted:
                kwargs["tag"] = tag
            if "cwd" in accepted:
                kwargs["cwd"] = base
            try:
                outcome = executor(config.notebook, build / f"{run.run_id}.ipynb", dict(run.params), out_dir,
                                   config.timeout_s, **kwargs)
            except Exception as exc:  # a broken executor must not stop the sweep
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
            if record_path.is_file():  # --force or a retry: keep the previous record, never lose it
                history = runs_dir / "history"
                history.mkdir(parents=True, exist_ok=True)
                shutil.copy2(record_path, history / f"{run.run_id}.{record_path.stat().st_mtime_ns}.json")
            write_json_atomic(record_path, record)
            summary.executed.append(run.run_id)
            summary.statuses[run.run_id] = record["status"]
            if record["status"] == "failed":
                log.warning("run %s failed: %s", run.run_id, record["error"])
            elif record["status"] == "skipped":
                log.info("run %s skipped: %s", run.run_id, record["error"])
            if bar is not None:
                bar.update(1)
    finally:
        try:
            if bar is not None:
                bar.close()
            if runs_dir.is_dir():
                summary.table, _ = write_table(results)
        finally:
            lock.release()
    return summary
