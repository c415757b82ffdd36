"""Rank replay: one device's pass order in one process, real kernels, stand-in neighbours."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import ctrlmem as cm  # noqa: E402
from ctrlmem.runtime.models import get_preset  # noqa: E402
from ctrlmem.runtime.replay import replay_device, theory_per_device  # noqa: E402


SLOW = pytest.mark.slow
NAMES = [pytest.param(n, marks=() if n == "zb-v" else SLOW)
         for n in ("1f1b", "zb-h1", "zb-v", "v-half", "v-min", "v-zb") if n in cm.SCHEDULES]


@pytest.mark.parametrize("name", NAMES)
def test_replay_memory_follows_theory_and_times_every_pass_kind(name):
    """Replayed saved-tensor peak within 5 % of the schedule's theory on the peak device; the
    allocator peak within 25 %; every pass kind the device runs has a positive time."""
    p = 4
    cfg = get_preset("tiny", num_layers=2 * p - 2)
    s = cm.build(name, p, 2 * p)
    theory = theory_per_device(s, cfg)
    d = max(range(p), key=lambda i: theory[i])
    r = replay_device(s, d, cfg)
    assert r.theory_peak_bytes == pytest.approx(theory[d])
    assert abs(r.peak_saved_bytes / r.theory_peak_bytes - 1) < 0.05
    assert 0.95 < r.peak_alloc_bytes / r.theory_peak_bytes < 1.25
    kinds = {ps.op.value for ps in s.device_passes[d]}
    for stage in r.stages:
        assert set(r.pass_times_s[str(stage)]) == kinds
        assert all(v["median"] > 0 for v in r.pass_times_s[str(stage)].values())


@pytest.mark.slow
def test_replay_ranks_schedules_like_theory():
    """At p=4, 1F1B's replayed peak is below interleaved-1F1B's, itself below GPipe's, as theory says."""
    p = 4
    cfg = get_preset("tiny", num_layers=2 * p - 2)
    peaks = {}
    for name in ("gpipe", "1f1b", "interleaved-1f1b"):
        s = cm.build(name, p, 2 * p)
        theory = theory_per_device(s, cfg)
        d = max(range(p), key=lambda i: theory[i])
        peaks[name] = replay_device(s, d, cfg, measure_allocator=False).peak_saved_bytes
    assert peaks["1f1b"] < peaks["interleaved-1f1b"] < peaks["gpipe"]
