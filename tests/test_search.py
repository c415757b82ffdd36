"""The search engine (ctrlmem.search): compact candidates, their timing, the bounds that skip work,
the compiled kernels against their plain-Python form, and the searches built on them."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.schedules.recipes import V_FUSED, V_SPLIT
from ctrlmem.search import Family, Query, clear_caches, search
from ctrlmem.search.bounds import span_bound
from ctrlmem.search.encoding import CandidateSet, extend, from_schedules, problem
from ctrlmem.search.timing import time_set

UNIT = cm.Costs(1, 1, 1, 0)
_cost = st.floats(0.25, 4.0, allow_nan=False).map(lambda x: round(x, 2))


def _costs(draw_data, S: int, per_stage: bool, comm: float) -> cm.Costs:
    if per_stage:
        f, b, w = (draw_data.draw(st.lists(_cost, min_size=S, max_size=S)) for _ in range(3))
    else:
        f, b, w = (draw_data.draw(_cost) for _ in range(3))
    return cm.Costs(f, b, w, comm)


@settings(max_examples=25)
@given(p=st.integers(2, 6), m=st.integers(1, 12), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.05, 0.3]))
def test_timing_equals_the_simulator(p, m, data, per_stage, comm):
    """For any costs, the engine's timing of a candidate gives the simulator's longest span,
    makespan and sum of spans, and its peak the simulator's peak."""
    names = ["v-min", "v-half", "v-zb", "zb-v"]
    costs = _costs(data, 2 * p, per_stage, comm)
    scheds = [(n, cm.build(n, p, m)) for n in names]
    cs = from_schedules(scheds)
    tm = time_set(cs, costs)
    for i, (_, s) in enumerate(scheds):
        r = cm.simulate(s, costs)
        assert tm.span[i] == max(r.device_spans)
        assert tm.makespan[i] == r.makespan
        assert tm.total[i] == pytest.approx(math.fsum(r.device_spans), abs=1e-6)
        assert cs.peak[i] == max(r.peak_memory)
    fused = from_schedules([("1f1b-v", cm.build("1f1b-v", p, m))], fused=True)
    r = cm.simulate(cm.build("1f1b-v", p, m), costs)
    assert time_set(fused, costs).span[0] == max(r.device_spans) and fused.peak[0] == max(r.peak_memory)


def test_a_deadlocked_candidate_gets_an_infinite_span():
    """Device orders that wait on each other are timed as infinite (never chosen)."""
    s = cm.build("1f1b", 2, 2)
    orders = [list(o) for o in s.device_passes]
    orders[1][0], orders[1][1] = orders[1][1], orders[1][0]  # device 1 runs B before its F
    bad = cm.Schedule("bad", 2, 2, s.placement, tuple(map(tuple, orders)))
    tm = time_set(from_schedules([("ok", s), ("bad", bad)], fused=True), UNIT)
    assert math.isfinite(tm.span[0]) and tm.span[1] == math.inf


def test_extend_lengthens_the_periodic_stable_phase():
    """A schedule built for few microbatches and lengthened equals the one built for all; one
    with no periodic stable phase is left out."""
    for name in ("v-min", "v-half", "v-zb"):
        short, full = cm.build(name, 6, 20), cm.build(name, 6, 60)
        got = extend(from_schedules([(name, short)]), 60)
        assert got.schedule(0, name).device_passes == full.device_passes, name
    tiny = from_schedules([("gpipe", cm.build("gpipe", 3, 2))], fused=True)
    assert len(extend(tiny, 9)) == 0


def test_problem_names_an_incomplete_candidate():
    """The winner check on arrays finds a pass missing or run twice, and a pass on the wrong device."""
    cs = from_schedules([("v", cm.build("v-half", 4, 6))])
    assert problem(cs, 0) is None
    keys = cs.keys.copy()
    keys[0, 0, 1] = keys[0, 0, 0]
    assert "appears" in problem(CandidateSet(cs.placement, cs.m, False, keys, ("x",)), 0)
    keys = cs.keys.copy()
    keys[0, [0, 1], 0] = keys[0, [1, 0], 0]  # two devices swap their first passes
    assert "placement" in problem(CandidateSet(cs.placement, cs.m, False, keys, ("x",)), 0)


class _Bogus(Family):
    """A family that yields an incomplete candidate that would win, then a valid one."""

    name = "bogus"

    def sets(self, q, progress):
        good = from_schedules([("good", cm.build("v-zb", q.p, q.m))])
        keys = good.keys.copy()
        keys[0, 0, -1] = keys[0, 0, -2]  # device 0 runs one W twice, another never
        yield CandidateSet(good.placement, good.m, False, keys, ("broken",))
        yield good


def test_an_invalid_candidate_is_skipped_and_logged(caplog):
    """Should a family ever produce an incomplete schedule, the search logs it and returns the
    best valid one instead."""
    q = Query(Placement.v_shape(4), 8, UNIT, 4.0)
    with caplog.at_level(logging.ERROR, logger="ctrlmem.search.engine"):
        found = search(q, [_Bogus()])
    assert found.label == "good"
    assert "broken" in caplog.text and "not a valid schedule" in caplog.text


@pytest.mark.slow
@settings(max_examples=10)  # benchmarks/check_wide.py checks the bound on 4,680 more
@given(p=st.integers(2, 5), extra=st.integers(0, 6), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.05, 0.3, 1.0]))
def test_bound_never_exceeds_a_schedule_within_the_cap(p, extra, data, per_stage, comm):
    """span_bound(C) is at most the longest span of every candidate whose peak is within C, for
    random costs: the search may skip what the bound rules out without changing its answer."""
    m = p + extra + 1
    costs = _costs(data, 2 * p, per_stage, comm)
    P = Placement.v_shape(p)
    bound = span_bound(P, m, costs)
    from ctrlmem.schedules.budgeted import v_shape_candidates

    for c in v_shape_candidates(p, m, costs, 2.0):
        assert bound(c.peak) <= c.max_span + 1e-9, (c.label, bound(c.peak), c.max_span)
    seq, zc = Placement.sequential(p), cm.Costs(1, 2, 1, comm)
    for limit in (1 / p, 0.5, 1.0, 2.0):
        r = cm.simulate(cm.build("zb", p, m, costs=zc, memory_limit=limit), zc)
        assert span_bound(seq, m, zc)(max(r.peak_memory)) <= max(r.device_spans) + 1e-9


def test_bound_sees_an_odd_number_of_half_activations():
    """With three half-activations a device (p = 6, m = 12, 3:4:2, budget 0.25) only one
    microbatch at a time can hold both of its stages: the span bound counts it (the levels, from
    the device's first forward), 265.5 where work and memory × time give 190, below the 300 the
    search reaches (the proven optimum's makespan, docs/theory.md §6); at p = 16, m = 128,
    3:4:2:0.1 the cap of 5.5 a is ruled out next to the 1503.3 v-shape finds at 8 a."""
    P, costs = Placement.v_shape(6), cm.Costs(3, 4, 2)
    bound = span_bound(P, 12, costs)
    assert bound(1.5) == pytest.approx(265.5)
    r = cm.simulate(cm.build("v-shape", 6, 12, costs=costs, memory_limit=0.25), costs)
    assert bound(1.5) <= max(r.device_spans) == 300
    assert bound(2.0) < bound(1.5) and bound(1.0) > bound(1.5)
    big = span_bound(Placement.v_shape(16), 128, cm.Costs(3, 4, 2, 0.1))
    assert big(5.5) > 1503.3 > big(6.0)


def test_bound_never_exceeds_the_proven_optimum():
    """On small instances solved to optimality by CP-SAT, the bound at the budget is at most the
    optimum's longest span."""
    pytest.importorskip("ortools")
    for p, m, costs, limit in ((2, 3, cm.Costs(3, 4, 2), 0.5), (3, 3, cm.Costs(2, 2, 2), 1.0), (2, 4, cm.Costs(1, 2, 1, 0.5), 1.0)):
        res = cm.optimal(p, m, costs, memory_limit=limit, time_limit=20)
        if res.status != "optimal":
            continue
        r = cm.simulate(res.schedule, costs)
        assert span_bound(Placement.v_shape(p), m, costs)(limit * p) <= max(r.device_spans) + 1e-9


def test_results_do_not_depend_on_what_is_cached():
    """The same search gives the same schedule whatever was searched before (bounds and caches
    only skip what cannot win)."""
    costs = cm.Costs(3, 4, 2, 0.1)
    budgets = [0.3, 0.5, 0.75, 1.0, 1.6]
    clear_caches()
    up = {b: cm.build("v-shape", 6, 20, costs=costs, memory_limit=b).device_passes for b in budgets}
    clear_caches()
    down = {b: cm.build("v-shape", 6, 20, costs=costs, memory_limit=b).device_passes for b in reversed(budgets)}
    assert up == down
    clear_caches()
    named = cm.build("v-half", 6, 20, costs=costs).device_passes
    clear_caches()
    cm.build("v-shape", 6, 20, costs=costs, memory_limit=2.0)
    assert cm.build("v-half", 6, 20, costs=costs).device_passes == named


@settings(max_examples=30)
@given(p=st.integers(2, 6), extra=st.integers(0, 8), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.05, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_retiming_after_a_move_equals_timing_the_whole_order(p, extra, data, per_stage, comm, seed):
    """After any move of one pass on one device (as the late-acceptance climb makes them), timing
    again only the passes that started at or after the moved position's old start gives every
    pass the start and end that timing the whole order gives, bit for bit, and the same span,
    makespan and sums; an order that deadlocks is found to deadlock. Chains of kept moves start
    each retiming from the last one's times. Whether a move deadlocks is known before it is made
    (a search for the one cycle it can close) exactly when timing finds it."""
    from ctrlmem.search.encoding import tables
    from ctrlmem.search.families.relocate import keeps_order, move_pass
    from ctrlmem.search.timing import closes_cycle, durations, keep, order_tables, retime, time_candidate, work_arrays

    m = p + extra
    costs = _costs(data, 2 * p, per_stage, comm)
    if data.draw(st.booleans()):  # passes that take no time: starts tie
        costs = cm.Costs(costs.f, costs.b, 0.0, comm)
    cs = from_schedules([("v-half", cm.build("v-half", p, m))])
    t = tables(cs.placement, m, False)
    dur = durations(cs.placement, m, False, costs)
    keys = cs.keys[:1].copy()
    n, L = t.dep.shape[0], keys.shape[2]
    end, start, stamp, ptr, free, first, out = work_arrays(n, p)
    time_candidate(keys, 0, t.dep, t.cross, dur, comm, end, start, stamp, ptr, free, first, out)
    end2, start2, cut = np.empty(n), np.empty(n), np.empty(p, np.int64)
    whole = work_arrays(n, p)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        d, i = int(rng.integers(p)), int(rng.integers(L))
        j = i + int(rng.integers(-8, 9))  # the climb's reach
        if j == i or not 0 <= j < L or not keeps_order(keys[0, d], i, j, t.dep):
            continue
        device, pos, head, users = order_tables(keys, 0, t.dep)
        cycle = closes_cycle(keys, 0, d, i, j, t.dep, device, pos, head, users, start, np.zeros(n + 1, np.int64),
                             np.empty(n, np.int64))
        lo = min(i, j)
        t0 = start[keys[0, d, lo]]
        move_pass(keys[0, d], i, j)
        retime(keys, 0, d, lo, t0, t.dep, t.cross, dur, comm, end, start, end2, start2, stamp, ptr, free, first, cut,
               out)
        time_candidate(keys, 0, t.dep, t.cross, dur, comm, *whole)
        w_end, w_start, w_out = whole[0], whole[1], whole[-1]
        assert cycle == (not np.isfinite(w_out[0]))
        if cycle:
            assert not np.isfinite(out[0])
            move_pass(keys[0, d], j, i)
            continue
        assert [out[x] for x in (0, 1, 2, 4)] == [w_out[x] for x in (0, 1, 2, 4)]
        if rng.random() < 0.5:  # not kept: the next retiming starts from the times before this move
            move_pass(keys[0, d], j, i)
            continue
        keep(keys, 0, end, start, end2, start2, cut)
        assert np.array_equal(end, w_end) and np.array_equal(start, w_start)


_PY_CHECK = r"""
import json, sys
import ctrlmem as cm
from ctrlmem.search import buildingblock, kernels
from ctrlmem.search.families import cyclic, lahc
# the late-acceptance climbs a 24th as long in both runs (a climb's length is a parameter, not
# what this compares): the same kernels and families; the medium pipelines' climbs took ~90 s of
# the plain-Python run at full length, 12 s at an eighth
lahc.EVALS, lahc.PATIENCE, lahc.MEDIUM_WORK, lahc.LONG_EVALS_MAX = 500, 80, 500 * 256, 2_000
lahc.SMALL_WORK, lahc.SMALL_EVALS_MAX = 2_000 * 64, 2_000
lahc.PATIENT_WORK, lahc.PATIENT_EVALS_MAX = 2_000 * 256, 4_000  # the V-shape's patient climbs likewise
# the cyclic blocks' local searches likewise shorter (they took 15 of the plain run's 26 s at full
# length, 5 s at a fifth)
cyclic.ITERS, cyclic.PATIENCE, cyclic.COPIES_ITERS = 250, 40, 160
out = {"jit": kernels.jit_enabled()}
costs = cm.Costs(3, 4, 2, 0.1)
for name, p, m, lim, *more in json.loads(sys.argv[1]):
    s = cm.build(name, p, m, costs=costs, memory_limit=lim, **({"objective": more[0]} if more else {}))
    out[f"{name} {p} {m} {lim} {more}"] = [str(s.params), [[str(x) for x in o] for o in s.device_passes]]
out["steps"] = cm.pipeline_steps(buildingblock.v_cost_block(4, (2, 2, 1, 0), (1, 1, 1), (0, 0, 0)), 7)["squeeze"].to_text()
print(json.dumps(out))
"""

#: every search at least once, at sizes where plain Python takes seconds: the small-pipeline
#: families (fill-ahead, polish, relocate, periodic, late-acceptance) run at p·m ≤ 64 and m ≥ 3,
#: the others above (the medium pipelines' climbs at p·m = 80: zb and v-min 5 × 16); both objectives
_CASES = [("v-shape", 2, 4, 0.75), ("v-shape", 2, 3, 0.75, "makespan"), ("zb", 3, 4, 1.0), ("zb", 5, 16, 1.0),
          ("v-min", 5, 16, None), ("1f1b-v", 4, 9, None)]


def _run_check(jit: bool, cases) -> dict:
    env = dict(os.environ, CTRLMEM_JIT="1" if jit else "0")
    proc = subprocess.run([sys.executable, "-c", _PY_CHECK, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
def test_compiled_and_plain_python_kernels_agree():
    """With numba and without (CTRLMEM_JIT=0), every search gives the same schedule: the kernels
    are one code run two ways."""
    compiled, plain = _run_check(True, _CASES), _run_check(False, _CASES)
    assert compiled.pop("jit") is True and plain.pop("jit") is False
    assert len(compiled) == len(_CASES) + 1
    assert compiled == plain


# -- the searches: the named schedules search what v-shape searches at their level -------------


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
@settings(max_examples=12)
@given(p=st.integers(3, 24), extra=st.integers(0, 5), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.05, 0.2]))
def test_named_schedules_never_slower_than_the_search_at_their_peak(p, extra, data, per_stage, comm):
    """With costs, v-min / v-half / v-zb are never slower than v-shape at their own peak, nor
    than their unit-cost pattern under the same costs; 1f1b-v never slower than the best
    fused-backward V schedule the engine finds at its peak, nor than its pattern."""
    m = p + extra
    costs = _costs(data, 2 * p, per_stage, comm)
    for name in ("v-min", "v-half", "v-zb", "1f1b-v"):
        pattern = cm.build(name, p, m)
        level = max(cm.simulate(pattern).peak_memory)
        adapted = cm.simulate(cm.build(name, p, m, costs=costs), costs)
        assert max(adapted.peak_memory) <= level + 1e-9, name
        assert max(adapted.device_spans) <= max(cm.simulate(pattern, costs).device_spans) + 1e-9, name
        if name == "1f1b-v":
            from ctrlmem.schedules.budgeted import search_v

            best = search_v(p, m, costs, level, fused=True)
            assert max(adapted.device_spans) <= best.span + 1e-9
        elif m >= 2:
            ours = cm.simulate(cm.build("v-shape", p, m, costs=costs, memory_limit=level / p), costs)
            assert max(adapted.device_spans) <= max(ours.device_spans) + 1e-9, name
            assert max(ours.device_spans) <= max(adapted.device_spans) + 1e-9, name


def test_families_every_candidate_is_a_valid_schedule():
    """Every candidate of every family (split and fused) is a complete schedule that validates,
    on small pipelines and unequal costs."""
    costs = cm.Costs(3, 4, 2, 0.1)
    for p, m in ((2, 3), (3, 7), (5, 12)):
        for fams, fused in ((V_SPLIT, False), (V_FUSED, True)):
            q = Query(Placement.v_shape(p), m, costs, 2.0 * p, fused)
            from ctrlmem.search.engine import Incumbent

            for fam in fams:
                for cs in fam.sets(q, Incumbent()):
                    for i in range(len(cs)):
                        assert problem(cs, i) is None, (fam.name, cs.labels[i])
                        if math.isfinite(time_set(cs, costs).span[i]):
                            cm.validate(cs.schedule(i, "x"))


# -- the objective: span (the default) or makespan ------------------------------------------------


def test_search_ranks_by_the_query_objective():
    """p = 4, m = 4, a hop latency of a fifth of a pass, 1F1B's memory: over the same candidates
    (families that do not climb by the objective), the span search returns the candidate of the
    shortest longest span (then makespan) and the makespan search the one of the shortest
    makespan (then span), and here they differ."""
    from ctrlmem.schedules.recipes import _BASE
    from ctrlmem.search.engine import Incumbent, timed

    costs = cm.Costs(8.0, 9.3, 8.4, 1.7)
    P, m, cap = Placement.v_shape(4), 4, 4.0
    pool = []
    for fam in _BASE:
        for cs in fam.sets(Query(P, m, costs, cap), Incumbent()):
            tm = timed(cs, costs)
            pool += [(float(tm.span[i]), float(tm.makespan[i])) for i in range(len(cs))
                     if cs.peak[i] <= cap + 1e-9 and math.isfinite(tm.span[i])]
    by_span = search(Query(P, m, costs, cap), _BASE)
    by_make = search(Query(P, m, costs, cap, objective="makespan"), _BASE)
    assert (by_span.span, by_span.makespan) == min(pool)
    assert (by_make.makespan, by_make.span) == min((mk, sp) for sp, mk in pool)
    assert by_make.makespan < by_span.makespan and by_span.span < by_make.span


@pytest.mark.slow
@settings(max_examples=10)
@given(p=st.integers(2, 6), extra=st.integers(0, 6), data=st.data(), per_stage=st.booleans(),
       comm=st.sampled_from([0.0, 0.1, 0.4]), limit=st.sampled_from([None, 0.5, 0.75, 1.0, 1.5]))
def test_makespan_objective_never_longer_in_makespan(p, extra, data, per_stage, comm, limit):
    """``objective="makespan"`` (v-shape and zb) gives a schedule within the budget whose makespan
    is never longer than the default's (ranked by span), and records the objective."""
    m = p + extra
    for name, S in (("v-shape", 2 * p), ("zb", p)):
        costs = _costs(data, S, per_stage, comm)
        lim = limit if limit is None or limit >= 1 / p else 1 / p
        default = cm.simulate(cm.build(name, p, m, costs=costs, memory_limit=lim), costs)
        s = cm.build(name, p, m, costs=costs, memory_limit=lim, objective="makespan")
        got = cm.simulate(s, costs)
        assert got.makespan <= default.makespan + 1e-9, name
        assert max(got.peak_memory) <= (1.0 if lim is None else lim) * p + 1e-9
        assert dict(s.params)["objective"] == "makespan"
        assert "objective" not in dict(default.schedule.params)


def test_unknown_objective_names_both():
    for name in ("v-shape", "zb"):
        with pytest.raises(ValueError, match="'span'.*'makespan'"):
            cm.build(name, 4, 8, memory_limit=0.5, objective="throughput")
    with pytest.raises(ValueError, match="objective"):
        Query(Placement.v_shape(2), 4, cm.Costs(), 2.0, objective="bubble")


@pytest.mark.slow
@settings(max_examples=6)
@given(p=st.integers(2, 4), extra=st.integers(0, 8), fbw=st.tuples(*(st.integers(1, 4),) * 3),
       comm=st.sampled_from([0.0, 0.3, 1.0]))
def test_makespan_objective_monotone_in_the_budget(p, extra, fbw, comm):
    """With ``objective="makespan"`` a larger budget never gives a longer makespan (v-shape and zb;
    the small-pipeline families climb by the objective at every cap)."""
    m = p + extra
    costs = cm.Costs(*fbw, comm)
    for name in ("v-shape", "zb"):
        prev = math.inf
        for limit in (1 / p, 0.5, 0.75, 1.0, 1.5):
            r = cm.simulate(cm.build(name, p, m, costs=costs, memory_limit=max(limit, 1 / p), objective="makespan"),
                            costs)
            assert r.makespan <= prev + 1e-9, (name, limit)
            prev = r.makespan
