"""One escaping rule for everything ctrlmem embeds in HTML (issue 31): a hostile name fed through
every HTML writer (the explorer's report and its ``draw --state`` form, ``ctrlmem draw -o
x.html``, the reproduction's tables) leaves the page's element structure exactly as a benign name
does: no element is injected, no script element is closed early, and the embedded JSON still reads
back the very name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

import ctrlmem as cm
from ctrlmem.util.htmlsafe import is_script_safe, script_json, text

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "</script><script>alert(1)</script><img/src=x/onerror=alert(2)><!--"
BENIGN = "benign-name-of-the-same-kind"


class _Tags(HTMLParser):
    """The start tags of a page, counted, and the bodies of its script elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: Counter = Counter()
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def tags(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    parser.close()
    return parser


def assert_same_structure(hostile_page: str, benign_page: str) -> None:
    """The property: the hostile page has exactly the benign page's elements, and the hostile
    text never appears raw (only escaped)."""
    h, b = tags(hostile_page), tags(benign_page)
    assert h.tags == b.tags, f"injected elements: {h.tags - b.tags}, lost: {b.tags - h.tags}"
    assert "img" not in h.tags
    assert HOSTILE not in hostile_page


def named(schedule: cm.Schedule, name: str) -> cm.Schedule:
    first, rest = schedule.to_text().split("\n", 1)
    return cm.Schedule.from_text(first.replace(f"schedule {schedule.name}", f"schedule {name}", 1) + "\n" + rest)


# ---------------------------------------------------------------------------------------------- the rule

def test_script_json_round_trips_and_never_ends_a_script():
    data = {"name": HOSTILE, "list": ["a<b", "c&d", "e>f", "\u2028"], "n": 1.5}
    body = script_json(data, sort_keys=True)
    assert is_script_safe(body) and "<" not in body and ">" not in body and "&" not in body
    assert json.loads(body) == data
    assert text(HOSTILE).count("<") == 0 and "&lt;/script&gt;" in text(HOSTILE)
    assert not is_script_safe("x </SCRIPT> y") and not is_script_safe("<!-- x")


def test_script_json_refuses_nan():
    with pytest.raises(ValueError):
        script_json(float("nan"))


# ---------------------------------------------------------------------------------------------- explorer report

def _report(name: str, tmp_path: Path) -> tuple[str, str, str]:
    """The explorer's HTML export of a view holding a loaded file named ``name``, and the page
    ``draw --state`` makes from that view's state (the same writer read back from JSON)."""
    from ctrlmem.explorer import views as V

    loaded = named(cm.build("zb-h1", 2, 4), name)
    view = V.compute(V.Settings(schedules=("1f1b",), num_devices=2, num_microbatches=4, loaded=(loaded,)))
    paths = V.export_view(view, "html", tmp_path / f"x{len(name)}")
    page = Path(paths[0]).read_text(encoding="utf-8")
    state = tmp_path / f"{len(name)}.state.json"
    V.write_state(view, state)
    out = tmp_path / f"drawn{len(name)}.html"
    V.draw_state(str(state), str(out))
    return page, out.read_text(encoding="utf-8"), paths[0]


def test_explorer_report_and_draw_state_inject_nothing(tmp_path):
    from ctrlmem.explorer import views as V

    hostile, hostile_drawn, hostile_path = _report(HOSTILE, tmp_path)
    benign, benign_drawn, _ = _report(BENIGN, tmp_path)
    assert_same_structure(hostile, benign)
    assert_same_structure(hostile_drawn, benign_drawn)
    # every script the report holds is safe, and the embedded state still names the schedule
    for body in tags(hostile).scripts[1:]:  # [0] is plotly.js itself
        assert is_script_safe(body)
    settings, _, _ = V.read_state(hostile_path)  # the report's own state reads back the very name
    assert settings.loaded[0].name == HOSTILE


# ---------------------------------------------------------------------------------------------- ctrlmem draw

def _draw(name: str, tmp_path: Path, view: str) -> str:
    src = tmp_path / f"s{len(name)}.txt"
    src.write_text(named(cm.build("1f1b", 2, 4), name).to_text())
    out = tmp_path / f"d{len(name)}-{view}.html"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "ctrlmem.cli", "draw", str(src), "--compare", "zb-h1", "--view", view,
                           "-o", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out.read_text(encoding="utf-8")


@pytest.mark.parametrize("view", ["schedule", pytest.param("memory", marks=pytest.mark.slow),
                                  pytest.param("lifespans", marks=pytest.mark.slow)])  # --fast: one view
def test_cli_draw_html_injects_nothing(tmp_path, view):
    assert_same_structure(_draw(HOSTILE, tmp_path, view), _draw(BENIGN, tmp_path, view))


# ---------------------------------------------------------------------------------------------- reproduction tables

def _tables(name: str) -> list[str]:
    from ctrlmem.reproduce.claims import Claim, ClaimsTable
    from ctrlmem.reproduce.table import Cell, Table

    table = Table("t", name, name, cells=[Cell(name, name, 1.0, name, name, group=name)], notes=[name])
    grid = Table("g", name, name, cells=[Cell(name, name, 1.0, 2.0, name, group=name)], grid=True, legend=name)
    claims = ClaimsTable("c", name, name)
    claims.claims.append(Claim(name, name, "reproduced", name, f"[{name}](javascript:alert(3)) {name}", name))
    return [t.to_html() for t in (table, grid, claims)] + [t._repr_html_() for t in (table, grid, claims)]


def test_reproduction_tables_inject_nothing():
    for hostile, benign in zip(_tables(HOSTILE), _tables(BENIGN)):
        assert_same_structure(hostile, benign)
        assert "javascript:" not in "".join(v or "" for _, v in _attrs(hostile))


def _attrs(page: str) -> list[tuple[str, str | None]]:
    out: list = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            out.extend(attrs)

    P().feed(page)
    return out
