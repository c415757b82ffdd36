"""What the reproduction notebooks show as they run: progress lines while a cell works, and a
summary whose links resolve from the notebook's folder (JupyterLab resolves them there)."""

import io
import logging
import os

from ctrlmem import reproduce as rp


def test_progress_prints_ctrlmem_lines_while_the_block_runs_and_then_stops():
    stream = io.StringIO()
    log = logging.getLogger("ctrlmem.reproduce.report")
    with rp.progress(stream):
        rp.build_table("table8", quick=True, out=os.devnull)
        log.info("inside")
    log.info("after")  # the handler is gone: a second run of the cell does not print twice
    lines = stream.getvalue().splitlines()
    assert any(line.endswith("table8: building (quick)") for line in lines)
    assert any("table8: exact" in line for line in lines)
    assert lines[-1].endswith("inside") and not any("after" in line for line in lines)
    assert all(line[2] == ":" and line[5] == ":" for line in lines)  # HH:MM:SS first


def test_summary_links_resolve_from_the_notebook_folder(tmp_path):
    """Links to the tables written become relative to the notebook's folder; claims.md, not
    written by this run, points to the committed copy; a link with no file anywhere is text."""
    out = tmp_path / "build" / "notebooks" / "20"
    notebooks = tmp_path / "notebooks"
    figures = tmp_path / "figures"
    for folder in (out, notebooks, figures):
        folder.mkdir(parents=True)
    (figures / "claims.md").write_text("# claims\n")
    tables = [rp.build_table(n, quick=True, out=out) for n in ("table2", "table8")]
    rp.write_report(out, tables, quick=True, partial=True)
    (out / "REPRODUCTION.md").write_text((out / "REPRODUCTION.md").read_text()
                                         + "| [gone](nowhere.md) | [CALC] stays | [web](https://x.org/a.md) |\n")
    text = rp.summary_markdown(out, base=notebooks, fallback=figures)
    assert "](../build/notebooks/20/table2.md)" in text and "](../build/notebooks/20/table8.md)" in text
    assert "[claims.md](../figures/claims.md)" in text
    assert "| gone |" in text and "[CALC] stays" in text and "[web](https://x.org/a.md)" in text
    import re

    for target in re.findall(r"\]\(([^)]+)\)", text):
        if "://" not in target:
            assert (notebooks / target).resolve().is_file(), target
