"""Fig. 9–10 curves (ctrlmem.reproduce.memory_curves) and their `ctrlmem reproduce` artifacts.

The real --quick Fig. 7, 9 and 10 artifacts are built (once) and checked by the papermill runs of
notebooks 21 and 23 in tests/test_notebooks.py."""

from __future__ import annotations

import json
import shutil

import pytest

from ctrlmem import Costs, build, simulate
from ctrlmem.model import paper
from ctrlmem.reproduce import memory_curves as mc
from ctrlmem import reproduce as rp


def test_steepest_drop_finds_the_largest_fall_and_skips_infeasible_limits():
    pts = [{"limit": 0.25, "bubble_rate": None}, {"limit": 0.5, "bubble_rate": 0.30},
           {"limit": 0.5625, "bubble_rate": 0.28}, {"limit": 0.625, "bubble_rate": 0.10},
           {"limit": 1.0, "bubble_rate": 0.05}]
    drop = mc.steepest_drop(pts)
    assert (drop["from"], drop["to"]) == (0.5625, 0.625)
    assert drop["at"] == pytest.approx(0.59375) and drop["drop"] == pytest.approx(0.18)
    assert mc.steepest_drop([{"limit": 1.0, "bubble_rate": 0.1}, {"limit": 2.0, "bubble_rate": 0.1}]) is None


def test_zb_curve_reuses_equal_caps_without_changing_results():
    """Limits with the same ⌊limit·p⌋ are built once; every point equals a direct build."""
    costs = Costs(6, 8, 4, 0.5)
    limits = (0.25, 0.3, 0.5, 0.6, 1.0, 1.2, 2.0)
    for q in mc.curve("zb", 4, 12, costs, limits):
        r = simulate(build("zb", 4, 12, costs=costs, memory_limit=q["limit"]), costs)
        assert q["bubble_rate"] == r.bubble_rate and q["memory"] == max(r.peak_memory) / 4


def test_v_curve_starts_at_smallest_feasible_and_never_rises():
    """The v-shape curve starts at its smallest feasible limit (1/p: one microbatch per device),
    is feasible at every limit from there to 2.0, stays within each limit and never rises."""
    costs = Costs(6, 8, 4, 0)
    pts = mc.curve("v-shape", 6, 24, costs)
    assert pts[0]["limit"] == pytest.approx(1 / 6) and pts[-1]["limit"] == 2.0
    for q in pts:
        assert q["bubble_rate"] is not None, q
        if q["memory"] is not None:
            assert q["memory"] <= q["limit"] + 1e-9
    rates = [q["bubble_rate"] for q in pts if q["bubble_rate"] is not None]
    assert rates == sorted(rates, reverse=True)
    # at 1F1B's memory the V family reaches the zero-bubble schedules' level (< 1F1B's)
    assert rates[-1] < mc.reference_1f1b(6, 24, costs)


def test_panels_keep_each_models_costs_and_cut_p_when_quick():
    full = mc.panels(False)
    quick = mc.panels(True)
    assert [(pn.model, pn.p, pn.m) for pn in full][:4] == [("9.6B", 16, 32), ("9.6B", 16, 64), ("9.6B", 16, 128),
                                                           ("9.6B", 16, 256)]
    assert {pn.p for pn in quick} == {mc.QUICK_P} and len(quick) == len(full) == 12
    for a, b in zip(full, quick):  # same model, same F : B : W ratios
        assert a.model == b.model and a.costs.f / a.costs.w == pytest.approx(b.costs.f / b.costs.w)


@pytest.fixture
def small(monkeypatch):
    """CPU-tiny Fig. 9–10: p = 4, m = 2p and 4p, and only the F = B = W [CALC] curve."""
    monkeypatch.setattr(mc, "QUICK_P", 4)
    monkeypatch.setattr(mc, "M_PER_P", (2, 4))
    key = next(k for k in paper.FIG9_CALC if k[2] == (2, 2, 2, 0))
    monkeypatch.setattr(paper, "FIG9_CALC", {key: paper.FIG9_CALC[key]})


def _files_ok(out, stem):
    assert (out / f"{stem}.html").is_file()
    if shutil.which("chromium"):
        assert (out / f"{stem}.png").stat().st_size > 10_000 and (out / f"{stem}.svg").is_file()


@pytest.mark.slow
def test_fig09_artifact_draws_the_figure_and_matches_calc_with_equal_costs(small, tmp_path):
    t = rp.build_table("fig09", quick=True, out=tmp_path)
    _files_ok(tmp_path, "fig09_bubble_vs_memory")
    calc = [c for c in t.cells if c.row.startswith("[CALC]")]
    assert len(calc) == 6 and all(c.deviation is not None and c.deviation < 1e-6 for c in calc)
    drops = [c for c in t.cells if c.column.startswith("steepest drop")]
    assert len(drops) == 6 and all(c.paper == 0.5 and isinstance(c.ours, float) for c in drops)
    data = json.loads((tmp_path / "fig09.json").read_text())
    assert data["quick"] and len(data["panels"]) == 6 and all(pn["p"] == 4 for pn in data["panels"])
    assert "A100 cost model" in t.title and "simulated" in t.title
    assert "F = B = W exact at all 6 limits" in t.agreement() and "paper: ≈ 0.5" in t.agreement()


@pytest.mark.slow
def test_fig10_artifact_v_is_not_above_zb_up_to_1f1b_memory(small, tmp_path):
    t = rp.build_table("fig10", quick=True, out=tmp_path)
    _files_ok(tmp_path, "fig10_v_vs_zb")
    data = json.loads((tmp_path / "fig10.json").read_text())
    for pn in data["panels"]:
        for v, z in zip(pn["v"], pn["zb"]):
            if v["bubble_rate"] is not None and v["limit"] <= 1.0:
                assert v["bubble_rate"] <= z["bubble_rate"] + 1e-9, (pn["model"], pn["m"], v["limit"])
        assert 0 < pn["bubble_rate_1f1b"] < 1
    assert t.agreement().startswith("V ≤ ZB at every common limit in ")
    assert "not comparable" in t.agreement()
    summary = rp.write_report(tmp_path, [t], quick=True, partial=True)
    assert "[Fig. 10" in summary.read_text()
