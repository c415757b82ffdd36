"""The artifact registry and the report: :func:`build_table` runs one artifact, :func:`reproduce`
runs many and writes ``<out>/<artifact>.md``/``.html`` and ``<out>/REPRODUCTION.md``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable, Sequence

from ctrlmem.reproduce.claims import claims
from ctrlmem.reproduce.curves import fig07, fig09, fig10, fig9_10
from ctrlmem.reproduce.drawings import schedule_figures
from ctrlmem.reproduce.gpu_replay import gpu_replay
from ctrlmem.reproduce.levers import memory_levers
from ctrlmem.reproduce.measured import cpu_real_memory
from ctrlmem.reproduce.optimality import optimality_gap
from ctrlmem.reproduce.optimality_levers import optimality_gap_levers
from ctrlmem.reproduce.table import Table, write_table_file
from ctrlmem.reproduce.theory import closed_forms, table1, table2, table8, table9, table_a
from ctrlmem.reproduce.throughput import table3, table4
from ctrlmem.model.replayfile import load_replay
import sys

log = logging.getLogger(__name__)

ARTIFACTS: dict[str, Callable[[bool], Table]] = {
    "table1": table1,
    "table2": table2,
    "table3": table3,
    "table4": table4,
    "table8": table8,
    "table9": table9,
    "table-a": table_a,
    "closed-forms": closed_forms,
    "fig9-10": fig9_10,
    "fig07": fig07,
    "fig09": fig09,
    "fig10": fig10,
    "cpu-real-memory": cpu_real_memory,
    "gpu-replay": gpu_replay,
    "schedule-figures": schedule_figures,
    "optimality-gap": optimality_gap,
    "memory-levers": memory_levers,
    "optimality-gap-levers": optimality_gap_levers,
    "claims": claims,
}


WRITES_FILES = frozenset({"schedule-figures", "fig07", "fig09", "fig10", "table3", "optimality-gap", "memory-levers",
                          "optimality-gap-levers"})
"""Artifacts that draw figure files into the output folder (their functions take ``out``)."""

READS_OUT = frozenset({"claims"})
"""Artifacts that read what earlier artifacts wrote into the output folder (they take ``out``;
``claims`` reads fig07/fig09/fig10.json, so it runs last)."""

READS_ROOT = frozenset({"cpu-real-memory"})
"""Artifacts that run an experiment config of the project folder (they take ``root``: the folder
holding ``experiments/`` and ``notebooks/``; ``None``: the current directory)."""

READS_REPLAY = frozenset({"gpu-replay", "claims", "table3"})
"""Artifacts that read a rank-replay file (their functions take ``replay``; ``None``: the shipped one)."""


def build_table(artifact: str, quick: bool = False, out: str | Path = "figures",
                replay: str | Path | None = None, root: str | Path | None = None) -> Table:
    """Build ``artifact``'s comparison (``out``: where drawn figures go, for :data:`WRITES_FILES`;
    ``replay``: a ``ctrlmem replay`` file for :data:`READS_REPLAY`, default the shipped H200 one)."""
    if artifact not in ARTIFACTS:
        raise ValueError(f"unknown artifact {artifact!r}; valid: {', '.join(ARTIFACTS)}")
    t0 = time.time()
    log.info("%s: building%s", artifact, " (quick)" if quick else "")
    func = ARTIFACTS[artifact]
    kw: dict = {}
    if artifact in WRITES_FILES or artifact in READS_OUT:
        kw["out"] = out
    if artifact in READS_REPLAY:
        kw["replay"] = replay
    if artifact in READS_ROOT:
        kw["root"] = root
    table = func(quick, **kw)
    table.seconds = time.time() - t0
    log.info("%s: %s (%.1f s)", artifact, table.agreement(), table.seconds)
    return table


LOG_NAME = "reproduce-log.json"
"""The one file of a report that holds dates and timings (``<out>/reproduce-log.json``): the
tables, REPRODUCTION.md and the figures stay byte-identical when regenerated from unchanged inputs."""


def notebook_out_dir(out_dir: str | Path, notebook: str) -> Path:
    """Where a reproduction notebook writes: ``out_dir`` when given, else ``build/notebooks/<notebook>/``.
    Both are relative to the working directory (the notebook's folder in JupyterLab, ``--cwd`` under
    papermill); ``build/`` is git-ignored at any depth, so running a notebook never touches the
    committed ``figures/``. Created if missing."""
    path = Path(out_dir) if str(out_dir).strip() else Path("build") / "notebooks" / notebook
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def progress(stream=None, level: int = logging.INFO):
    """Show ctrlmem's progress lines (``HH:MM:SS message``) on ``stream`` (default stdout) while
    the block runs: what a notebook cell prints as it goes. The handler is removed afterwards,
    so running the cell again does not print twice."""

    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("ctrlmem")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, before) if before else level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def summary_markdown(out: str | Path, base: str | Path = ".", fallback: str | Path | None = None) -> str:
    """``out/REPRODUCTION.md`` with its links made relative to ``base`` (the notebook's folder:
    JupyterLab resolves the links of a rendered output from there). A link to a file this run
    did not write points to ``fallback/<file>`` when that exists (e.g. the committed
    ``figures/``), else the link text stays without a link."""
    out, base = Path(out), Path(base)
    text = (out / "REPRODUCTION.md").read_text(encoding="utf-8")

    def fix(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if "://" in target or target.startswith("#"):
            return match.group(0)
        for folder in (out, Path(fallback) if fallback is not None else None):
            if folder is not None and (folder / target).is_file():
                return f"[{label}]({Path(os.path.relpath(folder / target, base)).as_posix()})"
        return label

    return _LINK.sub(fix, text)


def _size(quick: bool) -> str:
    return "--quick" if quick else "full"


def _current_row(line: str, legacy_size: str) -> str:
    """A summary row in the current form (artifact | size | done | agreement); rows of the older
    form (artifact | done | agreement | seconds) get the size the old summary was generated at."""
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    if len(cells) == 4 and cells[1] not in ("--quick", "full"):
        try:
            float(cells[3])
        except ValueError:
            return line
        return f"| {cells[0]} | {legacy_size} | {cells[1]} | {cells[2]} |"
    return line


def write_report(out: str | Path, tables: Sequence[Table], quick: bool, partial: bool = False) -> Path:
    """Write each table as ``<out>/<artifact>.md`` / ``.html``, the summary ``<out>/REPRODUCTION.md``
    and the run log ``<out>/reproduce-log.json`` (date, size and seconds per artifact: the only
    place with timings); with ``partial``, rows and log entries of artifacts not in ``tables`` are kept."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, str] = {}
    summary = out / "REPRODUCTION.md"
    log_path = out / LOG_NAME
    runs: dict[str, dict] = {}
    if partial and summary.exists():
        text = summary.read_text()
        legacy_size = "--quick" if "reproduce --quick`" in text else "full"
        for line in text.splitlines():
            for name in ARTIFACTS:
                if line.startswith("| [") and f"]({name}.md)" in line:
                    rows[name] = _current_row(line, legacy_size)
    if partial and log_path.exists():
        try:
            runs = dict(json.loads(log_path.read_text()).get("artifacts", {}))
        except (ValueError, AttributeError):
            runs = {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for table in tables:
        write_table_file(out / f"{table.artifact}.md", table.to_markdown())
        write_table_file(out / f"{table.artifact}.html", table.to_html())
        rows[table.artifact] = (f"| [{table.title}]({table.artifact}.md) | {_size(quick)} | {table.done} "
                                f"| {table.agreement()} |")
        runs[table.artifact] = {"finished": now, "size": _size(quick), "seconds": round(table.seconds, 1)}
    lines = ["# Reproduction summary", "",
             "Generated by `ctrlmem reproduce`. Per artifact: the size it was generated at (`--quick` or full), what "
             "was done, and the agreement with the paper (largest relative deviation over comparable cells, or why "
             "nothing is comparable). Details: the linked tables; the verdict per claim of the paper: "
             "[claims.md](claims.md); dates and timings of the runs: " + LOG_NAME + ".", "",
             "| artifact | size | what was done | agreement with the paper |", "|---|---|---|---|"]
    lines += [rows[n] for n in ARTIFACTS if n in rows]
    write_table_file(summary, "\n".join(lines) + "\n")
    write_table_file(log_path, json.dumps({"generated_by": "ctrlmem reproduce", "artifacts":
                                 {n: runs[n] for n in ARTIFACTS if n in runs}}, indent=1, sort_keys=True) + "\n")
    return summary


#: Where ``--quick`` writes when no folder is given: beside, never over, the committed full-size figures/.
QUICK_OUT = Path("build") / "reproduce-quick"


def default_out(quick: bool) -> Path:
    """The output folder when none is given: ``figures/`` for the full run (the committed artifacts),
    :data:`QUICK_OUT` for ``quick`` (its smaller grids would otherwise replace full-size results)."""
    return QUICK_OUT if quick else Path("figures")


def reproduce(out: str | Path | None = None, quick: bool = False, only: Sequence[str] | None = None,
              replay: str | Path | None = None, root: str | Path | None = None) -> Path:
    """Build every (or ``only`` the named) artifact's table and write them with
    :func:`write_report` into ``out`` (default :func:`default_out`); returns the path of
    ``REPRODUCTION.md``. ``replay``: a ``ctrlmem replay``
    file for the ``gpu-replay`` artifact (default: the shipped H200 measurement). ``root``: the project
    folder whose ``experiments/`` configs the measured artifacts run (default: the current directory)."""
    names = list(only) if only else list(ARTIFACTS)
    for n in names:
        if n not in ARTIFACTS:
            raise ValueError(f"unknown artifact {n!r}; valid: {', '.join(ARTIFACTS)}")
    if replay is not None:

        load_replay(replay)  # a bad file fails before anything runs
    out = default_out(quick) if out is None else Path(out)
    return write_report(out, [build_table(n, quick, out, replay=replay, root=root) for n in names], quick,
                        partial=bool(only))
