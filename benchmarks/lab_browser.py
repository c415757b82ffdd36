"""Drive the explorer notebook in a real JupyterLab with headless Chromium, and time updates
end to end: from a widget change in the page to both plots painted and the page settled.

Used by ``tests/test_browser.py`` (slow) and ``benchmarks/bench_explorer.py --browser``.
JupyterLab runs from this Python's environment on a loopback port with a random token, in a
temporary folder holding a copy of the notebook; Python playwright drives ``/usr/bin/chromium``
(never a downloaded browser). Everything started here is stopped on exit, failures included.

What is measured, in the page's own clock (``performance.now()``), from the input event that
commits the change (the Enter key of a typed value, the click on a checkbox; the typing before it
is the user's, not the explorer's: ``typing`` says how long it took):

* ``painted``: the first animation frame after the change in which both the diagram and the
  memory plot are new plotly graphs that have been drawn (plotly's ``_fullLayout`` is set and
  the diagram shows the expected device rows), i.e. the new plots are on screen;
* ``afterplot``: the last ``plotly_afterplot`` event of the new graphs (JupyterLab's plotly
  renderer redraws and resizes after its first draw);
* ``settled``: the end of the last long task (> 50 ms, the browser's Long Tasks API) after the
  change, once the page has been quiet for ``quiet_ms``: when the page responds again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def available() -> str | None:
    """Why the browser run cannot happen here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python playwright is not installed"
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM}"
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "jupyter")):
        return "jupyter is not installed in this environment"
    return None


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


def notebook_with_parameters(source: str, dest: str, **params) -> None:
    """Copy the notebook, overriding literals of its ``parameters`` cell (as papermill would)."""
    with open(source, encoding="utf-8") as fh:
        nb = json.load(fh)
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            lines = "".join(cell["source"]).splitlines()
            out = []
            for line in lines:
                key = line.split("=", 1)[0].strip()
                out.append(f"{key} = {params.pop(key)!r}" if key in params else line)
            out += [f"{k} = {v!r}" for k, v in params.items()]
            cell["source"] = "\n".join(out) + "\n"
            break
    with open(dest, "w", encoding="utf-8") as fh:
        json.dump(nb, fh)


EXPLORER_READY = (".ctrlmem-diagram .js-plotly-plot .main-svg", ".ctrlmem-memory .js-plotly-plot .main-svg")


@contextlib.contextmanager
def lab_page(notebook: str, *, workdir: str | None = None, viewport=(1400, 1600), env: dict | None = None,
             path: str = "explore.ipynb", ready: tuple[str, ...] = EXPLORER_READY,
             files: dict[str, str] | None = None, **params):
    """Yield a playwright page with ``notebook`` (parameters overridden by ``params``) open in
    JupyterLab and every cell run. Server, kernels and browser are stopped on exit.

    ``path``: where the notebook lies under the server's root (a sub-folder like
    ``notebooks/x.ipynb`` gives it the repository's layout); ``files``: more files to copy
    there (``{relative path: source}``); ``ready``: selectors that must show before the page is
    handed over (default: the explorer's two plots; the probe that times updates is installed
    when they are the explorer's)."""
    from playwright.sync_api import sync_playwright

    own_tmp = workdir is None
    tmp = tempfile.mkdtemp(prefix="ctrlmem-lab-") if own_tmp else workdir
    work = os.path.join(tmp, "lab")
    os.makedirs(os.path.dirname(os.path.join(work, path)), exist_ok=True)
    notebook_with_parameters(notebook, os.path.join(work, path), **params)
    for rel, source in (files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(work, rel)) or work, exist_ok=True)
        shutil.copyfile(source, os.path.join(work, rel))
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    full_env = dict(os.environ, JUPYTER_RUNTIME_DIR=os.path.join(tmp, "runtime"), PYTHONUNBUFFERED="1",
                    **(env or {}))
    log_path = os.path.join(tmp, "jupyter.log")
    log = open(log_path, "w")
    jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
    server = subprocess.Popen(
        [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
         f"--LabApp.workspaces_dir={os.path.join(tmp, 'workspaces')}",
         f"--LabApp.user_settings_dir={os.path.join(tmp, 'settings')}",
         "--ServerApp.open_browser=False", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=work,
    )
    pw = browser = None
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM still cleans up
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    with open(log_path) as fh:
                        raise RuntimeError("JupyterLab did not start:\n" + fh.read()[-3000:]) from None
                time.sleep(0.5)
        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
        page.set_default_timeout(180_000)
        page.goto(f"{base}/lab/tree/{path}?token={token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=180_000)
        page.wait_for_selector(".jp-StatusBar-Widget:has-text('Python 3 (ipykernel) | Idle')", timeout=180_000)
        for attempt in range(3):  # a click that lands before the kernel connection is up: retry
            page.click(".jp-NotebookPanel .jp-Cell >> nth=0")
            page.click(".lm-MenuBar-itemLabel:text-is('Run')")
            page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
            try:
                page.wait_for_selector(".jp-InputArea-prompt:has-text('[1]')", timeout=40_000)
                break
            except Exception:
                if attempt == 2:
                    raise
        for selector in ready:
            page.wait_for_selector(selector, timeout=300_000)
        news = page.locator(".jp-toast-button:text-is('No')")
        if news.count():
            news.first.click()  # the "Jupyter news?" toast would cover the plots
        if tuple(ready) == EXPLORER_READY:
            install_probe(page)
        yield page
    finally:
        if browser is not None:
            with contextlib.suppress(Exception):
                browser.close()
        if pw is not None:
            with contextlib.suppress(Exception):
                pw.stop()
        if server.poll() is None:
            _stop_kernels(base, token)
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        log.close()
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


_PROBE = """
() => {
  if (window.__cm) return;
  const cm = window.__cm = {longtasks: [], t0: null, commit: null, painted: null, afterplot: [], want: null};
  // the change is committed by the last Enter or click before the plots are painted
  const commit = e => { if (cm.t0 !== null && cm.painted === null && (e.type === 'click' || e.key === 'Enter'))
    cm.commit = performance.now(); };
  window.addEventListener('keydown', commit, true);
  window.addEventListener('click', commit, true);
  try {
    new PerformanceObserver(list => { for (const e of list.getEntries())
      cm.longtasks.push([e.startTime, e.startTime + e.duration]); }).observe({entryTypes: ['longtask']});
  } catch (e) { cm.noLongtasks = String(e); }
  cm.graphs = () => ['.ctrlmem-diagram', '.ctrlmem-memory'].map(
    sel => document.querySelector(sel + ' .js-plotly-plot'));
  const hook = gd => {  // every afterplot of every graph, with its time
    if (gd && gd.on && !gd.__cmHooked) {
      gd.__cmHooked = true;
      gd.on('plotly_afterplot', () => { gd.__cmLast = performance.now(); cm.afterplot.push(gd.__cmLast); });
    }
  };
  cm.arm = (want) => {
    for (const gd of cm.graphs()) if (gd) { gd.__cmOld = true; hook(gd); }
    cm.want = want; cm.painted = null; cm.commit = null; cm.afterplot = []; cm.t0 = performance.now();
    const frame = () => {
      const gds = cm.graphs();
      gds.forEach(hook);
      // a graph is updated when it is a new element (a renderer that replaces its output) or
      // when it was redrawn in place after the change (Plotly.react)
      const fresh = gds.every(gd => gd && gd._fullLayout && gd.querySelector('.main-svg')
                                    && (!gd.__cmOld || (gd.__cmLast || 0) > cm.t0));
      const ticks = fresh ? Array.from(gds[0].querySelectorAll('.ytick text')).map(e => e.textContent) : [];
      if (fresh && (cm.want === null || ticks.includes(cm.want))) { cm.painted = performance.now(); return; }
      requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  };
}
"""


def install_probe(page) -> None:
    page.evaluate(_PROBE)


def _commit(page, locator, value: str) -> None:
    locator.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)


def _exact(label: str):
    return re.compile("^" + re.escape(label) + "$")


def slider_readout(page, label: str):
    slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text=_exact(label)))
    return slider.locator(".widget-readout")


def timed_change(page, action, *, expect_tick: str | None = None, quiet_ms: int = 1500,
                 timeout_s: float = 300) -> dict:
    """Do ``action(page)`` (which must end with the keystroke or click that commits the change)
    and return the end-to-end times in seconds from that commit: ``painted``, ``afterplot``,
    ``settled``; ``typing``: from the action's start to the commit; ``python``: the explorer's
    own timer text. ``expect_tick``: a device label (``"d31"``) the new diagram must show."""
    page.evaluate("want => window.__cm.arm(want)", expect_tick)
    action(page)
    page.wait_for_function("() => window.__cm.painted !== null", timeout=timeout_s * 1000, polling=100)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # settled: no long task for quiet_ms
        state = page.evaluate(
            "q => { const c = window.__cm, now = performance.now();"
            " const last = c.longtasks.filter(t => t[1] > c.t0).reduce((a, t) => Math.max(a, t[1]), c.painted);"
            " return {quiet: now - last > q, last: last, t0: c.commit === null ? c.t0 : c.commit, armed: c.t0,"
            " painted: c.painted,"
            " afterplot: c.afterplot.length ? Math.max(...c.afterplot) : null}; }", quiet_ms)
        if state["quiet"]:
            break
        time.sleep(0.25)
    timer = page.locator(".ctrlmem-timing").inner_text() if page.locator(".ctrlmem-timing").count() else ""
    t0 = state["t0"]
    return {
        "typing": (t0 - state["armed"]) / 1e3,
        "painted": (state["painted"] - t0) / 1e3,
        "afterplot": None if state["afterplot"] is None else (state["afterplot"] - t0) / 1e3,
        "settled": (max(state["last"], state["painted"]) - t0) / 1e3,
        "python": timer.strip(),
    }


def set_slider(value: int, label: str):
    """An action for :func:`timed_change`: type ``value`` into a slider's readout, then Enter."""
    def act(page):
        _commit(page, slider_readout(page, label), str(value))
        page.keyboard.press("Enter")
    return act


def set_number(value: float, label: str):
    """An action: type ``value`` into the float field labelled ``label``, then Enter."""
    def act(page):
        box = page.locator(".widget-text", has=page.locator(".widget-label", has_text=_exact(label))).locator("input")
        _commit(page, box.first, repr(value))
        page.keyboard.press("Enter")
    return act
