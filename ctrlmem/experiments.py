"""Experiment configs, the papermill sweep runner and the result store (DESIGN.md "Experiments
and notebooks"; issue 6).

An **experiment config** (``experiments/*.yaml``) names a parameterized notebook and a set of
*points*: ``params`` (shared literals) merged with each entry of ``cases`` (a list of mappings)
and each combination of ``grid`` (mapping of name -> list of values). A point holding
``m_per_p`` gets ``m = m_per_p · p`` (the paper's grids run m = p … 16p). :func:`load_config`
validates the file and names the file, key and fix on error. Schedule names are **not** checked
on load: a config may name a schedule that is not registered yet (``v-min`` before it lands);
the notebook records such a run as *skipped* with the reason.

The **sweep** (:func:`run_sweep`, ``ctrlmem sweep CONFIG``) executes the notebook once per point
with papermill in a subprocess (a per-run timeout kills it), after checking every parameter name
against the notebook's ``parameters`` cell (``papermill.inspect_notebook``). Each run leaves

* ``<results>/runs/<run_id>.json``: the record (status ``ok`` / ``skipped`` / ``failed``, the
  error, parameters, timing and the notebook's own result JSON), written atomically;
* ``build/notebooks/<config>/<run_id>.ipynb``: the executed notebook (git-ignored);

and the sweep ends by rewriting the consolidated table ``<results>/results.csv`` and
``results.parquet`` from the run records. A ``run_id`` is derived from the point's parameters, so
a rerun skips every run whose record says ``ok`` (``force=True`` reruns them, after copying the
previous record to ``runs/history/``); records of finished runs are never rewritten otherwise,
and an interrupted sweep (Ctrl-C, SIGTERM, a kill) loses at most the run in flight.

:func:`simulate_point` is what ``notebooks/10_experiment.ipynb`` calls on its simulation path.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .costs import Costs, MemoryModel

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "Run",
    "RunOutcome",
    "REPO_ROOT",
    "DEFAULT_NOTEBOOK",
    "load_config",
    "plan_runs",
    "check_parameters",
    "run_sweep",
    "execute_with_papermill",
    "read_records",
    "write_table",
    "write_json_atomic",
    "simulate_point",
    "resolve_costs",
    "measured_costs",
    "real_run_available",
    "real_run_point",
    "runtime_model_name",
    "add_commands",
]

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOK = "notebooks/10_experiment.ipynb"
RESULT_FILE = "result.json"
"""Name of the file a notebook writes into its ``out_dir``."""

_TOP_KEYS = {
    "name": "a short slug naming the experiment, e.g. table4-cpu",
    "description": "one sentence: what the sweep reproduces",
    "paper": "the paper artifact it reproduces, e.g. 'Table 4 / Fig. 6'",
    "scale": "'paper' (A100 numbers from the cost model) or 'cpu' (runs here)",
    "counterpart": "name of the config at the other scale",
    "notebook": f"notebook path relative to the repository (default {DEFAULT_NOTEBOOK})",
    "timeout_s": "per-run timeout in seconds (default 600)",
    "params": "mapping of notebook parameters shared by every run",
    "cases": "list of mappings (each one group of parameters), or a mapping of group -> list (their product)",
    "grid": "mapping of parameter -> list of values (cartesian product)",
}
_REQUIRED = ("name", "description", "scale")
_SCALES = ("paper", "cpu")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ConfigError(ValueError):
    """A bad experiment config; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Run:
    """One point of a sweep: its id and the notebook parameters."""

    run_id: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment config (see the module docstring for the YAML form).

    Args:
        path: the YAML file it was read from (``None`` when built in code).
        name: slug naming the experiment; results go under ``experiments/results/<name>/``.
        description: what it reproduces.
        scale: ``"paper"`` or ``"cpu"``.
        notebook: the notebook to execute, absolute.
        timeout_s: per-run timeout in seconds.
        params, cases, grid: the point specification.
        paper: the paper artifact, free text.
        counterpart: the config at the other scale.
    """

    path: Path | None
    name: str
    description: str
    scale: str
    notebook: Path
    timeout_s: float
    params: Mapping[str, Any]
    cases: tuple[Mapping[str, Any], ...]
    grid: Mapping[str, tuple[Any, ...]]
    paper: str = ""
    counterpart: str = ""

    def runs(self) -> list[Run]:
        return plan_runs(self)


def _where(path: Path | str | None) -> str:
    return str(path) if path is not None else "<config>"


def _check_literal(where: str, key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ConfigError(f"{where}: key {key!r} is {value!r}; give a finite number")
        return value
    raise ConfigError(
        f"{where}: key {key!r} holds a {type(value).__name__} ({value!r}); notebook parameters must be "
        f"literals (string, number, bool or null) — write lists under 'grid' instead"
    )


def _check_mapping(where: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: key {key!r} must be a mapping of parameter: value, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{where}: key {key}.{k!r} is not a valid parameter name (a Python identifier)")
        out[k] = _check_literal(where, f"{key}.{k}", v)
    return out


def config_from_dict(data: Any, path: Path | str | None = None) -> ExperimentConfig:
    """Validate a parsed config mapping; ``ConfigError`` names the file, key and fix."""
    where = _where(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: the file must hold a YAML mapping (name:, description:, ...), "
                          f"got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in _TOP_KEYS.items())
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed keys — {allowed}")
    for key in _REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing required key {key!r} ({_TOP_KEYS[key]})")
    name = data["name"]
    if not isinstance(name, str) or not _SLUG.match(name):
        raise ConfigError(f"{where}: key 'name' must be a lower-case slug like 'table4-cpu', got {name!r}")
    if not isinstance(data["description"], str) or not data["description"].strip():
        raise ConfigError(f"{where}: key 'description' must be a non-empty string")
    scale = data["scale"]
    if scale not in _SCALES:
        raise ConfigError(f"{where}: key 'scale' must be one of {list(_SCALES)}, got {scale!r}")
    timeout = data.get("timeout_s", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"{where}: key 'timeout_s' must be a positive number of seconds, got {timeout!r}")
    nb_rel = data.get("notebook", DEFAULT_NOTEBOOK)
    if not isinstance(nb_rel, str):
        raise ConfigError(f"{where}: key 'notebook' must be a path string, got {nb_rel!r}")
    notebook = Path(nb_rel)
    if not notebook.is_absolute():
        notebook = REPO_ROOT / notebook
    if not notebook.is_file():
        raise ConfigError(f"{where}: key 'notebook': {nb_rel!r} does not exist (looked at {notebook}); "
                          f"give a path relative to the repository root")
    params = _check_mapping(where, "params", data.get("params") or {})
    raw_cases = data.get("cases") or []
    if isinstance(raw_cases, Mapping):
        groups = []
        for gname, group in raw_cases.items():
            if not isinstance(group, list) or not group:
                raise ConfigError(f"{where}: key 'cases.{gname}' must be a non-empty list of mappings")
            groups.append([_check_mapping(where, f"cases.{gname}[{i}]", c) for i, c in enumerate(group)])
        cases = tuple({k: v for part in combo for k, v in part.items()} for combo in itertools.product(*groups))
    elif isinstance(raw_cases, list):
        cases = tuple(_check_mapping(where, f"cases[{i}]", c) for i, c in enumerate(raw_cases))
    else:
        raise ConfigError(f"{where}: key 'cases' must be a list of mappings, or a mapping of group name -> list "
                          f"of mappings (product of the groups), got {type(raw_cases).__name__}")
    for key_path, mapping in [("params", params), *((f"cases[{i}]", c) for i, c in enumerate(cases))]:
        if "out_dir" in mapping:
            raise ConfigError(f"{where}: key '{key_path}.out_dir' is set by the sweep runner; remove it "
                              f"(use `ctrlmem sweep --build DIR`)")
    raw_grid = data.get("grid") or {}
    if not isinstance(raw_grid, Mapping):
        raise ConfigError(f"{where}: key 'grid' must be a mapping of parameter: [values], got {type(raw_grid).__name__}")
    grid: dict[str, tuple[Any, ...]] = {}
    for k, values in raw_grid.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{where}: key grid.{k!r} is not a valid parameter name")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: key 'grid.{k}' must be a non-empty list of values, got {values!r}; "
                              f"put a single value under 'params' instead")
        grid[k] = tuple(_check_literal(where, f"grid.{k}[{i}]", v) for i, v in enumerate(values))
    for text_key in ("paper", "counterpart"):
        if text_key in data and not isinstance(data[text_key], str):
            raise ConfigError(f"{where}: key {text_key!r} must be a string, got {data[text_key]!r}")
    config = ExperimentConfig(
        path=Path(path) if path is not None else None,
        name=name,
        description=data["description"].strip(),
        scale=scale,
        notebook=notebook,
        timeout_s=float(timeout),
        params=params,
        cases=cases,
        grid=grid,
        paper=data.get("paper", ""),
        counterpart=data.get("counterpart", ""),
    )
    runs = plan_runs(config)
    if not runs:
        raise ConfigError(f"{where}: the config defines no runs; add 'params', 'cases' or 'grid'")
    seen: dict[str, Mapping[str, Any]] = {}
    for run in runs:
        if run.run_id in seen:
            raise ConfigError(f"{where}: two points have the same parameters {dict(run.params)}; "
                              f"remove the duplicate from 'cases' or 'grid'")
        seen[run.run_id] = run.params
    return config


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment config (YAML)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file; configs live in experiments/*.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".splitlines()[0]) from None
    return config_from_dict(data, path)


def _run_id(params: Mapping[str, Any]) -> str:
    canonical = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:8]
    parts = [str(params[k]) for k in ("schedule", "model", "p", "m") if k in params]
    label = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", x) for x in parts) or "run"
    return f"{label}_{digest}"


def plan_runs(config: ExperimentConfig) -> list[Run]:
    """Every point of ``config`` in a stable order: cases × grid, merged over ``params``."""
    keys = list(config.grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(config.grid[k] for k in keys))]
    runs = []
    for case in config.cases or ({},):
        for combo in combos:
            point = {**config.params, **case, **combo}
            if "m_per_p" in point:
                factor = point.pop("m_per_p")
                if "p" not in point or not isinstance(point["p"], int) or not isinstance(factor, int):
                    raise ConfigError(f"{_where(config.path)}: 'm_per_p' needs integer 'p' and 'm_per_p' in the "
                                      f"same point, got p={point.get('p')!r}, m_per_p={factor!r}")
                point["m"] = factor * point["p"]
            runs.append(Run(_run_id(point), point))
    return runs


def check_parameters(notebook: Path, names: Iterable[str]) -> dict[str, Any]:
    """Raise ``ConfigError`` if any name is not a parameter of ``notebook``'s ``parameters``
    cell; returns papermill's parameter description."""
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    if not declared:
        raise ConfigError(f"{notebook}: has no cell tagged 'parameters'; tag the first code cell 'parameters'")
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise ConfigError(f"parameter(s) {unknown} are not declared in {notebook.name}'s parameters cell; "
                          f"valid names: {', '.join(declared)}")
    return declared


# --------------------------------------------------------------------------------------------
# Running


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
    """
    if not isinstance(config, ExperimentConfig):
        config = load_config(config)
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


# --------------------------------------------------------------------------------------------
# The simulation path of notebooks/10_experiment.ipynb


def resolve_costs(costs: str, model: str | None, p: int, microbatch_size: int, seq_len: int,
                  tp: int = 1) -> tuple[Costs, str]:
    """``costs`` as given to the notebook -> ``(Costs, description)``.

    ``"F,B,W[,COMM]"`` are full device-stage times; ``"paper"`` uses the A100 cost model of
    :mod:`ctrlmem.paper` for ``model``; ``"result:PATH"`` uses the pass costs a real run measured
    (:func:`measured_costs`); ``"measure"`` needs a real run (not this function)."""
    from . import paper

    if costs == "paper":
        if not model or model not in paper.MODELS:
            raise ValueError(f"costs='paper' needs a model preset ({', '.join(paper.MODELS)}), got model={model!r}")
        c = paper.paper_costs(model, p, microbatch_size, seq_len, tp=tp)
        return c, (f"A100 cost model (ctrlmem.paper: {paper.tp_efficiency(tp):.1%} of peak, seq {seq_len}, "
                   f"mb {microbatch_size}, tp {tp}; ms)")
    if costs.startswith("result:"):
        return measured_costs(costs[len("result:"):], p)
    if costs == "measure":
        raise ValueError("costs='measure' needs a real run (backend 'gloo' or 'nccl'); the simulation backend "
                         "takes 'F,B,W[,COMM]' or 'paper'")
    return Costs.parse(costs), f"given costs {costs}"


def measured_costs(path: str | Path, num_devices: int) -> tuple[Costs, str]:
    """Full device-stage ``Costs`` from a ``ctrlmem run`` ``result.json`` (its ``measured_costs``):
    the measured per-stage times summed over stages and divided by ``num_devices``, so a
    measurement of one schedule prices another placement of the same model."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"costs='result:{path}': no such file; give the result.json a `ctrlmem run` wrote")
    c = json.loads(path.read_text()).get("measured_costs")
    if not c:
        raise ValueError(f"{path} has no measured_costs; rerun `ctrlmem run` with --steps 1 or more")
    total = {k: sum(c[k]) if isinstance(c[k], list) else float(c[k]) for k in ("f", "b", "w")}
    if total["w"] == 0:
        raise ValueError(f"{path} was measured with a fused backward (w = 0); measure a split-backward "
                         f"schedule (e.g. --schedule zb-h1) to price B and W separately")
    costs = Costs(f=total["f"] / num_devices, b=total["b"] / num_devices, w=total["w"] / num_devices,
                  comm=float(c.get("comm", 0.0)))
    return costs, f"measured pass costs from {path} (thread CPU time, s)"


@functools.lru_cache(maxsize=64)
def _reference_1f1b(p: int, m: int, costs: Costs):
    """1F1B simulated under ``costs`` (the baseline of every point; cached across points)."""
    from .schedules import build
    from .simulate import simulate

    return simulate(build("1f1b", p, m), costs, MemoryModel())


def simulate_point(
    schedule: str,
    p: int,
    m: int,
    costs: str = "1,1,1,0",
    model: str | None = None,
    microbatch_size: int = 1,
    seq_len: int = 1024,
    memory_limit: float | None = None,
    tp: int = 1,
    dp: int = 1,
    global_batch: int = 0,
    flash_attention: bool = False,
) -> dict[str, Any]:
    """Build and simulate one point; the result dict the notebook writes.

    A schedule not registered in ``cm.SCHEDULES`` gives ``{"status": "skipped", "reason": ...}``.
    ``global_batch > 0`` sets ``m = global_batch / (dp · microbatch_size)``. With a model preset
    the result also carries paper-scale numbers: activation GB (34·h + 5·heads·s bytes per layer
    and token, PAPER.md §6), total GB with weights and optimizer state, whether it fits an
    A100 80 GB, and the predicted MFU (model FLOPs / (makespan · GPUs · peak))."""
    from . import paper
    from .schedules import SCHEDULES, build
    from .simulate import simulate

    if global_batch:
        if global_batch % (dp * microbatch_size):
            raise ValueError(f"global_batch={global_batch} is not divisible by dp·microbatch_size="
                             f"{dp * microbatch_size}; pick sizes that divide it")
        m = global_batch // (dp * microbatch_size)
    base = {"schedule": schedule, "p": p, "m": m, "model": model, "memory_limit": memory_limit,
            "tp": tp, "dp": dp, "microbatch_size": microbatch_size, "flash_attention": flash_attention}
    if schedule not in SCHEDULES:
        return {**base, "status": "skipped",
                "reason": f"schedule {schedule!r} is not registered in cm.SCHEDULES yet "
                          f"(registered: {', '.join(SCHEDULES)})"}
    cost_obj, cost_desc = resolve_costs(costs, model, p, microbatch_size, seq_len, tp=tp)
    sched = build(schedule, p, m, costs=cost_obj, memory_limit=memory_limit)
    memory = MemoryModel()
    res = simulate(sched, cost_obj, memory)
    ref = _reference_1f1b(p, m, cost_obj)
    out: dict[str, Any] = {
        **base,
        "status": "ok",
        "how": f"simulated ({cost_desc})",
        "costs": cost_obj.to_dict(),
        "num_stages": sched.num_stages,
        "makespan": res.makespan,
        "bubble_rate": res.bubble_rate,
        "max_device_bubble": max(res.device_bubbles),
        "peak_memory_a": max(res.peak_memory),
        "peak_memory": res.peak_memory,
        "device_spans": res.device_spans,
        "memory_vs_1f1b": max(res.peak_memory) / max(ref.peak_memory),
        "throughput_vs_1f1b": ref.makespan / res.makespan,
        "bubble_rate_1f1b": ref.bubble_rate,
    }
    if model and model in paper.MODELS:
        preset = paper.model(model)
        a_bytes = paper.activation_bytes(preset, preset.num_layers / p, microbatch_size, seq_len, tp=tp,
                                         flash_attention=flash_attention)
        states = paper.model_state_bytes(preset, p, tp, dp)
        out["bytes_per_a"] = a_bytes
        out["activation_gb"] = max(res.peak_memory) * a_bytes / 1e9
        out["activation_gb_1f1b"] = max(ref.peak_memory) * a_bytes / 1e9
        out["total_memory_gb"] = out["activation_gb"] + states / 1e9
        out["fits_a100_80gb"] = out["total_memory_gb"] * 1e9 <= paper.A100_MEMORY_BYTES
        if costs == "paper":
            flops = m * paper.model_flops(preset, microbatch_size, seq_len)
            out["mfu_predicted"] = flops / (res.makespan * 1e-3 * p * tp * paper.A100_PEAK_FLOPS)
            out["samples_per_s_per_gpu"] = m * microbatch_size / (res.makespan * 1e-3 * p * tp)
    return out


def real_run_available() -> tuple[bool, str]:
    """Whether ``ctrlmem run`` (real execution, issue "runtime") exists; ``(ok, why)``."""
    from . import cli

    import argparse

    for action in cli.make_parser()._actions:  # noqa: SLF001 (argparse keeps subcommands here)
        if isinstance(action, argparse._SubParsersAction) and "run" in action.choices:  # noqa: SLF001
            return True, "ctrlmem run is available"
    return False, ("`ctrlmem run` is not available in this checkout (no module in ctrlmem.cli._COMMAND_MODULES "
                   "adds it, or its optional dependencies are missing: see `ctrlmem --help`)")


def runtime_model_name(model: str | None) -> str | None:
    """Our preset name -> ``ctrlmem run --model``'s (``cpu-tiny`` -> ``tiny``, ``9.6B`` -> ``9.6b``)."""
    if not model:
        return None
    name = model.lower()
    return name[4:] if name.startswith("cpu-") else name


def real_run_point(schedule: str, p: int, m: int, backend: str, launcher: str, quick: bool,
                   out_dir: str | Path, model: str | None = None, memory_limit: float | None = None,
                   timeout_s: float = 1800) -> dict[str, Any]:
    """Run one point for real through ``ctrlmem run --json`` in a subprocess and return its
    result JSON; ``RuntimeError`` with a clear reason when that command or the launcher is
    missing. ``launcher="slurm"`` writes a Slurm script with ``--emit-sbatch`` and submits it
    with ``sbatch --wait``."""
    from .schedules import SCHEDULES

    ok, why = real_run_available()
    if not ok:
        raise RuntimeError(f"real run not available: {why}; use backend='simulate'")
    if schedule not in SCHEDULES:
        return {"schedule": schedule, "p": p, "m": m, "status": "skipped",
                "reason": f"schedule {schedule!r} is not registered in cm.SCHEDULES yet "
                          f"(registered: {', '.join(SCHEDULES)})"}
    if launcher not in ("local", "slurm"):
        raise ValueError(f"launcher must be 'local' or 'slurm', got {launcher!r}")
    run_dir = Path(out_dir) / "run"
    cmd = [sys.executable, "-m", "ctrlmem.cli", "run", "--schedule", schedule, "-p", str(p), "-m", str(m),
           "--backend", backend, "--out", str(run_dir), "--timeout", str(int(timeout_s))]
    if model:
        cmd += ["--model", runtime_model_name(model)]
    if memory_limit is not None:
        cmd += ["--param", f"memory_limit={memory_limit}"]
    if quick:
        cmd += ["--steps", "1"]
    if launcher == "slurm":
        script = Path(out_dir) / "run.sbatch"
        cmd += ["--emit-sbatch", str(script)]
    else:
        cmd.append("--json")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60, cwd=REPO_ROOT)
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise RuntimeError(f"`ctrlmem {' '.join(cmd[3:])}` failed (status {proc.returncode}): "
                           f"{err[-1] if err else 'no message'}")
    if launcher == "slurm":
        if shutil.which("sbatch") is None:
            raise RuntimeError(f"launcher='slurm': wrote {script}; `sbatch` is not on PATH here, submit it on the "
                               f"cluster (its result lands in {run_dir}/result.json)")
        sub = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True)
        if sub.returncode != 0:
            raise RuntimeError(f"sbatch --wait {script} failed: {sub.stderr.strip()[-300:]}")
    result_path = run_dir / "result.json"
    if not result_path.is_file():
        raise RuntimeError(f"`ctrlmem run` finished but wrote no {result_path}")
    result = json.loads(result_path.read_text())
    summary = {k: (max(v) if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) else v)
               for k, v in result.items() if k in ("peak_saved_bytes", "peak_alloc_bytes", "theory_peak_bytes",
                                                   "grad_rel_diff", "loss_abs_diff", "predicted_step_s",
                                                   "measured_step_s", "tokens_per_s")}
    return {**result, **{f"{k}_max" if isinstance(result[k], list) else k: v for k, v in summary.items()},
            "status": "ok" if result.get("status", "ok") == "ok" else "failed",
            "how": f"measured ({'CPU, gloo' if backend == 'gloo' else 'GPU, nccl'}; launcher {launcher})"}


# --------------------------------------------------------------------------------------------
# Command line


def _cmd_sweep(args) -> int:
    config = load_config(args.config)
    extra = {"quick": True} if args.quick else None
    runs = plan_runs(config)
    if args.list:
        for run in runs:
            print(run.run_id, json.dumps(dict(run.params), sort_keys=True))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def _terminate(signum, frame):  # SIGTERM: stop like Ctrl-C, so the run in flight is killed too
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    summary = run_sweep(config, results_dir=args.results, build_dir=args.build, force=args.force,
                        only=args.only or None, progress=not args.no_progress, extra_params=extra)
    print(f"{config.name}: {len(summary.executed)} executed, {len(summary.reused)} already done; "
          f"ok {summary.count('ok')}, skipped {summary.count('skipped')}, failed {summary.count('failed')}")
    if summary.table is not None:
        print(f"table: {summary.table} (+ results.parquet); runs: {summary.results_dir / 'runs'}")
    return 1 if summary.count("failed") else 0


def add_commands(subparsers) -> None:
    """Add ``ctrlmem sweep``."""
    p = subparsers.add_parser("sweep", help="execute an experiment config's notebook once per point (papermill)")
    p.add_argument("config", help="experiment config, e.g. experiments/table4_cpu.yaml")
    p.add_argument("--force", action="store_true", help="rerun points that already finished ok")
    p.add_argument("--quick", action="store_true", help="pass quick=True to every run (CI-sized)")
    p.add_argument("--only", action="append", metavar="RUN_ID", help="run only this run id (repeatable)")
    p.add_argument("--list", action="store_true", help="list the run ids and parameters, run nothing")
    p.add_argument("--results", default=None, help="results folder (default experiments/results/NAME)")
    p.add_argument("--build", default=None, help="folder for executed notebooks (default build/notebooks/NAME)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)
