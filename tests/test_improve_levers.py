"""cm.improve with recompute passes (docs/theory.md §12-13): the R passes are reordered with the
rest, the same forwards stay recomputed, the budget holds, and the bound stays a bound."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest

import ctrlmem as cm
from ctrlmem.cli.app import main as cli_main
from ctrlmem.model.levers import with_recompute


def _passes(schedule):
    return Counter(ps for row in schedule.device_passes for ps in row)


@pytest.mark.parametrize("name,p,m,limit,costs,mode", [
    ("zb", 4, 6, 0.3, (1, 1, 1, 0), "full"),           # the budgeted order runs one microbatch at a time
    ("v-shape", 4, 8, 0.4, (1, 1, 1, 0), "selective"),
    ("zb", 3, 6, 0.4, (3, 4, 2, 0.1), "full"),
    ("v-shape", 4, 8, 0.25, (1, 1, 1, 0), "auto"),    # the lever search's choice: 36.2 -> 33.7
])
def test_improve_reorders_recompute_passes_within_the_budget(name, p, m, limit, costs, mode):
    """An order built for the budget alone, then every forward recomputed, leaves memory unused,
    and the lever search's orders are not the best for their recomputes; cm.improve reorders them:
    shorter, the very same passes (every R kept, none added), the same mode, within the budget,
    never below its own lower bound."""
    c = cm.Costs(*costs)
    if mode == "auto":
        s = cm.build(name, p, m, costs=c, memory_limit=limit, recompute="auto")
    else:
        s = with_recompute(cm.build(name, p, m, costs=c, memory_limit=limit), mode)
    assert s.recomputes
    mode = s.recompute_mode
    before = cm.simulate(s, c)
    res = cm.improve(s, c, memory_limit=limit, time_limit=3, deterministic=True)
    out = cm.validate(res.schedule)
    after = cm.simulate(out, c)
    assert _passes(out) == _passes(s)
    assert out.recompute_mode == mode
    assert after.makespan == pytest.approx(res.makespan)
    assert after.makespan < before.makespan - 1e-9
    assert after.max_peak_memory <= limit * p + 1e-9
    assert res.lower_bound <= after.makespan + 1e-9
    assert "solver" not in dict(res.bounds)  # the whole model keeps the input's R passes: no bound from it


@pytest.mark.slow  # an exact search per case: the full tier runs it, --fast does not
@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("placement,name,m", [("sequential", "zb", 3), ("v-shape", "v-shape", 2)])
def test_improve_with_recompute_never_beats_the_optimum_and_its_bound_holds(mode, placement, name, m):
    """cm.optimal may recompute any forward: its proven optimum is below anything cm.improve finds
    from a schedule recomputing in that mode, and cm.improve's lower bound is below the optimum."""
    p, limit, c = 2, 0.5, cm.Costs(3, 4, 2, 0.1)
    opt = cm.optimal(p, m, c, limit, placement, time_limit=30, workers=1, recompute=mode)
    assert opt.status == "optimal"
    s = cm.build(name, p, m, costs=c, memory_limit=limit, recompute=mode)
    res = cm.improve(s, c, memory_limit=limit, time_limit=2, deterministic=True)
    assert res.lower_bound <= opt.makespan + 1e-9
    assert res.makespan >= opt.makespan - 1e-9


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
def test_improve_with_recompute_is_deterministic():
    c = cm.Costs(2, 1, 1, 0)
    s = cm.build("v-shape", 4, 8, costs=c, memory_limit=0.4, recompute="full")
    a = cm.improve(s, c, memory_limit=0.4, time_limit=1, deterministic=True)
    b = cm.improve(s, c, memory_limit=0.4, time_limit=1, deterministic=True)
    assert a.schedule.device_passes == b.schedule.device_passes and a.makespan == b.makespan


def test_a_deterministic_improve_that_settles_ends_within_its_budget(caplog):
    """Windows the solver settles at once still count (each at least 0.01 solver-seconds), so a
    deterministic run with nothing left to find ends by its budget, not the wall-clock safety
    limit (1F1B-R's order is optimal for its recomputes: it spun to 3 x 2 + 10 s before)."""
    with caplog.at_level(logging.WARNING, logger="ctrlmem.solver.improve"):
        res = cm.improve(cm.build("1f1b-r", 4, 8), time_limit=2, deterministic=True)
    assert res.makespan == cm.simulate(cm.build("1f1b-r", 4, 8)).makespan
    assert not [r for r in caplog.records if "safety limit" in r.getMessage()]


@pytest.mark.slow  # exact searches through the command line: the full tier runs it, --fast does not
def test_the_command_line_optimizes_recomputed_and_offloaded_orders(capsys):
    base = ["simulate", "v-shape", "-p", "4", "-m", "8", "--costs", "1,1,1,0", "--memory-limit", "0.25"]
    assert cli_main(base + ["--recompute", "auto", "--optimize", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["makespan"] < cm.simulate(cm.build("v-shape", 4, 8, memory_limit=0.25, recompute="auto")).makespan
    costs = cm.Costs(3, 4, 2, 0.1, offload=1.5)
    before = cm.simulate(cm.build("1f1b", 3, 6, costs=costs, offload=1.0), costs).makespan
    assert cli_main(["simulate", "1f1b", "-p", "3", "-m", "6", "--costs", "3,4,2,0.1", "--offload", "1",
                     "--offload-cost", "1.5", "--optimize", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["makespan"] < before


@pytest.mark.parametrize("name,p,m,limit,costs,mode", [
    ("zb", 4, 8, 0.375, (3, 4, 2, 0.1), "full"),       # 268.8 before: one microbatch at a time
    ("v-shape", 4, 8, 0.25, (1, 1, 1, 0), "full"),     # V-Half with every W after its B: 37 (58.5 before)
    ("v-shape", 16, 64, 0.2, (1, 1, 1, 0), "selective"),
    ("v-shape", 4, 8, 0.4, (3, 4, 2, 0.1), "full"),
])
def test_a_fixed_recompute_under_a_budget_uses_the_memory_it_frees(name, p, m, limit, costs, mode):
    """cm.build(budgeted, memory_limit=L, recompute=MODE) recomputes every forward and orders the
    passes for what that frees: never longer than the order built for L alone with every forward
    then recomputed, and here shorter; every forward recomputed, within the budget."""
    c = cm.Costs(*costs)
    s = cm.validate(cm.build(name, p, m, costs=c, memory_limit=limit, recompute=mode))
    naive = with_recompute(cm.build(name, p, m, costs=c, memory_limit=limit), mode)
    r, n = cm.simulate(s, c), cm.simulate(naive, c)
    assert s.recompute_mode == mode
    assert sum(ps.op is cm.Op.R for row in s.device_passes for ps in row) == s.num_stages * m
    assert r.max_peak_memory <= limit * p + 1e-9
    assert r.makespan < n.makespan - 1e-9


def test_a_fixed_recompute_under_a_budget_is_never_longer_than_the_budgets_order_recomputed():
    """Over sizes, costs, budgets and both modes: the order chosen for what recomputing frees is
    never longer than the budget's own order with every forward recomputed, fits wherever that
    fits, and recomputes every forward."""
    import itertools

    for name, p, m, limit, costs, mode in itertools.product(
            ("zb", "v-shape"), (4, 6), (12,), (0.25, 0.4), ((1, 1, 1, 0), (2, 3, 1, 0.2)), ("full", "selective")):
        c = cm.Costs(*costs)
        try:
            naive = cm.simulate(with_recompute(cm.build(name, p, m, costs=c, memory_limit=limit), mode), c)
        except ValueError:
            naive = None
        s = cm.build(name, p, m, costs=c, memory_limit=limit, recompute=mode)
        r = cm.simulate(s, c)
        assert r.max_peak_memory <= limit * p + 1e-9
        assert sum(ps.op is cm.Op.R for row in s.device_passes for ps in row) == s.num_stages * m
        if naive is not None:
            assert r.makespan <= naive.makespan + 1e-9, (name, p, limit, costs, mode)
