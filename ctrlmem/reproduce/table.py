"""The comparison model of the reproduction: a :class:`Cell` holds the paper's value, ours and
how ours was obtained; a :class:`Table` is one artifact's cells with its agreement line, written
as Markdown and HTML."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from ctrlmem.util.fileio import atomic_write

__all__ = ["Cell", "Table", "pending", "PaperValue"]

PaperValue = Any  # float | tuple[float, float] | str


def pending(name: str) -> str:
    return f"pending: schedule {name!r} not registered"


@dataclass(frozen=True)
class Cell:
    """One compared value.

    Args:
        row, column: where it sits in the paper's table.
        paper: the paper's number, a ``(low, high)`` range, or ``"not recovered"``.
        ours: our number, or a string saying why there is none (``pending: ...``).
        how: how ours was obtained.
        group: for a :attr:`Table.grid` table, the sub-table the cell belongs to (e.g. a metric
            of Table 4); ignored by the list layout.
    """

    row: str
    column: str
    paper: PaperValue
    ours: Any
    how: str
    group: str = ""

    @property
    def comparable(self) -> bool:
        return isinstance(self.ours, (int, float)) and (
            isinstance(self.paper, (int, float)) or isinstance(self.paper, tuple))

    @property
    def deviation(self) -> float | None:
        """Relative deviation |ours/paper − 1| (0 inside a range, distance to the nearest bound
        outside it); ``None`` when not comparable."""
        if not self.comparable:
            return None
        lo, hi = self.paper if isinstance(self.paper, tuple) else (self.paper, self.paper)
        if lo <= self.ours <= hi:
            return 0.0
        bound = lo if self.ours < lo else hi
        if bound == 0:
            return math.inf if self.ours != 0 else 0.0
        return abs(self.ours / bound - 1)

    def ratio_text(self) -> str:
        if not self.comparable:
            return "–"
        if isinstance(self.paper, tuple):
            return "within range" if self.deviation == 0 else f"outside range ({self.deviation:+.1%} off)"
        if self.paper == 0:
            return "exact" if self.ours == 0 else "paper 0"
        return f"{self.ours / self.paper:.3f}"


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return f"{_fmt(value[0])}–{_fmt(value[1])}"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.4g}" if abs(value) < 10 else f"{value:.2f}"
        return f"{value:.4f}"
    return str(value)


@dataclass
class Table:
    """An artifact's comparison: title, what was done, cells and notes."""

    artifact: str
    title: str
    done: str
    cells: list[Cell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the build; written only to the run log, never into the table files."""
    verdict: str | None = None
    """Overrides the computed agreement when no cell is numeric (e.g. drawings)."""
    grid: bool = False
    """Render as the paper lays the table out: one sub-table per cell ``group``, rows × columns,
    each cell ``paper | ours``, each cell's "how" as a numbered label under its sub-table."""
    row_label: str = "row"
    """Header of the row-label column of a grid."""
    paper_values: bool = True
    """Whether a grid's cells show the paper's value (``paper | ours``); ``False`` for an
    artifact the paper has no numbers for: the cells show ours alone, under :attr:`legend`."""
    legend: str | None = None
    """The grid's legend when :attr:`paper_values` is ``False``."""

    def agreement(self) -> str:
        if self.verdict is not None:
            return self.verdict
        comparable = [c for c in self.cells if c.comparable]
        pend = sum(1 for c in self.cells if isinstance(c.ours, str) and c.ours.startswith("pending"))
        tail = f"; {pend} cells pending (schedule not registered)" if pend else ""
        if not comparable:
            reasons = {str(c.ours) if not isinstance(c.ours, (int, float)) else "paper value not recovered"
                       for c in self.cells}
            reasons_list = sorted(reasons)
            more = f" (+{len(reasons_list) - 3} more)" if len(reasons_list) > 3 else ""
            return f"not comparable: {'; '.join(reasons_list[:3])}{more}"
        worst = max(comparable, key=lambda c: c.deviation)
        if worst.deviation < 1e-6:  # the simulator rounds times to 9 decimals
            return f"exact (to 1e-6) / within range on all {len(comparable)} comparable cells{tail}"
        exact = sum(1 for c in comparable if c.deviation < 1e-6)
        if math.isinf(worst.deviation):
            worst_text = f"{worst.row}, {worst.column}: {_fmt(worst.ours)} where the paper has 0"
        else:
            where = f"{worst.group}: " if worst.group else ""
            worst_text = f"max deviation {worst.deviation:.1%} ({where}{worst.row}, {worst.column})"
        return f"{worst_text}; {exact} of {len(comparable)} comparable cells exact or within range{tail}"

    def rows(self) -> list[list[str]]:
        return [[c.row, c.column, _fmt(c.paper), _fmt(c.ours), c.ratio_text(), c.how] for c in self.cells]

    HEADER = ["row", "column", "paper", "ours", "ours / paper", "how ours was obtained"]

    def grids(self) -> list[tuple[str, list[str], list[tuple[str, list[str]]], list[str]]]:
        """The grid layout: per group ``(group, columns, [(row, cell texts)], how labels)``; a
        cell's text is ``paper | ours`` followed by ``[k]`` naming its how label when the group
        has more than one; a missing cell is empty."""
        out = []
        groups: dict[str, list[Cell]] = {}
        for c in self.cells:
            groups.setdefault(c.group, []).append(c)
        for group, cells in groups.items():
            cols = list(dict.fromkeys(c.column for c in cells))
            rows = list(dict.fromkeys(c.row for c in cells))
            hows = list(dict.fromkeys(c.how for c in cells))
            at = {(c.row, c.column): c for c in cells}
            body = []
            for r in rows:
                texts = []
                for col in cols:
                    c = at.get((r, col))
                    if c is None:
                        texts.append("")
                        continue
                    mark = f" [{hows.index(c.how) + 1}]" if len(hows) > 1 else ""
                    texts.append(f"{_fmt(c.paper)} | {_fmt(c.ours)}{mark}" if self.paper_values
                                 else f"{_fmt(c.ours)}{mark}")
                body.append((r, texts))
            labels = ([f"[{i + 1}] {h}" for i, h in enumerate(hows)] if len(hows) > 1
                      else [f"every cell: {hows[0]}"])
            out.append((group, cols, body, labels))
        return out

    GRID_LEGEND = ("Each cell: the paper's value | ours (a range is the paper's range over all models and m; "
                   "'not recovered' = the paper's value is not in the sources we have).")

    def to_markdown(self) -> str:
        out = [f"# {self.title}", "", f"*What was done:* {self.done}", "",
               f"*Agreement:* {self.agreement()}", ""]
        if self.grid:
            out += [self.GRID_LEGEND if self.paper_values else (self.legend or ""), ""]
            for group, cols, body, labels in self.grids():
                if group:
                    out += [f"## {group}", ""]
                out.append("| " + " | ".join([self.row_label] + cols) + " |")
                out.append("|" + "---|" * (len(cols) + 1))
                for r, texts in body:
                    out.append("| " + " | ".join(x.replace("|", "\\|") for x in [r] + texts) + " |")
                out += [""] + [f"{lab}  " for lab in labels] + [""]
            if out[-1] == "":
                out.pop()
        else:
            out.append("| " + " | ".join(self.HEADER) + " |")
            out.append("|" + "---|" * len(self.HEADER))
            for row in self.rows():
                out.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
        if self.notes:
            out += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def _html_tables(self) -> str:
        esc = html.escape
        if not self.grid:
            body = "".join("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in row) + "</tr>\n" for row in self.rows())
            return ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in self.HEADER)
                    + f"</tr></thead><tbody>\n{body}</tbody></table>")
        parts = [f"<p>{esc(self.GRID_LEGEND if self.paper_values else (self.legend or ''))}</p>"]
        for group, cols, body, labels in self.grids():
            if group:
                parts.append(f"<h2>{esc(group)}</h2>")
            rows = "".join("<tr><th>" + esc(r) + "</th>" + "".join(f"<td>{esc(x)}</td>" for x in texts) + "</tr>\n"
                           for r, texts in body)
            parts.append("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in [self.row_label] + cols)
                         + f"</tr></thead><tbody>\n{rows}</tbody></table>")
            parts.append("<p class='how'>" + "<br>".join(esc(lab) for lab in labels) + "</p>")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        """Rendered in Jupyter: title, what was done, agreement, the table(s) and notes."""
        esc = html.escape
        notes = "".join(f"<li>{esc(n)}</li>" for n in self.notes)
        style = ("<style>.ctrlmem-table td,.ctrlmem-table th{text-align:left !important;vertical-align:top}"
                 ".ctrlmem-table .how{color:#555;font-size:90%}</style>")
        return (f"{style}<div class='ctrlmem-table'><h3>{esc(self.title)}</h3>"
                f"<p><em>What was done:</em> {esc(self.done)}</p>"
                f"<p><em>Agreement:</em> {esc(self.agreement())}</p>\n" + self._html_tables()
                + (f"<ul>{notes}</ul>" if notes else "") + "</div>")

    def to_html(self) -> str:
        esc = html.escape
        notes = "".join(f"<li>{esc(n)}</li>" for n in self.notes)
        return (
            "<!doctype html>\n<html><head><meta charset='utf-8'>"
            f"<title>{esc(self.title)}</title><style>body{{font-family:sans-serif}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
            ".how{color:#555;font-size:90%}"
            "</style></head><body>\n"
            f"<h1>{esc(self.title)}</h1><p><em>What was done:</em> {esc(self.done)}</p>"
            f"<p><em>Agreement:</em> {esc(self.agreement())}</p>\n"
            + self._html_tables()
            + (f"<ul>{notes}</ul>" if notes else "")
            + "</body></html>\n"
        )


def write_json(path: Path, data: Any) -> None:

    path.parent.mkdir(parents=True, exist_ok=True)
    write_table_file(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_table_file(path: Path, text: str) -> None:

    atomic_write(path, text)
