"""The rank-replay file that ``ctrlmem replay`` writes (:mod:`ctrlmem.runtime.replay`): finding the
shipped one, reading and checking a file, naming its GPU.

A file is ``{"gpu": ..., "rows": [...]}``, one row per replayed device: model, p, m, schedule,
device, stages, peak autograd-saved bytes, the schedule's theory peak and per-stage pass times
(``pass_times_s``: stage -> pass -> ``{"median": seconds, ...}``). The planner takes pass costs and
the allocator margin from it (:mod:`ctrlmem.planner.sources`); the reproduction turns it into
Table 4's GPU columns (:mod:`ctrlmem.reproduce.gpu_replay`).
"""

from __future__ import annotations

import math
import numbers
from importlib.resources import files
from pathlib import Path
from typing import Any
from ctrlmem.util.userfile import read_json

__all__ = ["DEFAULT_REPLAY", "MAX_REPLAY_BYTES", "ROW_KEYS", "default_replay_path", "load_replay", "gpu_label"]

DEFAULT_REPLAY = "h200_rank_replay.json"
"""The shipped H200 measurement: a data file of the ``ctrlmem`` package (``ctrlmem/data/``)."""

ROW_KEYS = ("model", "p", "m", "schedule", "device", "stages", "peak_saved_bytes", "theory_peak_bytes",
            "pass_times_s")


def default_replay_path() -> Path:
    """The shipped H200 measurement, read from the installed package (it is package data, so
    it is found from any working directory)."""
    return Path(str(files("ctrlmem") / "data" / DEFAULT_REPLAY))


def load_replay(path: str | Path, need: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read and check a replay file (through :func:`ctrlmem.util.userfile.read_json`: a regular
    file of at most :data:`MAX_REPLAY_BYTES`, JSON of bounded nesting); ``ValueError`` names the
    file and what is missing. ``need``: further row keys the caller reads, each a positive number
    (e.g. ``peak_alloc_bytes`` for the allocator margin)."""

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ValueError(f"replay file {str(path)!r} not found; give the JSON that `ctrlmem replay` wrote")
    data = read_json(path, "replay file", MAX_REPLAY_BYTES, fix="give the JSON that `ctrlmem replay` wrote")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"replay file {str(path)!r} has no 'rows' list; expected the form `ctrlmem replay` writes")
    for i, row in enumerate(rows):
        missing = [k for k in (*ROW_KEYS, *need) if k not in row] if isinstance(row, dict) else list(ROW_KEYS)
        if missing:
            raise ValueError(f"replay file {str(path)!r}: row {i} lacks {', '.join(missing)}; replay that device "
                             f"again with `ctrlmem replay` (it records every one)")
        problem = _row_problem(row, need)
        if problem:
            raise ValueError(f"replay file {str(path)!r}: row {i} ({str(row.get('schedule'))[:20]}, device "
                             f"{str(row.get('device'))[:10]}): {problem}; fix the row or replay that device again")
    return data


MAX_REPLAY_BYTES = 64 << 20
"""Largest replay file read."""


def _row_problem(row: dict, need: tuple[str, ...] = ()) -> str | None:
    """Why a replay row's numbers cannot be used (``None`` when they can): the ratios divide by
    the peaks, so both must be positive finite numbers; ``p``, ``m`` and the device whole."""
    def real(x) -> bool:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))

    for key in ("p", "m"):
        if not (isinstance(row[key], int) and not isinstance(row[key], bool) and row[key] >= 1):
            return f"{key} must be a positive integer, got {str(row[key])[:20]!r}"
    if not (isinstance(row["device"], int) and not isinstance(row["device"], bool) and 0 <= row["device"] < row["p"]):
        return f"device must be an integer in 0..{row['p'] - 1}, got {str(row['device'])[:20]!r}"
    for key in ("peak_saved_bytes", "theory_peak_bytes", *need):
        if not (real(row[key]) and row[key] > 0):
            return f"{key} must be a positive number of bytes, got {str(row[key])[:20]!r}"
    times = row["pass_times_s"]
    if not isinstance(times, dict):
        return "pass_times_s must map stage -> {pass: {median: seconds}}"
    for stage, kinds in times.items():
        if not str(stage).isdigit() or not isinstance(kinds, dict):
            return f"pass_times_s has a bad entry for stage {str(stage)[:10]!r}"
        for kind, stats in kinds.items():
            med = stats.get("median") if isinstance(stats, dict) else None
            if not (real(med) and med >= 0):
                return f"pass_times_s[{stage}][{str(kind)[:4]}] needs a median >= 0 seconds, got {str(med)[:20]!r}"
        if "F" not in kinds:
            return f"pass_times_s[{stage}] has no F time"
    return None


def gpu_label(data: dict[str, Any]) -> str:
    """'NVIDIA H200' from ``"gpu": "NVIDIA H200 (143771 MiB), driver ..."``; ``"CPU"`` for a replay
    run on the CPU (``"device": "cpu"`` or ``"gpu": "none: ..."``); ``"GPU"`` when nothing says."""
    gpu = str(data.get("gpu") or "GPU")
    if str(data.get("device", "")).startswith("cpu") or gpu.lower().startswith("none"):
        return "CPU"
    return gpu.split(" (")[0].split(",")[0].strip() or "GPU"
