"""Exported dualpipe-v CSVs, OVERLAP_F_B pairs included, run in torch's own _PipelineScheduleRuntime
(what torchtitan's pipeline_parallel_schedule_csv does) on CPU over gloo, with the stages placed as
torch's DualPipeV places them, and one step's gradients and losses equal a non-pipelined step on
the whole batch (float64, 1e-12). The worker and the reference are those of
tests/test_plan_torch_runtime.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ctrlmem as cm

torch = pytest.importorskip("torch")

from test_plan_torch_runtime import WIDTH, WORKER, _reference, wait_ranks  # noqa: E402

MB = 2  # samples per microbatch


def _run(p: int, m: int, tmp_path) -> None:
    s = cm.build("dualpipe-v", p, m)
    assert s.overlaps and "OVERLAP_F_B" in s.to_torch_csv()
    s.to_torch_csv(tmp_path / "dpv.csv")
    (tmp_path / "job.toml").write_text(
        f'[parallelism]\npipeline_parallel_degree = {p}\npipeline_parallel_schedule = "DualPipeV"\n'
        f'pipeline_parallel_schedule_csv = "dpv.csv"\npipeline_parallel_microbatch_size = {MB}\n'
        f"[training]\nlocal_batch_size = {m * MB}\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, "worker.py", str(r), str(p), str(WIDTH), "job.toml", "out"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(p)]
    wait_ranks(procs, 240)
    ref_losses, ref_grads = _reference(2 * p, m, MB)
    seen = set()
    for r in range(p):
        got = torch.load(tmp_path / "out" / f"rank{r}.pt")
        assert sorted(got["grads"]) == sorted([r, 2 * p - 1 - r])  # torch's V placement
        for st, grads in got["grads"].items():
            seen.add(st)
            for a, b in zip(grads, ref_grads[st]):
                assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), (p, st, (a - b).abs().max())
        if got["losses"]:
            assert torch.allclose(torch.stack(got["losses"]), torch.stack(ref_losses), rtol=1e-12, atol=0)
    assert seen == set(range(2 * p))


@pytest.mark.slow
def test_dualpipe_v_csv_runs_in_torch_runtime_with_exact_gradients_p2(tmp_path):
    _run(2, 6, tmp_path)


@pytest.mark.slow
def test_dualpipe_v_csv_runs_in_torch_runtime_with_exact_gradients_p4(tmp_path):
    _run(4, 8, tmp_path)
