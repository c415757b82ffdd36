"""The sweep's result store and its lock: what both launchers (the local one, :mod:`.sweep`, and
the Slurm one, :mod:`.slurm`) share, so that neither imports the other for it.

A results folder holds

* ``runs/<run_id>.json`` — one record per point (:func:`write_json_atomic`; :func:`read_record`
  checks one), ``runs/history/`` — records replaced by a rerun;
* ``results.csv`` / ``results.parquet`` — the table, rebuilt from the records (:func:`write_table`);
* ``.sweep.lock`` — the ``flock`` one sweep holds (:class:`SweepLock`), naming its holder;
* ``.inflight/<run_id>.json`` — a marker per point in flight, naming its **owner**: the sweep's
  pid, that process's start time, the host and the results folder's identity (device and inode).

:func:`reap_stale_runs` ends the processes of a marker only when its owner is provably dead
(same host; the pid is gone, or now belongs to a process started at another time) and the
marker was written for this very folder (same device and inode: a copied results folder holds
the original's markers, whose processes belong to the original sweep and are left alone).
:func:`check_layout` checks the folder's layout before the first point runs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ctrlmem.util import proctree
from ctrlmem.util.fileio import atomic_path, atomic_write, make_output_folder
from ctrlmem.experiments.config import ConfigError, ExperimentConfig, resolve_root
import fcntl

log = logging.getLogger(__name__)

__all__ = ["STATUSES", "SweepSummary", "SweepLock", "SweepLocked", "write_json_atomic", "record_problem",
           "read_record", "read_records", "write_table", "keep_history", "reap_stale_runs", "write_marker",
           "check_layout", "check_folder", "default_results_dir", "folder_identity", "process_started"]

STATUSES = ("ok", "skipped", "failed", "submitted")  # submitted: a job the Slurm launcher tracks
LOCK_NAME = ".sweep.lock"
INFLIGHT = ".inflight"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`ctrlmem.util.fileio.atomic_write`): a
    reader sees the old record or the whole new one; a failure (a full disk) keeps the old one
    and raises ``OSError`` naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def default_results_dir(config: ExperimentConfig, root: str | Path | None = None) -> Path:
    """``<root>/experiments/results/<name>`` (root: the current directory unless given)."""
    return resolve_root(root) / "experiments" / "results" / config.name


# -- records ---------------------------------------------------------------------------------

def record_problem(data: Any, expected_id: str | None = None) -> str | None:
    """Why ``data`` is not a valid run record (``None`` when it is one)."""
    if not isinstance(data, dict):
        return f"holds a {type(data).__name__} ({json.dumps(data)[:40]}), not a run record object"
    missing = [k for k in ("run_id", "status", "params") if k not in data]
    if missing:
        return f"misses key(s) {missing}"
    if not isinstance(data["run_id"], str) or (expected_id is not None and data["run_id"] != expected_id):
        return f"has run_id {str(data['run_id'])[:60]!r}, not {expected_id!r} (its file name)"
    if data["status"] not in STATUSES:
        return f"has status {str(data['status'])[:40]!r}, not one of {list(STATUSES)}"
    if not isinstance(data["params"], dict):
        return "has 'params' that is not a mapping"
    if data["status"] == "ok" and not isinstance(data.get("result"), dict):
        return "says 'ok' but holds no result"
    return None


MAX_RECORD_BYTES = 64 << 20
"""A run record larger than this is not read (it is reported as not a valid record)."""


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """``(record, None)``, or ``(None, "PATH: why it is not a valid record")``."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_RECORD_BYTES:
            return None, f"{path}: {size} bytes, larger than a run record can be ({MAX_RECORD_BYTES >> 20} MiB)"
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


def keep_history(record_path: Path) -> None:
    """Copy an existing record to ``runs/history/`` before it is replaced (never lose one)."""
    record_path = Path(record_path)
    if record_path.is_file():
        history = record_path.parent / "history"
        history.mkdir(parents=True, exist_ok=True)
        target = history / f"{record_path.stem}.{record_path.stat().st_mtime_ns}.json"
        atomic_write(target, record_path.read_bytes())
        shutil.copystat(record_path, target)


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
    """Rewrite ``results.csv`` and ``results.parquet`` from the run records, each atomically
    (a failure keeps the previous table and leaves no temporary file).

    Returns the two paths (parquet ``None`` when pyarrow is missing)."""
    import pandas as pd  # noqa: PLC0415 - pandas takes ~0.4 s to import; only tables need it

    results_dir = Path(results_dir)
    rows = [_flatten(r) for r in read_records(results_dir)]
    frame = pd.DataFrame(rows)
    results_dir.mkdir(parents=True, exist_ok=True)
    csv_path = results_dir / "results.csv"
    with atomic_path(csv_path) as tmp:
        frame.to_csv(tmp, index=False)
    parquet_path: Path | None = results_dir / "results.parquet"
    try:
        with atomic_path(parquet_path) as tmp:
            frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object}).to_parquet(tmp, index=False)
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

    def merge(self, other: "SweepSummary") -> None:
        self.executed += other.executed
        self.reused += other.reused
        self.statuses.update(other.statuses)
        self.table = other.table or self.table


# -- the folder's layout -----------------------------------------------------------------------

def check_folder(flag: str, path: Path) -> None:
    """``ConfigError`` unless ``path`` is a folder or can be created as one."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{flag} {path} is a broken symbolic link (or a link loop); remove it or give another folder")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder; give a folder (it is created if missing)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
            if not os.access(parent, os.W_OK | os.X_OK) and not path.exists():
                raise ConfigError(f"{flag} {path}: cannot create it in {parent} (permission denied); choose a "
                                  f"folder you can write to")
            break
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: permission denied; choose a folder you can write to")


def check_layout(results: Path, build: Path | None = None) -> None:
    """Check a results folder (and the build folder) before the first point runs:
    ``ConfigError`` naming the entry and the fix when something that must be a folder
    (``runs``, ``runs/history``, ``.inflight``) is a file, a broken link or a link loop, or
    something that must be a file (``results.csv``, ``results.parquet``, ``.sweep.lock``) is a
    folder."""
    results = Path(results)
    check_folder("--results", results)
    if build is not None:
        check_folder("--build", Path(build))
    for name in ("runs", "runs/history", INFLIGHT):
        entry = results / name
        if entry.is_symlink() and not entry.exists():
            raise ConfigError(f"results folder {results}: {name} is a broken symbolic link or a link loop; remove it "
                              f"(rm {entry}) so that the sweep can create the folder")
        if entry.exists() and not entry.is_dir():
            raise ConfigError(f"results folder {results}: {name} is a file, but the sweep keeps its run records in a "
                              f"folder there; move the file away (mv {entry} {entry}.bak) or give another --results")
    for name in ("results.csv", "results.parquet", LOCK_NAME):
        entry = results / name
        if entry.is_dir():
            raise ConfigError(f"results folder {results}: {name} is a folder, but the sweep writes a file there; move "
                              f"the folder away (mv {entry} {entry}.d) or give another --results")


# -- the lock ----------------------------------------------------------------------------------

class SweepLocked(ConfigError):
    """Another sweep holds the results folder's lock."""


class SweepLock:
    """An exclusive ``flock`` on ``<results>/.sweep.lock``: one sweep per results folder, whichever
    launcher runs it. The file names its holder (pid, host, start time, command); the kernel
    releases the lock when the holder dies, even by SIGKILL, so a stale lock never blocks."""

    def __init__(self, results_dir: Path) -> None:
        self.path = Path(results_dir) / LOCK_NAME
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text()[:4096])
            return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                    f"{str(info.get('command'))[:200]}")
        except (OSError, ValueError, AttributeError):
            return "an unknown process"

    def acquire(self, wait: float | None = 0.0, on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lock; ``wait`` seconds at most (``None``: as long as it takes; ``0``: not at all)."""

        make_output_folder(self.path.parent)
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
        try:  # the holder's name is information only: the flock is the lock (a full disk must not stop it)
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as exc:
            log.warning("could not write the lock holder into %s: %s", self.path, exc)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "SweepLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- in-flight markers and their owners --------------------------------------------------------

def folder_identity(path: Path) -> dict[str, Any]:
    """``{"path", "dev", "ino"}`` of a folder: a copy of it has another inode."""
    st = Path(path).stat()
    return {"path": str(Path(path).absolute()), "dev": st.st_dev, "ino": st.st_ino}


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), or ``None`` when there is none."""
    import psutil  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError, ValueError):
        return None


def write_marker(results: Path, run_id: str, tag: str, started: float) -> Path:
    """Write ``<results>/.inflight/<run_id>.json`` naming this sweep as the owner of the run
    whose processes carry ``tag``; returns its path (remove it when the run has ended)."""
    marker = Path(results) / INFLIGHT / f"{run_id}.json"
    write_json_atomic(marker, {
        "run_id": run_id, "tag": tag, "sweep_pid": os.getpid(), "sweep_started": process_started(os.getpid()),
        "host": socket.gethostname(), "results": folder_identity(results),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    })
    return marker


def _owner_state(info: Mapping[str, Any], results: Path) -> tuple[str, str]:
    """``("dead" | "alive" | "foreign" | "unknown", why)`` for a marker's owner."""
    pid, host = info.get("sweep_pid"), info.get("host")
    folder = info.get("results")
    try:
        here = folder_identity(results)
    except OSError:
        here = {}
    if not isinstance(folder, dict) or "ino" not in folder:
        return "unknown", "the marker does not say which results folder it was written for"
    if (folder.get("dev"), folder.get("ino")) != (here.get("dev"), here.get("ino")):
        return "foreign", (f"it was written for another results folder ({folder.get('path')}; this one was "
                           f"copied or moved?)")
    if host != socket.gethostname():
        return "unknown", f"its sweep ran on host {host}, and this host cannot tell whether it still runs"
    if not isinstance(pid, int) or isinstance(pid, bool):
        return "unknown", "the marker names no sweep process"
    started = process_started(pid)
    if started is None:
        return "dead", f"its sweep (pid {pid}) has exited"
    owner_started = info.get("sweep_started")
    if isinstance(owner_started, (int, float)) and abs(started - float(owner_started)) > 1.0:
        return "dead", f"its sweep (pid {pid}) has exited (the pid now belongs to another process)"
    if pid == os.getpid():
        return "dead", "it was left by an earlier sweep of this process that was interrupted"
    return "alive", f"its sweep (pid {pid}) is still running"


def reap_stale_runs(results_dir: Path) -> list[str]:
    """Deal with what earlier sweeps left in flight in ``results_dir`` (call it holding the lock).

    A marker whose owner is provably dead (see the module docstring) has its processes (its
    papermill, kernel, torchrun...: every process carrying the run's tag) ended and is removed;
    the point is run again. A marker written for another folder (a copied one), or whose owner
    cannot be proven dead (another host, an old marker), is removed without touching any
    process. A marker whose owner is alive is left alone. Returns one message per marker."""
    messages: list[str] = []
    results_dir = Path(results_dir)
    inflight = results_dir / INFLIGHT
    if not inflight.is_dir():
        return messages
    for marker in sorted(inflight.glob("*.json")):
        try:
            info = json.loads(marker.read_text()[: 1 << 20])
        except (OSError, ValueError):
            info = None
        if not isinstance(info, dict):
            marker.unlink(missing_ok=True)
            messages.append(f"run {marker.stem}: unreadable in-flight marker removed (no process touched); "
                            f"it will be run again")
            continue
        state, why = _owner_state(info, results_dir)
        if state == "alive":
            messages.append(f"run {marker.stem} is in flight and {why}; its processes and marker are left alone")
            continue
        if state == "dead":
            tag = info.get("tag")
            killed = proctree.kill_tagged(tag) if isinstance(tag, str) and tag else []
            messages.append(f"run {marker.stem} was left in flight: {why}; "
                            + (f"stopped its {len(killed)} remaining process(es) {killed}; " if killed else "")
                            + "it will be run again")
        else:
            messages.append(f"run {marker.stem} has an in-flight marker, but {why}; no process was touched, the "
                            f"marker is removed and the point will be run again")
        marker.unlink(missing_ok=True)
    return messages
