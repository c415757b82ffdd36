"""`import ctrlmem` and the command line stay light: no torch (or other heavy stacks) at start-up."""

import subprocess
import sys

HEAVY = ("torch", "plotly", "pandas", "papermill", "ipywidgets")


def heavy_modules_after(statement: str) -> list[str]:
    """Run ``statement`` in a fresh interpreter; return the heavy modules it imported."""
    code = f"import sys; {statement}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [m for m in out.stdout.strip().split(",") if m]


def test_import_does_not_pull_torch():
    assert heavy_modules_after("import ctrlmem") == []


def test_command_line_starts_without_heavy_imports():
    """Building the `ctrlmem` parser (every subcommand registered) loads none of them: they load
    only when their command runs."""
    assert heavy_modules_after("from ctrlmem.cli import make_parser; make_parser()") == []
