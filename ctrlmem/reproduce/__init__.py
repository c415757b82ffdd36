"""The reproduction: tables next to the paper's numbers, and ``ctrlmem reproduce``.

Every artifact is a function returning a :class:`Table` of :class:`Cell` s. A cell holds the
paper's value (a number, a ``(low, high)`` range, or :data:`ctrlmem.paper.NOT_RECOVERED`), ours,
and **how ours was obtained** (closed form; simulated, with which cost model; measured on CPU or
GPU). Cells of schedules that are not registered in ``cm.SCHEDULES`` when the code runs say
``pending: schedule 'v-min' not registered``; they fill in by themselves once the schedule lands.

:func:`reproduce` writes ``<out>/<artifact>.md`` and ``.html`` for each artifact, and
``<out>/REPRODUCTION.md``: artifact → what was done → agreement with the paper (the largest
relative deviation over comparable cells, or why nothing is comparable).

Method names of the paper map to registered schedules as in ``experiments/table4_pure_pp.yaml``.

Layout: :mod:`.table` (the Cell/Table model), one module per artifact group — :mod:`.theory`
(closed forms, Tables 1, 2, 8, 9, A), :mod:`.throughput` (Tables 3, 4), :mod:`.curves`
(Fig. 7, 9, 10), :mod:`.measured` (CPU runs), :mod:`.drawings` (schedule figures) — and
:mod:`.report` (registry, report writer), :mod:`.command` (the CLI).
"""

from __future__ import annotations

from .. import paper
from .report import ARTIFACTS, WRITES_FILES, build_table, reproduce, write_report
from .table import Cell, Table, pending
from .throughput import TABLE4_METHODS

__all__ = ["Cell", "Table", "ARTIFACTS", "WRITES_FILES", "TABLE4_METHODS", "build_table", "write_report",
           "reproduce", "pending", "paper"]
