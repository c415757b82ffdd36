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


def test_torch_csv_unknown_action_names_line_and_column(tmp_path):
    """An action torch does not know is refused; the error names the line, rank and column."""
    with pytest.raises(ValueError, match=r"line 2 \(rank 1\), column 2.*'1X0'"):
        Schedule.from_torch_csv_text("0F0,0B0\n1F0,1X0\n")


def test_torch_compute_comms_variant_keeps_the_compute_order():
    """torch's compute+comms dump loads: SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD are dropped and
    an OVERLAP_F_B action becomes its sub-actions in order."""
    comms = ("0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD\n"
             "1UNSHARD,1RECV_F0,1F0,1RECV_F1,(1F1;1B0)OVERLAP_F_B,1SEND_B0,1B1,1SEND_B1\n")
    s = Schedule.from_torch_csv_text(comms)
    assert [str(ps) for ps in s.device_passes[0]] == ["0F0", "0F1", "0BW0", "0BW1"]
    assert [str(ps) for ps in s.device_passes[1]] == ["1F0", "1F1", "1BW0", "1BW1"]
    cm.validate(s)


def test_torch_csv_path_with_a_comma_is_a_path(tmp_path):
    """A file name containing a comma is read as a file, never parsed as CSV text."""
    path = tmp_path / "sched,v2.csv"
    cm.build("1f1b", 2, 3).to_torch_csv(path)
    assert Schedule.from_torch_csv(str(path)).device_passes == cm.build("1f1b", 2, 3).device_passes
    with pytest.raises(FileNotFoundError):
        Schedule.from_torch_csv(str(tmp_path / "missing,0F0.csv"))


def test_torch_csv_text_keeps_working_through_the_old_entry_with_a_warning():
    with pytest.warns(DeprecationWarning, match="from_torch_csv_text"):
        s = Schedule.from_torch_csv("0F0,0B0\n")
    assert [str(ps) for ps in s.device_passes[0]] == ["0F0", "0BW0"]


def test_torch_csv_tolerates_bom_crlf_and_surrounding_blank_lines(tmp_path):
    s = cm.build("zb-v", 2, 4)
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xef\xbb\xbf\r\n" + s.to_torch_csv().replace("\n", "\r\n").encode() + b"\r\n\r\n")
    back = Schedule.from_torch_csv(path)
    assert back.device_passes == s.device_passes and back.placement == s.placement


@pytest.mark.parametrize("text,needle", [
    ("0F0,0B0\n\n1F0,1B0\n", "line 2: blank line between ranks"),
    ("0F0,0B0\n1F0,1B3\n", "line 2: microbatch 3 is outside 0..1"),
    ("0F0,0B0\n1F0,1F\n", "line 2 .*no microbatch index"),
    ("", "empty"),
])
def test_torch_csv_refuses_bad_input_naming_the_line(text, needle):
    with pytest.raises(ValueError, match=needle):
        Schedule.from_torch_csv_text(text, num_microbatches=2)


def test_binary_garbage_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "junk.csv"
    path.write_bytes(b"0F0,0B0\n\x89PNG\x00\xff\xfe\n")
    with pytest.raises(ValueError, match="line 2: not UTF-8 text"):
        Schedule.from_torch_csv(path)
    with pytest.raises(ValueError, match="line 2: contains control characters"):
        Schedule.from_text("schedule x p=1 m=1 placement=sequential:0\nd0: 0F0\x00 0BW0\n")


HEAD = "schedule s p=2 m=2 placement=sequential:0,1\n"


@pytest.mark.parametrize("text,needle", [
    (HEAD + "d0: 0F0 0F1 0BW0 0BW1\nd0: 0F0\nd1: 1F0\n", "line 3: device line 'd0' is given twice"),
    ("schedule s p=2 p=3 m=2 placement=sequential:0,1\n", "line 1: header key 'p' is given twice"),
    (HEAD + "d0: 0F0 0F2\n", "line 2: pass 0F2 names microbatch 2, outside 0..1"),
    (HEAD + "d0: 0F0\nd1: 5F0\n", "line 3: pass 5F0 names stage 5, outside 0..1"),
    (HEAD + "d2: 0F0\n", "line 2: device line 'd2' is outside d0..d1"),
    (HEAD + "\nd0: 0F0 0Q0\n", "line 3: cannot parse pass '0Q0'"),
])
def test_text_form_refuses_bad_input_naming_the_line(text, needle):
    with pytest.raises(ValueError, match=needle):
        Schedule.from_text(text)


def test_text_form_tolerates_bom_blank_lines_and_comments():
    s = cm.build("1f1b", 2, 3)
    text = "\ufeff# a comment\n\n" + s.to_text().replace("\nd1", "\n\nd1") + "\n\n"
    assert Schedule.from_text(text) == s


def test_load_reads_either_form(tmp_path):
    s = cm.build("v-half", 2, 4)
    (tmp_path / "a.txt").write_text(s.to_text())
    s.to_torch_csv(tmp_path / "b.csv")
    assert Schedule.load(tmp_path / "a.txt") == s
    b = Schedule.load(tmp_path / "b.csv")
    assert b.name == "b" and b.device_passes == s.device_passes and b.placement == s.placement


def test_schedule_rejects_wrong_row_count():
    with pytest.raises(ValueError, match="rows"):
        Schedule("x", 2, 1, Placement.sequential(2), ((),))


@pytest.mark.parametrize("name", ["1f1b-v", "v-min", "v-half", "v-zb", "v-shape", "zb"])
def test_text_round_trips_cost_adapted_schedules(name):
    """A cost-adapted schedule's parameters (free text with spaces, e.g. what the search chose)
    survive the text form: from_text(to_text(s)) == s."""
    s = cm.build(name, 2, 4, costs=cm.Costs(3, 4, 2, 0.1))
    assert cm.Schedule.from_text(s.to_text()) == s


def test_text_header_with_an_unbalanced_quote_names_the_line():
    with pytest.raises(ValueError, match="line 1: bad header"):
        cm.Schedule.from_text("schedule x p=1 m=1 placement=sequential:0 note='open\nd0: 0F0 0BW0\n")


def test_text_round_trips_parameters_named_like_header_keys():
    """A generator parameter called like a header key (the solver's 'placement') and None values
    round-trip; the header never holds a key twice."""
    s = cm.Schedule("x", 1, 1, Placement.sequential(1), ((Pass.parse("0F0"), Pass.parse("0BW0")),),
                    (("memory_limit", None), ("placement", "v-shape"), ("strict", True)))
    head = s.to_text().splitlines()[0]
    assert head.count("placement=") == 2 and "param.placement=v-shape" in head
    assert cm.Schedule.from_text(s.to_text()) == s
