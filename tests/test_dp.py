"""Data x pipeline parallelism (`ctrlmem run --dp D -p P`): D replicas of a P-stage pipeline on
a (dp, pp) device mesh, gloo on CPU, the batch split across replicas and gradients averaged."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import ctrlmem as cm
from ctrlmem.runtime.launch import RunConfig, RunError, prepare, run_many

GRAD_TOL = 1e-5
MEMORY_TOL = 0.10
NAMES = [n for n in ("1f1b", "v-half") if n in cm.SCHEDULES]


@pytest.mark.slow
def test_dp2_pp2_is_exact_on_the_whole_batch_and_memory_follows_theory(tmp_path):
    """--dp 2 -p 2 (4 processes) for 1F1B and V-Half: the loss and every gradient equal the
    non-pipelined model's on the whole batch (both replicas' microbatches), which only holds if
    each replica ran its own half and the gradients were averaged across replicas; every one of
    the 4 ranks holds its pipeline rank's stages, and its saved-tensor peak is within 10 % of the
    schedule's theory."""
    results = run_many([RunConfig(n, 2, 4, dp=2, steps=1, out=str(tmp_path / n), timeout_s=280,
                                  hang_timeout_s=120) for n in NAMES])
    for name, r in zip(NAMES, results):
        assert r["status"] == "ok", r.get("failure")
        assert r["dp"] == 2 and r["world_size"] == 4
        assert r["grad_rel_diff"] <= GRAD_TOL, (name, r["grad_rel_diff"])
        assert r["loss_abs_diff"] <= 1e-5 * max(1.0, abs(r["ref_loss"])), name
        layout = r["rank_layout"]
        assert [(x["dp_rank"], x["pp_rank"]) for x in layout] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert layout[0]["stages"] == layout[2]["stages"] and layout[1]["stages"] == layout[3]["stages"]
        assert len(r["saved_over_theory"]) == 4
        for rank, ratio in enumerate(r["saved_over_theory"]):
            assert abs(ratio - 1) <= MEMORY_TOL, (name, rank, ratio)
        assert r["theory_peak_bytes"][0] == r["theory_peak_bytes"][2]
        # tokens per step count both replicas' shares
        model = r["model"]
        tokens = 2 * 4 * model["microbatch_size"] * model["seq_len"]
        assert r["tokens_per_s"] == pytest.approx(tokens / r["step_time_s"]["median"])


def test_dp_must_be_a_positive_integer():
    """dp = 0 or a non-integer is refused before launching, naming dp."""
    for bad in (0, -1, 1.5, True):
        with pytest.raises(RunError, match="dp must be a positive integer"):
            prepare(RunConfig("1f1b", 2, 4, dp=bad))


def test_dp_world_size_and_worker_config():
    """The launch starts dp x p ranks and tells the workers dp."""
    config = RunConfig("1f1b", 2, 4, dp=3)
    assert config.world_size == 6
    _, worker = prepare(config)
    assert worker["dp"] == 3
