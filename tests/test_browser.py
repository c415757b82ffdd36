"""The explorer in a real browser: JupyterLab from the project venv on a loopback port, the
explorer notebook opened in headless Chromium (Python playwright driving /usr/bin/chromium),
all cells run, p changed with the slider, and the diagram re-rendered with the new number of
device rows. Leaves a screenshot in build/browser/ (git-ignored).

Slow (starts a server, a kernel and a browser): run with ``pytest -m slow tests/test_browser.py``.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]  # stops itself even if a wait hangs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "01_explore_schedules.ipynb")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOT_DIR = os.path.join(ROOT, "build", "browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # loopback only
        return json.loads(resp.read() or b"null")


def _stop_kernels(base: str, token: str) -> None:
    try:
        for k in _get(f"{base}/api/kernels?token={token}"):
            req = urllib.request.Request(f"{base}/api/kernels/{k['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=5).close()
    except OSError:
        pass


def _device_ticks(page) -> list[str]:
    return page.eval_on_selector_all(".ctrlmem-diagram .ytick text", "els => els.map(e => e.textContent)")


def test_explorer_notebook_in_jupyterlab(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
    if not os.path.exists(jupyter):
        pytest.skip("jupyter is not installed in this environment")
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / "explore.ipynb")  # the committed notebook stays output-free
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "jupyter.log", "w")
    server = subprocess.Popen(
        [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
         "--ServerApp.open_browser=False", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(work),
    )
    browser = None
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("JupyterLab did not start:\n" + open(tmp_path / "jupyter.log").read()[-3000:])
                time.sleep(0.5)
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(120_000)
            try:
                _drive(page, base, token)
            except Exception:
                os.makedirs(SHOT_DIR, exist_ok=True)
                page.screenshot(path=os.path.join(SHOT_DIR, "failure.png"))
                raise
            browser.close()
            browser = None
    finally:
        if browser is not None:
            try:
                browser.close()
            except Exception:  # noqa: BLE001  (best effort while failing)
                pass
        if server.poll() is None:
            _stop_kernels(base, token)
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        log.close()


def _drive(page, base: str, token: str) -> None:
    """Open the notebook, run all cells, move the p slider, check the redraw, screenshot."""
    page.goto(f"{base}/lab/tree/explore.ipynb?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    # the kernel is connected once the status bar says so
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('Python 3 (ipykernel) | Idle')", timeout=120_000)
    for attempt in range(3):  # a click that lands before the kernel connection is lost: retry
        page.click(".jp-NotebookPanel .jp-Cell >> nth=0")
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        try:
            page.wait_for_selector(".jp-InputArea-prompt:has-text('[1]')", timeout=30_000)
            break
        except Exception:  # noqa: BLE001  (playwright's TimeoutError)
            if attempt == 2:
                raise
    page.wait_for_selector(".ctrlmem-diagram .js-plotly-plot .ytick text", timeout=120_000)
    ticks = _device_ticks(page)
    p0 = 4  # the notebook's parameters cell
    assert ticks and set(ticks) == {f"d{d}" for d in range(p0)}, ticks
    panels = len(ticks) // p0

    # move the p slider two steps to the right with the keyboard, as a user would
    slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="p (devices)"))
    handle = slider.locator(".noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    handle.press("ArrowRight")
    handle.dispatch_event("change")
    p1 = p0 + 2
    page.wait_for_function(
        "n => Array.from(document.querySelectorAll('.ctrlmem-diagram .ytick text'))"
        ".some(e => e.textContent === 'd' + (n - 1))", arg=p1, timeout=60_000)
    readout = slider.locator(".widget-readout").inner_text().strip()
    assert readout == str(p1)
    ticks = _device_ticks(page)
    assert set(ticks) == {f"d{d}" for d in range(p1)} and len(ticks) == panels * p1, ticks
    # the stats table follows too: one peak per device in the row
    table = page.locator(".ctrlmem-stats").inner_text()
    assert "1f1b" in table and ", ".join(str(x) for x in range(p1, 0, -1)) in table
    news = page.locator(".jp-toast-button:text-is('No')")
    if news.count():
        news.first.click()  # the "Jupyter news?" toast would cover the memory plot
    page.locator(".ctrlmem-diagram").scroll_into_view_if_needed()
    os.makedirs(SHOT_DIR, exist_ok=True)
    page.screenshot(path=os.path.join(SHOT_DIR, "explorer.png"))
    assert os.path.getsize(os.path.join(SHOT_DIR, "explorer.png")) > 10_000
