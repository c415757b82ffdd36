"""Building blocks and the pipeline steps (docs/theory.md §2–§3): collisions, lifespans, Eq. 1,
repeat → place W → reorder → squeeze, each step on its own."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctrlmem as cm
from ctrlmem.search import buildingblock as B
from ctrlmem.search.buildingblock import SlotPass
from ctrlmem.model.ir import Op, Placement


def _block(name, p, m=10):
    f = B.GALLERY[name]
    return f(p, m) if name == "gpipe" else f(p)


# -- literal small cases -----------------------------------------------------------------------


def test_v_min_block_literal_p2():
    """V-Min at p=2: docs/theory.md §7 start slots, W in the first free slot after its B."""
    b = B.v_min_block(2)
    assert b.to_text() == "d0: F..fbw.BW..\nd1: .Ff..bB..wW"
    assert b.lifespans() == {0: 9, 1: 10, 2: 8, 3: 3}
    # Eq. 1: ceil(9/6) + ceil(3/6) = 3 chunk activations on device 0, ceil(10/6)+ceil(8/6) = 4 on 1
    assert b.memory_bound() == [1.5, 2.0]


def test_one_f_one_b_block_lifespans_and_bound():
    """1F1B: stage i lives 6(p−i) slots, so Eq. 1 gives (p−i)·a and p·a on device 0."""
    for p in (1, 2, 4, 7):
        b = B.one_f_one_b_block(p)
        assert b.lifespans() == {i: 6 * (p - i) for i in range(p)}
        assert b.memory_bound() == [float(p - i) for i in range(p)]
        assert b.collisions() == []


def test_repeat_literal_and_place_w_literal():
    """repeat() shifts the block by T per microbatch; place_w() puts each W in the first free
    slots after its B (chunk-1 W first) and leaves no overlap."""
    b = B.v_min_block(2)
    t = b.repeat(4)
    assert t.to_text() == "d0: F..fbwFBWfbwFBWfbwFBWfbw.BW..\nd1: .Ff..bBFfwWbBFfwWbBFfwWbB..wW"
    for row in t.rows:
        for sp in row:
            base = next(x for x in b.passes if (x.op, x.stage) == (sp.op, sp.stage))
            assert sp.start == base.start + 6 * sp.microbatch
    w = B.place_w(t.without_w())
    assert w.to_text() == "d0: F..fbwFBWfbwFBWfbwFBWfbw.BW\nd1: .Ff..bBFfwWbBFfwWbBFfwWbBwW"


def test_pipeline_steps_literal_p2():
    """The reorder step moves warm-up forwards and cool-down passes earlier (the paper's Fig. 11)."""
    steps = B.pipeline_steps(B.v_min_block(2), 4)
    assert list(steps) == ["repeat", "place_w", "reorder", "squeeze"]
    assert steps["squeeze"].to_text() == (
        "d0: FFFfbwfBWbwFBWfbw..BWfbw.BW\nd1: .FfFfbBwWFbBfwW.bwBFfW.bBwW"
    )
    assert all(isinstance(t, B.Timeline) for t in steps.values())
    cm.validate(steps["squeeze"].to_schedule())


# -- collisions ------------------------------------------------------------------------------


def test_v_min_without_gap_collides_when_3_divides_p():
    """docs/theory.md §7: without the extra gap g=2 the V-Min block collides when 3 | p."""
    for p in (3, 6, 9):
        blk = B.v_min_block(p)
        bad = [
            SlotPass(sp.start - 2 if sp.op is Op.B else sp.start, sp.length, sp.op, sp.stage, 0)
            for sp in blk.passes
            if sp.op is not Op.W
        ]
        # re-add W wherever free; a collision must be reported either way
        broken = B.BuildingBlock("v-min-nogap", blk.placement, 6, tuple(bad) + tuple(
            SlotPass(sp.start + 60, 1, Op.W, sp.stage, 0) for sp in blk.passes if sp.op is Op.W
        ))
        clashes = broken.collisions()
        assert clashes, p
        with pytest.raises(ValueError, match="collides when repeated"):
            broken.repeat(3)
    for p in (2, 4, 5, 7, 8):
        assert B.v_min_block(p).collisions() == []


def test_block_rejects_broken_dependencies():
    """A block whose B starts before the next stage's B ends is not a block."""
    P = Placement.sequential(2)
    passes = (
        SlotPass(0, 2, Op.F, 0, 0), SlotPass(2, 2, Op.F, 1, 0),
        SlotPass(4, 4, Op.BW, 1, 0), SlotPass(5, 4, Op.BW, 0, 0),
    )
    with pytest.raises(ValueError, match="starts before"):
        B.BuildingBlock("bad", P, 6, passes)


@pytest.mark.parametrize("name", sorted(B.GALLERY))
def test_gallery_blocks_do_not_collide(name):
    """Every gallery and V block repeats every T without two passes overlapping."""
    for p in (2, 3, 4, 5, 6, 8):
        blk = _block(name, p)
        assert blk.collisions() == [], (name, p)
        t = blk.repeat(5)
        for row in t.rows:
            for a, b in zip(row, row[1:]):
                assert a.end <= b.start


# -- Eq. 1 and the reorder ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(B.GALLERY))
def test_eq1_bound_covers_simulated_peak_and_reorder_never_raises_it(name):
    """Eq. 1 ≥ the simulated peak of the block-built schedule, and the reordered schedule's peak
    is ≤ the peak of the same block merely repeated and squeezed (docs/theory.md §3, App. C)."""
    for p in (2, 3, 4, 5, 7, 9):
        blk = _block(name, p)
        m = 10 if name == "gpipe" else 3 * p
        plain = B.pipeline_steps(blk, m, reorder_phases=False)["squeeze"].to_schedule()
        built = B.build_from_block(blk, m)
        cm.validate(built)
        peak = max(cm.simulate(built).peak_memory)
        assert peak <= max(blk.memory_bound()) + 1e-9, (name, p)
        assert peak <= max(cm.simulate(plain).peak_memory) + 1e-9, (name, p)


def test_eq1_bound_of_v_blocks_is_near_table_a():
    """Eq. 1 of the V blocks is at least the exact-values table peak and at most half a unit above it
    (the ceilings round a chunk's lifespan up to whole intervals)."""
    for p in range(2, 20):
        for blk, peak in ((B.v_min_block(p), (p + 4) // 3), (B.v_half_block(p), (p + 2) // 2), (B.v_zb_block(p), p)):
            bound = max(blk.memory_bound())
            assert peak <= bound <= peak + 0.5, (blk.name, p, bound)


def test_v_half_paper_variant_is_also_valid():
    """Both V-Half variants (code: F turn 1 / B turn 2; paper Table 9: F turn 2 / B turn 1) are
    collision-free with the same peak (docs/theory.md §7)."""
    for p in range(2, 13):
        a, b = B.v_half_block(p, "code"), B.v_half_block(p, "paper")
        assert a.collisions() == [] and b.collisions() == []
        sa, sb = B.build_from_block(a, 2 * p), B.build_from_block(b, 2 * p)
        assert max(cm.simulate(sa).peak_memory) == max(cm.simulate(sb).peak_memory)


# -- squeeze / place_w properties --------------------------------------------------------------


@given(p=st.integers(2, 7), m=st.integers(1, 14), which=st.sampled_from(["v-min", "v-half", "v-zb", "1f1b-v"]))
def test_each_step_gives_a_valid_timeline(p, m, which):
    """Every intermediate timeline is a valid schedule; squeeze keeps each device's order and
    never starts a pass later than before; W always follows its B."""
    steps = B.pipeline_steps(_block(which, p), m)
    for t in steps.values():
        cm.validate(t.to_schedule())
        for row in t.rows:
            b_end = {(sp.stage, sp.microbatch): sp.end for sp in row if sp.op is Op.B}
            for sp in row:
                if sp.op is Op.W:
                    assert sp.start >= b_end[(sp.stage, sp.microbatch)]
    before, after = steps["reorder"], steps["squeeze"]
    for r0, r1 in zip(before.rows, after.rows):
        assert [sp.pass_ for sp in r0] == [sp.pass_ for sp in r1]
        assert all(b.start <= a.start for a, b in zip(r0, r1))


def test_extend_stable_equals_direct_build():
    """Lengthening the periodic stable phase gives exactly the orders of building directly."""
    for f in (B.v_min_block, B.v_half_block, B.v_zb_block):
        for p in (2, 3, 5, 8):
            for m in (5 * p + 1,):
                fast = B.build_from_block(f(p), m)
                slow = B.build_from_block(f(p), m, direct=True)
                assert fast.device_passes == slow.device_passes, (f.__name__, p, m)


def test_extend_stable_refuses_schedule_without_stable_phase():
    """A schedule with no periodic window cannot be lengthened."""
    s = cm.build("gpipe", 2, 2)
    with pytest.raises(ValueError, match="no periodic stable phase"):
        B.extend_stable(s, 5)


def test_one_f_one_b_block_pipeline_is_1f1b():
    """The 1F1B block, repeated and squeezed, has 1F1B's bubble and peak."""
    for p, m in ((2, 4), (4, 8), (5, 12)):
        built = cm.simulate(B.build_from_block(B.one_f_one_b_block(p), m))
        ref = cm.simulate(cm.build("1f1b", p, m))
        assert built.makespan == ref.makespan
        assert max(built.peak_memory) == max(ref.peak_memory) == p


def test_gpipe_block_gives_gpipe_order():
    """The GPipe block repeated and squeezed is GPipe: all forwards, then all backwards."""
    s = B.build_from_block(B.gpipe_block(3, 4), 4)
    assert s.device_passes == cm.build("gpipe", 3, 4).device_passes


def test_v_shape_block_offsets_reproduce_v_min_peak():
    """The offset-parametrised V block with δ0 = δ1 = 1 has V-Min's peak."""
    for p in (4, 5, 7, 8):
        blk = B.v_shape_block(p, [1] * (p - 1), [1] * (p - 1))
        assert max(cm.simulate(B.build_from_block(blk, 3 * p)).peak_memory) == (p + 4) // 3
    with pytest.raises(ValueError, match="p-1=3 values"):
        B.v_shape_block(4, [1, 1], [1, 1, 1])


def test_single_device_v_blocks_explain():
    """p=1 has no V-shape pipeline; the error says what to use."""
    with pytest.raises(ValueError, match="at least 2 devices"):
        B.v_min_block(1)
