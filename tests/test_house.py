"""The house rules, checked: ruff's lint, import-linter's layer contracts, and no import circle
(function-level imports counted too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{tool} is not installed in this environment: run bash scripts/setup.sh")
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    r = _run("ruff", "check", "--no-cache", "ctrlmem", "tests", "scripts", "benchmarks")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_import_contracts_are_kept():
    r = _run("lint-imports", "--no-cache")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_counting_function_level_imports():
    graph = grimp.build_graph("ctrlmem", cache_dir=None)
    # the graph holds the imports inside functions too: cli.draw imports the explorer only when drawing
    assert "ctrlmem.explorer.views" in graph.find_modules_directly_imported_by("ctrlmem.cli.draw")
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self.edges[m]

    assert _cycles(Graph()) == [["a", "b", "c"]]


def test_importing_ctrlmem_and_its_cli_loads_no_heavy_library():
    code = ("import sys, ctrlmem, ctrlmem.cli; ctrlmem.cli.make_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'plotly', 'pandas', 'ortools', 'papermill', 'ipywidgets'}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
