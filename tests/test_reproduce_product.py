"""The reproduction as a product: self-contained (no team notes cited), deterministic files, the
GPU rank-replay artifact and the verdict per claim (ctrlmem.reproduce, ctrlmem.plots.figio)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ctrlmem import reproduce as rp
from ctrlmem.reproduce import claims as claims_mod
from ctrlmem.reproduce import gpu_replay as gr

REPO = Path(__file__).resolve().parents[1]
SHARED_REPLAY = REPO.parent / "shared" / "data" / "h200_rank_replay.json"
FORBIDDEN = re.compile(r"PAPER\.md|DESIGN\.md|STYLE\.md|\.\./shared")


def _files(paths):
    for top in paths:
        path = REPO / top
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
                        and not any(part.startswith(".") for part in p.relative_to(REPO).parts))


def test_product_cites_no_team_notes():
    """`grep -rn "PAPER.md|DESIGN.md|STYLE.md|../shared" README.md ctrlmem notebooks figures docs
    experiments` finds nothing: the repository carries its own docs and data."""
    hits = []
    for path in _files(["README.md", "ctrlmem", "notebooks", "figures", "docs", "experiments"]):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(REPO)}:{i}" for i, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]
    assert not hits, hits


def test_docs_sections_cited_exist():
    """Every 'docs/theory.md §N' cited anywhere in the product names a section docs/theory.md has."""
    theory = (REPO / "docs" / "theory.md").read_text()
    have = set(re.findall(r"^#+ (\d+(?:\.\d+)?)\b", theory, flags=re.M))
    missing = set()
    for path in _files(["README.md", "ctrlmem", "notebooks", "docs", "experiments", "tests", "figures"]):
        if path.suffix not in (".py", ".md", ".ipynb", ".yaml", ".json", ".html"):
            continue
        text = path.read_text(encoding="utf-8")
        for ref in re.findall(r"docs/theory\.md (?:§|\\u00a7)(\d+(?:\.\d+)?)", text):
            if ref not in have:
                missing.add(f"{path.relative_to(REPO)}: §{ref}")
    assert not missing, sorted(missing)
    assert (REPO / "docs" / "architecture.md").is_file()


def _run_reproduce(out: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "reproduce", "--quick", "--out", str(out), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_table_a_regenerates_byte_identical(tmp_path):
    """`ctrlmem reproduce --only table-a --out A` twice gives identical bytes in every table file;
    dates and timings live only in reproduce-log.json."""
    a, b = tmp_path / "A", tmp_path / "B"
    _run_reproduce(a, "--only", "table-a")
    first = {p.name: p.read_bytes() for p in a.iterdir()}
    shutil.copytree(a, b)
    _run_reproduce(b, "--only", "table-a")
    second = {p.name: p.read_bytes() for p in b.iterdir()}
    assert set(first) == {"table-a.md", "table-a.html", "REPRODUCTION.md", rp.report.LOG_NAME}
    for name in first:
        if name != rp.report.LOG_NAME:
            assert first[name] == second[name], name
    summary = first["REPRODUCTION.md"].decode()
    assert not re.search(r"20\d\d-\d\d-\d\d|seconds", summary)
    log = json.loads(second[rp.report.LOG_NAME])
    assert log["artifacts"]["table-a"]["size"] == "--quick" and log["artifacts"]["table-a"]["seconds"] >= 0


@pytest.mark.slow
def test_the_committed_tables_regenerate_byte_identical(tmp_path):
    """The committed full-size tables that take seconds to build (Tables 1, 2, 8, 9, the exact
    values, the closed forms, Fig. 9–10's [CALC] check) regenerate byte for byte from the code
    as it is: a search change that moves one of their numbers must regenerate the file with it
    (fig9-10.md had been left behind one, 2026-12-01 to 12-07)."""
    names = ("table1", "table2", "table8", "table9", "table-a", "closed-forms", "fig9-10")
    args = [a for name in names for a in ("--only", name)]
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "reproduce", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in names:
        for ext in (".md", ".html"):
            got, want = tmp_path / f"{name}{ext}", REPO / "figures" / f"{name}{ext}"
            assert got.read_bytes() == want.read_bytes(), f"figures/{name}{ext} is not what the code builds now"


@pytest.mark.slow
def test_svg_and_html_figures_regenerate_byte_identical(tmp_path):
    """A schedule figure written twice by ctrlmem.plots.figio gives identical SVG and HTML bytes (plotly's
    random div id, trace uids and kaleido's SVG ids are replaced by content-derived ones)."""
    import ctrlmem as cm
    from ctrlmem.plots import figio, figures as plot

    fig = plot.schedule_figure(cm.simulate(cm.build("v-half", 4, 8), cm.Costs(1, 1, 1, 0)))
    figio.write_files([(fig, tmp_path / "a.html")], include_plotlyjs="cdn")
    figio.write_files([(fig, tmp_path / "b.html")], include_plotlyjs="cdn")
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()
    assert fig.data[0].uid is None  # the caller's figure is not changed
    if shutil.which("chromium") is None:
        pytest.skip("no Chromium for kaleido: SVG export not available here")
    figio.write_files([(fig, tmp_path / "a.svg")])
    figio.write_files([(fig, tmp_path / "b.svg")])
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_figio_rejects_unknown_extension(tmp_path):
    import plotly.graph_objects as go

    from ctrlmem.plots import figio

    with pytest.raises(ValueError, match=r"\.html, \.png, \.svg or \.pdf"):
        figio.write_file(go.Figure(), tmp_path / "x.jpg")
    assert not (tmp_path / "x.jpg").exists()


# -- gpu-replay ------------------------------------------------------------------------------

def test_shipped_replay_is_the_measured_file():
    """The repository's copy of the H200 rank replay is the measured file, unchanged."""
    if not SHARED_REPLAY.is_file():
        pytest.skip("reference data not beside the clone")
    assert json.loads(gr.default_replay_path().read_text()) == json.loads(SHARED_REPLAY.read_text())


@pytest.fixture
def small_table4(monkeypatch):
    """Table 4's grid cut to two m per model (the replay's m = 2p and 16p) to keep tests fast."""
    setup = {k: (p, mb, (2 * p, 16 * p)) for k, (p, mb, _ms) in rp.paper.TABLE4_SETUP.items()}
    monkeypatch.setattr(rp.paper, "TABLE4_SETUP", setup)


@pytest.mark.slow
def test_gpu_replay_memory_ratios_and_labels(small_table4):
    """The measured ratios of the H200 replay (V-Min 0.40 / 0.39 / 0.39, V-Half 0.60 / 0.57 / 0.55,
    V-ZB 1.07 / 1.04 / 1.03 of 1F1B for 9.6B / 21B / 38.5B), every cell labelled measured or predicted."""
    t = rp.build_table("gpu-replay", quick=True)
    assert t.grid
    ratio = {(c.row.split(" ")[0], c.column): c.ours for c in t.cells if c.group.startswith("Activation memory / 1F1B's (")}
    expected = {"V-Min": (0.40, 0.39, 0.39), "V-Half": (0.60, 0.57, 0.55), "V-ZB": (1.07, 1.04, 1.03)}
    for method, values in expected.items():
        for model, want in zip(("9.6B", "21B", "38.5B"), values):
            assert ratio[(model, method)] == pytest.approx(want, abs=0.005), (model, method)
    for c in t.cells:
        assert c.how.startswith(("measured on NVIDIA H200 (rank replay)", "predicted from NVIDIA H200 pass costs")), c
    thr = [c for c in t.cells if c.group.startswith("Throughput")]
    assert thr and all(c.how.startswith("predicted") and 0.8 < c.ours < 2.0 for c in thr)
    assert any(c.paper != rp.paper.NOT_RECOVERED for c in thr)  # the 38.5B m = 512 MFU cells of Table 4
    md = t.to_markdown()
    assert "every cell: measured on NVIDIA H200 (rank replay)" in md or "] measured on NVIDIA H200 (rank replay)" in md


def test_gpu_replay_reads_a_users_file(tmp_path, small_table4):
    """--replay FILE: a user's own replay (another GPU, one model, devices 0 and p − 1 missing) gives
    memory cells labelled with that GPU and no throughput cells (pass costs of the end stages unknown)."""
    data = json.loads(gr.default_replay_path().read_text())
    data["gpu"] = "NVIDIA A100-SXM4-80GB (81920 MiB), driver 1"
    data["rows"] = [r for r in data["rows"] if r["model"] == "21b" and r.get("tag") == "paper-p" and r["device"] == 1]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    t = rp.build_table("gpu-replay", quick=True, replay=path)
    assert t.cells and all(c.how.startswith("measured on NVIDIA A100-SXM4-80GB (rank replay)") for c in t.cells)
    assert not [c for c in t.cells if c.group.startswith("Throughput")]


@pytest.mark.slow
def test_gpu_replay_reads_what_ctrlmem_replay_writes(tmp_path):
    """The file `ctrlmem replay` writes (here on the CPU, tiny model) is read as is: memory cells
    labelled "measured on CPU (rank replay)", none claiming a GPU."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "replay", "--model", "tiny", "-p", "4", "--schedules",
                           "1f1b,v-half", "--devices", "0,3", "--device", "cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    if proc.returncode != 0 and "invalid choice: 'replay'" in proc.stderr:
        pytest.skip("`ctrlmem replay` is not in this checkout")
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    t = rp.build_table("gpu-replay", quick=True, replay=files[0])
    assert t.cells and all(c.how.startswith("measured on CPU (rank replay)") for c in t.cells)
    ratio = next(c for c in t.cells if c.column.startswith("V-Half: theory"))
    assert ratio.ours == pytest.approx(ratio.paper, rel=0.02)  # saved bytes follow the schedule's theory


def test_gpu_replay_bad_file_is_a_clear_error(tmp_path):
    """A file without rows, or a row without its fields, is named in one line; the CLI exits 2."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"model": "9.6b"}]}))
    with pytest.raises(ValueError, match="row 0 lacks p, m, schedule"):
        gr.load_replay(bad)
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "reproduce", "--only", "gpu-replay", "--replay",
                           str(bad), "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "row 0 lacks" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_replay_costs_fill_unreplayed_stages_with_the_interior_mean():
    rows = [r for r in json.loads(gr.default_replay_path().read_text())["rows"]
            if r["model"] == "9.6b" and r["schedule"] == "v-half" and r.get("tag") == "paper-p"]
    c = gr.replay_costs(rows, 32)
    interior = [float(r["pass_times_s"][s]["F"]["median"]) for r in rows for s in r["pass_times_s"] if s not in ("0", "31")]
    assert c.f[5] == pytest.approx(sum(interior) / len(interior))
    assert c.f[0] == pytest.approx(rows[0]["pass_times_s"]["0"]["F"]["median"])
    assert gr.replay_costs([r for r in rows if r["device"] != 0], 32) is None


# -- claims ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_claims_give_a_verdict_per_claim(tmp_path, small_table4):
    """One line per claim with a valid verdict, a source in the paper, evidence and how; without the
    Fig. 7/9/10 curve data those lines say 'cannot be checked here' and name the artifact to run."""
    t = rp.build_table("claims", quick=True, out=tmp_path)
    assert len(t.claims) >= 12
    assert {c.verdict for c in t.claims} <= set(claims_mod.VERDICTS)
    for c in t.claims:
        assert c.source and c.evidence and c.how and c.ours
    missing = [c for c in t.claims if "Fig. 7" in c.source or "Fig. 9" in c.source or "Fig. 10" in c.source]
    assert len(missing) == 3 and all(c.verdict == "cannot be checked here" and "--only fig" in c.ours for c in missing)
    md = t.to_markdown()
    assert md.count("\n| ") == len(t.claims) + 1 and "**reproduced**" in md


def test_claim_verdict_follows_its_evidence(tmp_path):
    """The Fig. 10 claim: 'reproduced' when V ≤ ZB at every limit of every panel, 'partly' when V is
    above ZB at a few (panel, limit) pairs (named in the finding), 'not reproduced' when at many."""
    limits = [0.125 * k for k in range(1, 9)]  # 8 limits up to 1.0

    def panel(above=()):
        return {"p": 8, "v": [{"limit": x, "bubble_rate": 0.3 if x in above else 0.1} for x in limits],
                "zb": [{"limit": x, "bubble_rate": 0.2} for x in limits]}

    def verdict(*panels):
        (tmp_path / "fig10.json").write_text(json.dumps({"quick": True, "panels": list(panels)}))
        return claims_mod.claim_fig10_v_below_zb(tmp_path)

    assert verdict(panel(), panel()).verdict == "reproduced"
    few = verdict(panel(above=(0.125,)), panel())  # 1 of 16 pairs: at limit 1/p
    assert few.verdict == "partly" and "limit 1/p in 1 panel," in few.ours
    assert verdict(panel(above=limits[:4]), panel()).verdict == "not reproduced"  # 4 of 16 pairs
    with pytest.raises(ValueError, match="verdict must be one of"):
        claims_mod.Claim("c", "s", "maybe", "o", "e", "h")


def _setup_clean_filter() -> list[str]:
    """The nbstripout clean command scripts/setup.sh configures, as an argument list."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    match = re.search(r'git config filter\.nbstripout\.clean "\.venv/bin/python (-m nbstripout[^"]*)"', text)
    assert match, "scripts/setup.sh does not configure the nbstripout clean filter"
    return match.group(1).split()


@pytest.mark.parametrize("name", ["20_paper_tables", "22_schedule_figures"])
def test_running_a_notebook_does_not_dirty_it(name):
    """What JupyterLab saves after a run (outputs, execution counts, the kernel's language_info)
    goes through setup.sh's nbstripout filter back to the committed bytes; .gitattributes applies it."""
    pytest.importorskip("nbstripout")
    assert "*.ipynb filter=nbstripout" in (REPO / ".gitattributes").read_text()
    path = REPO / "notebooks" / f"{name}.ipynb"
    nb = json.loads(path.read_text())
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = i + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7", "file_extension": ".py"}
    executed = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    proc = subprocess.run([sys.executable, *_setup_clean_filter(), "-t"], input=executed, capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == path.read_text()
