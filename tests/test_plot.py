"""Figures: the diagram shows exactly the simulator's passes, colours follow the pass kind, the
memory curves are the simulator's, and exported PNG/SVG files open as images."""

import re
import shutil
from collections import Counter

import numpy as np
import pytest

import ctrlmem as cm
from ctrlmem import Op
from ctrlmem.plots import figures as plot

COSTS = [cm.Costs(1, 1, 1, 0), cm.Costs(3, 4, 2, 0.5)]
CASES = [(name, p, m) for name in cm.SCHEDULES for p, m in ((2, 4), (4, 8), (3, 7))]


def _build(name, p, m, costs=None):
    try:
        return cm.build(name, p, m, costs=costs)
    except ValueError as exc:  # e.g. interleaved needs m to split into rounds
        pytest.skip(f"{name} p={p} m={m}: {exc}")


def pass_boxes(fig, panel=0):
    """(device, op, stage, microbatch, start, end) of every box drawn in ``panel``."""
    boxes = []
    for tr in fig.data:
        meta = tr.meta or {}
        if meta.get("kind") != "pass" or meta.get("panel") != panel:
            continue
        assert len(tr.y) == len(tr.base) == len(tr.x) == len(tr.customdata)
        for dev, base, dur, (stage, mb, start, end) in zip(tr.y, tr.base, tr.x, tr.customdata):
            assert base == start and np.isclose(base + dur, end)
            boxes.append((int(round(dev)), meta["op"], int(stage), int(mb), float(base), float(base + dur)))
    return boxes


def sim_boxes(result):
    return [(tp.device, tp.op.value, tp.stage, tp.microbatch, tp.start, tp.end) for tp in result.passes]


@pytest.mark.parametrize("costs", COSTS, ids=str)
@pytest.mark.parametrize("name,p,m", CASES)
def test_one_box_per_pass_at_simulated_times(name, p, m, costs):
    """Every pass of the simulation is drawn exactly once, on its device, from its start to its end."""
    r = cm.simulate(_build(name, p, m, costs), costs)
    fig = plot.schedule_figure(r)
    assert Counter(pass_boxes(fig)) == Counter(sim_boxes(r))


def test_stacked_schedules_share_the_time_axis_and_keep_their_own_boxes():
    """Comparing schedules stacks one panel each; every panel holds exactly its own simulation."""
    rs = [cm.simulate(cm.build(n, 4, 8)) for n in ("1f1b", "zb-h1", "zb-v")]
    fig = plot.schedule_figure(rs)
    for i, r in enumerate(rs):
        assert Counter(pass_boxes(fig, i)) == Counter(sim_boxes(r))
    layout = fig.layout.to_plotly_json()
    assert layout["xaxis2"]["matches"] == "x" and layout["xaxis3"]["matches"] == "x"
    assert [len(layout[k]["tickvals"]) for k in ("yaxis", "yaxis2", "yaxis3")] == [4, 4, 4]
    domains = [layout[k]["domain"] for k in ("yaxis", "yaxis2", "yaxis3")]
    assert all(a[0] > b[1] for a, b in zip(domains, domains[1:])), "panels overlap or are out of order"


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v", "interleaved-1f1b"])
def test_colour_follows_pass_kind_and_chunk(name):
    """A box's fill is DEFAULT_COLORS[op][chunk]; chunks of one kind get different shades."""
    r = cm.simulate(cm.build(name, 4, 8))
    fig = plot.schedule_figure(r)
    seen = set()
    placement = r.schedule.placement
    for tr in fig.data:
        if (tr.meta or {}).get("kind") != "pass":
            continue
        op, chunk = Op(tr.meta["op"]), tr.meta["chunk"]
        assert tr.marker.color == plot.DEFAULT_COLORS[op][chunk]
        assert {placement.chunk_of(int(s)) for s, *_ in tr.customdata} == {chunk}
        seen.add((op, chunk))
    ops = {tp.op for tp in r.passes}
    assert {op for op, _ in seen} == ops
    colours = {plot.pass_color(op, c) for op, c in seen}
    assert len(colours) == len(seen), "two kinds/chunks share a colour"


def test_custom_colours_are_used():
    """Style is an argument: a custom palette reaches the boxes, and nothing global changes."""
    palette = {Op.F: ("#000001",), Op.B: ("#000002",), Op.W: ("#000003",), Op.BW: ("#000004",)}
    fig = plot.schedule_figure(cm.simulate(cm.build("zb-h1", 3, 6)), colors=palette, idle_color="#123456")
    fills = {tr.meta["op"]: tr.marker.color for tr in fig.data if tr.meta["kind"] == "pass"}
    assert fills == {"F": "#000001", "B": "#000002", "W": "#000003"}
    assert [tr.marker.color for tr in fig.data if tr.meta["kind"] == "idle"] == ["#123456"]
    again = plot.schedule_figure(cm.simulate(cm.build("zb-h1", 3, 6)))
    assert {tr.marker.color for tr in again.data if tr.meta["kind"] == "pass"} <= {
        c for shades in plot.DEFAULT_COLORS.values() for c in shades}


def test_idle_rows_span_the_time_axis_and_labels_hide_when_too_small():
    """Each device row has a grey background over the whole time axis (idle shows through) and
    microbatch labels use plotly's hide-if-it-does-not-fit rule."""
    r = cm.simulate(cm.build("1f1b", 5, 10))
    fig = plot.schedule_figure(r)
    idle = [tr for tr in fig.data if tr.meta["kind"] == "idle"]
    assert len(idle) == 1 and sorted(idle[0].y) == list(range(5))
    assert set(idle[0].x) == {r.makespan} and set(idle[0].base) == {0}
    assert fig.layout.uniformtext.mode == "hide"
    assert all(tr.texttemplate == "%{customdata[1]}" for tr in fig.data if tr.meta["kind"] == "pass")
    # boxes that no screen could label carry no text: at m=400 single-microbatch boxes are tiny
    big = plot.schedule_figure(cm.simulate(cm.build("1f1b", 2, 400)), overview=False)
    assert all(tr.textposition == "none" for tr in big.data if tr.meta["kind"] == "pass")
    no_labels = plot.schedule_figure(r, show_labels=False)
    assert all(tr.texttemplate is None for tr in no_labels.data)


def test_hover_names_pass_stage_microbatch_start_end():
    fig = plot.schedule_figure(cm.simulate(cm.build("zb-h1", 2, 3)))
    for tr in fig.data:
        if tr.meta["kind"] == "pass":
            for needle in ("stage %{customdata[0]}", "microbatch %{customdata[1]}",
                           "start %{customdata[2]", "end %{customdata[3]", tr.meta["op"]):
                assert needle in tr.hovertemplate


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 8), ("zb-v", 4, 8), ("zb-h2", 3, 9), ("gpipe", 3, 5)])
def test_memory_curves_equal_the_simulators(name, p, m):
    """Each device's line is SimResult.memory_curve (held to the makespan), and the reference
    lines sit at the theoretical peak and at 1F1B's simulated peak."""
    r = cm.simulate(cm.build(name, p, m), cm.Costs(2, 3, 1, 0.25))
    fig = plot.memory_figure(r)
    lines = {tr.meta["device"]: tr for tr in fig.data if tr.meta["kind"] == "memory"}
    assert sorted(lines) == list(range(p))
    for d, tr in lines.items():
        t, v = r.memory_curve(d)
        n = len(t)
        assert list(tr.x[:n]) == t and list(tr.y[:n]) == v
        assert tr.line.shape == "hv"
        assert max(tr.y) == r.peak_memory[d]
        assert tr.x[-1] == max(t[-1], r.makespan)
    ref = [tr for tr in fig.data if tr.meta["kind"] == "1f1b"]
    one = cm.simulate(cm.build("1f1b", p, m), cm.Costs(2, 3, 1, 0.25))
    assert [tr.meta["value"] for tr in ref] == [max(one.peak_memory)]
    theory = [tr.meta["value"] for tr in fig.data if tr.meta["kind"] == "theory"]
    assert theory == [plot.theoretical_peak(r.schedule)]


def test_theoretical_peak_matches_simulation_in_steady_state():
    """The closed forms drawn as 'theory' are the simulated peaks once m ≥ 2p."""
    names = [n for n in ("1f1b", "zb-h1", "zb-v", "gpipe", "v-min", "v-half", "v-zb") if n in cm.SCHEDULES]
    for name in names:
        for p in (4, 6, 8):
            s = cm.build(name, p, 3 * p)
            assert plot.theoretical_peak(s) == max(cm.simulate(s).peak_memory), (name, p)


def test_block_views_end_in_a_valid_schedule_and_keep_every_pass():
    """Block → repeat → … → final: the first panel is one microbatch, later panels hold all m."""
    # v-shape and zb take no single microbatch, DualPipe-V no fewer than 2p: their block is
    # microbatch 0 of the schedule itself (it raised "needs num_microbatches >= 2")
    for name in ("1f1b", "zb-h1", "zb-v", "v-shape", "zb", "dualpipe-v"):
        tls = plot.block_timelines(name, 4, 8 if name == "dualpipe-v" else 6)
        m = 8 if name == "dualpipe-v" else 6
        assert len(tls) >= 4
        assert {tp.microbatch for tp in tls[0].passes} == {0}
        per_mb = len(tls[0].passes)
        for i, tl in enumerate(tls[1:], 1):
            # the registered DualPipe-V fuses some B and W into one pass: count the others only
            assert len(tl.passes) == m * per_mb or (name == "dualpipe-v" and i == len(tls) - 1)
            assert {tp.microbatch for tp in tl.passes} == set(range(m))
        fig = plot.block_figure(name, 4, m)
        assert len([a for a in fig.layout.annotations]) == len(tls)
    with pytest.raises(ValueError, match="no one-microbatch building block"):
        plot.block_timelines("dualpipe", 4, 8)


def test_lifespans_of_1f1b():
    """1F1B with F=B=W=1: stage i lives from its F at t=i to its BW end, 3(p−i)+... long;
    the lifespans strictly decrease with the stage (device 0 is the memory bottleneck)."""
    r = cm.simulate(cm.build("1f1b", 4, 1))
    spans = plot.lifespans(r)
    assert [s["stage"] for s in spans] == [0, 1, 2, 3]
    for s in spans:
        starts = [tp.start for tp in r.passes if tp.stage == s["stage"] and tp.op is Op.F]
        ends = [tp.end for tp in r.passes if tp.stage == s["stage"] and tp.op is Op.BW]
        assert s["lifespan"] == ends[0] - starts[0]
    assert [s["lifespan"] for s in spans] == sorted((s["lifespan"] for s in spans), reverse=True)
    fig = plot.lifespan_figure(r)
    bars = [tr for tr in fig.data if tr.meta["kind"] == "lifespan"]
    assert list(bars[0].y) == [s["lifespan"] for s in spans]


def test_tradeoff_points_and_pareto_frontier():
    """Each point is its simulation; the frontier is exactly the non-dominated points."""
    names = ["1f1b", "gpipe", "zb-h1", "zb-h2"]
    pts = plot.tradeoff_points(names, 4, 12, cm.Costs(1, 1, 1))
    ref = cm.simulate(cm.build("1f1b", 4, 12))
    for pt in pts:
        r = cm.simulate(cm.build(pt["name"], 4, 12))
        assert pt["bubble_rate"] == r.bubble_rate
        assert pt["memory"] == max(r.peak_memory) / max(ref.peak_memory)
        assert pt["speedup"] == ref.makespan / r.makespan
    front = plot.pareto_frontier(pts, "memory", "speedup")
    for pt in pts:
        dominated = any(q["memory"] <= pt["memory"] and q["speedup"] >= pt["speedup"]
                        and (q["memory"], q["speedup"]) != (pt["memory"], pt["speedup"]) for q in pts)
        assert (pt in front) != dominated or any(
            (q["memory"], q["speedup"]) == (pt["memory"], pt["speedup"]) for q in front)
    fig = plot.pareto_figure(pts)
    assert [tr.meta["kind"] for tr in fig.data].count("frontier") == 1
    fig2 = plot.bubble_memory_figure(pts)
    assert {tr.meta["name"] for tr in fig2.data} == set(names)


def test_html_export_is_self_contained(tmp_path):
    """The .html file embeds plotly.js: it opens offline."""
    path = plot.write_figure(plot.schedule_figure(cm.simulate(cm.build("1f1b", 2, 2))), tmp_path / "s.html")
    text = open(path, encoding="utf-8").read()
    assert re.findall(r"<script[^>]*\bsrc=", text) == [], "loads a script from elsewhere"
    assert "Plotly.newPlot" in text and len(text) > 1_000_000, "plotly.js is not embedded"


def test_bad_extension_is_a_readable_error(tmp_path):
    with pytest.raises(ValueError, match=r"\.html, \.png, \.svg or \.pdf"):
        plot.write_figure(plot.schedule_figure(cm.simulate(cm.build("1f1b", 2, 2))), tmp_path / "s.jpg")


needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")),
    reason="static export needs a Chromium for kaleido (Debian: apt-get install chromium)",
)


@pytest.mark.slow  # a Chromium for kaleido: the full tier runs it, --fast does not
@needs_chromium
def test_png_and_svg_export_open_as_images(tmp_path):
    """PNG and SVG exports are non-empty and parse as images of the requested size."""
    import struct
    import xml.etree.ElementTree as ET

    fig = plot.schedule_figure([cm.simulate(cm.build("1f1b", 3, 4)), cm.simulate(cm.build("zb-v", 3, 4))],
                               width=800)
    png, svg = plot.write_figures([(fig, tmp_path / "s.png"), (fig, tmp_path / "s.svg")], scale=1)
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, fig.layout.height)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    text = open(svg, encoding="utf-8").read()
    assert "zb-v" in text and "d2" in text


def _overview_cells(trace):
    """(device, column) -> (op, chunk, microbatch) from an overview heatmap's colour codes (None
    where idle: a gap), checked against what its hover shows for the cell."""
    z, custom = np.asarray(trace["z"]), np.asarray(trace["customdata"])
    codes = trace["meta"]["codes"]
    out = {}
    for d in range(z.shape[0]):
        for j in range(z.shape[1]):
            if np.isnan(z[d, j]):
                assert trace["text"][d][j] == "" and np.isnan(custom[d, j]).all()
                out[d, j] = None
                continue
            k = int(z[d, j])
            op, chunk = codes[(k - 1) // 2]
            stage, hover_chunk, mb = (int(x) for x in custom[d, j, :3])
            assert (trace["text"][d][j], hover_chunk) == (op, chunk)
            out[d, j] = (op, chunk, mb)
    return out


@pytest.mark.parametrize("name,costs", [("v-half", cm.Costs(1, 1, 1, 0)), ("1f1b", cm.Costs(6, 8, 4, 0.2)),
                                        ("zb-v", cm.Costs(3, 4, 2, 0.5))])
def test_overview_cell_shows_the_pass_running_at_its_middle(name, costs):
    """Above the size threshold a panel is one heatmap: each cell is the pass (kind, chunk,
    microbatch) its device runs at the middle of the cell, idle (a gap) elsewhere; odd
    microbatches use the darker shade of their kind; the hover of a cell names its pass's kind,
    stage, chunk, microbatch, start and end."""
    r = cm.simulate(cm.build(name, 6, 24, costs=costs), costs)
    spec = plot.schedule_spec(r, overview=True, overview_columns=300)
    (hm,) = [t for t in spec["data"] if t["meta"]["kind"] == "overview"]
    edges = np.asarray(hm["x"])
    assert edges[0] == 0 and len(edges) - 1 == np.asarray(hm["z"]).shape[1] <= 300
    mids = (edges[:-1] + edges[1:]) / 2
    placement = r.schedule.placement
    cells = _overview_cells(hm)
    z = np.asarray(hm["z"])
    for d in range(6):
        mine = [tp for tp in r.passes if tp.device == d]
        for j, t in enumerate(mids):
            running = [tp for tp in mine if tp.start <= t < tp.end]
            want = None if not running else (running[0].op.value, placement.chunk_of(running[0].stage),
                                             running[0].microbatch)
            assert cells[d, j] == want, (d, j, t)
            if want is not None:
                assert (int(z[d, j]) - 1) % 2 == want[2] % 2
                # the hover names the pass: stage, start and end are the simulator's
                stage, _, _, start, end = np.asarray(hm["customdata"])[d, j]
                assert (int(stage), start, end) == pytest.approx(
                    (running[0].stage, running[0].start, running[0].end), rel=1e-6)
    legend = {t["name"] for t in spec["data"] if t["meta"]["kind"] == "legend"}
    assert legend == {"idle"} | {plot._kind_name(tp.op, placement.chunk_of(tp.stage), placement.num_chunks) for tp in r.passes}


def test_overview_switches_on_by_size_and_bounds_the_explorer_update():
    """p=32, m=256, 1F1B and V-Half: the diagram is a raster overview, so the figure JSON one
    explorer update sends is bounded by the cells (p × at most OVERVIEW_COLUMNS per panel, each
    with its pass's hover data: about 20 bytes), not by the passes; small figures keep one box
    per pass. The explorer's overview keeps its hover as a table, which its plotly figure
    (``view.diagram``) and the HTML report turn into plotly's hover naming kind, stage, chunk,
    microbatch, start and end."""
    import json

    from ctrlmem.explorer import ui

    small = plot.schedule_spec(cm.simulate(cm.build("v-half", 4, 8)))
    assert {t["meta"]["kind"] for t in small["data"]} == {"idle", "pass"}
    view = ui.compute(ui.Settings(schedules=("1f1b", "v-half"), num_devices=32, num_microbatches=256))
    assert {t["meta"]["kind"] for t in view.diagram_spec["data"]} == {"idle", "overview", "rows", "legend"}
    (_, vhalf) = [t for t in view.diagram_spec["data"] if t["meta"]["kind"] == "overview"]
    assert vhalf["hoverinfo"] == "none" and "customdata" not in vhalf and "text" not in vhalf
    assert vhalf["meta"]["hover"]["template"] == plot._overview_template(2)
    (_, full) = [t for t in view.diagram.data if (t.meta or {}).get("kind") == "overview"]
    for needle in ("%{text}", "stage %{customdata[0]}", "chunk %{customdata[1]}", "microbatch %{customdata[2]}",
                   "start %{customdata[3]", "end %{customdata[4]"):
        assert needle in full.hovertemplate
    cells = 2 * 32 * plot.OVERVIEW_COLUMNS
    size = sum(len(json.dumps(ui.mime_bundle(spec, "x"))) for spec in (view.diagram_spec, view.memory_spec))
    assert size < cells * 20 + 700_000, size


@pytest.mark.parametrize("name,costs", [("v-half", cm.Costs(1, 1, 1, 0)), ("1f1b", cm.Costs(6, 8, 4, 0.2)),
                                        ("zb-v", cm.Costs(3, 4, 2, 0.5))])
def test_overview_hover_table_gives_the_same_hover_as_plotly_cells(name, costs):
    """An overview drawn with its hover as a table (what the explorer's viewer reads) holds the
    same hover as one drawn with plotly's per-cell data: hover_on_cells of the first equals the
    second, trace by trace (customdata, text and template), and leaves a figure without tables
    as it is."""
    r = cm.simulate(cm.build(name, 6, 24, costs=costs), costs)
    cells = plot.schedule_spec(r, overview=True, overview_columns=300)
    table = plot.schedule_spec(r, overview=True, overview_columns=300, overview_hover="table")
    (hm,) = [t for t in table["data"] if t["meta"]["kind"] == "overview"]
    assert hm["hoverinfo"] == "none" and "customdata" not in hm and "text" not in hm
    assert hm["meta"]["hover"]["columns"] == np.asarray(hm["z"]).shape[1]
    back = plot.hover_on_cells(table)
    assert [t["meta"]["kind"] for t in back["data"]] == [t["meta"]["kind"] for t in cells["data"]]
    for a, b in zip(back["data"], cells["data"]):
        assert set(a) == set(b), (a["meta"], set(a) ^ set(b))
        if a["meta"]["kind"] == "overview":
            assert np.array_equal(a["customdata"], b["customdata"], equal_nan=True)
            assert a["text"] == b["text"] and a["hovertemplate"] == b["hovertemplate"]
            assert "hover" not in a["meta"]
    assert plot.hover_on_cells(cells) is cells
    stripped = plot.without_hover_tables(table)
    assert not any("hover" in t["meta"] for t in stripped["data"]) and any("hover" in t["meta"] for t in table["data"])
    with pytest.raises(ValueError, match="overview_hover"):
        plot.schedule_spec(r, overview=True, overview_hover="tooltip")


def ui_compute_p8():
    from ctrlmem.explorer import views

    return views.compute(views.Settings(schedules=("1f1b", "v-half"), num_devices=8, num_microbatches=16))


def test_overview_is_drawn_as_one_image_with_rows_apart():
    """What lets plotly.js draw an overview as one small image scaled up (not a rectangle per
    cell): equally spaced columns and rows, no gaps between cells; the rows stay apart by
    white lines on their boundaries. The explorer's device and memory axes never measure their
    labels for overflow (what took most of drawing a p = 32 diagram); other figures keep
    plotly's default (the committed figures stay byte-identical)."""
    for costs in (cm.Costs(1, 1, 1, 0), cm.Costs(6, 8, 4, 0.2)):
        r = cm.simulate(cm.build("v-half", 8, 64, costs=costs), costs)
        spec = plot.schedule_spec(r, overview=True)
        (hm,) = [t for t in spec["data"] if t["meta"]["kind"] == "overview"]
        steps = np.diff(np.asarray(hm["x"]))
        assert np.allclose(steps, steps[0]) and not hm.get("ygap") and not hm.get("xgap")
        assert np.array_equal(hm["y"], np.arange(8))
        (rows,) = [t for t in spec["data"] if t["meta"]["kind"] == "rows"]
        assert sorted(set(np.asarray(rows["y"])[~np.isnan(rows["y"])])) == [d + 0.5 for d in range(7)]
        assert rows["line"]["color"] == "white" and rows["hoverinfo"] == "skip"
        assert "ticklabeloverflow" not in spec["layout"]["yaxis"]  # plotly's default, unless asked
        fast = plot.schedule_spec(r, overview=True, tick_overflow="allow")
        assert all(fast["layout"][k]["ticklabeloverflow"] == "allow" for k in fast["layout"] if k.startswith("yaxis"))
    # unit costs: every pass boundary is a column edge (one column per interval, exact)
    r = cm.simulate(cm.build("1f1b", 4, 8), cm.Costs(1, 1, 1, 0))
    (hm,) = [t for t in plot.schedule_spec(r, overview=True)["data"] if t["meta"]["kind"] == "overview"]
    bounds = {tp.start for tp in r.passes} | {tp.end for tp in r.passes}
    assert bounds <= set(np.round(np.asarray(hm["x"]), 9))
    mem = plot.memory_spec(r, tick_overflow="allow")
    assert mem["layout"]["yaxis"]["ticklabeloverflow"] == "allow"
    view = ui_compute_p8()
    for spec in (view.diagram_spec, view.memory_spec):  # the explorer's figures ask for it
        assert spec["layout"]["yaxis"]["ticklabeloverflow"] == "allow"


@pytest.mark.parametrize("name", ["v-half", "1f1b"])
def test_reduced_memory_curves_keep_every_peak_and_the_ends(name):
    r = cm.simulate(cm.build(name, 8, 128), cm.Costs(6, 8, 4, 0.2))
    spec = plot.memory_spec(r, max_points=200)
    for tr in spec["data"]:
        if tr["meta"]["kind"] != "memory":
            continue
        t, v = r.memory_curve(tr["meta"]["device"])
        assert len(tr["x"]) <= 4 * 50 + 2 or not tr["meta"]["reduced"]
        assert max(tr["y"]) == max(v) and min(tr["y"]) == min(v)
        assert tr["x"][0] == pytest.approx(t[0]) and tr["y"][-1] == v[-1]


def test_sequential_panels_have_no_chunk_in_their_legend():
    """Comparing 1F1B with a V schedule: 1F1B's boxes are 'F' and 'BW', never 'BW chunk 0'."""
    spec = plot.schedule_spec([cm.simulate(cm.build("1f1b", 4, 8)), cm.simulate(cm.build("v-half", 4, 8))])
    names = {t["name"] for t in spec["data"] if t["meta"]["kind"] == "pass" and t["meta"]["panel"] == 0}
    assert names == {"F", "BW"}
    assert not any("BW chunk" in t["name"] for t in spec["data"])


def test_label_rule_is_full_size_or_nothing():
    """Labels are drawn at one size and hidden when they would have to shrink (uniformtext
    minsize = font size), in every box trace; the browser test checks the drawn boxes."""
    spec = plot.schedule_spec(cm.simulate(cm.build("zb-v", 4, 16)))
    sizes = {t["textfont"]["size"] for t in spec["data"] if t["meta"]["kind"] == "pass"}
    assert sizes == {spec["layout"]["uniformtext"]["minsize"]} and spec["layout"]["uniformtext"]["mode"] == "hide"
    fig = plot.lifespan_figure(cm.simulate(cm.build("v-half", 4, 8)), title="t")
    assert fig.layout.uniformtext.minsize == plot.LABEL_SIZE and fig.layout.title.text == "t"


@pytest.mark.slow  # a fresh kaleido/Chromium start for PDF (~6 s); PNG/SVG export stays in the fast tier
def test_pdf_export(tmp_path):
    if shutil.which("chromium") is None:
        pytest.skip("kaleido needs a Chromium")
    path = plot.write_figure(plot.schedule_figure(cm.simulate(cm.build("1f1b", 2, 3))), tmp_path / "x.pdf")
    assert open(path, "rb").read(5) == b"%PDF-"


def test_static_exports_apply_the_label_rule_at_their_width():
    """A PNG/SVG/PDF export keeps a box's label only if it fits with 3 px to spare on each side
    at the export's width: at p=8, m=32 (F=6, B=8, W=4) 1F1B's long BW boxes keep theirs, the
    short F boxes lose theirs; a wider export keeps more."""
    fig = plot.schedule_figure(cm.simulate(cm.build("1f1b", 8, 32, costs=cm.Costs(6, 8, 4, 0)), cm.Costs(6, 8, 4, 0)))
    before = fig.to_json()
    kept = {}
    for width in (1100, 3000):
        out = plot.static_labels(fig, width)
        px = (width - 70) / (out.layout.xaxis.range[1] - out.layout.xaxis.range[0])
        n = 0
        for tr in out.data:
            if tr.meta["kind"] != "pass":
                continue
            for text, dur in zip(tr.text, tr.x):
                if text:
                    assert dur * px >= len(text) * plot.DIGIT_EM * plot.LABEL_SIZE + 6
                    n += 1
            if tr.meta["op"] == "F" and width == 1100:
                assert not any(tr.text)
            if tr.meta["op"] == "BW":
                assert any(tr.text)
        kept[width] = n
    assert kept[3000] > kept[1100] > 0
    assert fig.to_json() == before, "the figure itself is not changed"


def test_time_axis_names_its_unit():
    """Simulated schedules are in cost units; the paper's building blocks and their steps in slots
    (one pass over one chunk), as their titles say."""
    fig = plot.schedule_figure(cm.simulate(cm.build("1f1b", 2, 3)))
    assert fig.layout.xaxis.title.text == "time (cost units)"
    if plot.paper_block("v-half", 4) is None:
        pytest.skip("no paper blocks")
    blocks = plot.block_figure("v-half", 4, 8)
    last = [k for k in blocks.layout.to_plotly_json() if k.startswith("xaxis")][-1]
    assert blocks.layout[last].title.text == plot.SLOTS_TITLE
    assert any("slots" in a.text for a in blocks.layout.annotations)


def test_an_overlapped_pair_is_drawn_as_one_framed_slot_of_two_half_boxes():
    """dualpipe-v: each pair's two passes share the slot (upper half F or B, lower half the other),
    with one frame around the pair; passes alone keep the full row."""
    r = cm.simulate(cm.build("dualpipe-v", 4, 8), cm.Costs(2, 2, 1, fb_overlap=0.8))
    fig = plot.schedule_figure(r)
    frames = [tr for tr in fig.data if (tr.meta or {}).get("kind") == "overlap"]
    assert len(frames) == 1 and len(frames[0].y) == sum(map(len, r.schedule.overlaps))
    starts = {(int(d), float(b)) for d, b in zip(frames[0].y, frames[0].base)}
    paired = alone = 0
    for tr in fig.data:
        if (tr.meta or {}).get("kind") != "pass":
            continue
        widths = np.broadcast_to(tr.width, (len(tr.y),))
        for y, base, width in zip(tr.y, tr.base, widths):
            d = int(round(y))
            if (d, float(base)) in starts and not np.isclose(y, d):
                assert np.isclose(width, frames[0].width / 2) and np.isclose(abs(y - d), width / 2)  # half a row
                paired += 1
            else:
                assert np.isclose(y, d) and np.isclose(width, frames[0].width)  # the full row
                alone += 1
    assert paired == 2 * len(frames[0].y) and alone == r.schedule.num_passes - paired


def test_step_grid_cells_are_each_devices_order_and_arrows_are_its_sends():
    """The step grid: cell (d, k) is device d's k-th pass, labelled stage-kind-microbatch in its
    kind's colour, its hover holding the simulated start and end; one arrow per dependency that
    crosses devices with both ends drawn, from the sender's cell to the receiver's; at most
    max_steps steps, the title saying how many there are."""
    r = cm.simulate(cm.build("v-half", 4, 8), cm.Costs(1, 1, 1, 0.1))
    spec = plot.step_grid_spec(r, max_steps=12)
    grid, sends = spec["data"]
    sched = r.schedule
    assert np.asarray(grid["z"]).shape == (4, 12) and "the first 12 steps of" in spec["layout"]["title"]["text"]
    codes = grid["meta"]["codes"]
    for d, row in enumerate(sched.device_passes):
        for k, ps in enumerate(row[:12]):
            assert grid["text"][d][k] == f"{ps.stage}{ps.op.value}{ps.microbatch}"
            assert codes[int(grid["z"][d][k]) - 1] == [ps.op.value, sched.placement.chunk_of(ps.stage)]
            tp = next(t for t in r.passes if (t.device, t.op, t.stage, t.microbatch) == (d, ps.op, ps.stage, ps.microbatch))
            assert tuple(grid["customdata"][d][k][2:]) == pytest.approx((tp.start, tp.end), rel=1e-6)
    where = {(d, ps.op, ps.stage, ps.microbatch): k for d, row in enumerate(sched.device_passes)
             for k, ps in enumerate(row[:12])}
    want = set()
    for tr in r.transfers():
        a = where.get((tr.sender.device, tr.sender.op, tr.sender.stage, tr.sender.microbatch))
        b = where.get((tr.receiver.device, tr.receiver.op, tr.receiver.stage, tr.receiver.microbatch))
        if a is not None and b is not None:
            want.add((a, tr.sender.device, b, tr.receiver.device))
    xs, ys = sends["x"], sends["y"]
    got = {(xs[i], ys[i], xs[i + 1], ys[i + 1]) for i in range(0, len(xs), 3)}
    assert got == want and sends["meta"]["count"] == len(want) > 0
    assert all(a[1] != a[3] for a in got)  # every arrow crosses devices
    assert sends["marker"]["size"][1::3] == [9] * len(want) and sends["marker"]["size"][0::3] == [0] * len(want)
    whole = plot.step_grid_spec(r, max_steps=100)
    longest = max(len(row) for row in sched.device_passes)
    assert np.asarray(whole["data"][0]["z"]).shape[1] == longest and "first" not in whole["layout"]["title"]["text"]
    assert np.asarray(plot.step_grid_spec(r)["data"][0]["z"]).shape[1] == min(plot.GRID_STEPS, longest)
    with pytest.raises(ValueError, match="max_steps"):
        plot.step_grid_spec(r, max_steps=0)
