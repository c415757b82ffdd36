"""`import ctrlmem` stays light: no torch (or other heavy stacks) in a fresh interpreter."""

import subprocess
import sys


def test_import_does_not_pull_torch():
    code = (
        "import sys, ctrlmem; "
        "heavy = [m for m in ('torch', 'plotly', 'pandas', 'papermill', 'ipywidgets') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import ctrlmem imported {out.stdout.strip()}"


def test_command_line_starts_without_heavy_imports():
    """Building the `ctrlmem` parser (every subcommand registered) loads no torch, plotly,
    pandas or papermill: those load only when their command runs."""
    code = (
        "import sys; from ctrlmem.cli import make_parser; make_parser(); "
        "heavy = [m for m in ('torch', 'plotly', 'pandas', 'papermill', 'ipywidgets') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the CLI imported {out.stdout.strip()} at start-up"
