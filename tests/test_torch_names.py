"""No silent hangs: a CSV is only named under a torch / torchtitan schedule class that places its
stages as the CSV does; a mismatching class name given by the user is refused naming the right ones."""

import inspect

import pytest

import ctrlmem as cm
from ctrlmem.cli import main
from ctrlmem.model.torchnames import TORCH_CLASS_STYLE, check_torch_class, classes_for, torch_placement

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
utils = pytest.importorskip("torch.distributed.pipelining._utils")


@pytest.mark.parametrize("name", list(TORCH_CLASS_STYLE))
@pytest.mark.parametrize("p,v", [(2, 1), (2, 2), (4, 2), (4, 3)])
def test_our_table_is_what_torch_builds(name, p, v):
    """Every class name torch's get_schedule_class knows; the stages a rank gets: one for a
    single-stage class, torch's V style where the class asks for style="v", else its loop style."""
    cls = schedules.get_schedule_class(name)
    ours = torch_placement(name, p, p * v)
    if issubclass(cls, schedules.PipelineScheduleSingle):
        want = list(range(p)) if v == 1 else None
    else:
        style = "v" if 'style="v"' in inspect.getsource(cls.__init__) else "loop"
        want = None if style == "v" and v != 2 else [utils.generate_stage_to_rank_mapping(p, p * v, style)[s]
                                                     for s in range(p * v)]
    assert (None if ours is None else list(ours.stage_device)) == want
    assert set(TORCH_CLASS_STYLE) == set(inspect.getsource(schedules.get_schedule_class).split("schedule_map = {")[1]
                                         .split("}")[0].replace('"', "").replace(":", " ").split()[::2])


def test_a_v_shape_csv_under_interleaved1f1b_is_refused_naming_the_right_class(tmp_path, capsys):
    s = cm.build("v-half", 4, 8)
    with pytest.raises(ValueError, match="use 'ZBVZeroBubble' or 'DualPipeV'"):
        check_torch_class(s, "Interleaved1F1B")
    assert check_torch_class(s, "dualpipev") == "DualPipeV"  # case as torch's get_schedule_class
    csv = tmp_path / "v.csv"
    s.to_torch_csv(csv)
    assert main(["export", str(csv), "--torch-schedule", "Interleaved1F1B", "--text", str(tmp_path / "v.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'ZBVZeroBubble' or 'DualPipeV'" in err and not (tmp_path / "v.txt").exists()


@pytest.mark.parametrize("name,kw,fits", [
    # one stage per rank: the loop style builds that too
    ("1f1b", {}, ["GPipe", "1F1B", "PipelineScheduleSingle", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                  "PipelineScheduleMulti"]),
    ("looped-bfs", {"num_chunks": 3}, ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "PipelineScheduleMulti"]),
    ("dualpipe-v", {}, ["ZBVZeroBubble", "DualPipeV"]),
])
def test_export_states_the_placement_check_and_takes_a_fitting_name(name, kw, fits, tmp_path, capsys):
    assert classes_for(cm.build(name, 4, 8, **kw)) == fits
    args = ["export", name, "-p", "4", "-m", "8", "--torch-csv", str(tmp_path / "s.csv"), "--torch-schedule", fits[-1]]
    args += [a for k, v in kw.items() for a in ("--param", f"{k}={v}")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f'pipeline_parallel_schedule = "{fits[-1]}"' in out
    assert f"placement check: the CSV is {cm.build(name, 4, 8, **kw).placement.kind}" in out and ", ".join(fits) in out
