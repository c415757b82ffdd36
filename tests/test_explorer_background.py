"""The explorer answers every edit at once and adapts in the background: what it shows first is
the order it already had, re-simulated under the new settings (and says so), the cost-adapted
build follows as a new state, and every element on screen names the one state it belongs to."""

import json
import re

import pytest

import ctrlmem as cm
from ctrlmem.explorer import views as explore, ui
from ctrlmem.plots import figures as plot

STATE = re.compile(r"data-ctrlmem-state='(\d+)'")


def states(e) -> set[int]:
    """The state numbers the explorer's HTML elements carry (empty ones included)."""
    found = set()
    for wdg in (e.message, e.verdict, e.stats_out, e.formulas, e.timing):
        found |= {int(x) for x in STATE.findall(wdg.value)}
    if e.progress.value:
        found |= {int(x) for x in STATE.findall(e.progress.value)}
    return found


@pytest.fixture
def vexp():
    e = ui.explorer(schedules=["1f1b", "v-half", "v-min"], num_devices=4, num_microbatches=8)
    e.wait()
    yield e
    e.close()


def test_a_cost_edit_shows_the_previous_order_resimulated_then_the_adapted_one(vexp):
    """F 1 -> 3: at once, V-Half is its order adapted for F=1 simulated at F=3 (marked not
    adapted, its build queued); after the background build, it is cm.build(..., costs) at F=3,
    marked adapted, in a new state."""
    before = vexp.view.results["v-half"].schedule
    assert vexp.view.origins["v-half"] == explore.ORIGIN_ADAPTED
    vexp.f.value = 3.0
    costs = cm.Costs(3, 1, 1, 0)
    shown = vexp.view.results["v-half"]
    assert shown.schedule is before and shown.makespan == cm.simulate(before, costs).makespan
    assert vexp.view.origins["v-half"].startswith("not adapted yet") and "F=1 B=1 W=1" in vexp.view.origins["v-half"]
    assert {j.name for j in vexp.view.jobs} == {"v-half", "v-min"} and all(j.costs == costs for j in vexp.view.jobs)
    assert "Provisional: v-half, v-min" in vexp.verdict.value
    assert "adapting to these costs in the background" in vexp.progress.value
    state = vexp.plots.seq
    vexp.wait()
    assert vexp.plots.seq > state
    for name in ("v-half", "v-min"):
        want = cm.simulate(cm.build(name, 4, 8, costs=costs), costs)
        assert vexp.view.results[name].makespan == want.makespan
        assert vexp.view.origins[name] == explore.ORIGIN_ADAPTED
    assert "Provisional" not in vexp.verdict.value and vexp.progress.value == ""
    row = vexp.view.stats.set_index("schedule").loc["v-half"]
    assert row["order"] == "adapted for these costs"


def test_the_kernel_thread_never_searches(monkeypatch):
    """An edit builds no cost-adapted schedule in the caller's thread (only the unit-cost
    patterns, which take no costs): the searches go to the background."""
    e = ui.explorer(schedules=["1f1b", "v-min"], num_devices=6, num_microbatches=12)
    calls = []
    real = explore.build

    def spy(name, p, m, costs=None, memory_limit=None, **kw):
        calls.append((name, costs))
        return real(name, p, m, costs=costs, memory_limit=memory_limit, **kw)

    monkeypatch.setattr(explore, "build", spy)
    try:
        e.f.value, e.devices.value = 2.0, 8
        assert [c for c in calls if c[0] == "v-min" and c[1] is not None] == []
        assert e.view.origins["v-min"] == explore.ORIGIN_PATTERN
        assert [j.name for j in e.view.jobs] == ["v-min"] and e.background.progress().job.name == "v-min"
    finally:
        e.close()


def test_every_element_names_the_state_it_belongs_to(vexp):
    """After any update every HTML element carries the same state number, the one the plots were
    sent with; the pending mark covers the time until the browser drew them."""
    for change in (("f", 2.0), ("comm", 0.25), ("devices", 5)):
        getattr(vexp, change[0]).value = change[1]
        assert states(vexp) == {vexp.plots.seq}
        assert "ctrlmem-pending" in vexp.widget._dom_classes
        vexp.plots.drawn = {"seq": vexp.plots.seq, "ms": 1.0}
        assert "ctrlmem-pending" not in vexp.widget._dom_classes
    vexp.wait()
    assert states(vexp) == {vexp.plots.seq}


def test_a_newer_edit_replaces_the_older_builds(vexp):
    """Two quick edits: the background builds for the second costs only."""
    vexp.f.value = 2.0
    vexp.f.value = 5.0
    job = vexp.background.progress().job
    assert job.costs == cm.Costs(5, 1, 1, 0)
    assert all(j.costs == cm.Costs(5, 1, 1, 0) for j in vexp.background.progress().waiting)
    vexp.wait()
    assert vexp.view.results["v-min"].makespan == cm.simulate(
        cm.build("v-min", 4, 8, costs=cm.Costs(5, 1, 1, 0)), cm.Costs(5, 1, 1, 0)).makespan


def test_a_budgeted_schedule_with_no_order_yet_is_listed_as_building():
    e = ui.explorer(schedules=["1f1b", "v-shape"], num_devices=4, num_microbatches=8, memory_limit=0.5)
    try:
        assert e.view.waiting == ["v-shape"] and "v-shape" not in e.view.results
        assert "building for these settings" in e.stats_out.value
        e.wait()
        assert e.view.waiting == [] and e.view.origins["v-shape"] == explore.ORIGIN_ADAPTED
        e.limit.value = 0.6  # a larger budget: the order built for 0.5 fits it, shown meanwhile
        assert e.view.origins["v-shape"].startswith("not adapted yet")
        assert e.view.stats.set_index("schedule").loc["v-shape", "fits limit"]
    finally:
        e.close()


def test_the_verdict_under_a_budget_considers_only_what_fits():
    """Budget 0.65 at p=8: V-ZB and 1F1B (1.0) exceed it, V-Half (5/8) and V-Min (4/8) fit; the
    verdict's fastest is within it (V-ZB is faster, but over) and the line names what it left out."""
    e = ui.explorer(schedules=["1f1b", "v-zb", "v-half", "v-min"], num_devices=8, num_microbatches=16,
                    memory_limit=0.65, background=False)
    try:
        line = e.verdict.value
        stats = e.view.stats.set_index("schedule")
        fits = stats[stats["fits limit"].astype(bool)]
        fastest = fits["makespan"].idxmin()
        assert f"Within the budget of 0.65 × 1F1B&#x27;s peak: Fastest: {fastest}" in line
        assert fastest in ("v-half", "v-min") and stats["makespan"].idxmin() == "v-zb"
        left = line.split("Left out, over the budget: ")[1]
        assert "v-zb" in left and "1f1b" in left and "v-half" not in left
    finally:
        e.close()


def test_comparisons_show_the_peak_memory_over_time_and_the_pareto_front(vexp):
    """The first comparison: each schedule's peak over devices against time (the maximum of the
    device curves at every instant) and memory against speed-up with every point labelled."""
    peaks, pareto = vexp.shown("compare-a"), vexp.shown("compare-b")
    for name, r in vexp.view.results.items():
        (tr,) = [t for t in peaks["data"] if t["meta"].get("kind") == "peak" and t["meta"]["name"] == name]
        t, v = plot.peak_memory_curve(r)
        for x, y in zip(t, v):
            assert y == max(r.memory_curve(d)[1][max(i for i, tt in enumerate(r.memory_curve(d)[0]) if tt <= x)]
                            for d in range(4))
        assert max(v) == max(r.peak_memory)
    labels = [a["text"] for a in pareto["layout"]["annotations"] if a.get("name") == "label"]
    assert sorted(", ".join(labels).split(", ")) == sorted(vexp.view.results)


def test_bubble_vs_budget_streams_sampled_budgets_and_goes_past_one_where_a_bubble_is_left(vexp):
    """The panel asks one background sweep per budgeted schedule (its budgets back to back,
    coarse ones first), draws the budgets searched as points joined by a dotted line in memory
    order (sampled, not drawn as exact steps between them), each point one budget built, and
    goes past 1.0 × 1F1B for a schedule that still has a bubble there (zb: ZB-1P at 1.0) but not
    for one that has none (v-shape reaches ZB-V's zero bubble at 1.0)."""
    from ctrlmem.explorer.ui import SWEEP_BEYOND

    vexp.compare.value = "bubble vs budget"
    jobs = [vexp.background.progress().job, *vexp.background.progress().waiting]
    assert sorted(j.name for j in jobs) == ["v-shape", "zb"]
    for j in jobs:
        assert sorted(j.limits) == sorted(plot.TRADEOFF_LIMITS) and j.limits[:2] == (1.0, 0.3)
    assert "budget builds done…" in vexp.shown("compare-a")["layout"]["title"]["text"]
    vexp.wait()
    fig = vexp.shown("compare-a")
    assert not [t for t in fig["data"] if t["meta"]["kind"] == "steps"]
    lines = {t["meta"]["name"]: t for t in fig["data"] if t["meta"]["kind"] == "samples"}
    marks = {t["meta"]["name"]: t for t in fig["data"] if t["meta"]["kind"] == "bubble"}
    assert set(lines) == {"v-shape", "zb"} and all(t["line"]["dash"] == "dot" for t in lines.values())
    for name, line in lines.items():
        assert line["x"] == marks[name]["x"] and line["y"] == marks[name]["y"]  # through the points only
        assert list(line["x"]) == sorted(line["x"])
    budgets = {name: {c[0] for c in marks[name]["customdata"]} for name in lines}
    assert budgets["v-shape"] == set(plot.TRADEOFF_LIMITS)
    assert budgets["zb"] == set(plot.TRADEOFF_LIMITS) | set(SWEEP_BEYOND)
    assert max(marks["zb"]["x"]) > 1.0
    assert "all budget builds done" in fig["layout"]["title"]["text"]


def test_state_file_round_trip_and_draw_state_is_identical(tmp_path):
    """A state saved by the explorer holds the settings (per-stage weights, budget, a loaded
    file inline) and the very orders shown; `ctrlmem draw --state` draws the same figures and
    the same report, and another explorer loading it shows the same table."""
    from ctrlmem.cli import main

    csv = tmp_path / "mine.csv"
    csv.write_text(cm.build("1f1b", 4, 8).to_torch_csv())
    e = ui.explorer(schedules=["1f1b", "v-half", "v-shape"], num_devices=4, num_microbatches=8, f=2,
                    memory_limit=0.75, stage_weights=[1.5, 1, 1, 1.5], load=[str(csv)], export_dir=None)
    try:
        e.wait()
        e.plots.width = 900  # as a browser would report
        path = e.save_state(tmp_path / "s.state.json")
        settings, orders, style = explore.read_state(path)
        assert settings == e.view.settings
        assert set(orders) == {"1f1b", "v-half", "v-shape"}
        for name, sched in orders.items():
            assert sched.device_passes == e.view.results[name].schedule.device_passes
        view, _ = explore.state_view(path)
        for which in ("diagram_spec", "memory_spec"):
            assert json.dumps(explore.jsonable(getattr(view, which))) == json.dumps(explore.jsonable(getattr(e.view, which)))
        (report,) = e.export("html", tmp_path / "x")
        assert main(["draw", "--state", str(path), "-o", str(tmp_path / "again.html")]) == 0
        assert open(report, encoding="utf-8").read() == (tmp_path / "again.html").read_text(encoding="utf-8")
        # the report carries the state: it draws itself again
        assert main(["draw", "--state", report, "-o", str(tmp_path / "from_report.html")]) == 0
        assert (tmp_path / "from_report.html").read_text(encoding="utf-8") == open(report, encoding="utf-8").read()
        other = ui.explorer(num_devices=2, num_microbatches=2, state=str(path), export_dir=None)
        try:
            cols = ["schedule", "makespan", "peak (a)", "order"]
            assert other.view.stats[cols].equals(e.view.stats[cols])
        finally:
            other.close()
    finally:
        e.close()


def test_a_bad_state_file_is_a_message(tmp_path, vexp):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    vexp.apply_state(str(bad))
    assert "Cannot load the state: not a ctrlmem state file" in vexp.message.value
    with pytest.raises(ValueError, match="not JSON"):
        explore.read_state("{oops")


def test_stop_adapting_keeps_what_is_shown_and_says_so(vexp):
    vexp.f.value = 4.0
    assert vexp.background.progress().job is not None and vexp.stop_button.layout.display == ""
    vexp.stop_background()
    assert vexp.background.idle and vexp.stop_button.layout.display == "none"
    assert "not adapted to these costs (stopped): v-half, v-min" in vexp.progress.value
    assert vexp.view.origins["v-half"].startswith("not adapted yet")


@pytest.mark.parametrize("argv,needle", [
    (["draw", "-o", "x.html"], "give a schedule name"),
    (["draw", "--state", "missing.json", "-o", "x.png"], "no such file"),
    (["draw", "1f1b", "--state", "s.json", "-o", "x.html"], "drop the schedule '1f1b'"),
    (["draw", "1f1b", "--view", "explorer", "-o", "x.png"], "add --state FILE"),
    (["draw", "--state", "notstate.json", "-o", "x.html"], "not a ctrlmem state file"),
    (["draw", "--state", "s.json", "--view", "pareto", "-o", "x.html"], "not 'pareto'"),
])
def test_draw_state_bad_input_is_one_line_and_status_2(tmp_path, capsys, monkeypatch, argv, needle):
    from ctrlmem.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notstate.json").write_text('{"settings": {}}')
    view = explore.compute(explore.Settings(schedules=("1f1b",), num_devices=2, num_microbatches=2))
    explore.write_state(view, tmp_path / "s.json")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_building_blocks_and_lifespans_are_comparisons_too(vexp):
    """The CLI's block and lifespan views are in the explorer: the blocks of the schedule picked
    (block → repeat → squeeze → reorder), the lifespans of every shown schedule; 'none' hides."""
    vexp.compare.value = "building blocks"
    vexp.compare_schedule.value = "v-half"
    blocks = vexp.shown("compare-a")
    assert blocks["layout"]["title"]["text"].startswith("v-half: building block")
    assert len(blocks["layout"]["annotations"]) == len(plot.block_timelines("v-half", 4, 8))
    assert vexp.shown("compare-b") is None
    vexp.compare.value = "lifespans"
    spans = vexp.shown("compare-a")
    assert [a["text"] for a in spans["layout"]["annotations"]] == list(vexp.view.results)
    vexp.compare.value = "none"
    assert vexp.shown("compare-a") is None and vexp.shown("compare-b") is None
    assert vexp.plots.shown[0] == {"keep": True}  # the main plots were not sent again


@pytest.mark.slow  # a recomputing search at every budget: the full tier runs it, --fast does not
def test_bubble_vs_budget_with_recompute_sweeps_the_budgeted_searches_with_it():
    """With recompute on, each budget of the sweep is cm.build(..., memory_limit=x,
    recompute=MODE), built in the background under the levered name (not the orders without
    levers), and the panel's title names the levers."""
    from ctrlmem.explorer.background import levered_name

    e = ui.explorer(schedules=["1f1b", "v-half"], num_devices=4, num_microbatches=8, recompute="full")
    try:
        e.wait()
        e.compare.value = "bubble vs budget"
        jobs = [e.background.progress().job, *e.background.progress().waiting]
        assert jobs and all(j.levers == ("full", "none") for j in jobs)
        e.wait()
        fig = e.shown("compare-a")
        assert "recompute full" in fig["layout"]["title"]["text"]
        marks = {t["meta"]["name"]: t for t in fig["data"] if t["meta"]["kind"] == "bubble"}
        costs = cm.Costs(1, 1, 1, 0)
        for name in ("v-shape", "zb"):
            got = {c[0]: y for c, y in zip(marks[name]["customdata"], marks[name]["y"])}
            for limit in (0.3, 0.5):
                want = cm.simulate(cm.build(name, 4, 8, costs=costs, memory_limit=limit, recompute="full"), costs)
                kept = e.builds.get(levered_name(name, ("full", "none")), 4, 8, costs, limit)
                assert kept is not None and kept.recomputes
                assert got[limit] == pytest.approx(want.bubble_rate)
    finally:
        e.close()
