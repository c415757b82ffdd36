"""Experiment configs, the papermill sweep runner and the result store.

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
* ``<build>/<run_id>.ipynb``: the executed notebook (default ``build/notebooks/<config>/``, git-ignored);

and the sweep ends by rewriting the consolidated table ``<results>/results.csv`` and
``results.parquet`` from the run records. A ``run_id`` is derived from the point's parameters, so
a rerun skips every run whose record says ``ok`` (``force=True`` reruns them, after copying the
previous record to ``runs/history/``); records of finished runs are never rewritten otherwise,
and an interrupted sweep (Ctrl-C, SIGTERM, a kill) loses at most the run in flight.

Paths: the library never locates itself. A relative config path, the config's ``notebook``
and the default ``experiments/results/<name>`` and ``build/notebooks/<name>`` folders mean the
current directory, or ``root`` (``--root``); the notebooks run there. Robustness: one sweep per
results folder, whichever launcher (an ``flock`` on ``<results>/.sweep.lock`` naming its holder; a
second sweep is refused, or waits with ``--wait-for-lock``); the folder's layout is checked before
the first point runs; each run in flight leaves ``<results>/.inflight/<run_id>.json`` naming its
owner (pid, that process's start time, host, the results folder's device and inode) and the tag
its processes carry, so a sweep killed with SIGKILL has its papermill, kernel and workers stopped
by the next sweep before that point runs again (they also get SIGTERM from the kernel when the
sweep dies, ``PR_SET_PDEATHSIG``) — only when that owner is provably dead and the marker was
written for this very folder: a sweep on a copied results folder never touches the original
sweep's processes; a record that is not valid (not JSON, truncated, ``{"status": "ok"}`` with no
result, ``[]``, ``null``) is reported naming its file and is not counted as done; every record,
table and marker is written atomically (a full disk stops the sweep naming the file, and keeps
every finished record); more than :data:`CONFIRM_POINTS` points need ``yes=True`` (``--yes``),
more than :data:`MAX_POINTS` are refused.

:func:`simulate_point` is what ``notebooks/10_experiment.ipynb`` calls on its simulation path.

Layout: :mod:`.config` (YAML configs and their points), :mod:`.store` (the result store, the
lock and the in-flight markers, shared by both launchers), :mod:`.sweep` (the entry point and the
local papermill launcher), :mod:`.slurm` (the Slurm launcher), :mod:`.points` (what a notebook
calls for one point), :mod:`.command` (``ctrlmem sweep``). Imports go one way: ``sweep`` →
``slurm`` → ``store`` → ``config``.
"""

from __future__ import annotations

from ctrlmem.experiments.config import CONFIRM_POINTS, DEFAULT_NOTEBOOK, MAX_POINTS, ConfigError, ExperimentConfig, Run, check_notebook, check_parameters, config_from_dict, load_config, plan_runs, resolve_root
from ctrlmem.experiments.points import measured_costs, real_run_available, real_run_point, resolve_costs, runtime_model_name, schedule_names, simulate_point
from ctrlmem.experiments.store import SweepLock, SweepLocked, SweepSummary, check_layout, read_record, read_records, reap_stale_runs, record_problem, write_json_atomic, write_table
from ctrlmem.experiments.sweep import RESULT_FILE, RunOutcome, execute_with_papermill, run_sweep

__all__ = [
    "ConfigError", "ExperimentConfig", "Run", "RunOutcome", "SweepSummary", "SweepLock", "SweepLocked",
    "DEFAULT_NOTEBOOK", "CONFIRM_POINTS", "MAX_POINTS", "RESULT_FILE", "resolve_root", "check_notebook", "read_record",
    "record_problem", "reap_stale_runs", "config_from_dict", "load_config", "plan_runs", "check_parameters", "run_sweep",
    "execute_with_papermill", "read_records", "write_table", "write_json_atomic", "simulate_point",
    "resolve_costs", "measured_costs", "real_run_available", "real_run_point", "runtime_model_name", "check_layout",
    "schedule_names",
]
