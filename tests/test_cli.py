"""The `ctrlmem` command line: list, simulate, export; bad input exits 2 with one line."""

import json
import subprocess
import sys

import pytest

import ctrlmem as cm
from ctrlmem.cli import main


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "ctrlmem.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_list_names_every_schedule(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in cm.SCHEDULES:
        assert name in out


def test_simulate_json_matches_library(capsys):
    """--json prints one object whose fields equal cm.simulate's."""
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", "--costs", "3,2,1,0.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    r = cm.simulate(cm.build("zb-h1", 4, 8), cm.Costs(3, 2, 1, 0.5))
    for key in ("makespan", "device_spans", "bubble_rate", "peak_memory"):
        assert data[key] == getattr(r, key)
    assert "passes" not in data


def test_simulate_human_output(capsys):
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8"]) == 0
    out = capsys.readouterr().out
    assert "bubble rate   0.2727" in out and "peak memory   4 a" in out


def test_export_torch_csv(tmp_path, capsys):
    path = tmp_path / "zbv.csv"
    assert main(["export", "zb-v", "-p", "2", "-m", "4", "--torch-csv", str(path)]) == 0
    assert cm.Schedule.from_torch_csv(path).device_passes == cm.build("zb-v", 2, 4).device_passes


@pytest.mark.parametrize(
    "args,needle",
    [
        (["simulate", "nope"], "valid names: gpipe"),
        (["simulate", "1f1b", "-p", "0"], "-p/--devices: must be a positive integer, got 0"),
        (["simulate", "1f1b", "-m", "-2"], "-m/--microbatches: must be a positive integer, got -2"),
        (["simulate", "1f1b", "--costs", "1,nan,1"], "b must be finite"),
        (["simulate", "1f1b", "--costs", "1,-1,1"], "b must be >= 0"),
        (["simulate", "1f1b", "--costs", "1,1"], "F,B,W or F,B,W,COMM"),
        (["simulate", "1f1b", "--memory-limit", "0.5"], "takes no memory_limit"),
        (["simulate", "interleaved-1f1b", "-p", "4", "-m", "9"], "not a multiple"),
        (["simulate", "1f1b", "--param", "num_chunks=2"], "does not take parameter"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle):
    """Exit status 2, the problem named on stderr in one line, no traceback."""
    proc = run(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
