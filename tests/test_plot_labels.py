"""Labels say what they show: per-stage costs as a range with every stage on hover, a budget
line called a budget, titles clear of plotly's toolbar, device colours that stay apart at
p = 32, budget sweeps as steps, every Pareto point named (coinciding ones too), and a stacked
export that keeps every trace of its parts."""

import numpy as np
import pytest

import ctrlmem as cm
from ctrlmem.plots import figures as plot
from ctrlmem.explorer import ui


def test_per_stage_costs_are_shown_as_their_range_not_first_and_last():
    """Weights 1.7,1,1,1.7: the first and last stage are equal, the middle ones cheaper; the
    label gives min–max and says per stage (the old label read "F=2.55..2.55")."""
    costs = ui.Settings(num_devices=4, f=1.5, b=1, w=1, stage_weights=(1.7, 1, 1, 1.7)).costs(4)
    label = plot.costs_label(costs)
    assert label == "F=1.5–2.55 B=1–1.7 W=1–1.7 (per stage) comm=0"
    assert plot.costs_label(cm.Costs(2, 1, 1, 0.5)) == "F=2 B=1 W=1 comm=0.5"
    assert plot.costs_label(cm.Costs([2, 2], [1, 1], [1, 1])) == "F=2 B=1 W=1 comm=0"


def test_panel_titles_carry_every_stage_cost_on_hover():
    costs = ui.Settings(num_devices=4, f=2, stage_weights=(2, 1, 1, 3)).costs(8)
    r = cm.simulate(cm.build("v-half", 4, 8), costs)
    for spec in (plot.schedule_spec(r), plot.memory_spec(r)):
        (note,) = [a for a in spec["layout"]["annotations"] if a.get("hovertext")]
        assert note["text"].endswith("(i)")
        lines = note["hovertext"].split("<br>")[1:]
        f, b, w = costs.stage_times(8, 4)
        assert lines == [f"{s}: {plot.fmt_time(f[s])}, {plot.fmt_time(b[s])}, {plot.fmt_time(w[s])}" for s in range(8)]
    uniform = plot.schedule_spec(cm.simulate(cm.build("v-half", 4, 8), cm.Costs(2, 1, 1)))
    assert not any(a.get("hovertext") for a in uniform["layout"]["annotations"])


def test_a_budgeted_schedule_draws_its_budget_labelled_budget():
    """A v-shape built for 0.5 × 1F1B: its dashed line sits at 0.5 × 1F1B's peak and says
    "budget", not "theory"; an unbudgeted schedule keeps its theory line."""
    if "v-shape" not in cm.SCHEDULES:
        pytest.skip("needs v-shape")
    budgeted = cm.simulate(cm.build("v-shape", 4, 8, memory_limit=0.5))
    plain = cm.simulate(cm.build("v-half", 4, 8))
    spec = plot.memory_spec([budgeted, plain], reference_peak=4.0)
    kinds = [(t["meta"]["kind"], t["meta"]["panel"]) for t in spec["data"] if t["meta"]["kind"] in ("theory", "budget")]
    assert kinds == [("budget", 0), ("theory", 1)]
    (line,) = [t for t in spec["data"] if t["meta"]["kind"] == "budget"]
    assert line["meta"]["value"] == 2.0 and line["text"][0].startswith("budget 2 a (0.5 × 1F1B)")


def test_titles_sit_below_the_toolbar_strip():
    """plotly's toolbar sits in the top MODEBAR_PX pixels at the right; titles start below it."""
    r = cm.simulate(cm.build("1f1b", 4, 8))
    for spec in (plot.schedule_spec(r, title="a long title " * 8), plot.memory_spec(r, title="t"),
                 plot.peak_memory_spec([r], title="t")):
        lay = spec["layout"]
        height = lay["height"]
        assert lay["title"]["yanchor"] == "top" and (1 - lay["title"]["y"]) * height >= plot.MODEBAR_PX
        assert lay["margin"]["t"] >= plot.MODEBAR_PX + 20
        for note in lay.get("annotations", []):  # panel titles sit above their panel, below the strip
            assert note["y"] <= 1.0 + 1e-9


def test_device_colours_stay_apart_at_p_32():
    """Up to 10 devices: the categorical palette; at p = 32 one colour per device from a
    sequential scale (no colour repeats), a colour bar instead of 32 legend entries."""
    assert plot.colors_for_devices(8) == list(plot.DEVICE_COLORS[:8])
    colours = plot.colors_for_devices(32)
    assert len(set(colours)) == 32
    r = cm.simulate(cm.build("1f1b", 32, 64))
    spec = plot.memory_spec(r)
    lines = [t for t in spec["data"] if t["meta"]["kind"] == "memory"]
    assert [t["line"]["color"] for t in lines] == colours and not any(t["showlegend"] for t in lines)
    (bar,) = [t for t in spec["data"] if t["meta"]["kind"] == "device-scale"]
    assert bar["marker"]["showscale"] and bar["marker"]["colorbar"]["ticktext"][-1] == "d31"


def test_budget_sweeps_are_steps_of_the_best_so_far():
    """Bubble against memory: a budgeted schedule's line holds each point's bubble rate until the
    next point (shape "hv"), never rises with a larger budget, and runs on to the largest budget."""
    pts = [{"name": "v-shape", "memory_limit": 0.5, "memory": 0.5, "peak": 2, "bubble_rate": 0.2},
           {"name": "v-shape", "memory_limit": 0.75, "memory": 0.75, "peak": 3, "bubble_rate": 0.1},
           {"name": "v-shape", "memory_limit": 1.0, "memory": 0.75, "peak": 3, "bubble_rate": 0.1},
           {"name": "v-shape", "memory_limit": 2.0, "memory": 1.5, "peak": 6, "bubble_rate": 0.12},
           {"name": "1f1b", "memory_limit": None, "memory": 1.0, "peak": 4, "bubble_rate": 0.3}]
    fig = plot.bubble_memory_figure(pts)
    (steps,) = [t for t in fig.data if t.meta["kind"] == "steps"]
    assert steps.line.shape == "hv"
    assert list(steps.x) == [0.5, 0.75, 0.75, 1.5, 2.0] and list(steps.y) == [0.2, 0.1, 0.1, 0.1, 0.1]
    assert [t.meta["name"] for t in fig.data if t.meta["kind"] == "bubble"] == ["v-shape", "1f1b"]


def test_pareto_points_are_labelled_and_coinciding_ones_stay_visible():
    pts = [{"name": "v-zb", "memory_limit": None, "memory": 1.0, "speedup": 1.2},
           {"name": "zb-v", "memory_limit": None, "memory": 1.0, "speedup": 1.2},
           {"name": "v-shape", "memory_limit": 0.5, "memory": 0.5, "speedup": 1.1},
           {"name": "1f1b", "memory_limit": None, "memory": 1.0, "speedup": 1.0}]
    fig = plot.pareto_figure(pts)
    labels = sorted(a.text for a in fig.layout.annotations if a.name == "label")
    assert labels == ["1f1b", "v-shape @0.5", "v-zb, zb-v"]
    sizes = {t.meta["name"]: t.marker.size[0] for t in fig.data if t.meta["kind"] == "point"}
    symbols = {t.meta["name"]: t.marker.symbol for t in fig.data if t.meta["kind"] == "point"}
    assert sizes["zb-v"] < sizes["v-zb"] and symbols["zb-v"] != symbols["v-zb"]


def test_peak_memory_curve_is_the_maximum_over_devices():
    r = cm.simulate(cm.build("v-half", 4, 8), cm.Costs(2, 1, 1, 0.1))
    t, v = plot.peak_memory_curve(r)
    rng = np.random.default_rng(0)
    for x in np.concatenate([t, rng.uniform(0, r.makespan, 50)]):
        want = 0.0
        for d in range(4):
            tt, vv = r.memory_curve(d)
            i = np.searchsorted(tt, x, side="right") - 1
            want = max(want, vv[i] if i >= 0 else 0.0)
        assert v[np.searchsorted(t, x, side="right") - 1] == want
    assert max(v) == max(r.peak_memory) and t[-1] == pytest.approx(r.makespan)


def test_stacked_export_keeps_every_trace_on_its_own_axes():
    rs = [cm.simulate(cm.build(n, 4, 8)) for n in ("1f1b", "v-half")]
    a, b = plot.schedule_spec(rs, title="a"), plot.memory_spec(rs, title="b")
    st = plot.stack_specs([a, b])
    assert len(st["data"]) == len(a["data"]) + len(b["data"])
    axes = {k for k in st["layout"] if k.startswith(("xaxis", "yaxis"))}
    for tr in st["data"]:
        assert ("x" + tr["xaxis"][1:]).replace("x", "xaxis", 1) in axes
        assert ("y" + tr["yaxis"][1:]).replace("y", "yaxis", 1) in axes
    domains = sorted(tuple(st["layout"][k]["domain"]) for k in axes if k.startswith("yaxis"))
    assert all(0 <= lo < hi <= 1 for lo, hi in domains)
    assert all(d1[1] <= d2[0] + 1e-9 for d1, d2 in zip(domains, domains[1:])), "panels overlap"
    import plotly.graph_objects as go

    go.Figure(st)  # valid for plotly


def test_figures_with_per_stage_hover_are_valid_plotly():
    """The per-stage hover on panel titles is made of properties plotly accepts (a static
    export validates the figure)."""
    import plotly.graph_objects as go

    costs = ui.Settings(num_devices=4, f=2, stage_weights=(2, 1, 1, 3)).costs(4)
    r = cm.simulate(cm.build("1f1b", 4, 8), costs)
    for spec in (plot.schedule_spec(r, title="t"), plot.memory_spec(r, title="t")):
        go.Figure(spec)


def test_lifespan_legend_names_every_chunk_once():
    """1F1B (one chunk) first, V-Half (two) next: the legend still has chunk 1."""
    fig = plot.lifespan_figure([cm.simulate(cm.build("1f1b", 4, 8)), cm.simulate(cm.build("v-half", 4, 8))])
    assert sorted(t.name for t in fig.data if t.showlegend) == ["chunk 0", "chunk 1"]
