"""The memory-levers artifact: with levers never slower than without and within the budget; the
copy cost at which offloading stops paying is bracketed; the claim's verdict follows its data."""

from __future__ import annotations

import json

import pytest

from ctrlmem.reproduce import claims as claims_mod
from ctrlmem.reproduce import levers


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(levers, "P", 4)
    monkeypatch.setattr(levers, "M", 8)
    monkeypatch.setattr(levers, "QUICK_BUDGETS", (0.25, 0.5, 1.0))
    monkeypatch.setattr(levers, "QUICK_COPY_COSTS", (0.0, 0.5, 8.0))


def test_levers_never_slow_a_budget_down_and_stay_within_it(small):
    data = levers.levers_data(quick=True)
    for a, b in zip(data["plain"], data["levers"]):
        assert a["limit"] == b["limit"] and b["makespan"] is not None
        assert b["peak"] <= b["limit"] + 1e-9
        if a["makespan"] is not None:  # the search with levers includes reordering alone
            assert b["makespan"] <= a["makespan"] + 1e-9
    assert data["levers"][-1]["makespan"] == data["plain"][-1]["makespan"]
    assert data["1f1b-r"]["peak"] < data["1f1b"]["peak"] == 1.0
    assert data["1f1b-r"]["makespan"] > data["1f1b"]["makespan"]
    equal, whole = data["copy"]
    assert equal["limit"] == data["1f1b-r"]["peak"] and whole["limit"] >= equal["limit"]
    assert (whole["limit"] * 2 * levers.P) == pytest.approx(round(whole["limit"] * 2 * levers.P))  # whole a/2 units
    for sweep in data["copy"]:
        assert all(q["peak"] is None or q["peak"] <= sweep["limit"] + 1e-9 for q in sweep["points"])
        # a free copy is never slower than a dear one at the same budget
        spans = [q["makespan"] for q in sweep["points"] if q["makespan"] is not None]
        assert spans[0] <= spans[-1]
    json.dumps(data)  # the artifact writes it


def test_stops_paying_brackets_the_copy_cost():
    copy = [{"offload_cost": c, "makespan": s} for c, s in ((0, 90), (0.5, 95), (1, 120), (2, None))]
    assert levers.stops_paying(copy, 100) == {"last_faster": 0.5, "first_not": 1}
    assert levers.stops_paying(copy, 80) == {"last_faster": None, "first_not": 0}
    assert levers.stops_paying(copy[:2], 100) == {"last_faster": 0.5, "first_not": None}


def _claim(tmp_path, copy):
    sweeps = [{"limit": lim, "label": label, "points": copy, "stops_paying": levers.stops_paying(copy, 100)}
              for lim, label in ((0.12, "1F1B-R's memory"), (0.125, "1F1B-R's memory in whole V stages"))]
    (tmp_path / "memory-levers.json").write_text(json.dumps({
        "p": 16, "m": 64, "quick": False, "1f1b-r": {"makespan": 100, "peak": 0.12}, "copy": sweeps}))
    return claims_mod.claim_memory_levers(tmp_path)


def test_the_levers_claim_follows_its_evidence(tmp_path):
    assert claims_mod.claim_memory_levers(tmp_path).verdict == "cannot be checked here"
    both = _claim(tmp_path, [{"offload_cost": 0, "makespan": 90}, {"offload_cost": 1, "makespan": 110}])
    assert both.verdict == "reproduced" and "faster than 1F1B-R up to a copy of 0 F, not from 1 F" in both.ours
    always = _claim(tmp_path, [{"offload_cost": 0, "makespan": 90}, {"offload_cost": 1, "makespan": 95}])
    assert always.verdict == "partly"
    never = _claim(tmp_path, [{"offload_cost": 0, "makespan": 120}])
    assert never.verdict == "not reproduced" and "never faster" in never.ours
