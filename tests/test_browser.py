"""The explorer in a real browser: JupyterLab from the project venv on a loopback port, the
explorer notebook opened in headless Chromium (Python playwright driving /usr/bin/chromium),
all cells run, then widgets changed by typing into them as a user would. Checks that the
diagram is redrawn with the new device rows, that no drawn label is wider (or taller) than its
box, and that a p=32, m=256 update is drawn as an overview; prints the end-to-end times (widget
change → both plots painted, and → page responsive again). Screenshots go to
$CTRLMEM_SCREENSHOTS (default: <tmp>/ctrlmem-browser/; never into the checkout). The harness (server, browser, timing) is benchmarks/lab_browser.py; it stops
the server, kernels and browser even on failure.

Slow (starts a server, a kernel and a browser): run with ``pytest -m slow tests/test_browser.py``.
"""

import os
import sys
import tempfile

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # stops itself even if a wait hangs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import lab_browser as lb  # noqa: E402

NOTEBOOK = os.path.join(ROOT, "notebooks", "01_explore_schedules.ipynb")
SHOT_DIR = os.environ.get("CTRLMEM_SCREENSHOTS") or os.path.join(tempfile.gettempdir(), "ctrlmem-browser")

# Every drawn box label (plotly puts a bar's path and its text in one g.point) with its box.
_LABELS = """
() => Array.from(document.querySelectorAll('.ctrlmem-diagram g.point')).flatMap(g => {
  const text = g.querySelector('text'), path = g.querySelector('path');
  if (!text || !path || !text.textContent || getComputedStyle(text).display === 'none') return [];
  const t = text.getBoundingClientRect(), b = path.getBoundingClientRect(), own = text.getBBox();
  return [{label: text.textContent, tw: t.width, th: t.height, bw: b.width, bh: b.height,
           shrunk: t.width < own.width - 0.5, inside: t.left >= b.left - 0.5 && t.right <= b.right + 0.5}];
})
"""


def _ticks(page) -> list[str]:
    return page.eval_on_selector_all(".ctrlmem-diagram .ytick text", "els => els.map(e => e.textContent)")


def _shot(page, name: str) -> str:
    os.makedirs(SHOT_DIR, exist_ok=True)
    path = os.path.join(SHOT_DIR, name)
    page.locator(".ctrlmem-explorer").scroll_into_view_if_needed()
    page.screenshot(path=path, full_page=True)
    return path


def test_explorer_in_jupyterlab_redraws_fast_with_labels_inside_their_boxes(tmp_path):
    why = lb.available()
    if why:
        pytest.skip(why)
    times = {}
    with lb.lab_page(NOTEBOOK, workdir=str(tmp_path), schedules=["1f1b", "v-half"],
                     num_devices=4, num_microbatches=12) as page:
        try:
            ticks = _ticks(page)
            assert set(ticks) == {f"d{d}" for d in range(4)}, ticks
            # a p change typed into the slider's readout, as a user would
            times["p 4->6"] = lb.timed_change(page, lb.set_slider(6, "p (devices)"), expect_tick="d5")
            assert lb.slider_readout(page, "p (devices)").inner_text().strip() == "6"
            ticks = _ticks(page)
            assert set(ticks) == {f"d{d}" for d in range(6)}, ticks
            table = page.locator(".ctrlmem-stats").inner_text()
            assert "1f1b" in table and "v-half" in table and "6, 5, 4, 3, 2, 1" in table

            # the label rule, checked on what Chromium drew: p=8, m=32 with F=6, B=8, W=4
            page_set = [lb.set_slider(8, "p (devices)"), lb.set_slider(32, "m (microbatches)")]
            for act in page_set:
                times.setdefault("p=8, m=32 (new p, m)", lb.timed_change(page, act, expect_tick="d7"))
            for value, label in ((6.0, "F"), (8.0, "B"), (4.0, "W")):
                times[f"{label} -> {value:g}"] = lb.timed_change(page, lb.set_number(value, label), expect_tick="d7")
            labels = page.evaluate(_LABELS)
            assert labels, "no label drawn at p=8, m=32"
            # the rule: the whole label, at full size, inside its box with 3 px to spare on each side
            too_big = [x for x in labels if x["tw"] + 6 > x["bw"] + 0.5 or x["th"] > x["bh"] + 0.5
                       or x["shrunk"] or not x["inside"]]
            assert not too_big, too_big[:5]
            assert "Fastest:" in page.locator(".ctrlmem-verdict").inner_text()
            assert "W+2B" in page.locator(".ctrlmem-formula").inner_text()
            cmd = page.locator(".ctrlmem-command input").input_value()
            assert cmd.startswith("ctrlmem draw 1f1b --compare v-half -p 8 -m 32 --costs 6,8,4,0")
            page.click(".ctrlmem-copy")  # "copy as command" puts exactly that line on the clipboard
            page.wait_for_selector(".ctrlmem-copy:text-is('copied')", timeout=10_000)
            assert page.evaluate("() => navigator.clipboard.readText()") == cmd
            _shot(page, "explorer_p8_m32.png")
            page.locator(".ctrlmem-diagram").screenshot(path=os.path.join(SHOT_DIR, "explorer_p8_m32_diagram.png"))

            # a real size: p=32, m=256 becomes a raster overview, still redrawn
            times["p=32"] = lb.timed_change(page, lb.set_slider(32, "p (devices)"), expect_tick="d31")
            times["m=256 (new m)"] = lb.timed_change(page, lb.set_slider(256, "m (microbatches)"), expect_tick="d31")
            times["comm at p=32, m=256"] = lb.timed_change(page, lb.set_number(0.2, "comm"), expect_tick="d31")
            assert page.locator(".ctrlmem-diagram .heatmaplayer").count() >= 1
            assert page.locator(".ctrlmem-diagram .js-plotly-plot").bounding_box()["height"] > 300
            assert page.locator(".ctrlmem-memory .js-plotly-plot").bounding_box()["height"] > 300
            _shot(page, "explorer_p32_m256.png")
            page.locator(".ctrlmem-memory").screenshot(path=os.path.join(SHOT_DIR, "explorer_p32_m256_memory.png"))
            # the window grows: both plots keep their height and follow the width
            before = page.locator(".ctrlmem-diagram .js-plotly-plot").bounding_box()
            page.set_viewport_size({"width": 1900, "height": 1700})
            page.wait_for_timeout(2000)
            for sel in (".ctrlmem-diagram .js-plotly-plot", ".ctrlmem-memory .js-plotly-plot"):
                box = page.locator(sel).bounding_box()
                assert box["height"] > 300, (sel, box)
            assert page.locator(".ctrlmem-diagram .js-plotly-plot").bounding_box()["width"] > before["width"] + 200
        except Exception:
            _shot(page, "failure.png")
            raise
    for what, t in times.items():
        print(f"end to end, {what}: painted {t['painted']:.2f} s, settled {t['settled']:.2f} s ({t['python']})")
