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
