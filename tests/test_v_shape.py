"""V-Min, V-Half, V-ZB and 1F1B-V built from their blocks (docs/theory.md §5–7).

Units: docs/theory.md counts bubbles in τ, one chunk pass. ctrlmem's ``Costs(1, 1, 1)`` gives a full
device-stage pass time 1, so a V-shape chunk pass takes 0.5 and a bubble of ``x`` τ shows up
as ``0.5·x`` in ``SimResult.device_bubbles``: ``tau = 2 * device_bubble``. Memory is in ``a``
(a full device-stage activation), the units of the exact-values table peaks.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlmem as cm

UNIT = cm.Costs(1, 1, 1, 0)


def tau_bubble(result) -> float:
    """Largest per-device bubble in τ (chunk passes)."""
    return 2 * max(result.device_bubbles)


def table_a(name: str, p: int) -> tuple[int, int]:
    """the exact values of docs/theory.md §7: (peak in a, bubble in τ) with F = B = W, no comm, m ≥ 2p."""
    if name == "v-min":
        return (p + 4) // 3, (4 * p - 7 if p % 3 == 0 else 4 * p - 5)
    if name == "v-half":
        return (p + 2) // 2, (3 * p - 7 if p % 2 == 0 else 3 * p - 4)
    return p, 0


def lower_bound(p: int, peak_a: float) -> float:
    """docs/theory.md §6: bubble ≥ 6p − 1 − 3k τ, k the peak in half-stage activations."""
    return 6 * p - 1 - 3 * (2 * peak_a)


def check_table_a(name, p, m):
    r = cm.simulate(cm.build(name, p, m), UNIT)
    peak, bubble = table_a(name, p)
    assert max(r.peak_memory) == peak, (name, p, m, r.peak_memory)
    if name == "v-half" and p == 2:
        # 3p−7 = −1 is impossible; the bound 6p−1−3k is −1 too, and one τ remains
        assert tau_bubble(r) == 1
    else:
        assert tau_bubble(r) == bubble, (name, p, m, tau_bubble(r))


@pytest.mark.parametrize("name", ["v-min", "v-half"])
@pytest.mark.parametrize("p", range(2, 13))
def test_table_a_peak_and_bubble_small_p(name, p):
    """Peak ⌊(p+4)/3⌋ / ⌊(p+2)/2⌋ and bubble 4p−5 (4p−7 when 3|p) / 3p−7 (even) 3p−4 (odd),
    independent of m ≥ 2p (docs/theory.md §7)."""
    for m in (2 * p, 2 * p + 1, 3 * p + 2):
        check_table_a(name, p, m)


@pytest.mark.parametrize("p", range(2, 13))
def test_table_a_v_zb_small_p(p):
    """V-ZB: peak p·a and zero bubble for every m ≥ 2p (docs/theory.md §7)."""
    for m in (2 * p, 2 * p + 1, 3 * p + 2):
        check_table_a("v-zb", p, m)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["v-min", "v-half", "v-zb"])
def test_table_a_large_p(name):
    """the exact-values table for p = 13..32 (slow: about 1 s per p)."""
    for p in range(13, 33):
        for m in (2 * p, 2 * p + 1):
            check_table_a(name, p, m)


TABLE_A_RATES = [  # p, m, V-Min, V-Half (docs/theory.md §7)
    (16, 32, 0.2351, 0.1760),
    (16, 64, 0.1332, 0.0965),
    (16, 128, 0.0713, 0.0507),
    (16, 256, 0.0370, 0.0260),
    (24, 48, 0.2361, 0.1841),
    (24, 384, 0.0372, 0.0274),
    (32, 64, 0.2426, 0.1882),
    (32, 512, 0.0385, 0.0282),
]


def _check_rates(p, m, v_min, v_half):
    assert round(cm.simulate(cm.build("v-min", p, m), UNIT).bubble_rate, 4) == v_min
    assert round(cm.simulate(cm.build("v-half", p, m), UNIT).bubble_rate, 4) == v_half
    assert cm.simulate(cm.build("v-zb", p, m), UNIT).bubble_rate == 0


@pytest.mark.parametrize("p,m,v_min,v_half", TABLE_A_RATES[:2])
def test_table_a_bubble_rates_p16(p, m, v_min, v_half):
    """Exact bubble rates to 4 decimals (rate = bubble / (6m + bubble))."""
    _check_rates(p, m, v_min, v_half)


@pytest.mark.slow
@pytest.mark.parametrize("p,m,v_min,v_half", TABLE_A_RATES[2:])
def test_table_a_bubble_rates_slow(p, m, v_min, v_half):
    """Exact bubble rates for the larger rows (p = 16 with m ≥ 128, p = 24, p = 32)."""
    _check_rates(p, m, v_min, v_half)


@settings(max_examples=15)
@given(p=st.integers(2, 12), extra=st.integers(0, 12), name=st.sampled_from(["v-min", "v-half", "v-zb"]))
def test_lower_bound_never_beaten(p, extra, name):
    """No V schedule beats the bubble lower bound 6p−1−3k τ for its own peak (docs/theory.md §6)."""
    r = cm.simulate(cm.build(name, p, 2 * p + extra), UNIT)
    assert tau_bubble(r) >= lower_bound(p, max(r.peak_memory))


@pytest.mark.parametrize("p", range(3, 17))
def test_v_half_meets_lower_bound(p):
    """V-Half sits exactly on the bound for every p ≥ 3 (at p = 2 the bound is negative)."""
    r = cm.simulate(cm.build("v-half", p, 2 * p + 2), UNIT)
    assert tau_bubble(r) == lower_bound(p, max(r.peak_memory))


def _max_bubble(name, p, m, costs):
    return max(cm.simulate(cm.build(name, p, m), costs).device_bubbles)


def test_v_half_bubble_constant_in_m_exactly_under_condition():
    """V-Half's bubble does not grow with m iff W + 2B ≥ 2F and W + 2F ≥ 2B, for every
    F, B, W ∈ 1..4, at p = 8 (docs/theory.md §5; at p = 4 and 6 the short pipeline also keeps some
    combinations outside the condition constant, or the reverse)."""
    p = 8
    schedules = [cm.build("v-half", p, m) for m in (2 * p, 3 * p, 4 * p)]
    for f in range(1, 5):
        for b in range(1, 5):
            for w in range(1, 5):
                costs = cm.Costs(f, b, w, 0)
                bubbles = [max(cm.simulate(s, costs).device_bubbles) for s in schedules]
                constant = bubbles[0] == bubbles[1] == bubbles[2]
                condition = w + 2 * b >= 2 * f and w + 2 * f >= 2 * b
                assert constant == condition, (f, b, w, bubbles)


def test_v_min_bubble_grows_with_m_when_costs_differ():
    """V-Min repeats a bubble every period when F, B, W differ (docs/theory.md §5, Fig. 5):
    with per-chunk F, B, W = 3, 4, 2 at p = 8 it grows by 6 per microbatch (docs/theory.md: 183 →
    855 for m = 16 → 128; ours 181 → 853), while V-Half's stays put (docs/theory.md 81, ours 83)."""
    costs = cm.Costs(6, 8, 4, 0)  # full-stage times = twice the per-chunk ones
    v_min = [_max_bubble("v-min", 8, m, costs) for m in (16, 32, 128)]
    assert v_min[1] - v_min[0] == 6 * 16 and v_min[2] - v_min[0] == 6 * 112
    v_half = {_max_bubble("v-half", 8, m, costs) for m in (16, 32, 128)}
    assert len(v_half) == 1
    for f, b, w in ((1, 2, 1), (2, 1, 1), (3, 4, 2), (2, 3, 1), (1, 2, 2)):
        c = cm.Costs(f, b, w)
        grow = [_max_bubble("v-min", 5, m, c) for m in (15, 25)]
        assert grow[1] > grow[0], (f, b, w)


@pytest.mark.parametrize("name", ["v-min", "v-half", "v-zb", "1f1b-v"])
@settings(max_examples=10)
@given(p=st.integers(2, 8), m=st.integers(1, 20))
def test_v_schedules_valid_for_any_m(name, p, m):
    """Every V schedule is valid for any m ≥ 1 and never exceeds its the exact-values table peak."""
    s = cm.build(name, p, m)
    cm.validate(s)
    r = cm.simulate(s, UNIT)
    if name != "1f1b-v":
        assert max(r.peak_memory) <= table_a(name, p)[0]


def test_1f1b_v_memory_and_bubble():
    """1F1B-V (App. I): 0.75 / 0.75 / 0.6875 of 1F1B's memory at p = 4 / 8 / 16 (docs/theory.md §8)
    and less bubble than 1F1B (docs/theory.md 33 τ vs 42 at p = 8, 75 vs 90 at p = 16)."""
    for p, frac, bubble in ((4, 0.75, 15), (8, 0.75, 33), (16, 0.6875, 75)):
        r = cm.simulate(cm.build("1f1b-v", p, 4 * p), UNIT)
        assert max(r.peak_memory) / p == frac
        assert tau_bubble(r) == bubble
        assert tau_bubble(r) < 6 * (p - 1)
    assert not cm.build("1f1b-v", 4, 8).split_backward


@pytest.mark.parametrize("name", ["v-min", "v-half", "v-zb", "1f1b-v"])
def test_single_device_is_explained(name):
    """p = 1 has no V-shape; the error names what is supported."""
    with pytest.raises(ValueError, match="num_devices >= 2"):
        cm.build(name, 1, 4)
