"""The optimality gap with memory levers (ctrlmem.solver.gap_levers, the ``optimality-gap-levers``
artifact): the grid, every method's makespan at or above the best bound with the lever, the
solvers never longer than the lever search, and a regeneration byte-identical."""

from __future__ import annotations

import json

from ctrlmem.reproduce.report import ARTIFACTS, build_table
from ctrlmem.solver import gap_levers as gl


def test_the_grid():
    """Full: p 2-4, m = p and 2p, two mixes, two budgets per p (below one microbatch per device at
    p = 2), three levers; quick: one instance per lever. The copy cost is in units of the mix's F."""
    full = gl.instances("full")
    assert len(full) == 3 * 2 * 2 * 2 * 3
    assert {(i.p, i.budget) for i in full} == {(2, 0.375), (2, 0.5), (3, 1 / 3), (3, 0.5), (4, 0.25), (4, 0.5)}
    assert len(gl.instances("quick")) == len(gl.LEVERS)
    inst = gl.Instance(3, 6, "3:4:2:0.1", 0.5, "offload, copy 2 F")
    assert inst.costs.offload == 6.0 and inst.costs.f == 3
    assert "optimality-gap-levers" in ARTIFACTS


def test_artifact_quick(tmp_path):
    """Every makespan is at or above the best lower bound with the row's lever (the bounds hold
    for every levered schedule), cm.optimal proves every quick row and is never longer than the
    lever search, cm.improve never longer either, and a second run writes the same bytes."""
    t = build_table("optimality-gap-levers", quick=True, out=tmp_path)
    data = json.loads((tmp_path / "optimality-gap-levers.json").read_text())
    rows = data["rows"]
    assert len(rows) == len(gl.LEVERS) * len(gl.SEARCH)
    for r in rows:
        lb = r["lower_bound"]
        assert r["proven"] and r["optimal"]["status"] == "optimal"
        made = [h["makespan"] for h in r["heuristics"].values() if h["fits"]]
        made += [r[k]["makespan"] for k in ("improve", "optimal") if r[k].get("makespan") is not None]
        assert all(x >= lb - 1e-9 for x in made), r
        search = r["heuristics"]["lever search"]["makespan"]
        assert r["optimal"]["makespan"] <= search + 1e-9
        if r["improve"].get("makespan") is not None:
            assert r["improve"]["makespan"] <= search + 1e-9
    # at p = 2, m = 2, budget 0.5 the V-shape solver offloads where the lever search does not
    v = next(r for r in rows if r["placement"] == "v-shape" and r["lever"] == "offload, copy ½ F")
    assert v["optimal"]["offloaded"] > 0 and v["optimal"]["makespan"] < v["heuristics"]["lever search"]["makespan"]
    assert "not comparable" in t.verdict
    build_table("optimality-gap-levers", quick=True, out=tmp_path / "b")
    assert (tmp_path / "b" / "optimality-gap-levers.json").read_bytes() == \
        (tmp_path / "optimality-gap-levers.json").read_bytes()
