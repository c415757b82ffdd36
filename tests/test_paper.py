"""The paper's numbers as data and the A100 cost model (ctrlmem.model.paper)."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.model import paper


@pytest.mark.parametrize("mb, ms", [(4, 12.96), (8, 26.30), (12, 39.45)])
def test_cost_model_predicts_table5_forward_pass(mb, ms):
    """One 9.6B layer (a V-shape chunk) forward at 65 % of A100 peak is within 2 % of Table 5."""
    f, _, _ = paper.pass_times("9.6B", 1, mb)
    assert f * 1e3 == pytest.approx(ms, rel=0.02)
    assert paper.TABLE5[("9.6B", mb)] == ms


@pytest.mark.parametrize("name", ["9.6B", "21B", "38.5B", "98.5B"])
def test_parameter_count_matches_model_name(name):
    """12·L·h² + V·h reproduces each Table 2 model's size within 1.5 %."""
    assert paper.parameter_count(name) / 1e9 == pytest.approx(float(name[:-1]), rel=0.015)


@pytest.mark.parametrize("name", ["9.6B", "21B", "38.5B", "98.5B"])
def test_table2_layers_follow_2p_minus_2(name):
    m = paper.model(name)
    assert m.num_layers == 2 * m.num_gpus - 2


def test_1f1b_activation_matches_fig6_reading():
    """1F1B's peak (p microbatches of a 1/p model slice) for 9.6B at mb 4 is in Fig. 6's 45–49 GB."""
    gb = 16 * paper.activation_bytes("9.6B", 30 / 16, 4) / 1e9
    assert 45 <= gb <= 49


def test_flops_split_sums_to_megatron_formula():
    """F + B + W per layer and token equals 72·h²·(1 + s/6h)."""
    h, s = 4096, 2048
    assert sum(paper.layer_flops(h, s)) == pytest.approx(72 * h * h * (1 + s / (6 * h)))


def test_paper_costs_scale_with_tp_and_are_positive():
    c1 = paper.paper_costs("98.5B", 10, 2, tp=1)
    c4 = paper.paper_costs("98.5B", 10, 2, tp=4)
    assert c4.f < c1.f / 4 * 1.3 and c4.f > c1.f / 4
    with pytest.raises(ValueError, match="tp must be one of"):
        paper.paper_costs("98.5B", 10, 2, tp=3)


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid presets: 9.6B"):
        paper.model("7B")


def test_table_a_rates_follow_from_table_a_bubbles():
    """docs/theory.md's printed rates equal bubble / (6m + bubble) of the exact-values table formulas (4 decimals)."""
    for (p, m), rates in paper.TABLE_A_RATES.items():
        for name, rate in rates.items():
            bubble = paper.table_a_bubble(name, p)
            assert round(bubble / (6 * m + bubble), 4) == pytest.approx(rate, abs=1e-4), (p, m, name)
        assert rates["1f1b"] == pytest.approx((p - 1) / (m + p - 1), abs=1e-4)


def test_table3_sixteen_percent():
    """The abstract's 16 %: V-ZB / 1F1B best MFU at seq 1024 is 1.156."""
    row = paper.TABLE3[(1024, 160)]
    assert round(row["V-ZB"] / row["1F1B"], 3) == 1.156


@pytest.mark.parametrize("p", [4, 8, 12, 16])
def test_registered_1f1b_matches_table_a(p):
    """The simulator's 1F1B has the exact-values table's bubble 6(p-1) τ (full-stage passes = 2τ) and peak p."""
    r = cm.simulate(cm.build("1f1b", p, 2 * p), cm.Costs(2, 2, 2, 0))
    assert max(r.device_bubbles) == paper.table_a_bubble("1f1b", p)
    assert max(r.peak_memory) == paper.table_a_memory("1f1b", p)
