"""The sweep runner and the result store: papermill runs one notebook per point in its own process
group, records are written atomically, the table is rebuilt from the records."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .config import REPO_ROOT, ConfigError, _run_id, ExperimentConfig, Run, check_parameters, load_config, plan_runs

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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def execute_with_papermill(notebook: Path, executed: Path, params: Mapping[str, Any], out_dir: Path,
                           timeout_s: float) -> RunOutcome:
    """Run ``notebook`` with papermill in its own process group; kill it after ``timeout_s``.

    The notebook must write ``out_dir/result.json``; a ``status`` key in it (``"skipped"``) is
    passed on."""
    import yaml

    executed.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / RESULT_FILE
    if result_path.exists():
        result_path.unlink()
    cmd = [
        sys.executable, "-m", "papermill", str(notebook), str(executed),
        "-y", yaml.safe_dump({**params, "out_dir": str(out_dir)}),
        "--cwd", str(REPO_ROOT), "--no-progress-bar", "--log-level", "WARNING", "-k", "python3",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return RunOutcome("failed", error=f"timeout: the run exceeded timeout_s={timeout_s:g} s and was killed")
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt) while waiting
            _kill_group(proc)
    if proc.returncode != 0:
        error = _notebook_error(executed)
        if error is None:
            tail = (output or "").strip().splitlines()[-3:]
            error = f"papermill exited with status {proc.returncode}: {' | '.join(tail)}"
        return RunOutcome("failed", error=error)
    if not result_path.is_file():
        return RunOutcome("failed", error=f"the notebook finished but wrote no {RESULT_FILE} to out_dir")
    result = json.loads(result_path.read_text())
    status = result.get("status", "ok")
    if status not in ("ok", "skipped"):
        return RunOutcome("failed", result=result, error=str(result.get("reason") or f"status {status!r}"))
    return RunOutcome(status, result=result, error=result.get("reason") if status == "skipped" else None)


def default_results_dir(config: ExperimentConfig) -> Path:
    return REPO_ROOT / "experiments" / "results" / config.name


def read_records(results_dir: Path) -> list[dict]:
    """Every run record under ``results_dir/runs``, sorted by run id."""
    runs = Path(results_dir) / "runs"
    if not runs.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]


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
    **slurm_options: Any,
) -> SweepSummary:
    """Execute ``config``'s notebook once per point; see the module docstring.

    Args:
        results_dir: where run records and the table go (default ``experiments/results/<name>``).
        build_dir: where executed notebooks go (default ``build/notebooks/<name>``).
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
    """
    if not isinstance(config, ExperimentConfig):
        config = load_config(config)
    # --- Slurm launcher hook ---
    if (launcher or config.launcher) == "slurm":
        from .slurm import run_sweep_slurm

        return run_sweep_slurm(config, results_dir=results_dir, build_dir=build_dir, force=force, only=only,
                               progress=progress, extra_params=extra_params, check=check, **slurm_options)
    if launcher not in (None, "local"):
        raise ConfigError(f"launcher must be 'local' or 'slurm', got {launcher!r}")
    if slurm_options:
        raise TypeError(f"run_sweep got Slurm options {sorted(slurm_options)} without launcher='slurm'")
    # --- end of the Slurm launcher hook ---
    runs = plan_runs(config)
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
    executor = executor or execute_with_papermill
    results = Path(results_dir) if results_dir is not None else default_results_dir(config)
    build = Path(build_dir) if build_dir is not None else REPO_ROOT / "build" / "notebooks" / config.name
    runs_dir = results / "runs"
    summary = SweepSummary(results_dir=results)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(runs), desc=config.name, unit="run", file=sys.stderr)
    try:
        for run in runs:
            record_path = runs_dir / f"{run.run_id}.json"
            if record_path.is_file() and not force:
                try:
                    old = json.loads(record_path.read_text())
                except ValueError:
                    old = {}
                if old.get("status") == "ok":
                    summary.reused.append(run.run_id)
                    summary.statuses[run.run_id] = "ok"
                    if bar is not None:
                        bar.update(1)
                    continue
            if bar is not None:
                bar.set_postfix_str(run.run_id, refresh=True)
            started = time.time()
            out_dir = build / run.run_id
            try:
                outcome = executor(config.notebook, build / f"{run.run_id}.ipynb", dict(run.params), out_dir,
                                   config.timeout_s)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # a broken executor must not stop the sweep
                outcome = RunOutcome("failed", error=f"{type(exc).__name__}: {exc}")
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
            if record_path.is_file():  # --force or a retry: keep the previous record, never lose it
                history = runs_dir / "history"
                history.mkdir(parents=True, exist_ok=True)
                shutil.copy2(record_path, history / f"{run.run_id}.{record_path.stat().st_mtime_ns}.json")
            write_json_atomic(record_path, record)
            summary.executed.append(run.run_id)
            summary.statuses[run.run_id] = outcome.status
            if outcome.status == "failed":
                log.warning("run %s failed: %s", run.run_id, outcome.error)
            elif outcome.status == "skipped":
                log.info("run %s skipped: %s", run.run_id, outcome.error)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if runs_dir.is_dir():
            summary.table, _ = write_table(results)
    return summary
