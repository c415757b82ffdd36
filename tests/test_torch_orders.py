"""ctrlmem's generators equal torch's own schedule classes action for action (torch 2.13's
torch.distributed.pipelining). Torch's orders are built without processes: each class's
``_calculate_single_rank_operations`` only reads the sizes, so an instance carrying them is enough."""

import pytest

import ctrlmem as cm

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def torch_orders(cls, p: int, m: int, stages_per_rank: int) -> list[list[str]]:
    """Per rank, torch's compute actions as strings (``0F0``, ``(0F7;7B3)OVERLAP_F_B``), Nones dropped."""
    obj = object.__new__(cls)
    obj.pp_group_size, obj._n_microbatches = p, m
    obj._stages = [None] * stages_per_rank
    obj._num_stages = p * stages_per_rank
    return [[str(a) for a in obj._calculate_single_rank_operations(r) if a is not None] for r in range(p)]


def ours(schedule) -> list[list[str]]:
    return [row.split(",") for row in schedule.to_torch_csv().splitlines()]


SIZES = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 3 * p + 1)]


@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("v", [2, 3])
def test_looped_bfs_equals_torch(p, m, v):
    assert ours(cm.build("looped-bfs", p, m, num_chunks=v)) == torch_orders(schedules.ScheduleLoopedBFS, p, m, v)


@pytest.mark.parametrize("p,m", [(p, m) for p in (2, 4, 8) for m in (2 * p, 2 * p + 1, 3 * p, 5 * p)])
def test_dualpipe_v_equals_torch_with_its_overlapped_pairs(p, m):
    """Every action, the OVERLAP_F_B pairs and their two sub-actions included, in torch's order."""
    s = cm.build("dualpipe-v", p, m)
    theirs = torch_orders(schedules.ScheduleDualPipeV, p, m, 2)
    assert ours(s) == theirs
    assert sum(map(len, s.overlaps)) == sum(c.endswith("OVERLAP_F_B") for row in theirs for c in row) > 0
    cm.validate(s)


def test_overlapped_pairs_round_trip_through_text_and_torch_csv(tmp_path):
    s = cm.build("dualpipe-v", 4, 8)
    assert "+" in s.to_text() and "OVERLAP_F_B" in s.to_torch_csv()
    assert cm.Schedule.from_text(s.to_text()) == s
    path = tmp_path / "dpv.csv"
    s.to_torch_csv(path)
    back = cm.Schedule.from_torch_csv(path, name="dualpipe-v")
    assert back.device_passes == s.device_passes and back.overlaps == s.overlaps
    # torch's own reader takes our cells, sub-actions in our order
    cell = next(c for c in s.to_torch_csv().splitlines()[0].split(",") if c.endswith("OVERLAP_F_B"))
    act = schedules._Action.from_str(cell)
    assert act.computation_type == schedules.OVERLAP_F_B and str(act) == cell and len(act.sub_actions) == 2


@pytest.mark.parametrize("p,m", [(2, 4), (4, 9), (8, 16)])
def test_torchs_own_dualpipe_v_orders_read_back_as_ours(p, m):
    """torch's actions, OVERLAP_F_B cells as torch prints them, load as the same schedule, pairs included."""
    text = "\n".join(",".join(row) for row in torch_orders(schedules.ScheduleDualPipeV, p, m, 2)) + "\n"
    back = cm.Schedule.from_torch_csv_text(text, num_microbatches=m, name="dualpipe-v")
    s = cm.build("dualpipe-v", p, m)
    assert back.device_passes == s.device_passes and back.overlaps == s.overlaps and back.placement == s.placement
