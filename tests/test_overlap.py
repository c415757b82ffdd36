"""Overlapped forward + backward pairs (Schedule.overlaps, Costs.fb_overlap): timing, checks, and
DualPipeV's closed forms (DualPipe README: bubble (PP/2 − 1)(F&B + B − 3W), PP + 1 activations,
with PP = 2p chunks on p devices)."""

import pytest

import ctrlmem as cm
from ctrlmem import Op, Pass, Placement, Schedule, ScheduleError


def two_devices(pair_at=1, d1=None):
    """1F1B-like order on two devices; device 1 runs positions ``pair_at``, ``pair_at + 1`` as a pair."""
    rows = [[Pass(Op.F, 0, 0), Pass(Op.F, 0, 1), Pass(Op.BW, 0, 0), Pass(Op.BW, 0, 1)],
            d1 or [Pass(Op.F, 1, 0), Pass(Op.F, 1, 1), Pass(Op.BW, 1, 0), Pass(Op.BW, 1, 1)]]
    return Schedule.from_orders("t", Placement.sequential(2), 2, rows, overlaps=((), (pair_at,)))


def test_a_pair_starts_when_both_inputs_are_ready_and_takes_fb_overlap_of_its_two_times():
    # stage 0's forward takes 2: 1F1's input is ready at 4, 1BW0's (1F0) at 3; the pair waits for both
    r = cm.simulate(two_devices(), cm.Costs([2, 1], 1, 1, fb_overlap=0.5))
    assert r.timing(1, 1) == r.timing(1, 2) == (4.0, 4.0 + 0.5 * (1 + 2))
    assert r.device_work[1] == 1 + 0.5 * 3 + 2  # the work counts the pair once, at its overlapped time
    assert r.timing(1, 3)[0] == 5.5  # 1BW1 follows the pair
    full = cm.simulate(two_devices(), cm.Costs([2, 1], 1, 1))
    assert full.timing(1, 1) == (4.0, 7.0)  # fb_overlap = 1: the pair takes F + BW


def test_pairs_are_checked():
    with pytest.raises(ScheduleError, match="one forward and one backward"):
        cm.validate(two_devices(pair_at=0))  # 1F0 + 1F1
    with pytest.raises(ScheduleError, match="runs one microbatch twice"):
        cm.validate(two_devices(d1=[Pass(Op.F, 1, 0), Pass(Op.BW, 1, 0), Pass(Op.F, 1, 1), Pass(Op.BW, 1, 1)],
                                pair_at=0))
    with pytest.raises(ValueError, match="needs this one and the next"):
        two_devices(pair_at=3)
    rows = two_devices().device_passes
    with pytest.raises(ValueError, match="share a pass"):
        Schedule.from_orders("t", Placement.sequential(2), 2, rows, overlaps=((), (1, 2)))
    with pytest.raises(ValueError, match="fraction of F"):
        cm.Costs(fb_overlap=0)


def test_text_form_writes_a_pair_as_one_token():
    s = two_devices()
    assert "d1: 1F0 1F1+1BW0 1BW1" in s.to_text()
    assert Schedule.from_text(s.to_text()) == s
    with pytest.raises(ValueError, match="joins 3 passes"):
        Schedule.from_text(s.to_text().replace("1F1+1BW0", "1F1+1BW0+1BW1"))


CLOSED_FORM_CASES = ([(p, w, 1.0) for p in (2, 4, 8) for w in (1.0, 0.5, 0.25)]
                     + [(2, w, fb) for w in (1.0, 0.5) for fb in (0.9, 0.75)])


@pytest.mark.parametrize("p,w,fb", CLOSED_FORM_CASES)
def test_dualpipe_v_closed_forms(p, w, fb):
    """Chunk times F = B (input backward) = 1 and W; F&B = fb · (F + B + W). The README's bubble
    holds exactly on device 0 (the fullest) for any W when F&B = F + B + W, and at p = 2 with a gain
    too (at p > 2 with a gain the simulated bubble differs: docs/theory.md, DualPipe). Peak
    PP + 1 = 2p + 1 chunk activations (a/2 each), for every m."""
    F = B = 1.0
    for m in (2 * p, 3 * p + 1):
        r = cm.simulate(cm.build("dualpipe-v", p, m), cm.Costs(2 * F, 2 * B, 2 * w, fb_overlap=fb))
        readme = (p - 1) * (fb * (F + B + w) + (B + w) - 3 * w)  # (PP/2 − 1)(F&B + B_full − 3W)
        assert r.device_bubbles[0] == pytest.approx(readme)
        assert max(r.device_bubbles) == r.device_bubbles[0]
        assert r.peak_memory[0] == (2 * p + 1) / 2


def test_the_side_by_side_table_in_the_docs_is_the_simulators():
    """docs/theory.md §14's table (p = 8, m = 20, F = B = W = 1): every simulated number in it."""
    from pathlib import Path

    text = Path(__file__).resolve().parents[1].joinpath("docs", "theory.md").read_text()
    rows = [ln for ln in text.split("## 13 ", 1)[1].splitlines() if ln.startswith("| `")]
    checked = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].split("`")[1]
        fb = float(cells[0].split("`fb_overlap` ")[1]) if "fb_overlap" in cells[0] else 1.0
        r = cm.simulate(cm.build(name, 8, 20), cm.Costs(1, 1, 1, 0, fb_overlap=fb))
        assert float(cells[1].split()[0]) == r.device_bubbles[0], row
        assert float(cells[2]) == r.makespan and float(cells[3]) == round(r.bubble_rate, 4), row
        assert float(cells[4].split()[0]) == max(r.peak_memory), row
        checked += 1
    assert checked == 8


def test_the_command_line_takes_fb_overlap(capsys):
    from ctrlmem.cli import main

    assert main(["simulate", "dualpipe-v", "-p", "4", "-m", "8", "--fb-overlap", "0.8", "--json"]) == 0
    got = __import__("json").loads(capsys.readouterr().out)
    want = cm.simulate(cm.build("dualpipe-v", 4, 8), cm.Costs(fb_overlap=0.8))
    assert got["makespan"] == want.makespan < cm.simulate(cm.build("dualpipe-v", 4, 8)).makespan
    assert got["costs"]["fb_overlap"] == 0.8
    assert main(["simulate", "dualpipe-v", "-p", "4", "-m", "8", "--fb-overlap", "1.5"]) == 2
    assert "in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("w", [1.0, 0.5])
def test_dualpipe_closed_forms(p, w):
    """Bidirectional DualPipe, stage times F = B = 1, W, F&B = F + B + W: the README's bubble
    (PP/2 − 1)(F&B + B_full − 3W) on every device, PP + 1 stage activations ((p + 1)·a) at the peak."""
    for m in (2 * p, 2 * p + 4):
        r = cm.simulate(cm.build("dualpipe", p, m), cm.Costs(1, 1, w))
        assert max(r.device_bubbles) == pytest.approx((p // 2 - 1) * ((1 + 1 + w) + (1 + w) - 3 * w))
        assert r.peak_memory == [p + 1.0] * p


@pytest.mark.parametrize("p,m", [(4, 8), (8, 20)])
def test_dualpipe_is_dualpipe_v_cut_in_half(p, m):
    """DualPipe on p devices, m microbatches times like DualPipeV on p/2 devices and m/2 (its chunks
    the same size: 1/p of the model), each DualPipeV device's order run by a device and its mirror."""
    costs = cm.Costs(1, 2, 1, fb_overlap=0.8)
    two = cm.simulate(cm.build("dualpipe", p, m), costs)
    v = cm.simulate(cm.build("dualpipe-v", p // 2, m // 2), cm.Costs(2, 4, 2, fb_overlap=0.8))
    assert two.makespan == v.makespan
    for d in range(p):
        h = min(d, p - 1 - d)
        assert [two.timing(d, i) for i in range(len(two.schedule.device_passes[d]))] == \
               [v.timing(h, i) for i in range(len(v.schedule.device_passes[h]))]


def test_dualpipe_holds_two_copies_that_torch_cannot_run(tmp_path):
    s = cm.build("dualpipe", 4, 8)
    assert s.model_copies == 2 and {s.copy_of_microbatch(ps.microbatch) for ps in s.device_passes[0]} == {0, 1}
    assert all(s.copy_of_stage(ps.stage) == s.copy_of_microbatch(ps.microbatch) for row in s.device_passes for ps in row)
    assert Schedule.from_text(s.to_text()) == s and "model_copies=2" in s.to_text()
    with pytest.raises(ValueError, match="export dualpipe-v"):
        s.to_torch_csv()
    rows = [list(row) for row in s.device_passes]
    i = next(i for i, ps in enumerate(rows[0]) if ps.stage == 0)
    rows[0][i] = rows[0][i]._replace(microbatch=4 + rows[0][i].microbatch % 4)  # a second-copy microbatch on copy 0
    bad = Schedule.from_orders("x", s.placement, 8, rows, overlaps=s.overlaps, model_copies=2)
    with pytest.raises(ScheduleError, match="runs microbatches 0..3 only"):
        cm.validate(bad)
    from ctrlmem.runtime.launch import RunConfig, RunError, _schedule_of

    with pytest.raises(RunError, match="run dualpipe-v"):
        _schedule_of(RunConfig("dualpipe", 4, 8, out=str(tmp_path)))


@pytest.mark.parametrize("name", ["dualpipe-v", "dualpipe"])
def test_the_search_refuses_what_it_does_not_model(name):
    """cm.improve times plain one-copy orders: overlapped pairs and two copies are refused, not mistimed."""
    with pytest.raises(ValueError, match="which the search does not model"):
        cm.improve(cm.build(name, 4, 8), time_limit=1)
