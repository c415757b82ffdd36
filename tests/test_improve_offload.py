"""cm.improve on schedules with activation copies (docs/theory.md §12-13): the offloaded forwards,
their shares and each reload's issue pass are kept, the result simulates (with its copies) to the
makespan reported, never longer than the input and within the budget; the exact whole model
(cm.optimal's, the input's choices fixed) runs where it takes the schedule, windows elsewhere."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.model.validate import validate


def _offloaded(s):
    return sorted((c.stage, c.microbatch, c.fraction) for row in s.copies for c in row if c.kind == "O")


def _check(res, src, costs, cap):
    s = res.schedule
    validate(s)
    assert _offloaded(s) == _offloaded(src)
    r = cm.simulate(s, costs)
    assert r.makespan == pytest.approx(res.makespan)
    assert r.makespan <= cm.simulate(src, costs).makespan + 1e-9
    assert r.max_peak_memory <= cap + 1e-9
    assert res.lower_bound <= res.makespan + 1e-9
    return r


def test_whole_model_shortens_an_offloaded_1f1b():
    """1F1B at p = 3, m = 6 (3:4:2, hop 0.1, a copy of one a taking 1.5) with every forward that
    waits offloaded: the exact model with its copies fixed reaches the device bound, 72.4 (73 in)."""
    costs = cm.Costs(3, 4, 2, 0.1, offload=1.5)
    s = cm.build("1f1b", 3, 6, costs=costs, offload=1.0)
    peak = cm.simulate(s, costs).max_peak_memory
    res = cm.improve(s, costs, time_limit=4, workers=1, deterministic=True)
    _check(res, s, costs, peak)
    assert res.makespan == pytest.approx(72.4) and res.status == "optimal"
    assert dict(res.bounds)["device"] == pytest.approx(72.4) and "lever trade" in dict(res.bounds)


def test_windows_keep_copies_on_any_placement():
    """An interleaved schedule (which the exact model does not take) goes through the windows: the
    result keeps its copies, is shorter (41.1 in), within the input's peak, the same in two runs."""
    costs = cm.Costs(3, 4, 2, 0.1, offload=1.5)
    s = cm.build("interleaved-1f1b", 2, 4, costs=costs, offload=1.0)
    assert s.offloads and cm.simulate(s, costs).makespan == pytest.approx(41.1)
    peak = cm.simulate(s, costs).max_peak_memory
    a = cm.improve(s, costs, time_limit=0.5, workers=1, deterministic=True)
    b = cm.improve(s, costs, time_limit=0.5, workers=1, deterministic=True)
    _check(a, s, costs, peak)
    assert a.makespan < 41.1 - 1e-9
    assert a.schedule == b.schedule and a.makespan == b.makespan


def test_a_tighter_budget_is_kept():
    """A budget below the input's peak is refused; at it, an offloaded V-Half (p = 3, m = 6)
    improves within it."""
    costs = cm.Costs(3, 4, 2, 0.1, offload=1.5)
    s = cm.build("v-half", 3, 6, costs=costs, offload=1.0)
    peak = cm.simulate(s, costs).max_peak_memory
    with pytest.raises(ValueError, match="above memory_limit"):
        cm.improve(s, costs, memory_limit=0.9 * peak / 3, time_limit=1)
    res = cm.improve(s, costs, memory_limit=peak / 3, time_limit=1.5, workers=1, deterministic=True)
    _check(res, s, costs, peak)
