"""Run All of each notebook, timed, next to the time its own text states.

Every notebook under ``notebooks/`` that states "Run All takes about N s" (or "N min") in its
Markdown is executed from a fresh kernel with its default parameters (papermill, into a
temporary folder: nothing is written into the checkout), and the measured wall time (kernel
start included, as a user's Run All after a restart) is printed next to the stated one, with
``DRIFT`` when they differ by more than a factor of 1.5 either way. Printed, never asserted: on a
shared machine the load decides, and it is printed too.

    .venv/bin/python benchmarks/bench_notebooks.py [--only 20,21] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATED = re.compile(r"Run All takes about (\d+(?:\.\d+)?) (s|min)\b")
DRIFT = 1.5


def stated_seconds(path: Path) -> float | None:
    """The time the notebook's Markdown states for Run All, in seconds (None if it states none)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        match = STATED.search("".join(cell["source"]))
        if match:
            value = float(match.group(1))
            return value * 60 if match.group(2) == "min" else value
    return None


def run_all(path: Path) -> float:
    """Execute the notebook once with its default parameters; wall seconds."""
    with tempfile.TemporaryDirectory(prefix="ctrlmem-nb-") as tmp:
        params = {}
        nb = json.loads(path.read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        if code and "out_dir" in "".join(code[0]["source"]):
            params["out_dir"] = os.path.join(tmp, "out")  # the notebook's own default is under the checkout
        cmd = [sys.executable, "-m", "papermill", str(path), os.path.join(tmp, "run.ipynb"), "--cwd",
               str(path.parent), "--no-progress-bar", "-k", "python3"]
        for key, value in params.items():
            cmd += ["-p", key, value]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{path.name} failed:\n{proc.stderr[-2000:]}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of notebook number prefixes, e.g. 20,21")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        if only and not any(path.name.startswith(o) for o in only):
            continue
        stated = stated_seconds(path)
        if stated is None:
            continue
        times = [run_all(path) for _ in range(args.repeats)]
        measured = statistics.median(times)
        ratio = measured / stated
        flag = "DRIFT" if not (1 / DRIFT <= ratio <= DRIFT) else "ok"
        print(f"{path.name:28s} stated about {stated:5.0f} s, measured {measured:6.1f} s "
              f"(x{ratio:.2f}, {flag}; load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
