"""Bad input, from a temporary working directory: the command line answers with exit status 2
and one line on stderr naming the problem (never a traceback, never a bare errno); the Python
API raises ``TypeError`` / ``ValueError`` naming the argument, and accepts what numbers are
(``numbers.Integral`` / ``numbers.Real``, numpy scalars included)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ctrlmem as cm
from ctrlmem import experiments as ex
from ctrlmem.cli import main
from ctrlmem.model import ir

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10_experiment.ipynb"
CFG = "name: bad\ndescription: d\nscale: cpu\n"


@pytest.fixture(autouse=True)
def _in_tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------- the command line

# (arguments, files to create in the working directory, text the one error line must hold)
CLI_CASES = [
    # size guards
    (["simulate", "1f1b", "-p", "4", "-m", "10000000"], {}, "--allow-large"),
    (["simulate", "1f1b", "-p", "1000000", "-m", "8"], {}, "more than the limit of 2e+06"),
    (["simulate", "interleaved-1f1b", "--param", "num_chunks=100000"], {}, "--allow-large"),
    (["simulate", "interleaved-1f1b", "--param", "num_chunks=true"], {}, "num_chunks must be a positive integer"),
    (["simulate", "1f1b", "--costs", "1e308,1,1"], {}, "f=1e+308 is larger than 1e+15"),
    (["simulate", "1f1b", "--costs", "0,0,0"], {}, "f + b + w must be > 0"),
    (["simulate", "v-shape", "--memory-limit", "0"], {}, "--memory-limit: must be a positive fraction"),
    # files and OS errors: what, where, and the fix
    (["export", "1f1b", "--torch-csv", "nodir/x.csv"], {}, "nodir/x.csv: no such file or folder"),
    (["export", "1f1b", "--torch-csv", "."], {}, ". is a folder; give a file name"),
    (["export", "1f1b", "--text", "sub"], {"sub/keep": "x"}, "sub is a folder"),
    (["export", "1f1b", "--text", "f/x.txt"], {"f": "x"}, "f/x.txt: part of this path is a file"),
    (["run", "--schedule", "1f1b", "--out", "f", "--steps", "0"], {"f": "x"}, "already exists and is not a folder"),
    (["run", "--schedule", "1f1b", "-p", "2", "-m", "1"], {}, "m >= p"),
    # sweep configs
    (["sweep", "missing.yaml"], {}, "no such config file"),
    (["sweep", "."], {}, "is a folder; give a config file"),
    (["sweep", "c.yaml"], {"c.yaml": b"\xff\xfe\x00garbage"}, "not a text (UTF-8) file"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + "params: {p: [1, 2}\n"}, "(line 4, column"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + f"notebook: {NOTEBOOK}\ngrid: {{}}\n"}, "key 'grid' is empty"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + f"notebook: {NOTEBOOK}\nparams: {{p: 2}}\ncases: []\n"},
     "key 'cases' is empty"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + "notebook: c.txt\nparams: {p: 2}\n", "c.txt": "hello\n" * 99},
     "is not a Jupyter notebook (expected a .ipynb file)"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + "notebook: n.ipynb\nparams: {p: 2}\n", "n.ipynb": "{oops"},
     "is not a Jupyter notebook (no nbformat JSON"),
    (["sweep", "c.yaml", "--list"], {"c.yaml": CFG + "params: {p: 2}\n"},
     "'notebooks/10_experiment.ipynb' does not exist (looked at"),
    (["sweep", "c.yaml", "--results", "f"], {"c.yaml": CFG + f"notebook: {NOTEBOOK}\nparams: {{p: 2}}\n", "f": "x"},
     "f is a file, not a folder; give a folder"),
    (["sweep", "c.yaml", "--root", "nowhere"], {"c.yaml": CFG + "params: {p: 2}\n"}, "--root nowhere: no such folder"),
    (["sweep", "c.yaml", "--no-progress"],
     {"c.yaml": CFG + f"notebook: {NOTEBOOK}\ngrid:\n  p: {list(range(1, 101))}\n  m: {list(range(1, 101))}\n"},
     "defines 10000 points (more than 1000)"),
    (["sweep", "c.yaml", "--no-progress", "--yes"],
     {"c.yaml": CFG + f"notebook: {NOTEBOOK}\ngrid:\n  p: {list(range(1, 1001))}\n  m: {list(range(1, 1001))}\n"},
     "defines 1,000,000 points (cases x grid), more than the 100,000 a sweep takes"),
    (["sweep", "c.yaml", "--only", "nope"], {"c.yaml": CFG + f"notebook: {NOTEBOOK}\nparams: {{p: 2}}\n"},
     "--only names unknown run id"),
]


@pytest.mark.parametrize("args, files, needle", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_cli_bad_input_is_exit_2_and_one_line(tmp_path, capsys, args, files, needle):
    """Exit status 2, one line on stderr holding the problem, nothing written to the checkout."""
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ctrlmem {args[0]}: error: ") and needle in lines[0], lines[0]
    assert "Errno" not in lines[0] and not lines[0].rstrip().endswith(": 2")


def test_cli_errors_from_another_process_have_no_traceback(tmp_path):
    """The installed entry point behaves the same (a subprocess, from a temporary cwd)."""
    p = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "export", "1f1b", "--torch-csv", "nodir/x.csv"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_allow_large_lifts_the_size_guard(monkeypatch, capsys):
    """--allow-large (allow_large=True) builds what the guard refuses."""
    monkeypatch.setattr(ir, "MAX_PASSES", 50)
    with pytest.raises(ValueError, match="allow_large=True"):
        cm.build("1f1b", 4, 8)
    assert cm.build("1f1b", 4, 8, allow_large=True).num_passes == 64
    assert main(["simulate", "1f1b", "--allow-large"]) == 0
    assert main(["simulate", "1f1b"]) == 2


# ---------------------------------------------------------------- the Python API


def _s():
    return cm.build("1f1b", 4, 8)


API_ERRORS = [
    ("build name=5", lambda: cm.build(5, 4, 8), TypeError, "name"),
    ("num_devices=True", lambda: cm.build("1f1b", True, 8), TypeError, "num_devices"),
    ("num_devices='4'", lambda: cm.build("1f1b", "4", 8), TypeError, "num_devices"),
    ("num_microbatches=4.5", lambda: cm.build("1f1b", 4, 4.5), ValueError, "num_microbatches"),
    ("num_microbatches=0", lambda: cm.build("1f1b", 4, 0), ValueError, "num_microbatches"),
    ("memory_limit=True", lambda: cm.build("v-shape", 4, 8, memory_limit=True), TypeError, "memory_limit"),
    ("memory_limit='0.5'", lambda: cm.build("v-shape", 4, 8, memory_limit="0.5"), TypeError, "memory_limit"),
    ("memory_limit=nan", lambda: cm.build("v-shape", 4, 8, memory_limit=math.nan), ValueError, "memory_limit"),
    ("m=10**7", lambda: cm.build("1f1b", 4, 10**7), ValueError, "allow_large"),
    ("p=10**6", lambda: cm.build("1f1b", 10**6, 8), ValueError, "num_devices=1000000"),
    ("num_chunks=10**5", lambda: cm.build("interleaved-1f1b", 4, 8, num_chunks=10**5), ValueError, "passes"),
    ("num_chunks=True", lambda: cm.build("interleaved-1f1b", 4, 8, num_chunks=True), TypeError, "num_chunks"),
    ("allow_large='yes'", lambda: cm.build("1f1b", 4, 8, allow_large="yes"), TypeError, "allow_large"),
    ("build costs=object()", lambda: cm.build("v-shape", 4, 8, costs=object()), TypeError, "costs"),
    ("simulate costs=object()", lambda: cm.simulate(_s(), object()), TypeError, "costs"),
    ("simulate costs=(1, 1)", lambda: cm.simulate(_s(), (1, 1)), ValueError, "costs"),
    ("simulate costs={'x': 1}", lambda: cm.simulate(_s(), {"x": 1}), TypeError, "costs"),
    ("simulate memory='x'", lambda: cm.simulate(_s(), None, "x"), TypeError, "memory"),
    ("simulate(None)", lambda: cm.simulate(None), TypeError, "schedule"),
    ("validate(None)", lambda: cm.validate(None), TypeError, "schedule"),
    ("validate('1f1b')", lambda: cm.validate("1f1b"), TypeError, "schedule"),
    ("Costs(True, 1, 1)", lambda: cm.Costs(True, 1, 1), TypeError, "f must be a number"),
    ("Costs('1', 1, 1)", lambda: cm.Costs("1", 1, 1), TypeError, "f must be a number"),
    ("Costs(1, 1, 1, [0, 1])", lambda: cm.Costs(1, 1, 1, [0, 1]), TypeError, "comm"),
    ("Costs per-stage zeros", lambda: cm.Costs([0, 0], [0, 0], [0, 0]), ValueError, "f + b + w"),
    ("Costs(1e308, ...)", lambda: cm.Costs(1e308, 1e308, 1e308), ValueError, "f=1e+308"),
    ("Costs(nan, ...)", lambda: cm.Costs(math.nan, 1, 1), ValueError, "f must be finite"),
    ("Costs(-1, ...)", lambda: cm.Costs(1, -1, 1), ValueError, "b must be >= 0"),
    ("Costs([], ...)", lambda: cm.Costs([], 1, 1), ValueError, "f is an empty list"),
    ("Costs.parse(5)", lambda: cm.Costs.parse(5), TypeError, "costs text"),
    ("release_at_b=True", lambda: cm.MemoryModel(release_at_b=True), TypeError, "release_at_b"),
    ("activation zeros", lambda: cm.MemoryModel(activation=[0, 0]), ValueError, "activation"),
    ("grid: {}", lambda: ex.config_from_dict({"name": "x", "description": "d", "scale": "cpu",
                                               "notebook": str(NOTEBOOK), "grid": {}}), ValueError, "'grid' is empty"),
]


@pytest.mark.parametrize("fn, exc, needle", [c[1:] for c in API_ERRORS], ids=[c[0] for c in API_ERRORS])
def test_api_bad_argument_raises_naming_it(fn, exc, needle):
    with pytest.raises(exc) as err:
        fn()
    assert needle in str(err.value)


def test_api_accepts_what_numbers_are():
    """numpy integers and floats are numbers: p, m, costs, memory_limit and release_at_b."""
    s = cm.build("1f1b", np.int64(4), np.int32(8))
    assert (s.num_devices, s.num_microbatches) == (4, 8) and type(s.num_devices) is int
    assert cm.build("1f1b", 4.0, 8).num_microbatches == 8
    c = cm.Costs(np.float64(1), np.float32(2), np.int64(1), np.float64(0.5))
    assert c == cm.Costs(1, 2, 1, 0.5)
    assert cm.Costs([np.float64(1), 2], 1, 1).f == (1.0, 2.0)
    assert cm.build("v-shape", 4, 8, memory_limit=np.float64(0.5)).num_devices == 4
    assert cm.MemoryModel(release_at_b=np.float32(0.5)).release_at_b == 0.5


def test_simulate_accepts_the_sensible_forms_of_costs():
    """"F,B,W[,COMM]" text, an (F, B, W[, COMM]) tuple and to_dict()'s mapping mean Costs(...)."""
    s = cm.build("zb-h1", 4, 8)
    want = cm.simulate(s, cm.Costs(1, 2, 1, 0.5)).makespan
    for form in ("1,2,1,0.5", (1, 2, 1, 0.5), [1, 2, 1, 0.5], {"f": 1, "b": 2, "w": 1, "comm": 0.5},
                 cm.Costs(1, 2, 1, 0.5).to_dict()):
        assert cm.simulate(s, form).makespan == want, form
    assert cm.simulate(s, (1, 2, 1)).makespan == cm.simulate(s, cm.Costs(1, 2, 1)).makespan
    assert cm.build("v-shape", 4, 8, costs="1,1,1,0").num_stages == 8


def test_large_costs_simulate_without_overflow():
    """The largest accepted costs keep every result finite."""
    r = cm.simulate(_s(), cm.Costs(1e15, 1e15, 1e15))
    assert math.isfinite(r.makespan) and 0 <= r.bubble_rate < 1


def test_sweep_of_many_points_needs_yes(tmp_path):
    grid = {"p": list(range(1, 41)), "m": list(range(1, 41))}
    cfg = ex.config_from_dict({"name": "big", "description": "d", "scale": "cpu", "notebook": str(NOTEBOOK),
                               "grid": grid})
    assert cfg.num_points == 1600
    with pytest.raises(ex.ConfigError, match="1600 points"):
        ex.run_sweep(cfg, results_dir=tmp_path / "r", check=False, executor=lambda *a: None)
    assert not (tmp_path / "r").exists()
    calls = []
    ex.run_sweep(cfg, results_dir=tmp_path / "r", build_dir=tmp_path / "b", check=False, yes=True,
                 only=[cfg.runs()[0].run_id],
                 executor=lambda *a: calls.append(1) or ex.RunOutcome("ok", result={"v": 1}))
    assert calls == [1]


# ---------------------------------------------------------------- relative paths mean the cwd


def test_sweep_resolves_notebook_and_results_against_the_cwd(tmp_path):
    """From another folder, a sweep runs *that* folder's notebook and writes only under it."""
    nb = json.loads(NOTEBOOK.read_text())
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "10_experiment.ipynb").write_text(json.dumps(nb))
    (tmp_path / "c.yaml").write_text(CFG + "params: {schedule: 1f1b, p: 2, m: 2}\n")
    cfg = ex.load_config("c.yaml")
    assert cfg.notebook == tmp_path / "notebooks" / "10_experiment.ipynb"
    seen = []

    def executor(notebook, executed, params, out_dir, timeout, cwd=None):
        seen.append((notebook, executed, out_dir, cwd))
        return ex.RunOutcome("ok", result={"v": 1})

    summary = ex.run_sweep(cfg, check=False, executor=executor)
    assert summary.results_dir == tmp_path / "experiments" / "results" / "bad"
    notebook, executed, out_dir, cwd = seen[0]
    assert cwd == tmp_path and all(tmp_path in Path(p).parents for p in (notebook, executed, out_dir))
    other = tmp_path / "other"
    other.mkdir()
    assert ex.load_config("c.yaml", root=tmp_path).notebook == cfg.notebook
    summary = ex.run_sweep(ex.load_config(tmp_path / "c.yaml", root=tmp_path), root=tmp_path, check=False,
                           executor=executor, results_dir="r2")
    assert summary.results_dir == tmp_path / "r2"


@pytest.mark.slow
def test_representative_commands_from_another_folder_leave_the_checkout_untouched(tmp_path):
    """simulate, export, draw, a one-point sweep (papermill) and a failing run, all from a
    temporary cwd with relative paths: the checkout's `git status --porcelain --ignored` and
    its files are unchanged, and the outputs are where the user asked."""
    from conftest import checkout_state

    before = checkout_state()
    if before is None:
        pytest.skip("not a git checkout")
    (tmp_path / "c.yaml").write_text(CFG + f"notebook: {NOTEBOOK}\nparams: {{schedule: 1f1b, p: 2, m: 2}}\n")
    commands = [
        ["simulate", "1f1b", "--json"],
        ["export", "1f1b", "--torch-csv", "x.csv"],
        ["draw", "1f1b", "-o", "d.html"],
        ["sweep", "c.yaml", "--no-progress", "--quick"],
        ["run", "--schedule", "1f1b", "-p", "2", "-m", "1", "--out", "runs"],  # refused before launching
    ]
    for args in commands:
        p = subprocess.run([sys.executable, "-m", "ctrlmem.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode in (0, 2) and "Traceback" not in p.stderr, (args, p.stderr[-800:])
    assert (tmp_path / "x.csv").is_file() and (tmp_path / "d.html").is_file()
    records = ex.read_records(tmp_path / "experiments" / "results" / "bad")
    assert [r["status"] for r in records] == ["ok"]
    assert (tmp_path / "build" / "notebooks" / "bad").is_dir()
    assert sorted(checkout_state() ^ before) == []
