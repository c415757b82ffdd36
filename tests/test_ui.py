"""Explorer without a browser: every widget change recomputes what cm.simulate gives for the new
settings, redraws the figures, and bad input becomes a readable message, never a traceback."""

import base64
import csv
import html
import json
import os

import numpy as np
import pytest

import ctrlmem as cm
from ctrlmem.plots import figures as plot
from ctrlmem.explorer import ui


def decode(arr):
    """A plotly.js typed-array spec (or a plain list) back to numbers."""
    if isinstance(arr, dict):
        out = np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]).newbyteorder("<"))
        if "shape" in arr:
            out = out.reshape([int(x) for x in arr["shape"].split(",")])
        return out
    return np.asarray(arr)


def test_figures_go_to_the_browser_in_one_plot_view(explorer):
    """The figures travel in one anywidget view (drawn with one Plotly.react each, plotly.js
    from the installed package): diagram, memory and the two comparison slots; every update is
    a new state number, and the browser's report of drawing it lands in the timer."""
    import json

    view = explorer.plots
    assert view.names == ["ctrlmem-diagram", "ctrlmem-memory", "ctrlmem-compare-a", "ctrlmem-compare-b"]
    sent = view.shown
    assert sent[:2] == json.loads(json.dumps([explorer.shown("diagram"), explorer.shown("memory")]))
    assert "window.Plotly" in view.plotly_js and "Plotly.react" in view._esm
    seq = view.seq
    explorer.w.value = 2.0
    assert view.seq == seq + 1 and view.shown[0] == json.loads(json.dumps(explorer.shown("diagram")))
    view.drawn = {"seq": view.seq, "ms": 123.0}  # what the browser reports after drawing
    assert "drawn by the browser in 123 ms" in explorer.timing.value


def expected(name, p, m, costs):
    return cm.simulate(cm.build(name, p, m, costs=costs), costs)


def assert_view_matches(explorer, names, p, m, costs):
    """Stats and both figures equal fresh simulations of the settings."""
    ref = expected("1f1b", p, m, costs)
    stats = explorer.view.stats.set_index("schedule")
    assert list(stats.index) == list(names)
    for i, name in enumerate(names):
        r = expected(name, p, m, costs)
        row = stats.loc[name]
        assert row["makespan"] == r.makespan
        assert row["bubble rate"] == r.bubble_rate
        assert row["peak per device (a)"] == r.peak_memory
        assert row["peak (a)"] == max(r.peak_memory)
        assert row["peak / 1F1B"] == pytest.approx(max(r.peak_memory) / max(ref.peak_memory))
        assert row["speed-up over 1F1B"] == pytest.approx(ref.makespan / r.makespan)
        # the diagram sent to the browser has one box per simulated pass, at its times
        fig = explorer.shown("diagram")
        boxes = []
        for tr in fig["data"]:
            if tr["meta"]["kind"] == "pass" and tr["meta"]["panel"] == i:
                custom = decode(tr["customdata"])
                for dev, _base, (stage, mb, start, end) in zip(decode(tr["y"]), decode(tr["base"]), custom):
                    boxes.append((int(dev), tr["meta"]["op"], int(stage), int(mb), float(start), float(end)))
        assert sorted(boxes) == sorted((tp.device, tp.op.value, tp.stage, tp.microbatch, tp.start, tp.end)
                                       for tp in r.passes)
        axis = fig["layout"]["yaxis" if i == 0 else f"yaxis{i + 1}"]
        assert axis["ticktext"] == [f"d{d}" for d in range(p)]
        # memory curves sent to the browser are the simulator's
        mem = explorer.shown("memory")
        for tr in mem["data"]:
            if tr["meta"]["kind"] == "memory" and tr["meta"]["panel"] == i:
                t, v = r.memory_curve(tr["meta"]["device"])
                assert list(decode(tr["x"])[: len(t)]) == t and list(decode(tr["y"])[: len(v)]) == v
    assert explorer.view.messages == []
    assert "Traceback" not in explorer.message.value


@pytest.fixture
def explorer():
    e = ui.explorer(schedules=["1f1b", "zb-v"], num_devices=4, num_microbatches=8)
    yield e
    e.close()


def test_initial_view_matches_simulation(explorer):
    assert_view_matches(explorer, ["1f1b", "zb-v"], 4, 8, cm.Costs(1, 1, 1, 0))


def test_changing_p_and_m_updates_figures_and_stats(explorer):
    explorer.devices.value = 6
    assert_view_matches(explorer, ["1f1b", "zb-v"], 6, 8, cm.Costs(1, 1, 1, 0))
    explorer.microbatches.value = 13
    assert_view_matches(explorer, ["1f1b", "zb-v"], 6, 13, cm.Costs(1, 1, 1, 0))


def test_changing_costs_updates_figures_and_stats(explorer):
    explorer.f.value = 3
    explorer.b.value = 4
    explorer.w.value = 2
    explorer.comm.value = 0.5
    assert_view_matches(explorer, ["1f1b", "zb-v"], 4, 8, cm.Costs(3, 4, 2, 0.5))


def test_changing_the_schedule_selection(explorer):
    explorer.schedules.value = ("zb-h1", "gpipe", "1f1b")
    assert_view_matches(explorer, ["zb-h1", "gpipe", "1f1b"], 4, 8, cm.Costs(1, 1, 1, 0))
    assert len([k for k in explorer.shown("diagram")["layout"] if k.startswith("yaxis")]) == 3


def test_extra_first_and_last_stage_cost_lengthens_those_stages(explorer):
    """Extra work on stage 0 and the last stage: the table is cm.simulate with per-stage costs."""
    explorer.first_extra.value = 0.5
    explorer.last_extra.value = 1.0
    for name in ("1f1b", "zb-v"):
        s = cm.build(name, 4, 8)
        S = s.num_stages
        share = 4 / S
        f = [share] * S
        f[0] += 0.5
        f[-1] += 1.0
        costs = cm.Costs(f, list(f), list(f), 0)
        r = cm.simulate(s, costs)
        row = explorer.view.stats.set_index("schedule").loc[name]
        assert row["makespan"] == r.makespan and row["bubble rate"] == r.bubble_rate
        durations = {(tp.op, tp.stage): tp.end - tp.start for tp in explorer.view.results[name].passes}
        assert durations[(cm.Op.F, 0)] == pytest.approx(share + 0.5)
        assert durations[(cm.Op.F, S - 1)] == pytest.approx(share + 1.0)
        assert durations[(cm.Op.F, 1)] == pytest.approx(share)


def test_memory_limit_nothing_meets_shows_a_message(explorer):
    """A limit below every selected schedule's peak: a readable message in the output area,
    the table flags every schedule, and no exception escapes."""
    explorer.limit_on.value = True
    explorer.limit.value = 0.1
    msgs = explorer.view.messages
    assert len(msgs) == 1 and "No selected schedule fits a memory limit of 0.1" in msgs[0]
    assert "1f1b needs 1.000" in msgs[0]
    assert "ctrlmem-message" in explorer.message.value and "Traceback" not in explorer.message.value
    assert explorer.view.stats["fits limit"].tolist() == [False, False]
    explorer.limit.value = 1.0
    assert explorer.view.messages == [] and explorer.view.stats["fits limit"].tolist() == [True, True]
    assert "ctrlmem-message" not in explorer.message.value


@pytest.mark.parametrize("widget,value,needle", [
    ("f", -1.0, "f must be >= 0"),
    ("comm", float("nan"), "comm must be finite"),
    ("first_extra", -0.5, "first-stage extra must be a number >= 0"),
])
def test_bad_numbers_show_a_message_not_a_traceback(explorer, widget, value, needle):
    getattr(explorer, widget).value = value
    assert any(needle in m for m in explorer.view.messages), explorer.view.messages
    assert html.escape(needle) in explorer.message.value
    assert explorer.shown("diagram") is None and explorer.view.stats.empty


def test_a_schedule_that_cannot_be_built_is_reported_and_the_rest_shown(explorer):
    """interleaved-1f1b cannot split m=7 into rounds: its error is the message, 1F1B still shows."""
    explorer.schedules.value = ("1f1b", "interleaved-1f1b")
    explorer.microbatches.value = 7
    explorer.devices.value = 3
    assert [m.split(":")[0] for m in explorer.view.messages] == ["interleaved-1f1b"]
    assert list(explorer.view.stats["schedule"]) == ["1f1b"]
    assert explorer.shown("diagram")["layout"]["yaxis"]["ticktext"] == ["d0", "d1", "d2"]


def test_unknown_schedule_name_is_a_message():
    e = ui.explorer(schedules=["1f1b", "no-such"], num_devices=2, num_microbatches=2)
    assert any("no-such: not a registered schedule" in m for m in e.view.messages)
    assert list(e.view.stats["schedule"]) == ["1f1b"]


def test_export_trace_is_each_schedules_simulated_trace(explorer, tmp_path):
    """The trace export (file and button) is ctrlmem.plots.trace of each shown schedule's simulation."""
    import base64
    import io
    import json
    import zipfile

    from ctrlmem.plots.trace import trace_events

    paths = explorer.export("trace", tmp_path)
    assert [p.rsplit("_", 1)[1] for p in paths] == ["1f1b.trace.json", "zb-v.trace.json"]
    for path, name in zip(paths, ["1f1b", "zb-v"]):
        assert json.loads(open(path).read()) == json.loads(json.dumps(trace_events(cm.simulate(cm.build(name, 4, 8)))))
    explorer.export_dir = str(tmp_path / "button")
    explorer._export_clicked("trace")
    (offered,) = explorer.downloads.files
    assert offered["name"].endswith("_traces.zip")
    zf = zipfile.ZipFile(io.BytesIO(base64.b64decode(offered["b64"])))
    assert sorted(zf.namelist()) == sorted(p.rsplit("/", 1)[1] for p in paths)


def test_compute_is_a_plain_function():
    """ui.compute needs no widgets and gives the same numbers as cm.simulate."""
    view = ui.compute(ui.Settings(schedules=("zb-h2",), num_devices=3, num_microbatches=9, f=2, b=1, w=1))
    r = expected("zb-h2", 3, 9, cm.Costs(2, 1, 1))
    assert view.stats["makespan"].tolist() == [r.makespan]
    assert view.diagram is not None and len(view.diagram.data) == len(view.diagram_spec["data"])


def test_export_csv_and_html(explorer, tmp_path):
    """torch CSV export is each schedule's to_torch_csv; HTML is one offline page."""
    paths = explorer.export("csv", tmp_path)
    assert len(paths) == 2
    for path, name in zip(paths, ["1f1b", "zb-v"]):
        rows = list(csv.reader(open(path)))
        assert len(rows) == 4
        assert open(path).read() == cm.build(name, 4, 8).to_torch_csv()
    (page,) = explorer.export("html", tmp_path)
    text = open(page, encoding="utf-8").read()
    # diagram, memory curves, peak memory over time, memory vs speed-up; stats; the state inside
    assert text.count("Plotly.newPlot") == 4 and "ctrlmem-stats" in text and "zb-v" in text
    assert "id='ctrlmem-state'" in text
    explorer.export_dir = str(tmp_path / "button")  # not the default build/explorer of the cwd (the checkout)
    explorer._export_clicked("csv")  # the button: one download (a zip of both CSVs), also written there
    (offered,) = explorer.downloads.files
    assert offered["name"].endswith("_torch_csv.zip") and "downloaded" in explorer.export_note.value
    import base64
    import io
    import zipfile

    zf = zipfile.ZipFile(io.BytesIO(base64.b64decode(offered["b64"])))
    assert sorted(zf.namelist()) == sorted(p.rsplit("/", 1)[1] for p in paths)
    for path in paths:
        assert zf.read(path.rsplit("/", 1)[1]).decode() == open(path).read()
    assert open(tmp_path / "button" / offered["name"], "rb").read() == base64.b64decode(offered["b64"])


def test_export_with_nothing_built_is_a_message(explorer, tmp_path):
    explorer.export_dir = str(tmp_path)
    explorer.f.value = -1
    explorer._export_clicked("png")
    assert "Export png failed: nothing to export" in explorer.export_note.value


def test_typed_arrays_round_trip():
    spec = plot.schedule_spec(cm.simulate(cm.build("zb-v", 3, 4)))
    js = ui.jsonable(spec)
    for tr, tj in zip(spec["data"], js["data"]):
        for key in ("x", "y", "base", "customdata"):
            if key in tr:
                assert np.array_equal(decode(tj[key]), tr[key])


def test_explorer_notebook_is_thin_and_clean():
    """The notebook only calls ctrlmem.explorer.ui, its first code cell is a tagged `parameters` cell of
    literals, and it is committed without outputs."""
    import ast
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "notebooks", "01_explore_schedules.ipynb")
    nb = json.load(open(path, encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", [])
    for stmt in ast.parse("".join(code[0]["source"])).body:
        assert isinstance(stmt, ast.Assign) and ast.literal_eval(stmt.value) is not ...
    for cell in code:
        assert cell["outputs"] == [] and cell["execution_count"] is None
    imports = [n for c in code[1:] for n in ast.walk(ast.parse("".join(c["source"])))
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(i.module, [a.name for a in i.names]) for i in imports] == [("ctrlmem.explorer", ["ui"])]


def test_cost_edits_reuse_built_schedules_and_still_match(explorer):
    """A cost edit re-simulates without rebuilding (cost-free generators); a new m rebuilds."""
    misses = explorer.builds.misses
    explorer.f.value = 2.5
    assert explorer.builds.misses == misses
    assert_view_matches(explorer, ["1f1b", "zb-v"], 4, 8, cm.Costs(2.5, 1, 1, 0))
    explorer.microbatches.value = 9
    assert explorer.builds.misses > misses
    assert_view_matches(explorer, ["1f1b", "zb-v"], 4, 9, cm.Costs(2.5, 1, 1, 0))


budgeted = pytest.mark.skipif(not {"v-shape", "zb"} <= set(cm.SCHEDULES),
                              reason="needs the memory-budgeted schedules v-shape and zb")


@budgeted
def test_memory_limit_builds_budgeted_schedules_within_it():
    """With a limit, v-shape and zb are built for it (same numbers as cm.build(..., memory_limit))
    and fit; 1F1B, which takes no limit, is flagged as over it."""
    e = ui.explorer(schedules=["1f1b", "v-shape", "zb"], num_devices=4, num_microbatches=8, memory_limit=0.5)
    assert e.view.waiting == ["v-shape", "zb"]  # searched in the background: nothing to show at first
    e.wait()
    e.close()
    stats = e.view.stats.set_index("schedule")
    for name in ("v-shape", "zb"):
        r = cm.simulate(cm.build(name, 4, 8, memory_limit=0.5))
        assert stats.loc[name, "makespan"] == r.makespan and stats.loc[name, "peak / 1F1B"] <= 0.5
        assert stats.loc[name, "fits limit"]
    assert not stats.loc["1f1b", "fits limit"]
    assert e.view.messages == ["Over the memory limit of 0.5 × 1F1B: 1f1b (1.000)."]


@budgeted
def test_a_limit_no_budgeted_schedule_can_meet_is_explained():
    e = ui.explorer(schedules=["v-shape", "zb"], num_devices=4, num_microbatches=8, memory_limit=0.1)
    e.wait()
    e.close()
    assert [m.split(":")[0] for m in e.view.messages] == ["v-shape", "zb"]
    assert all("smallest feasible limit" in m for m in e.view.messages)
    assert e.view.stats.empty and e.shown("diagram") is None
    assert "Traceback" not in e.message.value


def test_schedule_checkboxes_follow_the_selection_in_the_order_ticked(explorer):
    """Every registered schedule has a checkbox; ticking appends a panel, unticking removes it,
    and setting the value ticks the boxes."""
    boxes = explorer.schedules.boxes
    assert set(boxes) == set(cm.SCHEDULES)
    assert [n for n, b in boxes.items() if b.value] == [n for n in cm.SCHEDULES if n in ("1f1b", "zb-v")]
    boxes["zb-h1"].value = True
    assert explorer.schedules.value == ("1f1b", "zb-v", "zb-h1")
    assert list(explorer.view.stats["schedule"]) == ["1f1b", "zb-v", "zb-h1"]
    boxes["1f1b"].value = False
    assert list(explorer.view.stats["schedule"]) == ["zb-v", "zb-h1"]
    explorer.schedules.value = ("gpipe",)
    assert [n for n, b in boxes.items() if b.value] == ["gpipe"]


def test_per_stage_weights_set_each_stage_cost(explorer):
    """Weights of the p model slices (model order): a V schedule splits each slice in two."""
    explorer.weights.value = "2, 1, 1, 3"
    r = explorer.view.results["zb-v"]
    dur = {(tp.op, tp.stage): tp.end - tp.start for tp in r.passes}
    assert [dur[(cm.Op.F, s)] for s in range(8)] == pytest.approx([1, 1, 0.5, 0.5, 0.5, 0.5, 1.5, 1.5])
    want = cm.simulate(cm.build("1f1b", 4, 8), cm.Costs([2, 1, 1, 3], [2, 1, 1, 3], [2, 1, 1, 3], 0))
    assert explorer.view.stats.set_index("schedule").loc["1f1b", "makespan"] == want.makespan
    explorer.weights.value = "1, 2"
    assert any("give 4 numbers" in m for m in explorer.view.messages) or "give 4 numbers" in explorer.message.value


def test_formula_panel_states_closed_forms_and_the_v_conditions():
    e = ui.explorer(schedules=["1f1b", "v-half", "v-min"], num_devices=8, num_microbatches=32, f=6, b=8, w=4, comm=0.2)
    text = e.formulas.value
    assert "⌊(p+2)/2⌋ = 5" in text and "⌊(p+4)/3⌋ = 4" in text and "3p−7 = 17τ" in text
    assert "W+2B = 20 vs 2F = 12" in text and "W+2F = 16 vs 2B = 16" in text and "fails" not in text
    e.b.value = 12  # W+2F = 16 < 2B = 24
    assert "fails" in e.formulas.value and "grows with m" in e.formulas.value


def test_verdict_names_the_fastest_and_a_v_schedule_slower_than_1f1b():
    """README costs 6,8,4,0.2 at p=8, m=32: v-min runs at 0.81x of 1F1B's speed, and the line says so."""
    e = ui.explorer(schedules=["1f1b", "v-min", "v-half", "zb-v"], num_devices=8, num_microbatches=32,
                    f=6, b=8, w=4, comm=0.2)
    st = e.view.stats.set_index("schedule")
    speed = st.loc["v-min", "speed-up over 1F1B"]
    assert speed < 1
    fastest = st["makespan"].idxmin()
    line = e.verdict.value
    assert f"Fastest: {fastest}" in line
    assert f"v-min loses to 1F1B here ({plot.fmt_ratio(speed)}×" in line
    assert "With less memory" in line and "v-half" in line.split("With less memory")[1]


def test_copy_as_command_draws_the_same_schedules(explorer, tmp_path):
    """The command line the explorer shows, run through `ctrlmem draw`, simulates the same
    schedules at the same settings (same panel titles)."""
    import shlex

    from ctrlmem.cli import make_parser
    from ctrlmem.cli.draw import draw_figure

    explorer.f.value, explorer.comm.value = 2.0, 0.25
    cmd = explorer.command.value
    assert cmd.startswith("ctrlmem draw 1f1b --compare zb-v -p 4 -m 8 --costs 2,1,1,0.25 -o ")
    argv = shlex.split(cmd)[1:]
    argv[argv.index("-o") + 1] = str(tmp_path / "x.html")
    fig = draw_figure(make_parser().parse_args(argv))
    shown = [a["text"] for a in explorer.shown("diagram")["layout"]["annotations"]]
    assert [a.text for a in fig.layout.annotations] == shown


def test_load_a_torchtitan_csv_into_the_explorer(explorer, tmp_path):
    """The load box takes a torch/torchtitan CSV: p and m follow the file, it is simulated at the
    explorer's costs next to the ticked schedules; a bad file is a message."""
    path = tmp_path / "titan.csv"
    path.write_text("0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n")
    explorer.load_path.value = str(path)
    explorer.load_button.click()
    assert (explorer.devices.value, explorer.microbatches.value) == (2, 2)
    assert "titan (file)" in explorer.view.results
    want = cm.simulate(cm.Schedule.from_torch_csv(path), cm.Costs(1, 1, 1, 0))
    assert explorer.view.stats.set_index("schedule").loc["titan (file)", "makespan"] == want.makespan
    explorer.f.value = 2.0
    assert explorer.view.results["titan (file)"].makespan == cm.simulate(
        cm.Schedule.from_torch_csv(path), cm.Costs(2, 1, 1, 0)).makespan
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0Z0\n")
    explorer.load(str(bad))
    assert "Cannot load" in explorer.message.value and "line 1" in explorer.message.value
    explorer.load(("up.csv", path.read_bytes()))
    assert "up (file)" in explorer.view.results
    explorer.clear_button.click()
    assert not any(k.endswith("(file)") for k in explorer.view.results)


def test_export_names_and_titles_carry_costs_and_budget(tmp_path):
    e = ui.explorer(schedules=["1f1b", "v-half"], num_devices=4, num_microbatches=8, f=6, b=8, w=4, comm=0.2)
    (page,) = e.export("html", tmp_path)
    assert "p4_m8_F6-B8-W4-c0.2" in page
    e.limit_on.value, e.limit.value = True, 0.6
    (page2,) = e.export("html", tmp_path)
    assert page2 != page and "lim0.6" in page2
    title = e.shown("diagram")["layout"]["title"]["text"]
    assert "p=4, m=8" in title and "F=6 B=8 W=4 comm=0.2" in title and "memory limit 0.6" in title


def test_pending_mark_lasts_from_the_edit_until_the_browser_drew_that_state(explorer, monkeypatch):
    """An edit marks the whole explorer pending ('ctrlmem-pending': everything dims, a note names
    the new settings) before it computes; the mark stays after Python is done and goes only when
    the browser reports the new state drawn (a report of an older state changes nothing)."""
    seen = []
    real = ui.compute

    def spy(*a, **k):
        seen.append(("ctrlmem-pending" in explorer.widget._dom_classes, explorer.pending_note.value))
        return real(*a, **k)

    monkeypatch.setattr(ui, "compute", spy)
    explorer.f.value = 1.5
    assert seen and seen[0][0] and "F=1.5" in seen[0][1]
    assert "ctrlmem-pending" in explorer.widget._dom_classes
    explorer.plots.drawn = {"seq": explorer.plots.seq - 1, "ms": 5.0}
    assert "ctrlmem-pending" in explorer.widget._dom_classes
    explorer.plots.drawn = {"seq": explorer.plots.seq, "ms": 5.0}
    assert "ctrlmem-pending" not in explorer.widget._dom_classes and explorer.pending_note.value == ""


def test_labels_follow_the_width_the_browser_reports():
    """The browser reports the drawing's width; the explorer redraws and keeps a box's label only
    if it fits with 3 px to spare at that width (plot.label_fits), so a wider window shows more."""
    e = ui.explorer(schedules=["1f1b"], num_devices=8, num_microbatches=32, f=6, b=8, w=4)

    def labelled(fig):
        n = 0
        for tr in fig["data"]:
            if tr["meta"]["kind"] != "pass" or tr.get("textposition") == "none":
                continue
            if "texttemplate" in tr:
                n += len(decode(tr["y"]))
            else:
                n += sum(1 for t in tr["text"] if t)
        return n

    counts = {}
    for width in (700, 1400, 2800):
        e.plots.width = width
        fig = e.shown("diagram")
        span = fig["layout"]["xaxis"]["range"][1]
        for tr in fig["data"]:
            if tr["meta"]["kind"] == "pass" and "text" in tr:
                dur = decode(tr["x"])
                for text, d in zip(tr["text"], dur):
                    assert bool(text) == bool(plot.label_fits([d], [int(text or 0)], span, plot.LABEL_SIZE,
                                                              width - 70)[0]) or not text
        counts[width] = labelled(fig)
    assert counts[700] < counts[1400] <= counts[2800]


def test_stats_table_summarises_peaks_of_deep_pipelines():
    """Up to 8 devices the table lists every device's peak; beyond, the first, the last and
    where the extremes are (the View keeps every number)."""
    deep = ui.compute(ui.Settings(schedules=("1f1b",), num_devices=12, num_microbatches=24))
    text = ui.stats_html(deep.stats)
    assert "d0 12 … d11 1; max 12 (d0), min 1 (d11)" in text
    assert deep.stats["peak per device (a)"][0] == list(range(12, 0, -1))
    small = ui.compute(ui.Settings(schedules=("1f1b",), num_devices=4, num_microbatches=8))
    assert "4, 3, 2, 1" in ui.stats_html(small.stats)


def test_copy_button_carries_the_current_command(explorer):
    assert explorer.copy_command is not None and explorer.copy_command.text == explorer.command.value
    explorer.microbatches.value = 12
    assert "-m 12" in explorer.copy_command.text and explorer.copy_command.text == explorer.command.value
    assert "navigator.clipboard.writeText" in explorer.copy_command._esm


def test_save_records_settings_with_loaded_schedules(explorer, tmp_path):
    import json

    path = tmp_path / "t.csv"
    path.write_text("0F0,0I0,0W0\n1F0,1I0,1W0\n")
    explorer.load(str(path))
    saved = json.loads(open(explorer.save(tmp_path / "out")).read())
    assert saved["settings"]["num_devices"] == 2 and saved["settings"]["loaded"][0]["name"] == "t"
    assert cm.Schedule.from_text(saved["settings"]["loaded"][0]["text"]).device_passes == \
        cm.Schedule.from_torch_csv(path).device_passes
    assert [r["schedule"] for r in saved["stats"]] == ["1f1b", "zb-v", "t (file)"]


def test_static_exports_drop_the_hover_marks_the_browser_shows():
    """With per-stage weights each panel title ends in "(i)" and shows the cost table on hover
    in the browser; the figure a PNG/SVG/PDF export draws has neither (an image cannot hover),
    and the figure on screen keeps both."""
    import plotly.graph_objects as go

    view = ui.compute(ui.Settings(schedules=("1f1b", "v-half"), num_devices=4, num_microbatches=8,
                                  stage_weights=(1.5, 1, 1, 1.5)), adapt=False)
    shown = [a for a in go.Figure(view.diagram_spec).layout.annotations if a.hovertext]
    assert len(shown) == 2 and all(a.text.endswith(" (i)") for a in shown)
    static = ui.static_figure(view).layout.annotations
    assert not any("(i)" in (a.text or "") or a.hovertext for a in static)
    assert [a.text for a in static[:2]] == [a.text[:-4] for a in shown]


class _FlakyRenderer:
    """Stands in for the Chromium session: the first image fails as given, later ones arrive."""

    deadline = 90.0

    def __init__(self, first_error: BaseException):
        self.errors = [first_error]
        self.calls = []

    def submit(self, fig, fmt, **kw):
        import concurrent.futures

        self.calls.append(fmt)
        fut = concurrent.futures.Future()
        if self.errors:
            fut.set_exception(self.errors.pop())
        else:
            fut.set_result(b"\x89PNG\r\n\x1a\n" + b"0" * 16)
        return fut

    def close(self):
        pass


def test_an_export_past_its_deadline_says_what_failed_and_retries(explorer, tmp_path):
    """An image that does not arrive in time ends in one line naming the stage that did not
    answer and a retry button (never an endless "drawing…"); retry draws it again and
    downloads it, and the retry offer goes."""
    from ctrlmem.plots.render import ExportTimeout

    explorer.export_dir = str(tmp_path)
    explorer._renderer = _FlakyRenderer(ExportTimeout("drawing the PNG in Chromium (kaleido) did not finish "
                                                      "within 90 s (after 90 s)"))
    explorer._export_clicked("png")
    explorer.wait(5)
    note = html.unescape(explorer.export_note.value)
    assert "Export png failed: drawing the PNG in Chromium (kaleido) did not finish within 90 s" in note
    assert "retry" in note and explorer.retry_button.layout.display != "none"
    assert not explorer.downloads.files
    explorer.retry_button.click()
    explorer.wait(5)
    assert explorer._renderer.calls == ["png", "png"]
    (offered,) = explorer.downloads.files
    assert offered["name"].endswith(".png") and "downloaded" in explorer.export_note.value
    assert explorer.retry_button.layout.display == "none"


def test_an_image_the_exporter_refuses_names_chromium(explorer, tmp_path):
    """A render error (a crashed tab answers with a protocol error) is one line naming
    Chromium (kaleido) and the error, with the retry offer."""
    explorer.export_dir = str(tmp_path)
    explorer._renderer = _FlakyRenderer(RuntimeError({"code": -32000, "message": "Cannot find context"}))
    explorer._export_clicked("svg")
    explorer.wait(5)
    note = html.unescape(explorer.export_note.value)
    assert "Export svg failed: Chromium (kaleido) did not draw the SVG (RuntimeError: " in note
    assert "Cannot find context" in note and explorer.retry_button.layout.display != "none"


@pytest.mark.slow
def test_the_image_exporter_outlives_a_dead_chromium_and_keeps_its_deadline():
    """The renderer's Chromium killed (as an out-of-memory kill does): the next image still
    arrives, from a fresh Chromium (before, it never answered); an image that cannot be drawn
    in its deadline fails with ExportTimeout naming the stage, and the one after it arrives."""
    import os
    import signal
    import subprocess

    from ctrlmem.plots.render import ExportTimeout, StaticRenderer

    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("no Chromium")
    view = ui.compute(ui.Settings(schedules=("1f1b",), num_devices=4, num_microbatches=8), adapt=False)
    fig = ui.static_figure(view)
    r = StaticRenderer()
    try:
        assert r.submit(fig, "png").result(timeout=120)[:8] == b"\x89PNG\r\n\x1a\n"
        wrapper = r._session.kaleido.subprocess
        for line in subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout.splitlines():
            pid, ppid, args = line.split(None, 2)
            if ppid == str(wrapper.pid) and "chromium" in args:
                os.kill(int(pid), signal.SIGKILL)
        wrapper.wait(timeout=30)
        assert r.submit(fig, "png").result(timeout=120)[:8] == b"\x89PNG\r\n\x1a\n"
        assert r.restarts == 1
        with pytest.raises(ExportTimeout, match=r"within 0.01 s"):
            r.submit(fig, "svg", deadline=0.01).result(timeout=30)
        assert r.submit(fig, "svg").result(timeout=120).lstrip().startswith(b"<svg")
        assert r.restarts == 2
    finally:
        r.close()


def test_a_deadline_is_reported_even_when_stopping_chromium_fails_the_drawing_first():
    """At the deadline the exporter stops its Chromium, which fails the image still being drawn
    (its tab's pipe closes) on the session's own thread, possibly at once: the caller still gets
    the ExportTimeout naming the deadline, not that closed pipe (a race seen once in the suite),
    and the session is retired once. An image that arrives in time is returned as it is."""
    import concurrent.futures
    import types

    from ctrlmem.plots.render import ExportTimeout, StaticRenderer

    class PipeClosed(Exception):
        pass

    r = StaticRenderer()
    session = types.SimpleNamespace(opened=concurrent.futures.Future())
    session.opened.set_result(None)
    inner: concurrent.futures.Future = concurrent.futures.Future()
    retired = []

    def discard(s):  # stopping the session fails the drawing before anything else happens
        retired.append(s)
        if not inner.done():
            inner.set_exception(PipeClosed("the communication channel was closed"))

    r._discard = discard
    out = r._watched(inner, session, "svg", 0.01)
    with pytest.raises(ExportTimeout, match=r"drawing the SVG .* within 0.01 s"):
        out.result(timeout=30)
    assert retired == [session]
    fine: concurrent.futures.Future = concurrent.futures.Future()
    got = r._watched(fine, session, "png", 30)
    fine.set_result(b"png bytes")
    assert got.result(timeout=5) == b"png bytes" and retired == [session]


def test_the_solver_option_improves_the_schedule_chosen_and_names_its_panel_improved():
    """By default the solver option improves the first ticked schedule other than 1F1B (1F1B is
    often optimal already); "improve" picks another; the improved panel and row are named
    ``NAME+improved`` even when the solver hands back its input unchanged (1F1B here); the
    command line improves the same schedule (draw --optimize improves the first it is given);
    a chosen schedule that is not shown is one message."""
    from ctrlmem.explorer.views import command_line

    base = dict(schedules=("1f1b", "v-half"), num_devices=3, num_microbatches=6, optimize=2)
    view = ui.compute(ui.Settings(**base))
    assert list(view.results) == ["1f1b", "v-half", "v-half+improved"]
    assert command_line(view.settings).startswith("ctrlmem draw v-half --compare 1f1b ")
    chosen = ui.compute(ui.Settings(**base, improve="1f1b"))
    assert list(chosen.results) == ["1f1b", "1f1b+improved", "v-half"]
    assert chosen.results["1f1b+improved"].schedule.name == "1f1b+improved"
    titles = [a["text"] for a in chosen.diagram_spec["layout"]["annotations"]]
    assert any(t.startswith("1f1b+improved (p=3, m=6)") for t in titles), titles
    missing = ui.compute(ui.Settings(**base, improve="zb-v"))
    assert "optimize: zb-v is not shown; tick it, or choose a shown schedule to improve" in missing.messages
    e = ui.explorer(schedules=["1f1b", "v-half"], num_devices=3, num_microbatches=6, background=False,
                    export_dir=None)
    try:
        e.optimize.value = 2.0
        e.optimize_on.value = True
        assert list(e.view.results) == ["1f1b", "v-half", "v-half+improved"]
        e.improve.value = "1f1b"
        assert list(e.view.results) == ["1f1b", "1f1b+improved", "v-half"]
        assert e.view.settings.improve == "1f1b"
    finally:
        e.close()


def test_v_min_at_equal_costs_agrees_with_the_command_and_shows_simulated_next_to_closed_form():
    """At F=B=W (p=8, m=32) the explorer's adapted V-Min is the order `ctrlmem simulate v-min -p 8
    -m 32` prints (bubble rate 0.1070, 23 τ on the worst device), its formula row gives the
    paper's closed form 4p−5 = 27 τ beside that simulated 23 τ, and the unit-cost pattern it
    shows before adapting is simulated at exactly the closed form."""
    import re

    s = ui.Settings(schedules=("v-min",), num_devices=8, num_microbatches=32)
    adapted = ui.compute(s)
    cli = cm.simulate(cm.build("v-min", 8, 32, costs=cm.Costs(1, 1, 1, 0)), cm.Costs(1, 1, 1, 0))
    assert adapted.results["v-min"].bubble_rate == pytest.approx(cli.bubble_rate) == pytest.approx(0.10698, abs=1e-4)
    cells = lambda v: re.findall(r"<td>([^<]*)</td>", ui.formula_html(v))  # noqa: E731
    assert cells(adapted)[:6] == ["v-min", "⌊(p+4)/3⌋ = 4", "4", "4p−5 = 27τ", "23τ", "adapted for these costs"]
    pattern = ui.compute(s, adapt=False)
    assert cells(pattern)[3:5] == ["4p−5 = 27τ", "27τ"]


def test_building_block_title_names_its_panels_in_their_order():
    """The building-block view's title lists the panels as they are stacked, each step in
    words (no raw function name such as place_w)."""
    e = ui.explorer(schedules=["v-half", "1f1b"], num_devices=4, num_microbatches=8, background=False,
                    export_dir=None)
    try:
        e.compare.value = "building blocks"
        fig = e.shown("compare-a")
        panels = [a["text"].split(":")[0] for a in fig["layout"]["annotations"] if a.get("yanchor") == "bottom"]
        title = fig["layout"]["title"]["text"]
        assert panels[0] == "v-half" and "place_w" not in title and "place_w" not in " ".join(panels)
        assert title.startswith("v-half: " + " → ".join(["building block"] + panels[1:]) + " (p=4, m=")
    finally:
        e.close()


def _lever_expected(name, costs, **levers):
    return cm.simulate(cm.build(name, 4, 8, costs=costs, **levers), costs)


def test_memory_levers_are_cm_builds_and_the_reference_stays_without_them(explorer):
    """recompute and offload (with the copy's cost) shown for every schedule are what
    cm.build(..., recompute=, offload=) simulates: makespan and peaks equal, the R passes in the
    diagram; the 1F1B reference (the unit of "peak / 1F1B") keeps its own peak."""
    plain = _lever_expected("1f1b", cm.Costs(1, 1, 1, 0))
    explorer.recompute.value = "full"
    stats = explorer.view.stats.set_index("schedule")
    for name in ("1f1b", "zb-v"):
        r = _lever_expected(name, cm.Costs(1, 1, 1, 0), recompute="full")
        assert stats.loc[name, "makespan"] == r.makespan and stats.loc[name, "peak per device (a)"] == r.peak_memory
        assert stats.loc[name, "peak / 1F1B"] == pytest.approx(max(r.peak_memory) / max(plain.peak_memory))
    assert stats.loc["1f1b", "peak / 1F1B"] < 0.5  # 1F1B-R keeps inputs only
    ops = {tr["meta"]["op"] for tr in explorer.shown("diagram")["data"] if tr["meta"]["kind"] == "pass"}
    assert "R" in ops and "--recompute full" in explorer.command.value
    explorer.f.value = 2.0  # a cost edit: the kept levered orders are simulated under the new costs
    for name in ("1f1b", "zb-v"):
        r = _lever_expected(name, cm.Costs(2, 1, 1, 0), recompute="full")
        assert explorer.view.stats.set_index("schedule").loc[name, "makespan"] == r.makespan
    explorer.f.value = 1.0
    explorer.recompute.value = "none"
    explorer.offload_cost.value = 0.25
    explorer.offload_on.value = True
    explorer.offload.value = 0.5
    costs = cm.Costs(1, 1, 1, 0, offload=0.25)
    stats = explorer.view.stats.set_index("schedule")
    for name in ("1f1b", "zb-v"):
        r = _lever_expected(name, costs, offload=0.5)
        assert stats.loc[name, "makespan"] == r.makespan and stats.loc[name, "peak per device (a)"] == r.peak_memory
    assert stats.loc["1f1b", "peak / 1F1B"] < 1.0 and explorer.view.messages == []
    assert "--offload 0.5 --offload-cost 0.25" in explorer.command.value
    assert "offload 0.5 of each forward (copy 0.25 per a)" in ui.report_html(explorer.view)


def test_lever_command_line_draws_the_same_and_the_state_restores_the_levers(explorer, tmp_path):
    """The printed `ctrlmem draw` line carries the levers (same passes drawn), and a saved state
    brings the lever widgets and the levered orders back."""
    import shlex

    from ctrlmem.cli import make_parser
    from ctrlmem.cli.draw import draw_figure
    from ctrlmem.explorer.views import write_state

    explorer.recompute.value = "selective"
    explorer.offload_on.value = True
    explorer.offload.value = 0.4
    explorer.offload_cost.value = 0.5
    argv = shlex.split(explorer.command.value)[1:]
    argv[argv.index("-o") + 1] = str(tmp_path / "x.html")
    fig = draw_figure(make_parser().parse_args(argv))

    def passes(data):
        return sorted((tr["meta"]["panel"], tr["meta"]["op"], len(decode(tr["y"]))) for tr in data
                      if tr["meta"]["kind"] == "pass")

    assert passes(fig.to_plotly_json()["data"]) == passes(explorer.shown("diagram")["data"])
    stats = explorer.view.stats.copy()
    state = write_state(explorer.view, tmp_path / "s.json")
    other = ui.explorer(schedules=["1f1b"], num_devices=4, num_microbatches=8)
    try:
        other.apply_state(state)
        assert (other.recompute.value, other.offload_on.value, other.offload.value, other.offload_cost.value) == \
            ("selective", True, 0.4, 0.5)
        assert other.settings().levers_text() == "recompute selective, offload 0.4 of each forward (copy 0.5 per a)"
        assert other.view.stats["makespan"].tolist() == stats["makespan"].tolist()
        assert other.view.stats["peak (a)"].tolist() == stats["peak (a)"].tolist()
        other.comm.value = 0.5  # edits re-apply the levers to built orders (not the state's): same numbers back
        other.comm.value = 0.0
        assert other._pinned == {}
        assert other.view.stats["makespan"].tolist() == stats["makespan"].tolist()
    finally:
        other.close()


def test_bad_levers_are_one_message():
    """recompute auto (a search of the command line) and an offload that is no fraction are one
    readable line each, not a traceback."""
    from ctrlmem.explorer.views import Settings, compute

    assert "explorer takes none, selective or full" in compute(Settings(recompute="auto")).messages[0]
    assert "fraction in (0, 1]" in compute(Settings(offload=1.5)).messages[0]
    assert "offload must be" in compute(Settings(offload="half")).messages[0]


@pytest.mark.slow  # exact searches in the explorer and on the command line: the full tier runs it, --fast does not
def test_the_solver_option_improves_recomputed_orders_and_refuses_copies_as_on_the_command_line():
    """With recompute on, the improved order is the recomputed one improved (every R kept, the
    same passes, never longer) and the printed line carries --optimize with --recompute; with an
    offload (cm.improve models no copies) no improved order is shown, the message says why, and
    the line drops --optimize."""
    from ctrlmem.explorer.views import IMPROVED_SUFFIX, Settings, command_line, compute

    s = Settings(schedules=("1f1b", "v-shape"), num_devices=4, num_microbatches=8, memory_limit=0.25,
                 optimize=2.0, recompute="full")
    view = compute(s)
    label = "v-shape" + IMPROVED_SUFFIX
    assert list(view.results) == ["1f1b", "v-shape", label], view.messages
    shown, better = view.results["v-shape"].schedule, view.results[label].schedule
    count = lambda sch: sorted(ps for row in sch.device_passes for ps in row)  # noqa: E731
    assert count(better) == count(shown) and better.recomputes
    assert view.results[label].makespan <= view.results["v-shape"].makespan + 1e-9
    assert view.results[label].max_peak_memory <= 0.25 * 4 + 1e-9
    line = command_line(s)
    assert "--optimize 2" in line and "--recompute full" in line
    s2 = Settings(schedules=("1f1b", "v-half"), num_devices=4, num_microbatches=8, optimize=2.0, offload=0.5,
                  offload_cost=0.5)
    view = compute(s2)
    label = "v-half" + IMPROVED_SUFFIX
    assert list(view.results) == ["1f1b", "v-half", label], view.messages
    shown, better = view.results["v-half"].schedule, view.results[label].schedule
    offloaded = lambda sch: sorted((c.stage, c.microbatch) for row in sch.copies for c in row if c.kind == "O")  # noqa: E731
    assert offloaded(better) == offloaded(shown) and better.offloads
    assert view.results[label].makespan <= view.results["v-half"].makespan + 1e-9
    line = command_line(s2)
    assert "--optimize 2" in line and "--offload 0.5" in line


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32)])
def test_export_hints_say_the_report_size_before_the_click(p, m):
    """The HTML button's tooltip states the report's size within 15 % of the file written, and
    the image buttons state the pixels the static export draws."""
    view = ui.compute(ui.Settings(schedules=("1f1b", "v-half", "v-min"), num_devices=p, num_microbatches=m))
    hints = ui.export_hints(view)
    mb = float(hints["html"].split()[1])
    unit = {"MB": 1e6, "KB": 1e3}[hints["html"].split()[2]]
    real = len(ui.report_html(view).encode("utf-8"))
    assert abs(mb * unit - real) <= 0.15 * real, (hints["html"], real)
    fig = ui.static_figure(view)
    assert hints["png"] == f"{2 * fig.layout.width} × {2 * fig.layout.height} px"
    explorer = ui.Explorer(ui.Settings(schedules=("1f1b", "v-half", "v-min"), num_devices=p, num_microbatches=m))
    assert explorer.buttons["html"].tooltip == f"download HTML report: {hints['html']}"
    assert hints["png"] in explorer.buttons["png"].tooltip


def _loop_in_thread(name: str):
    """An event loop running in a thread of its own (the kernel's main loop, or a subshell's)."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, name=name, daemon=True)
    th.start()
    return loop, th


def _on(loop, fn):
    import asyncio

    async def call():
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=60)


@pytest.mark.parametrize("clicked_from", ["subshell loop", "plain thread"])
def test_an_export_clicked_in_another_thread_arrives_without_another_message(tmp_path, clicked_from):
    """ipykernel 7 answers widget messages in a subshell thread with its own event loop, while
    the explorer was made on the main thread's loop. An image clicked there arrives once drawn,
    with no other message to wake a loop (before, the poll was put on the main loop with
    call_later from the subshell thread: that loop slept on in its selector and the PNG never
    arrived). Also from a thread with no loop at all (the poll is handed over thread-safely)."""
    import concurrent.futures
    import threading
    import time

    main, main_th = _loop_in_thread("kernel-main")
    other = other_th = None
    try:
        e = _on(main, lambda: ui.explorer(schedules=["1f1b"], num_devices=4, num_microbatches=8))
        e.export_dir = str(tmp_path)
        drawn = concurrent.futures.Future()

        class SlowRenderer:
            deadline = 90.0

            def submit(self, fig, fmt, **kw):
                threading.Timer(0.3, lambda: drawn.set_result(b"\x89PNG\r\n\x1a\n" + b"0" * 16)).start()
                return drawn

            def close(self):
                pass

        e._renderer = SlowRenderer()
        if clicked_from == "subshell loop":
            other, other_th = _loop_in_thread("subshell")
            _on(other, lambda: e._export_clicked("png"))
        else:
            th = threading.Thread(target=e._export_clicked, args=("png",))
            th.start()
            th.join(30)
        t0 = time.monotonic()
        while not e.downloads.files and time.monotonic() - t0 < 10:
            time.sleep(0.05)  # nothing else happens: no widget message, no edit
        assert [f["name"][-4:] for f in e.downloads.files] == [".png"], html.unescape(e.export_note.value)
        _on(main, e.close)
    finally:
        for loop, th in ((main, main_th), (other, other_th)):
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
                th.join(10)
                loop.close()


def test_budgeted_orders_with_recompute_are_cm_builds_in_the_view_and_the_worker():
    """With a budget and recompute on, the budgeted searches show what cm.build(...,
    memory_limit=, recompute=) gives (an order for the memory recomputing frees: zb at 0.375,
    3:4:2 runs 123.6, not the 268.8 of its budget's order with every forward then recomputed),
    built at once or in the background worker, kept apart from the orders without levers."""
    from ctrlmem import build
    from ctrlmem.explorer.background import Job, _build_part
    from ctrlmem.explorer.views import Settings, compute
    from ctrlmem.schedules import SCHEDULES

    costs = cm.Costs(3, 4, 2, 0.1)
    s = Settings(schedules=("zb", "v-shape"), num_devices=4, num_microbatches=8, f=3, b=4, w=2, comm=0.1,
                 memory_limit=0.375, recompute="full")
    view = compute(s)
    for name in ("zb", "v-shape"):
        want = cm.simulate(cm.build(name, 4, 8, costs=costs, memory_limit=0.375, recompute="full"), costs)
        assert view.results[name].makespan == want.makespan
        assert view.results[name].peak_memory == want.peak_memory
    assert view.results["zb"].makespan < 200  # the budget's own order, recomputed, takes 268.8
    job = Job("zb", 4, 8, costs, 0.375, levers=("full", "none"))
    assert job.cache_name != "zb" and Job("zb", 4, 8, costs, 0.375).cache_name == "zb"
    sched, got_costs, error, _, _ = _build_part(job, SCHEDULES, build)
    assert error is None and cm.simulate(sched, got_costs).makespan == view.results["zb"].makespan
    job = Job("zb", 4, 8, costs, 0.375, optimize=1.0, improve_limit=0.375, levers=("full", "none"))
    assert job.cache_name not in ("zb", Job("zb", 4, 8, costs, 0.375, optimize=1.0).cache_name)
    sched, got_costs, error, _, note = _build_part(job, SCHEDULES, build)
    assert error is None and sched.recomputes and "cm.improve" in note
    assert cm.simulate(sched, got_costs).makespan <= view.results["zb"].makespan + 1e-9


def test_fb_overlap_shortens_dualpipe_as_the_command_and_the_state_carry_it(tmp_path):
    """The F&B overlap control: DualPipeV's overlapped pairs take that fraction of F + B (its
    makespan drops, 1F1B's does not move), the `ctrlmem draw` line and the export name carry it, a
    state brings it back, and a value with no overlapping schedule shown says so."""
    import shlex

    from ctrlmem.cli import make_parser
    from ctrlmem.cli.draw import draw_figure
    from ctrlmem.explorer.views import Settings, compute, write_state

    ex = ui.explorer(schedules=["1f1b", "dualpipe-v"], num_devices=4, num_microbatches=16, f=1, b=2, w=1)
    try:
        before = dict(zip(ex.view.stats["schedule"], ex.view.stats["makespan"]))
        ex.fb_overlap.value = 0.6
        after = dict(zip(ex.view.stats["schedule"], ex.view.stats["makespan"]))
        assert after["1f1b"] == before["1f1b"]
        assert after["dualpipe-v"] < before["dualpipe-v"]
        costs = cm.Costs(1, 2, 1, 0, fb_overlap=0.6)
        assert after["dualpipe-v"] == pytest.approx(cm.simulate(cm.build("dualpipe-v", 4, 16), costs).makespan)
        assert "--fb-overlap 0.6" in ex.command.value
        argv = shlex.split(ex.command.value)[1:]
        argv[argv.index("-o") + 1] = str(tmp_path / "x.html")
        fig = draw_figure(make_parser().parse_args(argv))
        assert "F&B=0.6" in fig.layout.title.text
        assert not ex.view.messages
        state = write_state(ex.view, tmp_path / "s.json")
        other = ui.explorer(schedules=["1f1b"], num_devices=4, num_microbatches=8)
        try:
            other.apply_state(state)
            assert other.fb_overlap.value == 0.6
            assert dict(zip(other.view.stats["schedule"], other.view.stats["makespan"])) == after
        finally:
            other.close()
    finally:
        ex.close()
    view = compute(Settings(schedules=("1f1b",), fb_overlap=0.5))
    assert any("tick dualpipe or dualpipe-v" in x for x in view.messages)
    assert "fraction" in " ".join(compute(Settings(schedules=("dualpipe-v",), fb_overlap=1.5)).messages)


def test_a_hugging_face_config_gives_the_memory_panel_its_gb_axis(tmp_path):
    """The model path field takes a Hugging Face config.json: the GB axis is that model's (a of
    ctrlmem.planner.gb.bytes_per_a for it), the path wins over the preset, and a state restores
    the path field, not the dropdown; a bad path is one message."""
    from pathlib import Path

    from ctrlmem.explorer.views import write_state
    from ctrlmem.planner.gb import bytes_per_a

    cfg = str(Path(__file__).parent / "data" / "hf_configs" / "llama-3-8b.json")
    ex = ui.explorer(schedules=["1f1b", "v-half"], num_devices=4, num_microbatches=8)
    try:
        ex.model.value = "9.6B"
        ex.model_path.value = cfg
        assert ex.settings().model == cfg
        layout = ex.view.memory_spec["layout"]
        axes = [k for k in layout if k.startswith("yaxis") and "overlaying" in layout[k]]
        assert axes, list(layout)
        gb = layout[axes[0]]
        assert "9.6B" not in gb["title"]["text"] and "mb 1" in gb["title"]["text"]
        a_axis = layout["yaxis" + gb["overlaying"][1:]]
        assert gb["range"][1] == pytest.approx(a_axis["range"][1] * bytes_per_a(cfg, 4, 1) / 1e9)
        state = write_state(ex.view, tmp_path / "s.json")
        other = ui.explorer(schedules=["1f1b"], num_devices=4, num_microbatches=8)
        try:
            other.apply_state(state)
            assert (other.model.value, other.model_path.value) == ("", cfg)
        finally:
            other.close()
        ex.model_path.value = str(tmp_path / "missing.json")
        assert any("GB axis" in x for x in ex.view.messages)
    finally:
        ex.close()


def test_edits_from_the_subshell_and_the_main_loop_run_one_at_a_time_on_the_explorer_thread():
    """ipykernel 7 answers widget messages in a subshell thread with a loop of its own, beside
    the main thread's loop that made the explorer. Edits arriving on both at once (and a
    schedule ticked from the subshell) are all answered on the explorer's own thread, one at a
    time, and once they settle the explorer shows the widgets' last values: the last edit wins,
    the state shown is the latest, no state number is lost. (Before, an edit from the subshell
    was answered on the subshell's thread, beside the main thread's.)"""
    import asyncio
    import threading
    import time

    main, main_th = _loop_in_thread("kernel-main")
    sub, sub_th = _loop_in_thread("subshell")
    try:
        e = _on(main, lambda: ui.explorer(schedules=["1f1b", "zb-v"], num_devices=4, num_microbatches=8,
                                          background=False, export_dir=None))
        threads, active, overlaps, renders = [], {}, [0], [0]

        def watched(fn, count=None):
            def run(*args, **kwargs):
                me = threading.current_thread().name
                threads.append(me)
                overlaps[0] += any(n for t, n in active.items() if t != me)  # another thread inside
                active[me] = active.get(me, 0) + 1
                if count is not None:
                    count[0] += 1
                try:
                    time.sleep(0.002)  # widen the window a second thread would race in
                    return fn(*args, **kwargs)
                finally:
                    active[me] -= 1
            return run

        e.update, e.render = watched(e.update), watched(e.render, renders)
        start = e._state

        async def edit(widget, values):
            for v in values:
                widget.value = v
                await asyncio.sleep(0.003)

        comms = [round(0.01 * k, 2) for k in range(1, 31)]
        fs = [round(1 + 0.1 * k, 1) for k in range(1, 31)]
        both = [asyncio.run_coroutine_threadsafe(edit(e.comm, comms), sub),
                asyncio.run_coroutine_threadsafe(edit(e.f, fs), main)]
        for fut in both:
            fut.result(timeout=120)
        _on(sub, lambda: setattr(e.schedules.boxes["v-half"], "value", True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # settled: nothing scheduled, the last edit answered
            time.sleep(0.1)
            if not _on(main, lambda: e._flush_scheduled) and "v-half" in e.view.settings.schedules:
                break
        settled = _on(main, lambda: (e.view.settings, e.settings(), e._state, e.plots.seq))
        assert set(threads) == {"kernel-main"}, sorted(set(threads))
        assert overlaps[0] == 0
        view_settings, widgets, state, seq = settled
        assert view_settings == widgets and (view_settings.comm, view_settings.f) == (comms[-1], fs[-1])
        assert view_settings.schedules == ("1f1b", "zb-v", "v-half")
        assert seq == state and state - start == renders[0] > 0
        _on(main, e.close)
    finally:
        for loop, th in ((main, main_th), (sub, sub_th)):
            loop.call_soon_threadsafe(loop.stop)
            th.join(10)
            loop.close()


def test_per_stage_costs_are_summed_or_split_for_each_schedule_and_checked():
    """Given per-stage costs (K stages in model order), a schedule of S stages gets them summed
    over K/S neighbours or split into S/K equal parts (the model's total stays), its one-time
    form is a full device-stage's average, they survive the state file, and a stage count neither
    divides is refused naming both."""
    from ctrlmem.explorer.views import Settings

    f, b, w = (1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0), (2.0,) * 8, (1.0,) * 7 + (0.5,)
    s = Settings(schedules=("1f1b", "v-half"), num_devices=4, num_microbatches=8, stage_costs=(f, b, w), comm=0.5)
    assert s.costs(8).f == f and s.costs(4).f == (3.0, 4.0, 4.0, 5.0) and s.costs(16).f[:3] == (0.5, 0.5, 1.0)
    for n in (4, 8, 16):
        assert sum(s.costs(n).w) == pytest.approx(sum(w)) and s.costs(n).comm == 0.5
    assert (s.costs().f, s.costs().b) == (16 / 4, 16 / 4) and s.per_stage
    assert Settings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ValueError, match="8 stages cannot time a schedule of 12"):
        s.costs(12)
    with pytest.raises(ValueError, match="three lists"):
        Settings(stage_costs=((1.0, 2.0), (1.0,), (1.0, 1.0))).costs(2)
    view = ui.compute(s)
    assert not view.messages and view.results["v-half"].costs.f == f and view.reference.costs.f == s.costs(4).f
    assert "per-stage costs of 8 stages" in ui.command_line(s)


def test_a_plans_winner_opens_in_the_explorer_as_the_plan_simulated_it(tmp_path):
    """cm.plan's fastest configuration that fits, as an explorer state (plan_state; `ctrlmem
    plan --emit` writes it as explorer.state.json): its schedule next to 1F1B at its PP and
    microbatches, with the very order and per-stage costs (ms) the plan simulated, so the
    explorer shows the plan's pipeline time; the explorer opens it and `ctrlmem draw --state`
    draws it."""
    from ctrlmem.explorer import views
    from ctrlmem.planner.core import row_schedule

    df = cm.plan(model="9.6b", gpus=8, gpu_memory_gb=40, costs="h200", progress=False)
    win = int(df.index[df["status"] == "ok"][0])
    row = df.iloc[win]
    state = views.plan_state(df)
    view, _ = views.state_view(state)
    name = str(row["schedule"]).partition("@")[0]
    assert list(view.results) == list(dict.fromkeys([name, "1f1b"])) and not view.messages
    sched, costs = row_schedule(df, win)
    shown = view.results[name]
    assert shown.schedule.device_passes == sched.device_passes and shown.costs.f == tuple(costs.f)
    assert shown.makespan == pytest.approx(row["pipeline_s"] * 1e3, rel=1e-9)
    assert (view.settings.num_devices, view.settings.num_microbatches) == (row["pp"], row["m"])
    assert view.origins[name].startswith("the plan's order: rank 1") and view.settings.model == "9.6B"
    e = ui.explorer(state=json.dumps(state), background=False, export_dir=None)
    try:
        assert e.view.results[name].makespan == shown.makespan and e.view.settings.stage_costs
        assert e.f.disabled and "per-stage costs of" in e.stage_note.value
        e.clear_stage_costs.click()  # back to the F, B, W fields
        assert not e.view.settings.stage_costs and not e.f.disabled and e.stage_note.value == ""
    finally:
        e.close()
    with pytest.raises(ValueError, match="rows 0.."):
        views.settings_from_plan(df, len(df) + 3)


def test_a_static_export_keeps_the_gb_axis_on_its_memory_panel():
    """With a model chosen, each memory panel has a second (GB) axis overlaying it; stacked under
    the diagram for a PNG/SVG/PDF it still overlays that memory panel, not the diagram's panel of
    the same number (which hid the diagram's boxes behind it)."""
    from ctrlmem.explorer import views

    view = views.compute(views.Settings(schedules=("1f1b", "v-half"), num_devices=4, num_microbatches=8,
                                        model="9.6B"))
    fig = views.static_figure(view)
    memory_axes = {tr.yaxis for tr in fig.data if (tr.meta or {}).get("kind") == "memory"}
    overlays = {fig.layout[k].overlaying for k in fig.layout if k.startswith("yaxis") and fig.layout[k].overlaying}
    assert overlays and overlays == memory_axes, (overlays, memory_axes)


def test_a_state_link_opens_the_same_state_in_the_explorer_and_the_command_line(tmp_path, capsys):
    """'share link' puts the state into one line of text (also inside a URL, after # or ?): with
    its very orders when they fit, which the explorer's 'open link' field, explorer(state=LINK)
    and `ctrlmem draw --state LINK` show again exactly; a state too long for a link keeps its
    settings and the orders are built again, to the same schedules; a broken link is a message."""
    from ctrlmem.cli.app import main
    from ctrlmem.explorer import views

    e = ui.explorer(schedules=["1f1b", "v-half"], num_devices=4, num_microbatches=12, f=2.0, comm=0.1,
                    background=False, export_dir=None)
    other = ui.explorer(schedules=["1f1b"], num_devices=2, num_microbatches=4, background=False, export_dir=None)
    try:
        e.link_button.click()
        link = e.link_out.value
        assert link.startswith(views.STATE_LINK_KEY) and len(link) < views.MAX_LINK_CHARS
        assert "the very orders shown" in e.export_note.value
        other.link_in.value = f"http://localhost:8888/lab/tree/01_explore_schedules.ipynb#{link}"
        shown = {n: (r.makespan, r.schedule.device_passes) for n, r in e.view.results.items()}
        assert {n: (r.makespan, r.schedule.device_passes) for n, r in other.view.results.items()} == shown
        assert other.view.settings == e.view.settings
        assert main(["draw", "--state", link, "-o", str(tmp_path / "linked.html")]) == 0
        assert (tmp_path / "linked.html").read_bytes() == views.report_html(e.view, e._style()).encode("utf-8")
        # too long with its orders: the settings alone, the orders built again
        short, exact = views.state_link(e.view, max_chars=600)
        assert not exact and len(short) <= 600
        rebuilt, _ = views.state_view(short)
        assert {n: (r.makespan, r.schedule.device_passes) for n, r in rebuilt.results.items()} == shown
        other.link_in.value = link[:-40] + "!!"
        assert "Cannot load the state" in other.message.value
        with pytest.raises(ValueError, match="state link"):
            views.read_state(views.STATE_LINK_KEY + "1.AAAA")
    finally:
        e.close()
        other.close()


def test_the_step_grid_comparison_shows_the_schedule_chosen():
    """'step grid' under the plots draws the schedule picked in 'of' as device × step cells with
    its sends, and follows that choice."""
    e = ui.explorer(schedules=["1f1b", "v-half"], num_devices=4, num_microbatches=8, background=False,
                    export_dir=None)
    try:
        e.compare.value = "step grid"
        fig = e.shown("compare-a")
        assert fig["data"][0]["meta"]["kind"] == "grid" and fig["layout"]["title"]["text"].startswith("1f1b")
        e.compare_schedule.value = "v-half"
        fig = e.shown("compare-a")
        assert fig["layout"]["title"]["text"].startswith("v-half") and fig["data"][1]["meta"]["count"] > 0
        assert e.shown("compare-b") is None
    finally:
        e.close()


def test_a_measured_run_is_drawn_under_its_simulation_and_kept_in_the_state(tmp_path):
    """A run's trace-measured.json loaded in the explorer: p and m follow it, a panel of its
    passes at their measured times (ms) comes right under the simulation of its schedule, a line
    gives its step and mean pass times (F, B, W in ms make the simulation comparable: with them
    the shared axis is in ms for both), the state keeps it, 'clear loaded' drops it; a run of a
    schedule not shown says to tick it."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_trace import _run_of

    from ctrlmem.explorer import views
    from ctrlmem.plots.trace import measured_trace_events

    r = cm.simulate(cm.build("1f1b", 4, 8), cm.Costs(2, 3, 1, 0.2))
    path = tmp_path / "trace-measured.json"
    path.write_text(json.dumps(measured_trace_events(r.schedule, _run_of(r, factor=1.0))))
    e = ui.explorer(schedules=["v-half", "1f1b"], num_devices=2, num_microbatches=4, background=False,
                    export_dir=None)
    try:
        run = e.load(str(path))
        assert (e.devices.value, e.microbatches.value) == (4, 8) and run.name == "1f1b"
        titles = [a["text"] for a in e.shown("diagram")["layout"]["annotations"] if a.get("yanchor") == "bottom"]
        assert [t.split(" ")[0] for t in titles] == ["v-half", "1f1b", "measured"], titles
        assert titles[2].startswith(f"measured 1f1b: step {r.makespan:.4g} ms (trace-measured.json")
        f, b, w = views.measured_costs(run, r.schedule)
        assert (f, b + w) == pytest.approx((2, 4))
        line = next(x for x in e.view.messages if x.startswith("measured 1f1b"))
        assert f"step {r.makespan:.4g} ms" in line and "2 / 2 / 2 ms" in line
        e.f.value, e.b.value, e.w.value, e.comm.value = 2.0, 3.0, 1.0, 0.2  # the run's costs: the same axis
        assert e.view.results["1f1b"].makespan == pytest.approx(run.step_ms)
        state = views.state_dict(e.view)
        assert views.read_state(json.dumps(state))[0].measured == (run,)
        report = views.report_html(e.view)
        assert "except the panels titled <i>measured</i>" in report and "measured runs" in report
        e.schedules.value = ("v-half",)
        assert any("tick 1f1b" in x for x in e.view.messages)
        e.clear_loaded()
        assert not e.view.settings.measured
        assert e.load(str(tmp_path / "missing.json")) is None and "Cannot load" in e.message.value
    finally:
        e.close()
