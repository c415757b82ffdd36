"""Simulator: exact closed forms of the classic and zero-bubble schedules, and timeline
properties for every generator (docs/theory.md §5, §8; docs/architecture.md)."""

import math

import pytest
from hypothesis import assume, given, strategies as st

import ctrlmem as cm
from ctrlmem import Op

COSTS = [
    cm.Costs(1, 1, 1),
    cm.Costs(3, 2, 1),
    cm.Costs(2, 3, 1.5),
    cm.Costs(1, 3, 1),
    cm.Costs(2, 1, 1),
    cm.Costs(1, 2, 3),
]
FULL_GRID = [(p, m) for p in range(1, 17) for m in range(1, 4 * p + 1)]
# The default run samples the grid at the sizes where closed forms change regime; the full
# p ∈ 1..16, m ∈ 1..4p grid runs with the slow tests.
SPARSE_GRID = [
    (p, m) for p in range(1, 17) for m in sorted({1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1, 4 * p})
    if 1 <= m <= 4 * p and (p <= 6 or p % 3 == 1 or p == 16)
]


def _1f1b(p, m, c):
    """Bubble (p−1)(F+B+W) on the worst device for every m, peak min(p, m) (docs/theory.md §8)."""
    return (p - 1) * (c.f + c.b + c.w), min(p, m)


def _zb_h1(p, m, c):
    """(p−1)(F+B−W) for m ≥ p when W ≤ B (each deferred W fits a B-gap); peak p."""
    if m < p or c.w > c.b:
        return None
    return (p - 1) * (c.f + c.b - c.w), p


def _zb_h2(p, m, c):
    """(p−1)(F+B−2W) for m ≥ 2p−1 when that is ≥ 0; peak 2p−1."""
    if m < 2 * p - 1 or c.f + c.b < 2 * c.w:
        return None
    return (p - 1) * (c.f + c.b - 2 * c.w), 2 * p - 1


def _zb_v(p, m, c):
    """Zero bubble at 1F1B memory for F = B = W and m ≥ 2p−1."""
    if m < 2 * p - 1 or not c.f == c.b == c.w:
        return None
    return 0.0, p


def _interleaved(v):
    def expected(p, m, c):
        """(p−1)(F+B+W)/v for m a multiple of p; device 0 peak (2(p−1)+(v−1)p+1)/v for m ≥ 2p."""
        if m % p:
            return None
        peak = (2 * (p - 1) + (v - 1) * p + 1) / v if m >= 2 * p and p > 1 else None
        return (p - 1) * (c.f + c.b + c.w) / v, peak
    return expected


CLOSED_FORMS = {
    "1f1b": ({}, _1f1b),
    "zb-h1": ({}, _zb_h1),
    "zb-h2": ({}, _zb_h2),
    "zb-v": ({}, _zb_v),
    "interleaved-1f1b(v=2)": ({"num_chunks": 2}, _interleaved(2)),
    "interleaved-1f1b(v=3)": ({"num_chunks": 3}, _interleaved(3)),
}


def check_closed_form(label, grid):
    params, expected = CLOSED_FORMS[label]
    name = label.split("(")[0]
    checked = 0
    for p, m in grid:
        if not any(expected(p, m, c) for c in COSTS):
            continue
        s = cm.build(name, p, m, **params)  # the order does not depend on costs: build once
        for c in COSTS:
            want = expected(p, m, c)
            if want is None:
                continue
            r = cm.simulate(s, c)
            bub, peak = want
            assert max(r.device_bubbles) == pytest.approx(bub, abs=1e-9), (label, p, m, c)
            if peak is not None:
                got = r.peak_memory[0] if name == "interleaved-1f1b" else max(r.peak_memory)
                assert got == pytest.approx(peak, abs=1e-8), (label, p, m)
            if name == "1f1b" and m >= p:
                assert r.bubble_rate == pytest.approx((p - 1) / (m + p - 1), abs=1e-9), (p, m)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("label", list(CLOSED_FORMS))
def test_closed_forms(label):
    """Bubble and peak memory equal the paper's closed forms (sampled grid, six cost mixes)."""
    check_closed_form(label, SPARSE_GRID)


@pytest.mark.slow
@pytest.mark.parametrize("label", list(CLOSED_FORMS))
def test_closed_forms_full_grid(label):
    """The same over the full grid p ∈ 1..16, m ∈ 1..4p."""
    check_closed_form(label, FULL_GRID)


def test_interleaved_peak_memory_matches_paper_for_two_chunks():
    """(3p−1)/2 for v = 2 (docs/theory.md §8)."""
    for p in range(2, 17):
        r = cm.simulate(cm.build("interleaved-1f1b", p, 4 * p))
        assert r.peak_memory[0] == (3 * p - 1) / 2


def test_gpipe_peak_is_m():
    for p, m in [(1, 3), (4, 8), (8, 5)]:
        assert max(cm.simulate(cm.build("gpipe", p, m)).peak_memory) == m


def test_comm_is_added_on_cross_device_edges_only():
    """One microbatch through 1F1B: makespan = p(F + B + W) + 2(p−1)·comm."""
    for p in range(1, 8):
        r = cm.simulate(cm.build("1f1b", p, 1), cm.Costs(1, 2, 3, comm=0.5))
        assert r.makespan == pytest.approx(p * 6 + 2 * (p - 1) * 0.5)
    # Stages on the same device exchange nothing: V-shape on one device ignores comm.
    v1 = cm.build("zb-v", 1, 3)
    assert cm.simulate(v1, cm.Costs(1, 1, 1, comm=5)).makespan == cm.simulate(v1).makespan == 9


def test_release_at_b_lowers_split_backward_peak_only():
    """Freeing part of the activation at B lowers ZB-H1's peak but not 1F1B's (fused BW)."""
    full = cm.simulate(cm.build("zb-h1", 4, 8)).peak_memory
    half = cm.simulate(cm.build("zb-h1", 4, 8), memory=cm.MemoryModel(release_at_b=0.5)).peak_memory
    assert half[-1] < full[-1] and all(h <= f for h, f in zip(half, full))
    one = cm.simulate(cm.build("1f1b", 4, 8), memory=cm.MemoryModel(release_at_b=0.5)).peak_memory
    assert one == cm.simulate(cm.build("1f1b", 4, 8)).peak_memory


# ---------------------------------------------------------------------------------------------
# Properties over random sizes and per-stage costs, for every registered generator.

def _valid_size(name, p, m):
    if name == "interleaved-1f1b":
        rounds = max(1, m // p)
        return m % rounds == 0
    return True


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(cm.SCHEDULES)))
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 14))
    if not _valid_size(name, p, m):
        m = p * draw(st.integers(1, 3))
    try:
        s = cm.build(name, p, m)
    except ValueError:  # a size the generator documents as unsupported (checked below)
        assume(False)
    n = s.num_stages
    pos = st.floats(0.05, 5, allow_nan=False)
    costs = cm.Costs(
        f=draw(st.lists(pos, min_size=n, max_size=n)),
        b=draw(st.lists(pos, min_size=n, max_size=n)),
        w=draw(st.lists(pos, min_size=n, max_size=n)),
        comm=draw(st.floats(0, 2)),
    )
    return s, costs


@given(cases())
def test_timeline_properties(case):
    """Valid schedule; every dependency holds (plus comm across devices, within each model copy);
    no two units of a device overlap (an overlapped pair is one unit: both passes over one interval
    of their two times) and each keeps its order; memory returns to zero; spans, work and bubble
    rate follow their definitions."""
    s, costs = case
    cm.validate(s)
    r = cm.simulate(s, costs)
    S = s.num_stages
    per = S // s.model_copies  # the stages of one model copy
    f, b, w = costs.stage_times(S, s.num_devices * s.model_copies)
    paired = {(d, i + j) for d in range(s.num_devices) for i in s.overlap_starts(d) for j in (0, 1)}
    times = {(tp.op, tp.stage, tp.microbatch): tp for tp in r.passes}
    assert len(times) == len(r.passes) == s.num_passes
    dev = s.placement.device_of

    def back(stage, k):
        return times.get((Op.B, stage, k)) or times[(Op.BW, stage, k)]

    rec = costs.recompute_times(S, s.num_devices, s.recompute_mode)  # an R (1f1b-r) costs its recompute

    def duration(op, stage):
        return {Op.F: f, Op.B: b, Op.W: w, Op.R: rec}[op][stage] if op is not Op.BW else b[stage] + w[stage]

    for d in range(s.num_devices):
        row = s.device_passes[d]
        for i in range(len(row)):
            start, end = r.timing(d, i)
            if (d, i) not in paired:
                assert end - start == pytest.approx(duration(row[i].op, row[i].stage))
            elif i in s.overlap_starts(d):
                both = duration(row[i].op, row[i].stage) + duration(row[i + 1].op, row[i + 1].stage)
                assert r.timing(d, i + 1) == (start, end) and end - start == pytest.approx(both)
    for tp in r.passes:
        if tp.op is Op.R:
            need, hop = times[(Op.F, tp.stage, tp.microbatch)], False
            assert tp.end <= back(tp.stage, tp.microbatch).start + 1e-9
        elif tp.op is Op.F and tp.stage % per > 0:
            need, hop = times[(Op.F, tp.stage - 1, tp.microbatch)], dev(tp.stage - 1) != dev(tp.stage)
        elif tp.op in (Op.B, Op.BW):
            if tp.stage % per == per - 1:
                need, hop = times[(Op.F, tp.stage, tp.microbatch)], False
            else:
                need, hop = back(tp.stage + 1, tp.microbatch), dev(tp.stage + 1) != dev(tp.stage)
        elif tp.op is Op.W:
            need, hop = times[(Op.B, tp.stage, tp.microbatch)], False
        else:
            continue
        assert tp.start >= need.end + (costs.comm if hop else 0) - 1e-9
    for d in range(s.num_devices):
        mine = [tp for tp in r.passes if tp.device == d]
        assert [(tp.op, tp.stage, tp.microbatch) for tp in mine] == [
            (ps.op, ps.stage, ps.microbatch) for ps in s.device_passes[d]
        ]
        units = [tp for i, tp in enumerate(mine) if i - 1 not in s.overlap_starts(d)]  # a pair's second shares the first's interval
        for a, c in zip(units, units[1:]):
            assert c.start >= a.end - 1e-9
        span = mine[-1].end - min(tp.start for tp in mine)
        assert r.device_spans[d] == pytest.approx(span)
        assert r.device_work[d] == pytest.approx(math.fsum(tp.end - tp.start for tp in units))
        assert r.device_bubbles[d] == pytest.approx(span - r.device_work[d], abs=1e-6)
        times_d, values = r.memory_curve(d)
        assert values[-1] == pytest.approx(0, abs=1e-9)
        assert max(values) == pytest.approx(r.peak_memory[d])
        assert min(values) >= -1e-9
    assert r.makespan == pytest.approx(max(tp.end for tp in r.passes))
    assert r.bubble_rate == pytest.approx(1 - max(r.device_work) / max(r.device_spans), abs=1e-9)


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
def test_every_generator_supports_typical_sizes():
    """Unsupported sizes are skipped above; every generator must build and validate at the
    sizes any pipeline user needs (p ≥ 2, m a multiple of p and ≥ 2p)."""
    for name in cm.SCHEDULES:
        kw = {"time_limit": 1} if name == "optimal" else {}  # (the exact solver's own tests time it)
        for p, m in [(2, 4), (3, 6), (4, 8), (4, 16), (6, 12)]:
            if name == "dualpipe" and p % 2:  # two pipelines fed from both ends: DualPipe needs an even p
                continue
            cm.validate(cm.build(name, p, m, **kw))


def test_a_schedule_simulated_again_under_new_costs_is_simulated_afresh():
    """The structural index of a schedule is kept between simulations (an explorer cost edit
    re-simulates the same orders): a schedule simulated under one set of costs and then another
    gives exactly what a fresh copy of it gives under the second, levers included."""
    s = cm.build("v-shape", 4, 8, costs=cm.Costs(1, 1, 1, offload=0.5), memory_limit=0.25,
                 recompute="auto", offload="auto")
    for costs in (cm.Costs(1, 1, 1, offload=0.5), cm.Costs(3, 4, 2, 0.1, offload=1.5), cm.Costs(2, 1, 1, 0.3)):
        a = cm.simulate(s, costs)
        b = cm.simulate(cm.Schedule.from_text(s.to_text()), costs)
        assert (a.makespan, a.peak_memory, a.passes, a.copies) == (b.makespan, b.peak_memory, b.passes, b.copies)


@given(cases(), st.floats(0, 3))
def test_a_second_simulation_times_every_pass_as_the_event_loop_does(case, comm2):
    """A schedule simulated again is timed by one loop over the order the event loop first
    reached its passes in (that order follows the orders alone): every start and end, span and
    peak equals what the event loop (``validate.execute``) gives, under the first costs and
    under others."""
    from unittest import mock

    from ctrlmem.model import simulate as sim

    s, costs = case
    for c in (costs, cm.Costs(costs.f, costs.b, costs.w, comm=comm2)):
        r = cm.simulate(s, c)
        with mock.patch.object(sim, "_plan_of", lambda index: None):  # the event loop alone
            want = cm.simulate(s, c)
        assert (r._start, r._end, r.device_spans, r.peak_memory, r.makespan) == \
            (want._start, want._end, want.device_spans, want.peak_memory, want.makespan)
    index = sim._index_of(s)
    assert (sim._plan_of(index) is None) == (index.partner is not None or bool(index.extra_dep or index.lanes))
