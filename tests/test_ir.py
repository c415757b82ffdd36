"""Data model: passes, placements, schedules, text and torch-CSV round trips."""

import pytest

import ctrlmem as cm
from ctrlmem import Op, Pass, Placement, Schedule

CORE = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"]


def test_pass_text_round_trips():
    """Every op's compact text parses back to the same pass."""
    for op in Op:
        ps = Pass(op, 12, 345)
        assert Pass.parse(str(ps)) == ps
    assert str(Pass(Op.BW, 5, 2)) == "5BW2"


@pytest.mark.parametrize("bad", ["", "F3", "3X0", "3F", "a3F0", "3 F 0"])
def test_pass_parse_rejects_garbage(bad):
    """Malformed pass text is a ValueError that shows the expected form."""
    with pytest.raises(ValueError, match="expected <stage>"):
        Pass.parse(bad)


def test_placements():
    """The standard placements put stages where the paper says."""
    assert Placement.sequential(3).stage_device == (0, 1, 2)
    assert Placement.interleaved(3, 2).stage_device == (0, 1, 2, 0, 1, 2)
    v = Placement.v_shape(3)
    assert v.stage_device == (0, 1, 2, 2, 1, 0)
    assert v.stages_of(0) == (0, 5) and v.chunk_of(5) == 1 and v.chunk_of(0) == 0
    assert Placement.infer((0, 1, 1, 0), 2).kind == "v-shape"
    assert Placement.infer((0, 1, 0, 1), 2).kind == "interleaved"
    assert Placement.infer((1, 0), 2).kind == "custom"


def test_placement_rejects_uneven_devices():
    """A device with a different number of stages is refused with the counts."""
    with pytest.raises(ValueError, match="same, non-zero number of stages"):
        Placement("custom", (0, 0, 1), 2)
    with pytest.raises(ValueError, match="outside"):
        Placement("custom", (0, 2), 2)


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (3, 7)])
def test_text_form_round_trips(name, p, m):
    """to_text -> from_text gives back an equal schedule."""
    if name == "interleaved-1f1b" and m == 7:
        pytest.skip("interleaved needs m a multiple of its rounds")
    s = cm.build(name, p, m)
    back = Schedule.from_text(s.to_text())
    assert back == s


@pytest.mark.parametrize("name", CORE)
def test_torch_csv_round_trips(name, tmp_path):
    """to_torch_csv -> from_torch_csv keeps every pass, its order and the placement."""
    s = cm.build(name, 4, 8)
    path = tmp_path / "s.csv"
    s.to_torch_csv(path)
    back = Schedule.from_torch_csv(path, name=name)
    assert back.device_passes == s.device_passes
    assert back.placement == s.placement
    assert back.num_microbatches == 8


def test_torch_csv_uses_torch_letters():
    """Our B is torch's I and our BW is torch's B."""
    s = Schedule.from_orders(
        "x", Placement.sequential(1), 1, [[(Op.F, 0, 0), (Op.B, 0, 0), (Op.W, 0, 0)]]
    )
    assert s.to_torch_csv().strip() == "0F0,0I0,0W0"
    fused = cm.build("1f1b", 1, 1)
    assert fused.to_torch_csv().strip() == "0F0,0B0"


def test_torch_csv_rejects_communication_actions():
    """Only compute actions can be imported; the error names rank and column."""
    with pytest.raises(ValueError, match="rank 0, column 1"):
        Schedule.from_torch_csv("0F0,0SEND_F0\n")


def test_schedule_rejects_wrong_row_count():
    with pytest.raises(ValueError, match="rows"):
        Schedule("x", 2, 1, Placement.sequential(2), ((),))
