"""The sweep's Slurm launcher: one ``sbatch`` job per real-run point (``ctrlmem sweep CONFIG
--launcher slurm``, or ``launcher: slurm`` in the config).

For every point whose ``backend`` is ``gloo`` or ``nccl`` the launcher writes the point's batch
script with ``ctrlmem run ... --emit-sbatch`` (the same script a user gets by hand: ``srun`` +
``torchrun`` with c10d rendezvous) into ``<build>/<run_id>/run.sbatch``, submits it with
``sbatch --parsable`` and records the job at once: ``<results>/runs/<run_id>.json`` gets
``status: "submitted"`` and ``slurm: {job_id, state, script, out, submitted_at}``. It then polls
the jobs (``squeue``; ``scontrol show job`` for jobs that left the queue; ``sacct`` where the
cluster keeps accounting) until each one ends, and:

* a ``COMPLETED`` job that wrote ``result.json``: the run folder gets a ``slurm_job.json``
  marker and the point's notebook is executed by papermill on this host, exactly as the local
  launcher does, except that :func:`~ctrlmem.experiments.points.real_run_point` collects the
  job's ``result.json`` instead of running; the record is the local launcher's record plus
  ``launcher: "slurm"`` and ``slurm: {...}``;
* any other end (``CANCELLED`` by ``scancel``, ``FAILED``, ``TIMEOUT``, ``NODE_FAIL``,
  ``OUT_OF_MEMORY``..., or a job Slurm no longer knows that left no result) is recorded as
  ``failed`` with the Slurm state and the first failing rank's message when there is one.

It is resumable: rerunning the sweep never resubmits a point whose job is still pending or
running (it polls that job again) nor one recorded ``ok``; it resubmits points recorded
``failed`` (that is how a cancelled or failed point is rerun; ``--only RUN_ID`` picks one), and
``--force`` reruns ``ok`` points too. ``wait=False`` (``--no-wait``) submits and returns; a later
sweep collects. Ctrl-C while polling leaves the submitted jobs to Slurm (they are the cluster's
to run) and says which; rerun the sweep to collect them or ``scancel`` them. Points with
``backend: simulate`` run locally, as with the local launcher. ``SLURM_CONF`` and the ``PATH``
of the Slurm client commands come from the environment.

The output folder of every job is under the sweep's build folder, so on a cluster that folder
(``--build``) and the Python environment must be on a file system the nodes share.

The launcher runs inside :func:`ctrlmem.experiments.sweep.run_sweep`, which takes the results
folder's lock first (the same lock as the local launcher: a folder another sweep holds is
refused), checks the folder's layout and hands over the points and a function that runs points
locally (simulation points, and collecting a finished job through the notebook). This module
depends on the result store (:mod:`.store`), never on the local launcher's module.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ctrlmem.util import checks
from ctrlmem.experiments.config import ExperimentConfig, Run
from ctrlmem.experiments.points import SLURM_MARKER, run_command
from ctrlmem.experiments.store import SweepSummary, keep_history, write_json_atomic, write_table

log = logging.getLogger(__name__)

__all__ = ["SlurmError", "ACTIVE_STATES", "slurm_available", "check_slurm", "submit", "job_states", "run_slurm"]

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
REAL_BACKENDS = ("gloo", "nccl")


class SlurmError(RuntimeError):
    """Slurm is missing or refused a command; the message says which and what to do."""


def slurm_available() -> tuple[bool, str]:
    """Whether the Slurm client commands this launcher uses are on ``PATH``; ``(ok, why)``."""
    missing = [c for c in ("sbatch", "squeue", "scontrol") if shutil.which(c) is None]
    if missing:
        return False, (f"Slurm client command(s) {', '.join(missing)} not on PATH; run on a Slurm login node, "
                       f"or start the local one-node Slurm: bash scripts/slurm-local.sh start")
    return True, "ok"


def _slurm(args: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"`{args[0]}` is not on PATH; {slurm_available()[1]}") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args)}` did not answer in {timeout:g} s; is slurmctld up?") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(args)}` failed (status {proc.returncode}): {msg[-1] if msg else 'no message'}")
    return proc


def submit(script: str | Path) -> str:
    """``sbatch --parsable SCRIPT``; the job id."""
    out = _slurm(["sbatch", "--parsable", str(script)]).stdout.strip()
    job_id = out.split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {out!r}, not a job id")
    return job_id


def job_states(job_ids: Sequence[str]) -> dict[str, str]:
    """The Slurm state of each job (``PENDING``, ``RUNNING``, ``COMPLETED``, ``CANCELLED``, ...;
    ``UNKNOWN`` when neither ``squeue``, ``scontrol`` nor ``sacct`` knows it any more)."""
    states: dict[str, str] = {}
    ids = [str(j) for j in job_ids]
    if not ids:
        return states
    proc = _slurm(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T"], check=False)
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            jid, _, state = line.strip().partition("|")
            if jid in ids:
                states[jid] = state.strip()
    elif "invalid job id" not in (proc.stderr + proc.stdout).lower():
        # the controller did not answer: no state is known, which is not the same as "ended"
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"squeue failed (status {proc.returncode}): {msg[-1] if msg else 'no message'}")
    for jid in ids:
        if jid in states:
            continue
        proc = _slurm(["scontrol", "show", "job", "-o", jid], check=False)
        for token in proc.stdout.split() if proc.returncode == 0 else []:
            if token.startswith("JobState="):
                states[jid] = token.split("=", 1)[1]
                break
        if jid not in states and shutil.which("sacct"):
            proc = _slurm(["sacct", "-n", "-X", "-P", "-j", jid, "-o", "State"], check=False)
            line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
            if line:
                states[jid] = line.split()[0]
        states.setdefault(jid, "UNKNOWN")
    return states


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _time_limit(timeout_s: float) -> str:
    minutes = int(math.ceil(timeout_s / 60)) + 2  # the run's own limit plus start-up
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _failure_detail(run_dir: Path) -> str:
    errors = [e for e in (_read(p) for p in sorted(run_dir.glob("rank*.error.json"))) if e]
    if errors:
        first = min(errors, key=lambda e: (not e.get("in_pass"), e.get("time", 0.0), e.get("rank", 0)))
        return f"rank {first.get('rank')} failed in {first.get('where')}: {first.get('reason')}"
    result = _read(run_dir / "result.json")
    if result and result.get("status") == "failed":
        return str(result.get("failure"))
    return ""


_TIME_LIMIT = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


def check_slurm(wait: bool = True, poll_s: float | None = None, partition: str | None = None,
                account: str | None = None, time_limit: str | None = None, nodes: int | None = None) -> None:
    """Refuse, before anything runs: Slurm's client commands missing (:class:`SlurmError`), or a
    bad launcher option (``ValueError`` / ``TypeError`` naming it)."""
    ok, why = slurm_available()
    if not ok:
        raise SlurmError(why)
    checks.flag("wait", wait)
    if poll_s is not None:
        checks.number("poll_s", poll_s, positive=True, maximum=3600, what="seconds between job state polls")
    if nodes is not None:
        checks.integer("nodes", nodes, maximum=100_000, what="nodes per job")
    for name, value in (("partition", partition), ("account", account), ("time_limit", time_limit)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__} {checks.short_repr(value)}")
    if time_limit is not None and not _TIME_LIMIT.match(time_limit.strip()):
        raise ValueError(f"time_limit {time_limit!r} is not a Slurm time: give MINUTES, HH:MM:SS or D-HH:MM:SS")


def run_slurm(
    config: ExperimentConfig,
    runs: Sequence[Run],
    results: Path,
    build: Path,
    *,
    run_local: Callable[..., SweepSummary],
    force: bool = False,
    progress: bool = False,
    wait: bool = True,
    poll_s: float | None = None,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str | None = None,
    nodes: int | None = None,
) -> SweepSummary:
    """Run ``runs``' real-run points as Slurm jobs (see the module docstring); the others through
    ``run_local(runs, force=..., progress=...)``, which also collects a finished job through the
    notebook. Called by :func:`ctrlmem.experiments.sweep.run_sweep` with the results folder's
    lock held; ``results`` and ``build`` are absolute. The Slurm options default to the config's
    ``slurm:`` mapping."""
    check_slurm(wait, poll_s, partition, account, time_limit, nodes)
    opts = dict(config.slurm or {})
    poll_s = float(poll_s if poll_s is not None else opts.get("poll_s", 5.0))
    partition = partition or opts.get("partition")
    account = account or opts.get("account")
    time_limit = time_limit or opts.get("time_limit") or _time_limit(config.timeout_s)
    nodes = int(nodes or opts.get("nodes", 1))
    runs_dir = results / "runs"
    summary = SweepSummary(results_dir=results)
    real = [r for r in runs if r.params.get("backend") in REAL_BACKENDS]
    local = [r for r in runs if r not in real]
    if local:  # simulation points: nothing to submit
        summary.merge(run_local(local, force=force, progress=False))

    tracked: dict[str, tuple[Run, dict]] = {}  # job id -> (run, record)
    for run in real:
        record_path = runs_dir / f"{run.run_id}.json"
        old = _read(record_path) or {}
        job = old.get("slurm") or {}
        if old.get("status") == "ok" and not force:
            summary.reused.append(run.run_id)
            summary.statuses[run.run_id] = "ok"
            continue
        if old.get("status") == "submitted" and job.get("job_id"):
            state = job_states([job["job_id"]])[job["job_id"]]
            if state in ACTIVE_STATES or state == "COMPLETED" or not force:
                # never resubmit a job Slurm still runs; an ended one is collected below
                tracked[job["job_id"]] = (run, old)
                summary.statuses[run.run_id] = "submitted"
                continue
        record = _submit_point(config, run, build, record_path, partition, account, time_limit, nodes)
        summary.statuses[run.run_id] = record["status"]
        if record["status"] == "submitted":
            tracked[record["slurm"]["job_id"]] = (run, record)
        else:
            summary.executed.append(run.run_id)

    bar = None
    if progress and tracked:
        from tqdm import tqdm  # noqa: PLC0415 - optional dependency: the core installs with numpy only

        bar = tqdm(total=len(tracked), desc=f"{config.name} (slurm)", unit="job", file=sys.stderr)
    try:
        while tracked:
            try:
                states = job_states(list(tracked))
            except SlurmError as exc:  # the controller is away: the jobs stay recorded as submitted
                log.warning("cannot read job states (%s); %s", exc,
                            "retrying" if wait else "rerun the sweep to collect them")
                if not wait:
                    break
                time.sleep(poll_s)
                continue
            for job_id, state in states.items():
                if state in ACTIVE_STATES:
                    continue
                run, record = tracked.pop(job_id)
                final = _finish_point(run, record, state, results, build, run_local)
                summary.executed.append(run.run_id)
                summary.statuses[run.run_id] = final["status"]
                if bar is not None:
                    bar.update(1)
            if not tracked or not wait:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        ids = sorted(tracked, key=int)
        log.warning("interrupted: %d Slurm job(s) still queued or running (%s); rerun the sweep to collect them, "
                    "or cancel them with: scancel %s", len(ids), ", ".join(ids), " ".join(ids))
        raise
    finally:
        if bar is not None:
            bar.close()
        if runs_dir.is_dir():
            summary.table, _ = write_table(results)
    return summary


def _submit_point(config: ExperimentConfig, run: Run, build: Path, record_path: Path, partition, account,
                  time_limit: str, nodes: int) -> dict:
    """Write the point's batch script, submit it and record the job (or the reason it failed)."""
    params = dict(run.params)
    out_dir = build / run.run_id
    run_dir = out_dir / "run"
    script = out_dir / "run.sbatch"
    run_dir.mkdir(parents=True, exist_ok=True)  # Slurm writes the job's log there from the start
    stale_files = [*run_dir.glob("rank*.json"), run_dir / "result.json", run_dir / SLURM_MARKER, out_dir / "result.json"]
    for stale in stale_files:
        stale.unlink(missing_ok=True)
    record = {
        "run_id": run.run_id, "config": config.name,
        "config_path": str(config.path) if config.path else None,
        "notebook": str(config.notebook), "executed_notebook": str(build / f"{run.run_id}.ipynb"),
        "params": params, "launcher": "slurm", "result": None, "started_at": _now(),
    }
    try:
        p, dp = int(params["p"]), int(params.get("dp", 1) or 1)
        world = p * dp
        if world % nodes:
            raise SlurmError(f"p x dp = {world} ranks cannot be spread evenly over {nodes} node(s); "
                             f"set slurm.nodes to a divisor of {world}")
        if params.get("schedules"):
            raise SlurmError(f"point {run.run_id} runs several schedules in one launch ('schedules': "
                             f"{params['schedules']}); the Slurm launcher submits one schedule per job: move them to "
                             f"grid: {{schedule: [...]}}")
        cmd = run_command(params["schedule"], p, int(params["m"]), params["backend"], run_dir.resolve(),
                          params.get("model") or None, params.get("memory_limit"), bool(params.get("quick")),
                          config.timeout_s, dp, recompute=params.get("recompute", "none"),
                          offload=params.get("offload", "none"))
        cmd += ["--emit-sbatch", str(script.resolve()), "--nodes", str(nodes), "--gpus-per-node", str(world // nodes),
                "--time-limit", time_limit]
        if partition:
            cmd += ["--partition", str(partition)]
        if account:
            cmd += ["--account", str(account)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            raise SlurmError(f"could not write the batch script: {err[-1] if err else f'status {proc.returncode}'}")
        job_id = submit(script)
    except (SlurmError, KeyError, ValueError) as exc:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}" if not isinstance(exc, SlurmError)
                      else str(exc), finished_at=_now(), duration_s=0.0)
        keep_history(record_path)
        write_json_atomic(record_path, record)
        log.warning("run %s not submitted: %s", run.run_id, record["error"])
        return record
    record.update(status="submitted", error=None,
                  slurm={"job_id": job_id, "state": "PENDING", "script": str(script), "out": str(run_dir),
                         "submitted_at": record["started_at"], "submitted_epoch": time.time()})
    keep_history(record_path)
    write_json_atomic(record_path, record)
    log.info("run %s submitted as Slurm job %s", run.run_id, job_id)
    return record


def _finish_point(run: Run, record: dict, state: str, results: Path, build: Path,
                  run_local: Callable[..., SweepSummary]) -> dict:
    """A job ended in ``state``: collect its result through the notebook, or record the failure."""
    slurm = dict(record.get("slurm") or {})
    slurm.update(state=state, ended_at=_now())
    run_dir = Path(slurm.get("out") or build / run.run_id / "run")
    record_path = results / "runs" / f"{run.run_id}.json"
    if state == "COMPLETED" and (run_dir / "result.json").is_file():
        write_json_atomic(run_dir / SLURM_MARKER, {"job_id": slurm["job_id"], "state": state})
        run_local([run], force=True, progress=False, table=False)
        final = _read(record_path) or {}
        final.update(launcher="slurm", slurm=slurm)
        write_json_atomic(record_path, final)
        return final
    detail = _failure_detail(run_dir)
    if state == "COMPLETED":
        reason = f"Slurm job {slurm['job_id']} COMPLETED but wrote no result.json"
    elif state == "UNKNOWN":
        reason = f"Slurm job {slurm['job_id']} is no longer known to Slurm and left no result.json"
    else:
        reason = f"Slurm job {slurm['job_id']} ended {state}"
    log_file = run_dir / f"slurm-{slurm['job_id']}.out"
    error = reason + (f": {detail}" if detail else "") + (f"; see {log_file}" if log_file.is_file() else "")
    final = {**record, "status": "failed", "error": error, "slurm": slurm, "finished_at": _now()}
    final["duration_s"] = round(time.time() - slurm.get("submitted_epoch", time.time()), 3)
    keep_history(record_path)
    write_json_atomic(record_path, final)
    log.warning("run %s failed: %s", run.run_id, error)
    return final
