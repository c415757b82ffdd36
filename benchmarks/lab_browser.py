"""Drive the explorer notebook in a real JupyterLab with headless Chromium, and time updates
end to end: from a widget change in the page to both plots painted and the page settled.

Used by ``tests/test_browser.py`` (slow) and ``benchmarks/bench_explorer.py --browser``.
JupyterLab runs from this Python's environment on a loopback port with a random token, in a
temporary folder holding a copy of the notebook; Python playwright drives ``/usr/bin/chromium``
(never a downloaded browser). Everything started here is stopped on exit, failures included.
:func:`lab_page` starts a server and a browser for one page; :func:`lab_server` starts them once
for several pages (``lab_page(..., lab=...)``: each notebook in a folder, kernel and browser
context of its own), which is how ``tests/test_browser.py`` runs its tests.

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


def notebook_with_parameters(source: str, dest: str, kernelspec: dict | None = None, **params) -> None:
    """Copy the notebook, overriding literals of its ``parameters`` cell (as papermill would),
    and its kernel when ``kernelspec`` (``{"name", "display_name", "language"}``) is given."""
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
    if kernelspec is not None:
        nb.setdefault("metadata", {})["kernelspec"] = kernelspec
    with open(dest, "w", encoding="utf-8") as fh:
        json.dump(nb, fh)


EXPLORER_READY = (".ctrlmem-diagram .js-plotly-plot .main-svg", ".ctrlmem-memory .js-plotly-plot .main-svg")
KERNEL_NAME = "Python 3 (ipykernel)"  # the display name of the python3 kernel the notebooks name


class Lab:
    """A JupyterLab server from this Python's environment (loopback port, random token, a
    temporary root folder) and a headless Chromium driven by playwright, both started by
    :func:`lab_server`. Several pages can be opened on it one after the other
    (:meth:`page`), each notebook in a sub-folder of its own with its own kernel and browser
    context: what a test module shares instead of starting a server and a browser per test."""

    def __init__(self, tmp: str, env: dict | None):
        self.tmp = tmp
        self.root = os.path.join(tmp, "lab")
        self.kernels_dir = os.path.join(tmp, "share", "kernels")  # on the server's JUPYTER_PATH
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.kernels_dir, exist_ok=True)
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.server: subprocess.Popen | None = None
        self.pw = self.browser = None
        self._pages = 0
        self._folders: dict[int, str] = {}  # id(page) -> its folder under the root

    # -- the server

    def _start(self) -> None:
        full_env = dict(os.environ, JUPYTER_RUNTIME_DIR=os.path.join(self.tmp, "runtime"), PYTHONUNBUFFERED="1",
                        **(self.env or {}))
        full_env["JUPYTER_PATH"] = os.pathsep.join(
            x for x in (os.path.join(self.tmp, "share"), os.environ.get("JUPYTER_PATH")) if x)
        self.log_path = os.path.join(self.tmp, "jupyter.log")
        self._log = open(self.log_path, "w")
        jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
        self.server = subprocess.Popen(
            [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             f"--LabApp.workspaces_dir={os.path.join(self.tmp, 'workspaces')}",
             f"--LabApp.user_settings_dir={os.path.join(self.tmp, 'settings')}",
             "--ServerApp.open_browser=False", *(["--allow-root"] if os.geteuid() == 0 else [])],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=self.root,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                _get(f"{self.base}/api/status?token={self.token}")
                break
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    with open(self.log_path) as fh:
                        raise RuntimeError("JupyterLab did not start:\n" + fh.read()[-3000:]) from None
                time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)

    def _stop(self) -> None:
        if self.browser is not None:
            with contextlib.suppress(Exception):
                self.browser.close()
        if self.pw is not None:
            with contextlib.suppress(Exception):
                self.pw.stop()
        if self.server is not None:
            if self.server.poll() is None:
                _stop_kernels(self.base, self.token)
                self.server.terminate()
                try:
                    self.server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.server.kill()
                    self.server.wait(timeout=10)
            self._log.close()

    # -- kernels

    def _sessions(self, folder: str) -> list[dict]:
        """The server's sessions of notebooks under ``folder`` (relative to the root)."""
        try:  # a generous timeout: a kernel left running would take the CPU until the module ends
            sessions = _get(f"{self.base}/api/sessions?token={self.token}", timeout=60) or []
        except OSError:
            return []
        return [s for s in sessions if str(s.get("path", "")).startswith(folder + "/")]

    def kernel_ids(self, page) -> list[str]:
        """The ids of the kernels of the notebook ``page`` shows (its folder's sessions)."""
        return [s["kernel"]["id"] for s in self._sessions(self._folders[id(page)]) if s.get("kernel")]

    def _stop_folder_kernels(self, folder: str) -> None:
        """Shut down the sessions (and so the kernels) of the notebooks under ``folder``; the
        server answers once each kernel has ended."""
        for s in self._sessions(folder):
            with contextlib.suppress(OSError):
                req = urllib.request.Request(f"{self.base}/api/sessions/{s['id']}?token={self.token}",
                                             method="DELETE")
                urllib.request.urlopen(req, timeout=60).close()

    def _kernelspec(self, env: dict) -> dict:
        """A python3 kernel with ``env`` added to its environment (a kernelspec on the server's
        JUPYTER_PATH, written on first use); the notebook's metadata names it."""
        label = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
        name = "ctrlmem-" + re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower()[:60]
        folder = os.path.join(self.kernels_dir, name)
        spec = {"name": name, "display_name": f"{KERNEL_NAME} {label}", "language": "python"}
        if not os.path.isdir(folder):
            os.makedirs(folder)
            with open(os.path.join(folder, "kernel.json"), "w", encoding="utf-8") as fh:
                json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                           "display_name": spec["display_name"], "language": "python",
                           "env": {str(k): str(v) for k, v in env.items()}, "metadata": {"debugger": True}}, fh)
        return spec

    # -- pages

    @contextlib.contextmanager
    def page(self, notebook: str, *, viewport=(1400, 1600), env: dict | None = None, path: str = "explore.ipynb",
             ready: tuple[str, ...] = EXPLORER_READY, files: dict[str, str] | None = None, **params):
        """Yield a playwright page (in a browser context of its own) with ``notebook``
        (parameters overridden by ``params``) open and every cell run, from a sub-folder of its
        own; on exit the context is closed and the notebook's kernel shut down, failures
        included. ``env``: added to the kernel's environment (through a kernelspec); the other
        arguments as for :func:`lab_page`."""
        self._pages += 1
        folder = f"page{self._pages}"
        work = os.path.join(self.root, folder)
        os.makedirs(os.path.dirname(os.path.join(work, path)), exist_ok=True)
        spec = self._kernelspec(env) if env else None
        notebook_with_parameters(notebook, os.path.join(work, path), kernelspec=spec, **params)
        for rel, source in (files or {}).items():
            os.makedirs(os.path.dirname(os.path.join(work, rel)) or work, exist_ok=True)
            shutil.copyfile(source, os.path.join(work, rel))
        kernel_name = spec["display_name"] if spec else KERNEL_NAME
        context = None
        try:
            context = self.browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=self.base)
            page = context.new_page()
            self._folders[id(page)] = folder
            page.set_default_timeout(180_000)
            # a workspace of its own: JupyterLab restores nothing another page left open
            page.goto(f"{self.base}/lab/workspaces/{folder}/tree/{folder}/{path}?token={self.token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=180_000)
            page.wait_for_selector(f".jp-StatusBar-Widget:has-text('{kernel_name} | Idle')", timeout=180_000)
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
            if context is not None:
                with contextlib.suppress(Exception):
                    context.close()
            self._stop_folder_kernels(folder)


@contextlib.contextmanager
def lab_server(*, workdir: str | None = None, env: dict | None = None):
    """Start JupyterLab and a headless Chromium and yield the :class:`Lab`; the server, every
    kernel and the browser are stopped on exit, failures included (a SIGTERM too, when this is
    the main thread). ``workdir``: the folder for the server's root, runtime files and log
    (default: a temporary folder, removed on exit); ``env``: added to the server's environment
    (and so to every kernel's)."""
    own_tmp = workdir is None
    tmp = tempfile.mkdtemp(prefix="ctrlmem-lab-") if own_tmp else workdir
    lab = Lab(tmp, env)
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM still cleans up
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        lab._start()
        yield lab
    finally:
        lab._stop()
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def lab_page(notebook: str, *, lab: Lab | None = None, workdir: str | None = None, viewport=(1400, 1600),
             env: dict | None = None, path: str = "explore.ipynb", ready: tuple[str, ...] = EXPLORER_READY,
             files: dict[str, str] | None = None, **params):
    """Yield a playwright page with ``notebook`` (parameters overridden by ``params``) open in
    JupyterLab and every cell run. Server, kernels and browser are stopped on exit.

    ``lab``: a running :class:`Lab` (:func:`lab_server`) to open the page on, in a sub-folder
    and browser context of its own (its kernel is shut down on exit, the server and browser
    keep running); without it a server and a browser are started for this page alone, in
    ``workdir`` (default: a temporary folder). ``env``: added to the kernel's environment.
    ``path``: where the notebook lies under its folder (a sub-folder like
    ``notebooks/x.ipynb`` gives it the repository's layout); ``files``: more files to copy
    there (``{relative path: source}``); ``ready``: selectors that must show before the page is
    handed over (default: the explorer's two plots; the probe that times updates is installed
    when they are the explorer's)."""
    kw = dict(viewport=viewport, path=path, ready=ready, files=files, **params)
    if lab is not None:
        if workdir is not None:
            raise ValueError("workdir is the server's folder: give it to lab_server, not with lab")
        with lab.page(notebook, env=env, **kw) as page:
            yield page
        return
    with lab_server(workdir=workdir, env=env) as own, own.page(notebook, **kw) as page:
        yield page


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
