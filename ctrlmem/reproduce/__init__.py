"""The reproduction: tables next to the paper's numbers, and ``ctrlmem reproduce``.

Every artifact is a function returning a :class:`Table` of :class:`Cell` s. A cell holds the
paper's value (a number, a ``(low, high)`` range, or :data:`ctrlmem.model.paper.NOT_RECOVERED`), ours,
and **how ours was obtained** (closed form; simulated, with which cost model; measured on CPU or
GPU, predicted from GPU pass costs). A cell of a schedule with no generator here (e.g. 1F1B-R)
says ``pending: schedule '1f1b-r' not registered``.

:func:`reproduce` writes ``<out>/<artifact>.md`` and ``.html`` for each artifact, and
``<out>/REPRODUCTION.md``: artifact → size → what was done → agreement with the paper (the
largest relative deviation over comparable cells, or why nothing is comparable); the ``claims``
artifact writes ``<out>/claims.md``, one verdict per claim of the paper. Dates and timings go
only to ``<out>/reproduce-log.json``, so regenerating unchanged inputs gives identical files.

Method names of the paper map to registered schedules as in ``experiments/table4_pure_pp.yaml``.

Layout: :mod:`.table` (the Cell/Table model), one module per artifact group — :mod:`.theory`
(closed forms, Tables 1, 2, 8, 9, the exact values), :mod:`.throughput` (Tables 3, 4),
:mod:`.curves` (Fig. 7, 9, 10), :mod:`.measured` (CPU runs), :mod:`.gpu_replay` (GPU rank
replay), :mod:`.drawings` (schedule figures), :mod:`.optimality` (heuristics over the exact
optimum), :mod:`.claims` (verdict per claim) — and
:mod:`.report` (registry, report writer), :mod:`.command` (the CLI).
"""

from __future__ import annotations

from ctrlmem.model import paper
from ctrlmem.reproduce.report import ARTIFACTS, WRITES_FILES, build_table, notebook_out_dir, progress, reproduce, summary_markdown, write_report
from ctrlmem.reproduce.table import Cell, Table, pending
from ctrlmem.reproduce.throughput import TABLE4_METHODS

__all__ = ["Cell", "Table", "ARTIFACTS", "WRITES_FILES", "TABLE4_METHODS", "build_table", "write_report", "notebook_out_dir",
           "progress", "summary_markdown",
           "reproduce", "pending", "paper"]
