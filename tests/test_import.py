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


def test_run_launcher_checks_a_run_without_torch():
    """`ctrlmem run` validates a run (the torch range, the model preset, the schedule, the CPU
    memory) and writes its worker config without importing torch: only the ranks need it (it
    cost the launcher, and every `--emit-sbatch`, 3 s of CPU)."""
    assert heavy_modules_after(
        "from ctrlmem.runtime.launch import RunConfig, prepare; "
        "_, worker = prepare(RunConfig('v-half', 2, 4, out='o')); "
        "assert worker['torch_version'] and worker['model']['name'] == 'tiny'") == []


def test_the_sweeps_papermill_starts_without_jsonschemas_iri_grammars():
    """The papermill command line a sweep starts (and `ctrlmem sweep` itself) imports papermill
    without jsonschema's optional IRI checker, whose import compiles Lark grammars (1.7 s of
    CPU per point); jsonschema's other format checks stay."""
    code = ("import sys; from ctrlmem.experiments.papermill_cli import without_iri_grammars; without_iri_grammars(); "
            "import papermill.cli, jsonschema; checks = jsonschema.Draft7Validator.FORMAT_CHECKER.checkers; "
            "print('lark' in sys.modules, 'iri' in checks, 'date' in checks and 'email' in checks)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]
