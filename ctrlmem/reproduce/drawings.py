"""The schedule drawings (Fig. 1–5, 11, 18), made by `ctrlmem figures` and listed in the report."""

from __future__ import annotations

from pathlib import Path

from ctrlmem.model.paper import NOT_RECOVERED
from ctrlmem.reproduce.table import Cell, Table
import subprocess
import sys

def schedule_figures(quick: bool, out: str | Path = "figures") -> Table:
    """Fig. 2, 4, 5 and the Fig. 18 gallery, drawn by ``ctrlmem figures`` (another module) into
    ``out``; listed here so REPRODUCTION.md covers them."""

    t = Table("schedule-figures", "Fig. 1–5, 11, 18 — schedule figures (drawn by `ctrlmem figures`)",
              "Ran `ctrlmem figures` (schedule Gantt charts, memory curves, lifespans, building blocks) into the "
              "output folder; drawings are compared with the paper's by eye, so no cell is numeric.")
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "figures", "-o", str(out)], capture_output=True,
                          text=True)
    listing = Path(out) / "schedule_figures.md"
    if proc.returncode != 0 or not listing.is_file():
        err = (proc.stderr or proc.stdout).strip().splitlines()
        t.cells.append(Cell("schedule figures", "drawn", NOT_RECOVERED,
                            f"not available: `ctrlmem figures` failed ({err[-1] if err else proc.returncode})", "–"))
        return t
    drawn = True
    for line in listing.read_text().splitlines():
        if line.startswith("Not drawn"):
            drawn = False
        if not line.startswith("- "):
            continue
        head, _, desc = line[2:].partition(": ")
        stem = head.strip("`")
        if drawn:
            t.cells.append(Cell(stem, desc, "figure in the paper", f"drawn: {stem}.png / .svg",
                                "drawn by `ctrlmem figures` from simulated schedules"))
        else:
            t.cells.append(Cell(head, "not drawn", "figure in the paper", desc or "not drawn", "–"))
    n_drawn = sum(1 for c in t.cells if str(c.ours).startswith("drawn"))
    t.verdict = (f"not comparable (drawings, check by eye): {n_drawn} figures drawn, "
                 f"{len(t.cells) - n_drawn} not drawn (see the table)")
    return t
