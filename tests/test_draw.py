"""``ctrlmem draw`` and ``ctrlmem figures``: files by extension, comparisons, readable errors."""

import re
import shutil

import pytest

import ctrlmem as cm
from ctrlmem.cli import draw
from ctrlmem.cli import main, make_parser


def run(*argv):
    return main([str(a) for a in argv])


def plotly_payload(path):
    text = open(path, encoding="utf-8").read()
    assert re.findall(r"<script[^>]*\bsrc=", text) == [], "the page must not load scripts from elsewhere"
    return text


def test_draw_html_compare_stacks_schedules(tmp_path, capsys):
    """--compare draws every schedule on one page; the file works offline (plotly.js inside)."""
    out = tmp_path / "cmp.html"
    assert run("draw", "1f1b", "-p", 4, "-m", 8, "--costs", "2,3,1,0.5", "--compare", "zb-h1,zb-v", "-o", out) == 0
    text = plotly_payload(out)
    assert "Plotly.newPlot" in text and len(text) > 1_000_000
    for name in ("1f1b (p=4, m=8)", "zb-h1 (p=4, m=8)", "zb-v (p=4, m=8)"):
        assert name in text
    assert f"wrote {out}" in capsys.readouterr().out


def test_draw_figure_is_the_simulation(tmp_path):
    """The figure behind `ctrlmem draw` has the simulated passes of the requested settings."""
    args = make_parser().parse_args(["draw", "zb-h2", "-p", "3", "-m", "7", "--costs", "1,2,1,0", "-o", "x.html"])
    fig = draw.draw_figure(args)
    r = cm.simulate(cm.build("zb-h2", 3, 7), cm.Costs(1, 2, 1, 0))
    boxes = sorted((int(d), tr.meta["op"], float(b), float(b + x))
                   for tr in fig.data if tr.meta["kind"] == "pass"
                   for d, b, x in zip(tr.y, tr.base, tr.x))
    assert boxes == sorted((tp.device, tp.op.value, tp.start, tp.end) for tp in r.passes)


@pytest.mark.parametrize("view", ["memory", "blocks", "lifespans", "bubble", "pareto"])
def test_draw_other_views(tmp_path, view):
    out = tmp_path / f"{view}.html"
    assert run("draw", "1f1b", "-p", 3, "-m", 6, "--view", view, "-o", out) == 0
    assert "Plotly.newPlot" in plotly_payload(out)


@pytest.mark.parametrize("argv,needle", [
    (["draw", "1f1b", "-o", "x.jpg"], "must end in .html, .png, .svg or .pdf"),
    (["draw", "1f1b", "--compare", "nope", "-o", "x.html"], "unknown schedule 'nope'"),
    (["draw", "nope", "-o", "x.html"], "unknown schedule 'nope'"),
    (["draw", "1f1b", "--memory-limit", "0.5", "-o", "x.html"], "takes no memory_limit"),
    (["draw", "1f1b", "--compare", "zb-v", "--view", "blocks", "-o", "x.html"], "drop --compare"),
    (["figures", "--format", "jpg"], "--format takes"),
    (["draw", "1f1b", "--compare", "nope", "--view", "pareto", "-o", "x.html"], "'nope' is not one"),
    (["draw", "no/such.csv", "-o", "x.html"], "no such file"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, needle):
    argv = [str(tmp_path / a) if a.startswith("x.") else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_paper_figures_cover_fig4_fig5_fig18():
    """The figure list names Fig. 4, 5 and the gallery; Fig. 4 holds 1F1B with p=4, m=10 and
    every V schedule that is available."""
    figs, notes = draw.paper_figures()
    stems = [f.stem for f in figs]
    assert "fig04_schedules" in stems and "fig04_memory" in stems
    assert {"fig18a_1f1b", "fig18c_zb-h1", "fig18d_zb-h2", "fig18e_gpipe"} <= set(stems)
    fig4 = next(f for f in figs if f.stem == "fig04_schedules").make()
    titles = [a.text for a in fig4.layout.annotations]
    assert titles[0].startswith("1f1b (p=4, m=10)")
    drawn = {t.split(" ")[0] for t in titles}
    for name in ("v-min", "v-half", "v-zb"):
        assert name in drawn or any(name in n for n in notes), f"{name} neither drawn nor noted"
    if "fig05_unequal_costs" in stems:
        fig5 = next(f for f in figs if f.stem == "fig05_unequal_costs").make()
        assert [a.text.split(" ")[0] for a in fig5.layout.annotations] == ["v-min", "v-half"]


def test_figures_command_writes_and_indexes(tmp_path):
    assert run("figures", "-o", tmp_path, "--format", "html", "--only", "fig18a") == 0
    assert (tmp_path / "fig18a_1f1b.html").exists()
    assert run("figures", "-o", tmp_path / "all", "--format", "html", "--only", "nothing-matches") == 0


@pytest.mark.slow  # a Chromium start (~6 s); tests/test_plot.py keeps a fast PNG/SVG export check
@pytest.mark.skipif(not shutil.which("chromium"), reason="static export needs Chromium for kaleido")
def test_draw_svg(tmp_path):
    out = tmp_path / "s.svg"
    assert run("draw", "zb-v", "-p", 3, "-m", 6, "-o", out) == 0
    text = open(out, encoding="utf-8").read()
    assert text.lstrip().startswith("<svg") and "zb-v (p=3, m=6)" in text


def test_pareto_view_plots_each_schedule_at_its_simulated_point():
    args = make_parser().parse_args(["draw", "1f1b", "-p", "4", "-m", "12", "--compare", "zb-h1,zb-h2",
                                     "--view", "pareto", "-o", "x.html"])
    fig = draw.draw_figure(args)
    ref = cm.simulate(cm.build("1f1b", 4, 12))
    points = {tr.meta["name"]: (tr.x[0], tr.y[0]) for tr in fig.data if tr.meta["kind"] == "point"}
    for name, (mem, speedup) in points.items():
        r = cm.simulate(cm.build(name, 4, 12))
        assert mem == max(r.peak_memory) / max(ref.peak_memory)
        assert speedup == ref.makespan / r.makespan
    assert set(points) == {"1f1b", "zb-h1", "zb-h2"}


def test_draw_html_regenerates_byte_identical(tmp_path):
    """Drawing the same schedule twice gives the same bytes (no random div or trace ids)."""
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert main(["draw", "v-half", "-p", "4", "-m", "8", "--costs", "6,8,4,0.2", "-o", str(a)]) == 0
    assert main(["draw", "v-half", "-p", "4", "-m", "8", "--costs", "6,8,4,0.2", "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
