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
    """

    row: str
    column: str
    paper: PaperValue
    ours: Any
    how: str

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
    verdict: str | None = None
    """Overrides the computed agreement when no cell is numeric (e.g. drawings)."""

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
            worst_text = f"max deviation {worst.deviation:.1%} ({worst.row}, {worst.column})"
        return f"{worst_text}; {exact} of {len(comparable)} comparable cells exact or within range{tail}"

    def rows(self) -> list[list[str]]:
        return [[c.row, c.column, _fmt(c.paper), _fmt(c.ours), c.ratio_text(), c.how] for c in self.cells]

    HEADER = ["row", "column", "paper", "ours", "ours / paper", "how ours was obtained"]

    def to_markdown(self) -> str:
        out = [f"# {self.title}", "", f"*What was done:* {self.done}", "",
               f"*Agreement:* {self.agreement()}", ""]
        out.append("| " + " | ".join(self.HEADER) + " |")
        out.append("|" + "---|" * len(self.HEADER))
        for row in self.rows():
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
        if self.notes:
            out += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def to_html(self) -> str:
        esc = html.escape
        body = "".join("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in row) + "</tr>\n" for row in self.rows())
        notes = "".join(f"<li>{esc(n)}</li>" for n in self.notes)
        return (
            "<!doctype html>\n<html><head><meta charset='utf-8'>"
            f"<title>{esc(self.title)}</title><style>body{{font-family:sans-serif}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
            "</style></head><body>\n"
            f"<h1>{esc(self.title)}</h1><p><em>What was done:</em> {esc(self.done)}</p>"
            f"<p><em>Agreement:</em> {esc(self.agreement())}</p>\n<table><thead><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in self.HEADER)
            + f"</tr></thead><tbody>\n{body}</tbody></table>"
            + (f"<ul>{notes}</ul>" if notes else "")
            + "</body></html>\n"
        )


def _write_json(path: Path, data: Any) -> None:

    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
