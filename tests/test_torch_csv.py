"""Every generator's torch CSV is read by torch's own action parser and passes torch's own
schedule validator (torch.distributed.pipelining, torch 2.13)."""

import csv

import pytest

import ctrlmem as cm

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def _sizes(name):
    return [(2, 4), (4, 8), (3, 6)]


@pytest.mark.parametrize("name", sorted(cm.SCHEDULES))
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
                 for ps in row] for row in s.device_passes]
        theirs = [[(a.stage_index, a.computation_type.value, a.microbatch_index) for a in actions[r]]
                  for r in range(p)]
        assert theirs == ours
        stage_to_rank = schedules._validate_schedule(actions, p, s.num_stages, m)
        assert stage_to_rank == {st: s.placement.device_of(st) for st in range(s.num_stages)}
