"""The exact solver and the closed-form bounds with recomputation allowed (docs/theory.md §13):
the solver may recompute any forward, its schedules stay valid and within the budget, its
optimum is never longer than the one without levers, and the bounds hold for every schedule
that may recompute, where the bounds without levers do not."""

from __future__ import annotations

import itertools

import pytest

import ctrlmem as cm
from ctrlmem.model.ir import Op, Placement
from ctrlmem.search.bounds import makespan_bound
from ctrlmem.solver.optimal import kept_units, optimal


def _check_recomputed(schedule, costs, cap):
    """Every F, B, W once; each R on its stage's device after its F and before its B; the
    simulated peak within ``cap``."""
    seen = {}
    for d, row in enumerate(schedule.device_passes):
        for i, ps in enumerate(row):
            assert schedule.placement.device_of(ps.stage) == d
            seen.setdefault((ps.stage, ps.microbatch), {})[ps.op] = i
    for key, ops in seen.items():
        assert {Op.F, Op.B, Op.W} <= set(ops), key
        if Op.R in ops:
            assert ops[Op.F] < ops[Op.R] < ops[Op.B], key
    r = cm.simulate(schedule, costs)
    assert r.max_peak_memory <= cap + 1e-9
    return r


@pytest.mark.parametrize("p, m, limit, placement, costs", [
    (2, 3, 0.5, "v-shape", "1,1,1"),
    (2, 2, 0.5, "v-shape", "1,2,1"),
    (3, 3, 0.4, "sequential", "1,2,1"),
])
def test_recompute_never_loses_and_stays_within_the_budget(p, m, limit, placement, costs):
    """With recompute allowed the proven optimum is at most the one without (not recomputing is
    one of the solver's choices) and its schedule is valid: each R between its F and B on the
    stage's device, the peak within the budget, the makespan the simulated one."""
    plain = optimal(p, m, costs, limit, placement, time_limit=30)
    lev = optimal(p, m, costs, limit, placement, time_limit=30, recompute="full")
    assert plain.status == lev.status == "optimal"
    assert lev.makespan <= plain.makespan + 1e-9
    r = _check_recomputed(lev.schedule, cm.Costs.parse(costs), limit * p)
    assert r.makespan == pytest.approx(lev.makespan)
    assert lev.lower_bound <= lev.makespan + 1e-9


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
def test_recompute_reaches_budgets_reordering_cannot():
    """Below one microbatch per device no order fits, and the solver says recompute would; with
    recompute allowed it finds and proves a schedule there, of the kind 1F1B-R is."""
    with pytest.raises(ValueError, match="recompute='full'"):
        optimal(2, 3, "1,1,1", 0.3, time_limit=10)
    r = optimal(2, 3, "1,1,1", 0.3, time_limit=60, recompute="full")
    assert r.status == "optimal" and r.schedule.recomputes and r.schedule.recompute_mode == "full"
    _check_recomputed(r.schedule, cm.Costs(), 0.3 * 2)
    # the text form carries the R passes and reads back to the same schedule
    assert cm.Schedule.from_text(r.schedule.to_text()) == r.schedule
    with pytest.raises(ValueError, match="recompute must be none, full or selective"):
        optimal(2, 3, recompute="auto")


def test_kept_fraction_units():
    """The kept share as N / K: exact for the default 2/34 and selective 34/114, rounded up (the
    model keeps at least the truth) for a share no K ≤ 1000 makes whole."""
    assert kept_units(2 / 34) == (1, 17, True)
    assert kept_units(34 / 114) == (17, 57, True)
    n, k, exact = kept_units(0.1234567891)
    assert not exact and n / k >= 0.1234567891


@pytest.mark.slow  # a lever search per case: the full tier runs it, --fast does not
def test_bounds_with_recompute_hold_for_recomputing_schedules():
    """On a grid of sizes, costs and budgets, every schedule the lever search builds (that
    recomputes) and every fully recomputed fixed pattern within the budget is at least the bound
    with recompute allowed; the bound without levers is beaten by some of them (it does not hold
    once forwards may recompute), so the lever-aware one is needed."""
    beaten_plain = 0
    for p, m, costs, limit, name in itertools.product([2, 4], [4, 8], ["1,1,1", "2,3,1,0.2"], [0.25, 0.3, 0.5],
                                                      ["v-shape", "zb"]):
        costs = cm.Costs.parse(costs)
        P = Placement.v_shape(p) if name == "v-shape" else Placement.sequential(p)
        candidates = []
        try:
            candidates.append(cm.build(name, p, m, costs=costs, memory_limit=limit, recompute="auto"))
        except ValueError:
            pass
        candidates.append(cm.build("1f1b-r" if name == "zb" else "v-min", p, m, recompute="full"))
        cap = limit * p
        bound = makespan_bound(P, m, costs, cap, recompute="full")
        plain = makespan_bound(P, m, costs, cap)
        for s in candidates:
            r = cm.simulate(s, costs)
            if r.max_peak_memory > cap + 1e-9 or s.placement != P:
                continue
            assert r.makespan >= bound, (p, m, costs, limit, name, r.makespan, bound)
            beaten_plain += r.makespan < plain
    assert beaten_plain > 0


def test_cli_optimal_recompute(capsys):
    """`ctrlmem optimal --recompute full` solves below reordering's floor and says how many
    forwards it recomputes."""
    from ctrlmem.cli import main

    assert main(["optimal", "-p", "2", "-m", "2", "--memory-limit", "0.3", "--recompute", "full",
                 "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "status optimal" in out and "recompute full allowed: the solver recomputes" in out


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
@pytest.mark.parametrize("p, m, limit, placement, costs", [
    (2, 3, 0.3, "v-shape", "1,1,1"),
    (2, 3, 0.5, "sequential", "1,1,1"),
    (2, 4, 0.5, "sequential", "2,3,1,0.2"),
])
def test_the_recompute_trade_bound_is_tighter_and_below_proven_optima(p, m, limit, placement, costs):
    """Below the memory a schedule without recompute needs, the budget forces recomputation and
    with it R work: the "recompute trade" bound counts that work against the memory × time it
    saves. It is above every other closed form on these instances and never above the proven
    optimum with recompute allowed."""
    from ctrlmem.search.bounds import makespan_bounds

    c = cm.Costs.parse(costs)
    P = Placement.v_shape(p) if placement == "v-shape" else Placement.sequential(p)
    bounds = makespan_bounds(P, m, c, limit * p, recompute="full")
    trade = bounds.pop("recompute trade")
    assert trade > max(bounds.values()) * 1.05, (trade, bounds)
    best = optimal(p, m, costs, limit, placement, time_limit=30, recompute="full")
    assert best.status == "optimal"
    assert trade <= best.makespan + 1e-9


def test_the_recompute_trade_is_a_relaxation_of_the_integer_choice():
    """The trade's value (fractional recompute counts) is never above the best integer choice of
    how many forwards of each stage to recompute, and meets it when one stage decides."""
    import random

    from ctrlmem.search.bounds import _recompute_trade

    rng = random.Random(3)
    for _ in range(300):
        m, cap = rng.randint(1, 6), rng.uniform(0.3, 3)
        stages = [(rng.choice([0.0, rng.uniform(0.1, 3)]), rng.uniform(0, 5), 0.0) for _ in range(rng.randint(1, 3))]
        stages = [(r, g, g + rng.uniform(0, 5)) for r, g, _ in stages]
        head, work = rng.uniform(0, 3), rng.uniform(0, 30)
        value = _recompute_trade(head, work, m, cap, stages)
        hi0 = head + m * sum(h for _, _, h in stages) / cap
        best = min(max(head + work + sum(x * r for x, (r, _, _) in zip(xs, stages)),
                       hi0 - sum(x * g for x, (_, g, _) in zip(xs, stages)) / cap)
                   for xs in itertools.product(range(m + 1), repeat=len(stages)))
        assert value <= best + 1e-9
        assert value >= head + work - 1e-9 and value >= hi0 - m * sum(g for _, g, _ in stages) / cap - 1e-9
