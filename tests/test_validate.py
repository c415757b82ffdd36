"""Validation: structure, same-device order and cross-device deadlock, with readable errors."""

import pytest

import ctrlmem as cm
from ctrlmem import Op, Pass, Placement, Schedule, ScheduleError


def seq(p, m, orders):
    return Schedule.from_orders("hand", Placement.sequential(p), m, orders)


def test_w_before_b_is_reported_with_position_and_grid():
    """W placed before its B: the error names the device, step, pass and what it waits for."""
    s = seq(1, 1, [[(Op.F, 0, 0), (Op.W, 0, 0), (Op.B, 0, 0)]])
    with pytest.raises(ScheduleError) as info:
        cm.validate(s)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.device, err.position) == (0, 1)
    assert err.pass_ == Pass(Op.W, 0, 0) and err.waits_for == Pass(Op.B, 0, 0)
    assert "same device" in str(err)
    assert "<-- ERROR HERE" in err.grid and ">>0W0" in err.grid


def test_cross_device_deadlock_shows_the_wait_chain():
    """Two devices each waiting for the other: ScheduleError with the chain and the grid."""
    # device 0 wants the backward of mb 0 before sending forward of mb 1, device 1 runs mb 1 first
    s = seq(2, 2, [
        [(Op.F, 0, 0), (Op.BW, 0, 0), (Op.F, 0, 1), (Op.BW, 0, 1)],
        [(Op.F, 1, 1), (Op.BW, 1, 1), (Op.F, 1, 0), (Op.BW, 1, 0)],
    ])
    with pytest.raises(ScheduleError) as info:
        cm.validate(s)
    err = info.value
    text = str(err)
    assert "deadlock" in text and "Wait chain" in text
    assert err.device == 0 and err.position == 1
    assert err.waits_for == Pass(Op.BW, 1, 0)
    assert "step 1" in text and "<-- ERROR HERE (device 0)" in text


@pytest.mark.parametrize(
    "orders,match",
    [
        ([[(Op.F, 0, 0)]], "missing"),
        ([[(Op.F, 0, 0), (Op.BW, 0, 0), (Op.W, 0, 0)]], "fused BW and also a W"),
        ([[(Op.F, 0, 0), (Op.F, 0, 0), (Op.BW, 0, 0)]], "duplicates"),
        ([[(Op.F, 0, 0), (Op.BW, 0, 0), (Op.F, 0, 1)]], "microbatch 1, outside"),
        ([[(Op.F, 3, 0)]], "stage 3, outside"),
    ],
)
def test_structural_errors(orders, match):
    with pytest.raises(ScheduleError, match=match):
        cm.validate(seq(1, 1, orders))


def test_pass_on_wrong_device():
    s = seq(2, 1, [[(Op.F, 0, 0), (Op.F, 1, 0), (Op.BW, 1, 0), (Op.BW, 0, 0)], []])
    with pytest.raises(ScheduleError, match="puts on device 1"):
        cm.validate(s)


def test_grid_is_windowed_for_long_schedules():
    """A long schedule shows only a window around the failing step."""
    m = 200
    order = [(Op.F, 0, k) for k in range(m)] + [(Op.BW, 0, k) for k in range(m)]
    order[150], order[m + 150] = order[m + 150], order[150]  # BW of mb 150 before its F
    with pytest.raises(ScheduleError) as info:
        cm.validate(seq(1, m, [order]))
    grid = info.value.grid
    assert "earlier steps" in grid and "later steps" in grid
    assert len(grid.splitlines()) < 20
