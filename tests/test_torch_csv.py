"""Every generator's torch CSV is read by torch's own action parser and passes torch's own
schedule validator (torch.distributed.pipelining, torch 2.13)."""

import csv

import pytest

import ctrlmem as cm

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def _sizes(name):
    return [(2, 4), (4, 8), (3, 6)]


# every schedule but bidirectional DualPipe, whose two model copies torch's CSV cannot express (its
# to_torch_csv refuses, tests/test_overlap.py)
ONE_COPY = sorted(n for n in cm.SCHEDULES if n != "dualpipe")


@pytest.mark.parametrize("name", ONE_COPY)
def test_torch_parses_and_validates_our_csv(name, tmp_path):
    for p, m in _sizes(name):
        s = cm.build(name, p, m)
        path = tmp_path / f"{name}-{p}-{m}.csv"
        s.to_torch_csv(path)
        with open(path, newline="") as fh:
            actions = {rank: [schedules._Action.from_str(c) for c in row] for rank, row in enumerate(csv.reader(fh))}
        assert len(actions) == p
        # torch's letters are ours translated: I = B, B = BW
        ours = [[(ps.stage, {"B": "I", "BW": "B"}.get(ps.op.value, ps.op.value), ps.microbatch)
                 for ps in row] for row in s.compute_only().device_passes]  # R passes: no torch action
        theirs = [[(a.stage_index, a.computation_type.value, a.microbatch_index)
                   for unit in actions[r] for a in (unit.sub_actions or (unit,))]  # OVERLAP_F_B: its two
                  for r in range(p)]
        assert theirs == ours
        stage_to_rank = schedules._validate_schedule(actions, p, s.num_stages, m)
        assert stage_to_rank == {st: s.placement.device_of(st) for st in range(s.num_stages)}


# A 4-rank schedule in torchtitan's CSV form (what `pipeline_parallel_schedule_csv` loads through
# torch's `_load_csv`): 1F1B with the backward split into I (input grad) and W (weight grad).
TITAN_1F1B_SPLIT = """\
0F0,0F1,0F2,0F3,0I0,0W0,0I1,0W1,0I2,0W2,0I3,0W3
1F0,1F1,1F2,1I0,1W0,1F3,1I1,1W1,1I2,1W2,1I3,1W3
2F0,2F1,2I0,2W0,2F2,2I1,2W1,2F3,2I2,2W2,2I3,2W3
3F0,3I0,3W0,3F1,3I1,3W1,3F2,3I2,3W2,3F3,3I3,3W3
"""
# The same 4 ranks with a V-shape placement (8 stages, rank r holds stages r and 7-r), as
# torchtitan's ZBV schedules run.
TITAN_V = """\
0F0,0F1,0F2,0F3,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,7I3,7W3,0I0,0W0,0I1,0W1,0I2,0W2,0I3,0W3
1F0,1F1,1F2,1F3,6F0,6F1,6I0,6W0,6F2,6I1,6W1,6F3,6I2,6W2,1I0,1W0,6I3,6W3,1I1,1W1,1I2,1W2,1I3,1W3
2F0,2F1,2F2,5F0,2F3,5F1,5F2,5I0,5W0,5F3,5I1,5W1,2I0,2W0,5I2,5W2,2I1,2W1,5I3,5W3,2I2,2W2,2I3,2W3
3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,4I0,4W0,3I0,3W0,4I1,4W1,3I1,3W1,4I2,4W2,3I2,3W2,4I3,4W3,3I3,3W3
"""


@pytest.mark.parametrize("text,stages,kind", [(TITAN_1F1B_SPLIT, 4, "sequential"), (TITAN_V, 8, "v-shape")])
def test_torchtitan_csv_loads_and_simulates_from_the_command_line(text, stages, kind, tmp_path, capsys):
    """`ctrlmem simulate FILE.csv` and `ctrlmem draw FILE.csv` take a 4-rank torchtitan CSV (torch's
    own loader accepts the same file); the numbers are the simulation of exactly that order."""
    import json

    from ctrlmem.cli import main

    path = tmp_path / "titan,4ranks.csv"  # a comma in the name: still a path
    path.write_text(text)
    with open(path, newline="") as fh:
        actions = {r: [schedules._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(fh))}
    schedules._validate_schedule(actions, 4, stages, 4)  # torch agrees it is a valid schedule
    s = cm.Schedule.from_torch_csv(path)
    assert (s.num_devices, s.num_microbatches, s.num_stages, s.placement.kind) == (4, 4, stages, kind)
    assert main(["simulate", str(path), "--costs", "6,8,4,0.2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = cm.simulate(s, cm.Costs(6, 8, 4, 0.2))
    assert got["makespan"] == want.makespan and got["peak_memory"] == list(want.peak_memory)
    assert main(["simulate", str(path)]) == 0
    assert "titan,4ranks" in capsys.readouterr().out
    out = tmp_path / "titan.html"
    assert main(["draw", str(path), "--compare", "1f1b", "-o", str(out)]) == 0
    html = out.read_text()
    assert "titan,4ranks" in html and "p=4, m=4" in html
    capsys.readouterr()
    assert main(["export", str(path), "--torch-csv", "-"]) == 0
    assert capsys.readouterr().out == s.to_torch_csv()


def test_schedule_file_errors_are_one_line(tmp_path, capsys):
    from ctrlmem.cli import main

    path = tmp_path / "t.csv"
    path.write_text(TITAN_1F1B_SPLIT)
    assert main(["simulate", str(path), "-p", "8"]) == 2
    assert "-p 8 does not match" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0I0,0W0\n1F0,1X0\n")
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "1X0" in err and len(err.strip().splitlines()) == 1


def test_export_torch_csv_dash_prints_to_stdout(tmp_path, capsys, monkeypatch):
    from ctrlmem.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["export", "zb-v", "-p", "2", "-m", "4", "--torch-csv", "-"]) == 0
    assert capsys.readouterr().out == cm.build("zb-v", 2, 4).to_torch_csv()
    assert not (tmp_path / "-").exists()
