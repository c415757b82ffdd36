"""The host-copy checks of scripts/gpu-check.sh, on the CPU: the bandwidth is measured and
labelled, an offloaded step computes identical gradients and sends every saved activation to the
host, and the prediction puts V-Min's copies into the schedule model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctrlmem.runtime import hostcopy  # noqa: E402 - after the torch skip


def test_copy_bandwidth_is_measured_and_says_how():
    bw = hostcopy.copy_bandwidth("cpu", mib=4, repeats=2)
    assert bw["d2h_gbs"] > 0 and bw["h2d_gbs"] > 0 and "CPU has no host link" in bw["how"]
    with pytest.raises(ValueError, match="mib and repeats"):
        hostcopy.copy_bandwidth("cpu", mib=0)


def test_an_offloaded_step_moves_the_saved_tensors_and_keeps_the_gradients():
    step = hostcopy.offloaded_step("tiny", "cpu", microbatches=2)
    assert step["grads_identical"]
    one = hostcopy.offloaded_step("tiny", "cpu", microbatches=1)["offloaded_bytes"]
    # every microbatch saves the same tensors: two microbatches send twice one's bytes to the host
    assert one > 0 and step["offloaded_bytes"] == 2 * one
    pred = hostcopy.predicted_v_min(step, {"d2h_gbs": 1e9}, p=4, m=8)
    assert pred["copy_over_forward"] < 1e-3 and pred["offloaded_peak"] < pred["peak"]
    assert pred["offloaded_makespan"] == pytest.approx(pred["makespan"], rel=1e-3)  # free copies cost nothing
    slow = hostcopy.predicted_v_min(step, {"d2h_gbs": 1e-6}, p=4, m=8)
    assert slow["offloaded_makespan"] > slow["makespan"]
