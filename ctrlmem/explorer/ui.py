"""The schedule explorer: ipywidgets around :mod:`ctrlmem.explorer.views` (``ui.explorer()`` in a notebook).

How an edit is answered:

1. At once, everything on screen is marked pending (the explorer carries the CSS class
   ``ctrlmem-pending``: the message, verdict, table, closed forms, timer and plots dim, an
   "updating…" note names the new settings).
2. :func:`ctrlmem.explorer.views.compute` with ``adapt=False`` re-simulates what the explorer already
   has under the new settings: cost-free generators are cached, and a cost-adapted schedule
   (V-Min, V-Half, V-ZB, 1F1B-V, the budgeted ``v-shape`` / ``zb``) not yet built for these
   costs is shown with its latest order, re-simulated, its table row saying so. This takes a
   few hundred milliseconds at p = 32, m = 256, and is drawn as one new *state*: every element
   carries ``data-ctrlmem-state`` with its number, and the pending mark goes when the browser
   reports the plots of that state drawn.
3. The builds for the new costs run in the background, in one worker process, one at a time
   (:mod:`ctrlmem.explorer.background`; a newer edit replaces what an older one asked for and stops a
   build it no longer needs), with a progress line; each finished build is swapped in as a
   new state, its row marked "adapted for these costs".

Several edits queued in the kernel are answered once (the work runs on the kernel's event loop
after the queued widget messages). Every widget callback runs on the explorer's home thread, the
one whose loop made it (:meth:`Explorer._on_home`): ipykernel 7 takes widget messages in a
subshell thread with a loop of its own, and those are handed over, so the explorer's state has one
writer and the last edit wins. Without an event loop (a script, the tests), every edit is
answered at once and :meth:`Explorer.wait` applies the background builds.

The "optimize (solver)" option improves the schedule chosen in "improve" (default: the first
selected one other than 1F1B, which is often optimal already) with
:func:`ctrlmem.improve` for the seconds given, in the same background worker, and shows the
improved order right below it (``NAME+improved``, its row naming the makespan before and after,
the lower bound and the gap).

The memory levers (docs/theory.md §13) apply to every registered schedule ticked, as
``cm.build(..., recompute=, offload=)`` applies them: "recompute" (none, selective, full) and
"offload" (a fraction of each forward's activation, with the copy's time per ``a``); the diagram
draws the ``R`` passes in their own colour, and the 1F1B reference stays without levers.

Below the two main plots the explorer compares the shown schedules (peak memory over time
overlaid, memory against speed-up with the Pareto frontier, the bubble-vs-budget steps of
``v-shape`` and ``zb``, building blocks, lifespans, and the step grid: one schedule as device ×
step cells with its sends between devices as arrows, as torch's pipelining visualizer draws it).
Exports (PNG/SVG/PDF of the diagram above
the memory curves, the HTML report, torch CSV, the simulated Chrome / Perfetto trace, the state file) are offered as downloads in the
browser and written into ``export_dir`` (default ``build/explorer`` under the kernel's working
directory, the notebook's folder in JupyterLab; ``None`` writes nothing); static images come
from one Chromium kept open in a thread (:mod:`ctrlmem.plots.render`), so the widgets stay live.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import html
import io
import json
import logging
import os
import tempfile
import threading
import time
import zipfile
from dataclasses import replace
from typing import Sequence


from ctrlmem.plots import figures as plot
from ctrlmem.explorer.background import BackgroundBuilds, Job, levered_name
from ctrlmem.explorer.views import EXPORT_KINDS, export_files, PLOTLY_MIME, BuildCache, Settings, StageCosts, View, command_line, comparison_specs, compute, default_schedules, export_view, formula_html, jsonable, messages_html, mime_bundle, read_state, report_html, save_view, slug, state_dict, static_figure, stats_html, stats_table, verdict
from ctrlmem.model.ir import Schedule
from ctrlmem.schedules import SCHEDULES
from ctrlmem.model.simulate import simulate
from ctrlmem.model.validate import ScheduleError
from ctrlmem.plots.render import ExportTimeout
from ctrlmem.planner.model import PRESET_NAMES
from ctrlmem.model.validate import validate
from ctrlmem.model.ir import _clean_text
from ctrlmem.explorer.views import order_levers, state_link, write_state
from ctrlmem.explorer.views import export_hints
from ctrlmem.plots.render import StaticRenderer
from ctrlmem.plots.figio import stabilize_svg
from ctrlmem.plots.plotview import plot_view_class, plotly_js
from ctrlmem.plots.render import settled_bytes
from ctrlmem.plots.trace import MeasuredRun, read_measured_trace
from ctrlmem.util.fileio import atomic_write, make_output_folder

__all__ = ["Settings", "View", "BuildCache", "compute", "stats_table", "export_view", "save_view", "jsonable", "Explorer",
           "explorer", "default_schedules", "COMPARISONS"]

log = logging.getLogger(__name__)

#: The comparison views under the main plots.
COMPARISONS = ("peak memory & speed-up", "bubble vs budget", "building blocks", "lifespans", "step grid", "none")
#: Microbatches the building-block view draws (the construction repeats after a few).
BLOCK_MICROBATCHES = 8
#: Seconds between two looks at the background builds (progress line, finished builds): the
#: worker takes its next job only when a look collects the last one's result, so this is also
#: the gap between two builds (16 budget builds at 0.4 s took 8.9 s at p = 16, m = 64).
TICK_SECONDS = 0.1
#: Budgets beyond 1 × 1F1B the bubble-vs-budget panel adds for a schedule whose bubble at 1.0
#: is still above ``SWEEP_BUBBLE_LEFT`` (more memory can still buy speed there).
SWEEP_BEYOND = (1.25, 1.5, 2.0)
SWEEP_BUBBLE_LEFT = 0.005
#: Seconds an edit waits for the next ones already queued in the kernel (answered together).
COALESCE_SECONDS = 0.02


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ScheduleError):
        return exc.reason
    msg = exc.args[0] if exc.args else str(exc)
    return str(msg).splitlines()[0] if str(msg) else type(exc).__name__


def _export_reason(kind: str, exc: BaseException | None) -> str:
    """One line on why an export failed: for an image, what Chromium (kaleido) did."""

    if exc is None:
        return "unknown error"
    if isinstance(exc, ExportTimeout) or kind not in ("png", "svg", "pdf"):
        return _reason(exc)
    text = str(exc.args[0]) if exc.args else ""
    detail = f": {text.splitlines()[0][:160]}" if text else ""
    return (f"Chromium (kaleido) did not draw the {kind.upper()} ({type(exc).__name__}{detail}); that Chromium "
            "was stopped and the next try starts a fresh one")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _tagged(state: int, body: str) -> str:
    """``body`` in a block that names the state it belongs to."""
    return f"<div class='ctrlmem-state' data-ctrlmem-state='{state}'>{body}</div>"


def _settings_summary(s: Settings) -> str:
    costs = plot.costs_label(s.costs(s.num_devices) if s.per_stage else s.costs())
    out = f"p={s.num_devices}, m={s.num_microbatches}, {costs}"
    if s.memory_limit is not None:
        out += f", budget {s.memory_limit:g} × 1F1B"
    return out


class Explorer:
    """The ipywidgets explorer. ``explorer.widget`` is the layout; ``explorer.view`` the
    :class:`View` on screen; every widget change calls :meth:`update` (deferred to the kernel's
    event loop when there is one, so queued edits are answered once).

    Args:
        settings: initial settings.
        export_dir: where exports are written besides the browser download (``None``: nowhere).
        max_devices, max_microbatches: slider ranges.
        style: ``{"diagram": {...}, "memory": {...}}`` keyword arguments for
            :func:`ctrlmem.plots.figures.schedule_spec` and :func:`ctrlmem.plots.figures.memory_spec`.
        background: adapt schedules to the costs in a background process (default); ``False``
            searches inside :meth:`update` (every edit then waits for it).
    """

    def __init__(self, settings: Settings | None = None, *, export_dir: str | None = "build/explorer",
                 max_devices: int = 32, max_microbatches: int = 256, style: dict | None = None,
                 background: bool = True):
        import ipywidgets as W  # noqa: PLC0415 - only inside Jupyter

        s = settings or Settings()
        self.style = style or {}
        self.export_dir = export_dir
        self.builds = BuildCache()
        self.background = BackgroundBuilds() if background else None
        self._renderer = None
        self.loaded: list[Schedule] = list(s.loaded)
        self.measured: list[MeasuredRun] = list(s.measured)
        self._pinned: dict[str, Schedule] = {}
        self._pinned_origins: dict[str, str] = {}
        self._state = 0
        self._flush_scheduled = False
        self._tick_handle = None
        # the home thread: every handler, timer and poll runs here (see Explorer._on_home)
        self._home_loop = _running_loop()
        self._home_thread = threading.get_ident()
        self._exports: list[tuple] = []
        self._block_cache: dict[tuple, dict] = {}
        self._sweep_sims: dict[tuple, object] = {}  # (build key, costs) -> SimResult of a budget point
        self._closed = False
        self.last_render_seconds = 0.0  # sending the last main plots (s)
        self._compare_seconds: float | None = None  # sending the comparisons, when a state of their own
        self._main_state, self._main_drawn = 0, None  # the state of the main plots shown, the browser's report
        self.view: View | None = None
        names = list(SCHEDULES)
        self._unknown = [n for n in s.schedules if n not in SCHEDULES]
        label = {"style": {"description_width": "initial"}}
        self.schedules = _checklist_class()(names, [n for n in s.schedules if n in SCHEDULES], dispatch=self._on_home)
        self.devices = W.IntSlider(value=s.num_devices, min=1, max=max(max_devices, s.num_devices),
                                   description="p (devices)", continuous_update=False, **label)
        self.microbatches = W.IntSlider(value=s.num_microbatches, min=1,
                                        max=max(max_microbatches, s.num_microbatches),
                                        description="m (microbatches)", continuous_update=False, **label)
        box = W.Layout(width="150px")
        self.f = W.FloatText(value=s.f, description="F", layout=box, **label)
        self.b = W.FloatText(value=s.b, description="B", layout=box, **label)
        self.w = W.FloatText(value=s.w, description="W", layout=box, **label)
        self.comm = W.FloatText(value=s.comm, description="comm", layout=box, **label)
        self.fb_overlap = W.BoundedFloatText(value=s.fb_overlap, min=0.01, max=1.0, step=0.05, description="F&B overlap",
                                             layout=W.Layout(width="180px"), **label)
        wide = W.Layout(width="230px")
        self.first_extra = W.FloatText(value=s.first_stage_extra, description="first-stage extra",
                                       layout=wide, **label)
        self.last_extra = W.FloatText(value=s.last_stage_extra, description="last-stage extra",
                                      layout=wide, **label)
        self.weights = W.Text(value=",".join(f"{x:g}" for x in s.stage_weights), description="per-stage weights",
                              placeholder="p numbers, model order, e.g. 1.3,1,1,1.6", continuous_update=False,
                              layout=W.Layout(width="420px"), **label)
        # per-stage costs given whole (a plan's winner, Settings.stage_costs): shown, not edited
        self._stage_costs = tuple(s.stage_costs)
        self.stage_note = W.HTML()
        self.stage_note.add_class("ctrlmem-stage-costs-note")
        self.clear_stage_costs = W.Button(description="use F, B, W instead", layout=W.Layout(width="170px"),
                                          tooltip="drop the given per-stage costs and use the F, B, W fields")
        self.clear_stage_costs.on_click(self._on_home(lambda _b: self._drop_stage_costs()))
        self.limit_on = W.Checkbox(value=s.memory_limit is not None, description="memory limit",
                                   indent=False, layout=W.Layout(width="110px"))
        self.limit = W.FloatSlider(value=s.memory_limit if s.memory_limit is not None else 0.5,
                                   min=0.05, max=2.0, step=0.05, description="× 1F1B peak",
                                   continuous_update=False, readout_format=".2f", **label)
        self.optimize_on = W.Checkbox(value=bool(s.optimize), description="optimize (solver)", indent=False,
                                      layout=W.Layout(width="140px"))
        self.optimize = W.BoundedFloatText(value=s.optimize or 10.0, min=1.0, max=600.0, description="seconds",
                                           layout=W.Layout(width="150px"), **label)
        self.improve = W.Dropdown(options=[("first other than 1f1b", "")] + [(n, n) for n in names],
                                  value=s.improve if s.improve in SCHEDULES else "", description="improve",
                                  layout=W.Layout(width="240px"), **label)
        self.improve.add_class("ctrlmem-improve")
        # the memory levers (docs/theory.md §13), applied to every registered schedule shown
        self.recompute = W.Dropdown(options=[("none", "none"), ("selective", "selective"), ("full", "full")],
                                    value=s.recompute if s.recompute in ("selective", "full") else "none",
                                    description="recompute", layout=W.Layout(width="200px"), **label)
        self.offload_on = W.Checkbox(value=s.offload is not None, description="offload", indent=False,
                                     layout=W.Layout(width="80px"))
        self.offload = W.BoundedFloatText(value=s.offload if s.offload is not None else 0.5, min=0.01, max=1.0,
                                          step=0.05, description="of each forward", layout=W.Layout(width="190px"),
                                          **label)
        self.offload_cost = W.BoundedFloatText(value=s.offload_cost, min=0.0, max=1e6, step=0.1,
                                               description="copy time per a", layout=W.Layout(width="190px"), **label)

        preset = _preset_of(s.model)
        self.model = W.Dropdown(options=[("none", "")] + [(n, n) for n in PRESET_NAMES.values()],
                                value=preset or "", description="model (GB axis)", layout=W.Layout(width="230px"),
                                **label)
        self.model_path = W.Text(value="" if preset or not s.model else s.model, continuous_update=False,
                                 placeholder="or a Hugging Face config.json (path)", description="",
                                 layout=W.Layout(width="300px"))
        self.model_mb = W.BoundedIntText(value=s.microbatch_size or 0, min=0, max=4096, description="microbatch",
                                         layout=W.Layout(width="160px"), **label)
        self.load_path = W.Text(placeholder="torch / torchtitan CSV, ctrlmem text, or a run's trace-measured.json",
                                description="load schedule", continuous_update=False,
                                layout=W.Layout(width="420px"), **label)
        self.load_button = W.Button(description="load", layout=W.Layout(width="70px"))
        self.upload = W.FileUpload(accept=".csv,.txt,.json", multiple=False, description="upload",
                                   layout=W.Layout(width="110px"))
        self.clear_button = W.Button(description="clear loaded", layout=W.Layout(width="110px"))
        self.load_button.on_click(self._on_home(lambda _b: self.load(self.load_path.value)))
        self.clear_button.on_click(self._on_home(lambda _b: self.clear_loaded()))
        self.upload.observe(self._on_home(self._uploaded), names="value")
        self.message = W.HTML()
        self.verdict = W.HTML()
        self.verdict.add_class("ctrlmem-verdict")
        self.stats_out = W.HTML()
        self.formulas = W.HTML()
        self.command = W.Text(description="as a command", layout=W.Layout(width="90%"), **label)
        self.command.add_class("ctrlmem-command")
        self.copy_command = _copy_button(self.command)
        self.timing = W.HTML()
        self.timing.add_class("ctrlmem-timing")
        self.pending_note = W.HTML()
        self.pending_note.add_class("ctrlmem-busy-note")
        self.progress = W.HTML()
        self.progress.add_class("ctrlmem-progress")
        self.stop_button = W.Button(description="stop adapting", layout=W.Layout(width="120px", display="none"))
        self.stop_button.on_click(self._on_home(lambda _b: self.stop_background()))
        self.compare = W.ToggleButtons(options=COMPARISONS, value=COMPARISONS[0], description="compare",
                                       style={"button_width": "auto", "description_width": "initial"})
        self.compare.add_class("ctrlmem-compare")
        self.compare_schedule = W.Dropdown(options=[], description="of", layout=W.Layout(width="220px"),
                                           style={"description_width": "initial"})
        self._compare_handler = self._on_home(self._compare_changed)
        self.compare.observe(self._compare_handler, names="value")
        self.compare_schedule.observe(self._compare_handler, names="value")
        self.plots = plot_view_class()(names=["ctrlmem-diagram", "ctrlmem-memory", "ctrlmem-compare-a",
                                               "ctrlmem-compare-b"], main=2, plotly_js=plotly_js())
        self.plots.observe(self._on_home(self._drawn), names="drawn")
        self.plots.observe(self._on_home(self._width_changed), names="width")
        self._sent: list[dict | None] = [None, None, None, None]
        self.downloads = _downloads_class()()
        self.export_note = W.HTML()
        self.export_note.add_class("ctrlmem-export-note")
        labels = {"png": "PNG", "svg": "SVG", "pdf": "PDF", "html": "HTML report", "csv": "torch CSV",
                  "trace": "trace JSON", "state": "save state"}
        self._labels = labels
        self.buttons = {kind: W.Button(description=labels[kind], tooltip=f"download {labels[kind]}",
                                       layout=W.Layout(width="110px" if kind in ("png", "svg", "pdf") else "130px"))
                        for kind in EXPORT_KINDS}
        for kind, button in self.buttons.items():
            button.add_class(f"ctrlmem-export-{kind}")
            button.on_click(self._on_home(lambda _b, kind=kind: self._export_clicked(kind)))
        self.retry_button = W.Button(description="retry", tooltip="try the failed export again",
                                     layout=W.Layout(width="80px", display="none"))
        self.retry_button.add_class("ctrlmem-export-retry")
        self.retry_button.on_click(self._on_home(lambda _b: self._retry_export()))
        self._failed_export: str | None = None
        self.load_state_button = W.FileUpload(accept=".json,.html", multiple=False, description="load state",
                                              layout=W.Layout(width="130px"))
        self.load_state_button.observe(self._on_home(self._state_uploaded), names="value")
        # a state as one line to share (state_link), and a field that opens one
        self.link_button = W.Button(description="share link", layout=W.Layout(width="110px"),
                                    tooltip="this state as one line of text to send: opened by 'open link', "
                                            "explorer(state=LINK) or ctrlmem draw --state LINK")
        self.link_button.add_class("ctrlmem-link-button")
        self.link_button.on_click(self._on_home(lambda _b: self._share_link()))
        self.link_out = W.Text(description="", placeholder="share link: click the button", layout=W.Layout(width="60%"))
        self.link_out.add_class("ctrlmem-link")
        self.copy_link = _copy_button(self.link_out, "ctrlmem-copy-link")
        self.link_in = W.Text(description="open link", placeholder="paste a ctrlmem-state=... link (or a URL holding one)",
                              continuous_update=False, layout=W.Layout(width="420px"), style={"description_width": "initial"})
        self.link_in.add_class("ctrlmem-open-link")
        self.link_in.observe(self._on_home(self._link_pasted), names="value")
        self._inputs = [self.schedules, self.devices, self.microbatches, self.f, self.b, self.w,
                        self.comm, self.fb_overlap, self.first_extra, self.last_extra, self.weights, self.limit_on, self.limit,
                        self.model, self.model_path, self.model_mb, self.optimize_on, self.optimize, self.improve,
                        self.recompute, self.offload_on, self.offload, self.offload_cost]
        self._edit_handler = self._on_home(self._edited)
        for wdg in self._inputs:
            wdg.observe(self._edit_handler, names="value")
        controls = W.VBox([
            W.HTML(_CSS + "<b>schedules</b> <small>(tick to compare; panels stack in the order ticked)</small>"),
            self.schedules,
            W.HBox([self.devices, self.microbatches, self.limit_on, self.limit, self.optimize_on, self.optimize,
                    self.improve],
                   layout=W.Layout(flex_flow="row wrap")),  # wraps in a narrow notebook column
            W.HBox([self.f, self.b, self.w, self.comm, self.fb_overlap,
                    W.HTML("<small>F&B overlap: an overlapped forward + backward pair (dualpipe, dualpipe-v) "
                           "takes this fraction of F + B</small>")],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.first_extra, self.last_extra, self.weights]),
            W.HBox([self.stage_note, self.clear_stage_costs]),
            W.HBox([self.recompute, self.offload_on, self.offload, self.offload_cost,
                    W.HTML("<small>memory levers for every schedule ticked (recompute: an R before each backward; "
                           "offload: copied to host after the forward, back before the backward)</small>")],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.model, self.model_path, self.model_mb,
                    W.HTML("<small>a model adds a GB axis to the memory panel (a config.json path wins over the "
                           "preset; microbatch 0: the paper's, 1 for a config)</small>")],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.load_path, self.load_button, self.upload, self.clear_button]),
            W.HBox([W.HTML("<b style='margin-right:6px'>export</b>"), *self.buttons.values(),
                    self.load_state_button]),
            W.HBox([self.downloads, self.export_note, self.retry_button]),
            W.HBox([self.link_button, self.link_out] + ([self.copy_link] if self.copy_link else []) + [self.link_in],
                   layout=W.Layout(flex_flow="row wrap")),
        ])
        results = W.VBox([
            W.HBox([self.pending_note, self.timing]),
            W.HBox([self.progress, self.stop_button]),
            self.message, self.verdict, self.stats_out, self.formulas,
            W.HBox([self.command] + ([self.copy_command] if self.copy_command else [])),
            W.HBox([self.compare, self.compare_schedule]),
            self.plots,
        ])
        results.add_class("ctrlmem-results")
        self.widget = W.VBox([controls, results])
        self.widget.add_class("ctrlmem-explorer")
        self._show_stage_costs()
        self.update()

    # -- settings and updates -------------------------------------------------------------------

    def settings(self) -> Settings:
        """The settings the widgets show now (bad per-stage weights raise ``ValueError``)."""
        return Settings(
            schedules=tuple(self.schedules.value) + tuple(self._unknown),
            num_devices=int(self.devices.value), num_microbatches=int(self.microbatches.value),
            f=self.f.value, b=self.b.value, w=self.w.value, comm=self.comm.value,
            first_stage_extra=self.first_extra.value, last_stage_extra=self.last_extra.value,
            memory_limit=float(self.limit.value) if self.limit_on.value else None,
            stage_weights=_parse_weights(self.weights.value), stage_costs=self._stage_costs, loaded=tuple(self.loaded),
            measured=tuple(self.measured),
            model=self.model_path.value.strip() or self.model.value or None, microbatch_size=int(self.model_mb.value) or None,
            optimize=float(self.optimize.value) if self.optimize_on.value else 0.0,
            improve=self.improve.value or None, recompute=self.recompute.value,
            offload=float(self.offload.value) if self.offload_on.value else None,
            offload_cost=float(self.offload_cost.value), fb_overlap=float(self.fb_overlap.value),
        )

    def _show_stage_costs(self) -> None:
        """With per-stage costs given whole, say so (their range, from where) and take F, B, W,
        the weights and the extras out of play until they are dropped."""
        given = bool(self._stage_costs)
        for widget in (self.f, self.b, self.w, self.first_extra, self.last_extra, self.weights):
            widget.disabled = given
        self.clear_stage_costs.layout.display = "" if given else "none"
        if given:
            k = len(self._stage_costs[0])
            spans = ", ".join(f"{name} {min(part):.4g}–{max(part):.4g}" for name, part in zip("FBWR", self._stage_costs))
            self.stage_note.value = (f"<small>per-stage costs of {k} stages given whole (a plan's, or a saved "
                                     f"state's): {html.escape(spans)}; F, B, W and the weights are not used</small>")
        else:
            self.stage_note.value = ""

    def _drop_stage_costs(self) -> None:
        self._stage_costs = ()
        self._show_stage_costs()
        self._edited()

    # -- one thread ----------------------------------------------------------------------------

    def _home(self) -> asyncio.AbstractEventLoop | None:
        """The home loop while it runs (the loop running where the explorer was made: in a
        kernel, the main thread's), else None."""
        home = self._home_loop
        return home if home is not None and home.is_running() else None

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the explorer's work runs on: its home loop, else the one running here, else
        None (a script: everything runs at once)."""
        return self._home() or _running_loop()

    def _at_home(self) -> bool:
        """Whether this thread may touch the explorer's state now: the home thread, or any
        when no home loop runs (a script, a test)."""
        return self._home() is None or threading.get_ident() == self._home_thread

    def _on_home(self, handler):
        """``handler`` (a widget callback) made to run on the explorer's home thread.

        ipykernel 7 answers widget messages in a subshell thread with an event loop of its own,
        beside the main thread whose loop ran the cell that made the explorer (and runs the
        user's later cells); a handler would otherwise run on whichever thread got the message,
        and two of them could change the explorer's state at once. Called on another thread, the
        handler is handed to the home loop (``call_soon_threadsafe``, in the order the messages
        came) and returns; the widgets' values it reads are then the latest, so the last edit
        wins. Without a home loop (a script) it runs at once."""

        @functools.wraps(handler)
        def on_home(*args):
            if self._at_home():
                return handler(*args)
            if not self._closed:
                self._home_loop.call_soon_threadsafe(self._guarded, handler, *args)
            return None

        return on_home

    def _guarded(self, handler, *args) -> None:
        """Run a handler handed over from another thread (an exception is logged, as a widget
        callback's would be)."""
        if self._closed:
            return
        try:
            handler(*args)
        except Exception:
            log.exception("explorer handler %s failed", getattr(handler, "__name__", handler))

    def _edited(self, change=None) -> None:
        """A widget changed: mark everything pending now, answer once the queued edits are in."""
        if change is not None and change.get("owner") is self.schedules:
            self._unknown = []  # names from the initial settings that are not registered: reported until the user picks
        self._pinned = {}  # a loaded state's orders are shown until the first edit
        self._request()

    def _request(self) -> None:
        self._mark_pending()
        loop = self._loop()
        if loop is None:
            self.update()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # a moment for the edits already queued in the kernel to arrive: they are answered once
            loop.call_later(COALESCE_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._closed:
            self.update()

    def _mark_pending(self) -> None:
        try:
            summary = _settings_summary(self.settings())
        except ValueError:
            summary = "new settings"
        self.pending_note.value = f"<span>updating for {html.escape(summary)}…</span>"
        if hasattr(self, "widget"):
            self.widget.add_class("ctrlmem-pending")

    def update(self, *_change) -> View | None:
        """Recompute for the widgets' settings and draw the result as a new state (the
        instant answer; builds for new costs go to the background). Returns the view."""
        if hasattr(self, "widget"):
            self._mark_pending()
        try:
            try:
                settings = self.settings()
            except ValueError as exc:
                settings = None
                view = View(self.view.settings if self.view is not None else Settings(), {}, None,
                            stats_table({}, None), [f"Cannot compute: {_reason(exc)}"], None, None)
            if settings is not None:
                view = compute(settings, style=self._style(), cache=self.builds,
                               adapt=self.background is None, orders=self._pinned,
                               order_origins=self._pinned_origins)
        except Exception as exc:  # an unexpected failure still shows a message, not a traceback
            log.exception("explorer update failed")
            view = View(Settings(), {}, None, stats_table({}, None),
                        [f"Unexpected error: {type(exc).__name__}: {exc}"], None, None)
        self.view = view
        self.render(view)
        self._submit()
        return view

    def _submit(self) -> None:
        """Ask the background for what the view still needs (and the budget sweep when shown);
        what an older edit asked for and this one does not is dropped."""
        if self.background is None or self._closed:
            return
        jobs = list(self.view.jobs) if self.view is not None else []
        if self.compare.value == "bubble vs budget":
            jobs += [job for job in self._sweep(figure=False)[1] if job not in jobs]
        self.background.submit(jobs)
        self._show_progress()
        if jobs:
            self._schedule_tick()

    def _schedule_tick(self) -> None:
        """Poll again in TICK_SECONDS, on the home loop (from another thread, the timer is handed
        to it with ``call_soon_threadsafe``, which wakes it: a timer put on another thread's loop
        may not wake that loop, which can sleep in its selector until a message arrives)."""
        if self._tick_handle is not None or self._closed:
            return
        loop = self._loop()
        if loop is None or loop.is_closed():
            return
        if not self._at_home():
            loop.call_soon_threadsafe(self._schedule_tick)
            return
        self._tick_handle = loop.call_later(TICK_SECONDS, self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        if self._closed:
            return
        try:
            self.poll()
        except Exception:
            log.exception("explorer background poll failed")
        busy = (self.background is not None and not self.background.idle) or self._exports
        if busy:
            self._schedule_tick()

    def poll(self) -> bool:
        """Take in finished background builds and exports; redraw when a build belongs to what
        is shown (a new state). Returns whether it redrew."""
        redraw = sweep = False
        if self.background is not None:
            wanted = set(self.view.jobs) if self.view is not None else set()
            for res in self.background.poll():
                job = res.job
                key = self.builds.key(job.cache_name, job.num_devices, job.num_microbatches,
                                      res.costs if res.schedule is not None else job.costs, job.memory_limit)
                if res.schedule is not None:
                    self.builds.put(job.cache_name, job.num_devices, job.num_microbatches, res.costs, job.memory_limit,
                                    res.schedule)
                    if res.note:
                        self.builds.notes[key] = res.note
                else:
                    self.builds.failed[key] = res.error or "build failed"
                log.info("background build of %s: %s in %.1f s", job.name, res.error or "done", res.seconds)
                if job in wanted:
                    redraw = True  # a shown schedule, adapted: a new state
                else:
                    sweep = True  # a point of the budget sweep: the comparison only
        self._finish_exports()
        if redraw and not self._flush_scheduled:
            self._redraw_adapted()
        elif sweep and not self._flush_scheduled and self.view is not None and self.compare.value == "bubble vs budget":
            self._mark_pending()
            self.render(self.view, keep_main=True)
            self._submit()  # a finished budget can ask for more (beyond 1.0 while a bubble is left)
        else:
            self._show_progress()
        return redraw or sweep

    def _redraw_adapted(self) -> None:
        """A build finished: the same settings, now with it: a new state."""
        try:
            settings = self.settings()
        except ValueError:
            return
        view = compute(settings, style=self._style(), cache=self.builds, adapt=False, orders=self._pinned,
                       order_origins=self._pinned_origins)
        self.view = view
        self._mark_pending()
        self.render(view)
        self._submit()

    def wait(self, timeout: float | None = 600) -> View | None:
        """Block until the background builds and exports asked for are done, applying each
        (for scripts and tests; in a kernel the event loop does this). Returns the view."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            idle = (self.background is None or self.background.idle) and not self._exports
            if idle or (deadline is not None and time.monotonic() > deadline):
                return self.view
            time.sleep(0.05)

    def stop_background(self) -> None:
        """Stop the background builds (what is shown stays, marked not adapted)."""
        if self.background is not None:
            self.background.cancel()
        self._show_progress()

    def _show_progress(self) -> None:
        """The progress line: the build running in the background, for how long, what waits,
        and which shown orders are not adapted yet (part of the current state)."""
        view = self.view
        parts = []
        prog = self.background.progress() if self.background is not None else None
        if prog is not None and prog.job is not None:
            def named(job):
                text = job.name + (f" @ budget {job.memory_limit:g}" if job.memory_limit is not None else "")
                if job.limits:
                    text = f"{job.name} @ budgets {', '.join(f'{x:g}' for x in job.limits)}"
                return f"improving {text} with the solver ({job.optimize:g} s)" if job.optimize else text

            then = list(dict.fromkeys(named(j) for j in prog.waiting))
            parts.append(f"adapting to these costs in the background: <b>{html.escape(named(prog.job))}</b> "
                         f"({prog.seconds:.0f} s)" + (f", then {html.escape(', '.join(then))}" if then else "")
                         + (f"; {prog.done} done" if prog.done else ""))
            if view is not None and view.provisional:
                parts.append(f"shown meanwhile: {html.escape(', '.join(view.provisional))}, their last order "
                             "re-simulated")
        elif view is not None and (view.provisional or view.waiting):
            parts.append("not adapted to these costs (stopped): "
                         + html.escape(", ".join(view.provisional + view.waiting)))
        self.progress.value = (_tagged(self._state, f"<small class='ctrlmem-progress-line'>{'; '.join(parts)}</small>")
                               if parts else "")
        self.stop_button.layout.display = "" if prog is not None and prog.job is not None else "none"

    # -- drawing --------------------------------------------------------------------------------

    def render(self, view: View, *, keep_main: bool = False) -> None:
        """Put ``view`` into the widgets as a new state (``keep_main``: the two main plots are
        already the view's; only the comparisons change).

        On a running event loop (a kernel) the comparisons of a new view follow as a state of
        their own, made just after this one is sent: the browser draws the diagram and the
        memory curves meanwhile (the comparisons shown before stay, dimmed, until then)."""
        t0 = time.perf_counter()
        self._state += 1
        n = self._state
        self.message.value = _tagged(n, messages_html(view.messages))
        self.verdict.value = _tagged(n, f"<div style='margin:4px 0'>{html.escape(verdict(view))}</div>"
                                     if view.results else "")
        self.stats_out.value = _tagged(n, stats_html(view.stats, view.waiting))
        self.formulas.value = _tagged(n, formula_html(view))
        self.command.value = command_line(view.settings) if view.results else ""
        names = list(view.results)
        if list(self.compare_schedule.options) != names:
            current = self.compare_schedule.value
            self.compare_schedule.unobserve(self._compare_handler, names="value")
            try:
                self.compare_schedule.options = names
                self.compare_schedule.value = current if current in names else (names[0] if names else None)
            finally:
                self.compare_schedule.observe(self._compare_handler, names="value")
        loop = _running_loop() if self._at_home() else None
        later = (not keep_main and loop is not None and view.results and self.compare.value != "none"
                 and any(x is not None for x in self._sent[2:]))
        if keep_main:
            main = self._sent[:2]
        else:
            main = [mime_bundle(spec, label)[PLOTLY_MIME] if spec is not None else None
                    for spec, label in ((view.diagram_spec, "schedule diagram"), (view.memory_spec, "memory curves"))]
        if later:
            extra = self._sent[2:]
        else:
            extra = [mime_bundle(spec, "comparison")[PLOTLY_MIME] if spec is not None else None
                     for spec in self._comparison(view)]
        self._sent = main + extra
        self.plots.show(self._sent, seq=n, keep=[keep_main, keep_main, later, later])
        self._hint_exports(view)
        seconds = time.perf_counter() - t0
        if keep_main:
            self._compare_seconds = seconds
        else:
            self.last_render_seconds, self._compare_seconds = seconds, None
            self._main_state, self._main_drawn = n, None
        self._python_ms = (view.seconds + self.last_render_seconds) * 1e3
        self.timing.value = _tagged(n, self._timing_text(n, None))
        if later:
            loop.call_soon(self._comparisons_after, n)

    def _comparisons_after(self, state: int) -> None:
        """The comparisons of state ``state``'s view, as the next state (unless a newer edit or
        build has drawn one of its own meanwhile)."""
        if self._closed or self._state != state or self._flush_scheduled or self.view is None:
            return
        try:
            self.render(self.view, keep_main=True)
        except Exception:  # a comparison that fails must not take the explorer down
            log.exception("explorer comparisons failed")

    def _timing_text(self, n: int, drawn: dict | None) -> str:
        """The timer line of state ``n`` (``drawn``: the browser's report of it, when in): the
        Python side of the main plots (computed, sent), the browser's drawing of them (each
        plot's share), and the comparisons when they came as a state of their own."""
        view_ms = self.view.seconds * 1e3 if self.view is not None else 0.0
        text = f"state {n}: computed in {view_ms:.0f} ms, sent in {self.last_render_seconds * 1e3:.0f} ms"
        main = self._main_drawn
        if main is not None:
            slots = main.get("slots") or []
            split = f" (diagram {slots[0]:.0f} ms, memory {slots[1]:.0f} ms)" if len(slots) >= 2 else ""
            text += f", drawn by the browser in {main.get('ms', 0):.0f} ms{split}"
        if self._compare_seconds is not None:
            text += f"; comparisons sent in {self._compare_seconds * 1e3:.0f} ms"
            if drawn is not None:
                text += f", drawn in {drawn.get('ms', 0):.0f} ms"
        if drawn is None:
            text += "; drawing…"
        return f"<small style='color:#777'>{text}</small>"

    def _drawn(self, change) -> None:
        """The browser drew state ``seq`` in ``ms``: the pending mark goes if it is the latest."""
        got = change["new"] or {}
        slots = got.get("slots") or []
        if (not got.get("error") and (got.get("seq") or 0) >= self._main_state
                and (len(slots) < 2 or slots[0] or slots[1])):  # the latest main plots were drawn (no split: all)
            self._main_drawn = got
        if got.get("seq") != self._state or self.view is None:
            return
        if got.get("error"):
            self.message.value = _tagged(self._state, messages_html(
                [f"The browser could not draw the plots: {got['error']}"]))
        self.timing.value = _tagged(self._state, self._timing_text(self._state, got))
        if not self._flush_scheduled:
            self.widget.remove_class("ctrlmem-pending")
            self.pending_note.value = ""

    def _width_changed(self, change) -> None:
        """The drawing got wider or narrower: which labels fit changed, so redraw."""
        old, new = change["old"] or 0, change["new"] or 0
        if new and abs(new - old) > 0.04 * max(old, 1):
            self._request()

    def _style(self) -> dict:
        """The figure style, with the label rule at the drawing's width when the browser told it."""
        style = {k: dict(v) for k, v in self.style.items()}
        width = self.plots.width if getattr(self, "plots", None) is not None else 0
        if width:
            style.setdefault("diagram", {}).setdefault("label_width", width)
        return style

    def shown(self, which: str = "diagram") -> dict | None:
        """The figure JSON last sent to the browser: ``"diagram"``, ``"memory"``, ``"compare-a"``
        or ``"compare-b"`` (None when nothing is drawn there)."""
        return self._sent[("diagram", "memory", "compare-a", "compare-b").index(which)]

    # -- comparisons ----------------------------------------------------------------------------

    def _compare_changed(self, _change=None) -> None:
        if self.view is None:
            return
        self._mark_pending()
        self.render(self.view, keep_main=True)
        self._submit()

    def _comparison(self, view: View) -> list[dict | None]:
        """The figure dicts of the comparison view chosen (two slots)."""
        which = self.compare.value
        if not view.results or which == "none":
            return [None, None]
        try:
            if which == "peak memory & speed-up":
                return list(comparison_specs(view))
            if which == "bubble vs budget":
                return [self._sweep()[0], None]
            if which == "lifespans":
                return [plot.lifespan_figure(list(view.results.values()),
                                             title="lifespans of microbatch 0 per device (simulated)").to_plotly_json(),
                        None]
            if which == "building blocks":
                return [self._blocks(view), None]
            if which == "step grid":
                name = self.compare_schedule.value if self.compare_schedule.value in view.results else next(iter(view.results))
                return [plot.step_grid_spec(view.results[name]), None]
        except (ValueError, ScheduleError, KeyError) as exc:
            log.info("comparison %s: %s", which, exc)
            return [_note_figure(f"{which}: {_reason(exc)}"), None]
        return [None, None]

    def _blocks(self, view: View) -> dict:
        name = self.compare_schedule.value or next(iter(view.results))
        s = view.settings
        if name.endswith(" (file)"):
            return _note_figure(f"{name}: a schedule file has no building block")
        m = min(s.num_microbatches, BLOCK_MICROBATCHES)
        key = (name, s.num_devices, m, s.f, s.b, s.w, s.comm)
        if key not in self._block_cache:
            fig = plot.block_figure(name, s.num_devices, m, costs=s.costs(), title=name)
            # the title names the panels in their order: "building block", then each step's own name
            panels = [a.text.split(":")[0] for a in fig.layout.annotations if a.yanchor == "bottom"]
            steps = ["building block"] + panels[1:]
            fig.layout.title.text = f"{name}: {' → '.join(steps)} (p={s.num_devices}, m={m})"
            self._block_cache = {key: fig.to_plotly_json()}
        return self._block_cache[key]

    def _sweep(self, figure: bool = True) -> tuple[dict | None, list[Job]]:
        """The bubble-vs-budget points of the budgeted schedules (``v-shape``, ``zb``) at the
        current p, m and costs, from the builds done so far (the cache the shown schedules use
        too), and the builds still to do, coarse budgets first so the curve's shape comes early.
        ``figure=False``: the builds only (what asking the background needs), no figure drawn."""
        view = self.view
        s = view.settings if view is not None else None
        if s is None or view.reference is None:
            return None, []
        budgeted = [n for n in ("v-shape", "zb") if n in SCHEDULES]
        p, m = s.num_devices, s.num_microbatches
        ref_peak = max(view.reference.peak_memory)
        points, jobs = [], []
        job_settings = StageCosts(replace(s, schedules=(), loaded=()))
        # every point is a budget: with recompute on, each is built with the levers, as the shown budgeted schedules
        lev = order_levers(s, plot.TRADEOFF_LIMITS[0])
        for name in budgeted:
            limits = _coarse_first(sorted(set(plot.TRADEOFF_LIMITS) | ({s.memory_limit} if s.memory_limit else set())),
                                   s.memory_limit)
            done: dict[float, dict] = {}
            for group in (limits, SWEEP_BEYOND):
                if group is SWEEP_BEYOND and not (1.0 in done and done[1.0]["bubble_rate"] > SWEEP_BUBBLE_LEFT):
                    continue
                todo, want, stages = self._sweep_group(name, group, s, view, ref_peak, done, lev)
                if todo:  # one job per group: the worker builds its budgets back to back
                    jobs.append(Job(name, p, m, want, None, None if stages is not None else job_settings,
                                    limits=tuple(todo), levers=lev))
            points += [done[x] for x in sorted(done)]
        if not figure:
            return None, jobs
        for name, r in view.results.items():
            if name not in budgeted:
                points.append(_point(name, None, r, view.reference, ref_peak))
        done_n = sum(1 for q in points if q["memory_limit"] is not None)
        todo_n = sum(len(j.limits) for j in jobs)
        title = (f"bubble rate vs memory budget ({_settings_summary(s)}"
                 + (f"; {s.levers_text()}" if s.levers else "") + "); "
                 + (f"{done_n} of {done_n + todo_n} budget builds done…" if jobs else "all budget builds done")
                 + "; points: the budgets searched")
        fig = (plot.bubble_memory_figure(points, title=title, steps=False).to_plotly_json() if points
               else _note_figure(title))
        return fig, jobs

    def _sweep_group(self, name: str, group, s: Settings, view: View, ref_peak: float, done: dict,
                     levers: tuple = ()):
        """Points of ``group``'s budgets already built go into ``done``; returns the budgets
        still to build (not failed, not a build the view itself waits for), the costs to build
        them for and the stage count when known. ``levers``: the ``(recompute, offload)`` the
        budgets are built with (kept under :func:`levered_name`); without them an offload alone
        goes onto each built order, as ``cm.build`` puts it."""
        p, m = s.num_devices, s.num_microbatches
        kept = levered_name(name, levers)
        queued = {j.memory_limit for j in view.jobs if j.name == name and j.levers == levers}
        todo, want, stages = [], s.costs(), None
        for limit in group:
            stages = self.builds.num_stages(kept, p, m, limit)
            want = s.costs(stages) if stages is not None else s.costs()
            key = self.builds.key(kept, p, m, want, limit)
            if key in self.builds.failed:
                continue
            sched = self.builds.get(kept, p, m, want, limit)
            if sched is not None:
                if not levers and s.offload is not None:
                    sched = self.builds.with_levers(sched, "none", float(s.offload), s.costs(sched.num_stages))
                done[limit] = _point(name, limit, self._sweep_sim(key, sched, s), view.reference, ref_peak)
            elif limit not in queued:
                todo.append(limit)
        return todo, want, stages

    def _sweep_sim(self, key: tuple, sched: Schedule, s: Settings):
        """The simulation of a budget point (kept: a sweep redrawn per finished build would
        re-simulate every earlier point each time)."""
        costs = s.costs(sched.num_stages)
        memo = (key, costs, s.recompute, s.offload)
        if memo not in self._sweep_sims:
            if len(self._sweep_sims) > 128:
                self._sweep_sims.clear()
            self._sweep_sims[memo] = simulate(sched, costs)
        return self._sweep_sims[memo]

    # -- files ----------------------------------------------------------------------------------

    def load(self, source) -> Schedule | MeasuredRun | None:
        """Add a schedule file (torch / torchtitan CSV or ctrlmem's text form; a path, or
        ``(name, bytes)`` from the upload button) to the comparison; p and m follow the file.
        A ``.json`` file is a measured step of a real run (``ctrlmem run``'s
        ``trace-measured.json``): drawn under the simulation of its schedule (see
        :attr:`~ctrlmem.explorer.views.Settings.measured`)."""
        label = source[0] if isinstance(source, tuple) else str(source).strip()
        if label.lower().endswith(".json"):
            try:
                run = read_measured_trace(source[1] if isinstance(source, tuple) else label, name=os.path.basename(label))
            except (OSError, ValueError) as exc:
                self.message.value = messages_html([f"Cannot load {label}: {_reason(exc)}"])
                return None
            self.measured = [x for x in self.measured if x.source != run.source] + [run]
            self._set_quietly(self.devices, run.num_devices)
            self._set_quietly(self.microbatches, run.num_microbatches)
            self.update()
            return run
        try:
            if isinstance(source, tuple):
                name, raw = source

                text = _clean_text(raw, name)
                stem = os.path.splitext(os.path.basename(name))[0] or "uploaded"
                sched = (Schedule.from_text(text) if text.lstrip().startswith("schedule ")
                         else Schedule.from_torch_csv_text(text, name=stem, source=name))
            else:
                path = str(source).strip()
                if not path:
                    raise ValueError("type the path of a schedule file first")
                sched = Schedule.load(path)

            validate(sched)
        except (OSError, ValueError, ScheduleError) as exc:
            self.message.value = messages_html([f"Cannot load {source[0] if isinstance(source, tuple) else source}: "
                                                f"{_reason(exc)}"])
            return None
        self.loaded = [x for x in self.loaded if x.name != sched.name] + [sched]
        self._set_quietly(self.devices, sched.num_devices)
        self._set_quietly(self.microbatches, sched.num_microbatches)
        self.update()
        return sched

    def clear_loaded(self) -> None:
        """Drop the loaded schedule files and measured runs."""
        self.loaded = []
        self.measured = []
        self.update()

    def _set_quietly(self, widget, value) -> None:
        widget.unobserve(self._edit_handler, names="value")
        try:
            if hasattr(widget, "max") and isinstance(value, (int, float)):
                widget.max = max(widget.max, value)
            widget.value = value
        finally:
            widget.observe(self._edit_handler, names="value")

    def _uploaded(self, change) -> None:
        item = _first_upload(change["new"])
        if item is not None:
            self.load(item)

    def apply_state(self, source) -> None:
        """Show a state (a file's path, its text or bytes, the data itself, or a state link):
        settings, loaded files and the very orders it recorded (kept until the next edit; ``ctrlmem
        draw --state`` draws the same); a link of its settings alone has its orders built again."""
        try:
            settings, orders, style = read_state(source)
            origins = style.pop("origins", {})
        except (OSError, ValueError, ScheduleError) as exc:
            self.message.value = messages_html([f"Cannot load the state: {_reason(exc)}"])
            return
        unknown = [n for n in settings.schedules if n not in SCHEDULES]
        self._unknown = unknown
        self._set_quietly(self.schedules, tuple(n for n in settings.schedules if n in SCHEDULES))
        for widget, value in ((self.devices, settings.num_devices), (self.microbatches, settings.num_microbatches),
                              (self.f, settings.f), (self.b, settings.b), (self.w, settings.w),
                              (self.comm, settings.comm), (self.first_extra, settings.first_stage_extra),
                              (self.last_extra, settings.last_stage_extra),
                              (self.weights, ",".join(f"{x:g}" for x in settings.stage_weights)),
                              (self.limit_on, settings.memory_limit is not None),
                              (self.model, _preset_of(settings.model) or ""),
                              (self.model_path, "" if _preset_of(settings.model) else settings.model or ""),
                              (self.fb_overlap, settings.fb_overlap), (self.model_mb, settings.microbatch_size or 0),
                              (self.optimize_on, bool(settings.optimize)),
                              (self.improve, settings.improve if settings.improve in SCHEDULES else ""),
                              (self.recompute, settings.recompute if settings.recompute in ("selective", "full")
                               else "none"),
                              (self.offload_on, settings.offload is not None),
                              (self.offload_cost, settings.offload_cost)):
            self._set_quietly(widget, value)
        if settings.offload is not None:
            self._set_quietly(self.offload, settings.offload)
        if settings.memory_limit is not None:
            self._set_quietly(self.limit, settings.memory_limit)
        if settings.optimize:
            self._set_quietly(self.optimize, settings.optimize)
        self.loaded = list(settings.loaded)
        self.measured = list(settings.measured)
        self._stage_costs = tuple(settings.stage_costs)
        self._show_stage_costs()
        for part, values in style.items():
            self.style.setdefault(part, {}).update({k: v for k, v in values.items() if k != "label_width"})
        self._pinned = orders
        self._pinned_origins = origins
        self.update()

    def share_link(self) -> str:
        """The state shown as a link (:func:`ctrlmem.explorer.views.state_link`): with its very
        orders when they fit in one, else its settings (the orders are built again when opened)."""
        if self.view is None or not self.view.results:
            raise ValueError("nothing to share: no schedule could be built for these settings")
        return state_link(self.view, self._style())[0]

    def _share_link(self) -> None:
        try:
            link, exact = state_link(self.view, self._style()) if self.view is not None and self.view.results \
                else (None, False)
        except ValueError as exc:
            self.export_note.value = messages_html([f"Share link: {_reason(exc)}"])
            return
        if link is None:
            self.export_note.value = messages_html(["Share link: nothing to share: no schedule could be built"])
            return
        self.link_out.value = link
        what = ("the settings and the very orders shown" if exact else
                "the settings (the orders are too long for a link and are built again when it is opened; save the "
                "state file to keep them)")
        self.export_note.value = (f"<small class='ctrlmem-link-note'>state {self._state} as a link of "
                                  f"{len(link):,} characters: {what}</small>")

    def _link_pasted(self, change) -> None:
        text = (change["new"] or "").strip()
        if text:
            self.apply_state(text)

    def _state_uploaded(self, change) -> None:
        item = _first_upload(change["new"])
        if item is not None:
            self.apply_state(item[1])

    # -- export ---------------------------------------------------------------------------------

    def export(self, kind: str, directory: str | None = None) -> list[str]:
        """Export the current view into ``directory`` (default :attr:`export_dir`), blocking
        (see :func:`ctrlmem.explorer.views.export_view`); the buttons do the same without blocking and
        offer the file as a download."""
        return export_view(self.view, kind, directory or self.export_dir or "build/explorer", self._style())

    def save(self, out_dir: str | os.PathLike) -> str:
        """Record the current view (see :func:`ctrlmem.explorer.views.save_view`)."""
        return save_view(self.view, out_dir)

    def save_state(self, path: str | os.PathLike) -> str:
        """Write the state file of what is shown (see :func:`ctrlmem.explorer.views.write_state`)."""

        return write_state(self.view, path, self._style())

    @property
    def renderer(self):
        """The Chromium session static exports are drawn in (started on first use)."""
        if self._renderer is None:

            self._renderer = StaticRenderer()
        return self._renderer

    def _hint_exports(self, view: View) -> None:
        """Each export button's tooltip says what the file will be (an HTML report of 10 MB, a
        PNG of 2200 × 3900 px) before the click."""
        hints = export_hints(view, scale=2.0)
        for kind, button in self.buttons.items():
            hint = hints.get(kind)
            tip = f"download {self._labels[kind]}" + (f": {hint}" if hint else "")
            if button.tooltip != tip:
                button.tooltip = tip

    def _export_clicked(self, kind: str) -> None:
        view, n = self.view, self._state
        if view is None or not view.results:
            self.export_note.value = messages_html([f"Export {kind} failed: nothing to export: no schedule could "
                                                    "be built for these settings"])
            return
        stem = slug(view)
        self._export_failed(None)
        try:
            if kind in ("png", "svg", "pdf"):
                future = self.renderer.submit(static_figure(view), kind, scale=2.0)
                self._exports.append((future, kind, f"{stem}.{kind}", n))
                self.export_note.value = (f"<small class='ctrlmem-exporting'>drawing {kind.upper()} of state {n} "
                                          f"(the widgets stay live; at most {self.renderer.deadline:.0f} s)…</small>")
                self._schedule_tick()
                return
            if kind == "html":
                self._deliver(f"{stem}.html", "text/html", report_html(view, self._style()).encode("utf-8"), n)
            elif kind == "state":

                data = json.dumps(state_dict(view, self._style()), indent=1, sort_keys=True).encode("utf-8")
                self._deliver(f"{stem}.state.json", "application/json", data, n)
            elif kind in ("csv", "trace"):
                files = {f"{stem}_{suffix}": data for suffix, data in export_files(view, kind).items()}
                if len(files) == 1:
                    (name, data), = files.items()
                    self._deliver(name, "text/csv" if kind == "csv" else "application/json", data, n)
                else:
                    buf = io.BytesIO()
                    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                        for name, data in files.items():
                            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
                    zipped = "torch_csv" if kind == "csv" else "traces"
                    self._deliver(f"{stem}_{zipped}.zip", "application/zip", buf.getvalue(), n)
        except Exception as exc:  # kaleido/Chromium missing, unwritable folder
            log.exception("export failed")
            self._export_failed(kind, exc)

    def _finish_exports(self) -> None:
        still = []
        for future, kind, name, n in self._exports:
            if not future.done():
                still.append((future, kind, name, n))
                continue
            try:
                data = future.result()
                mime = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}[kind]
                self._deliver(name, mime, data, n)
            except Exception as exc:
                log.exception("export failed")
                self._export_failed(kind, exc)
        self._exports = still

    def _export_failed(self, kind: str | None, exc: BaseException | None = None) -> None:
        """Say in one line that the ``kind`` export failed and why, and offer to retry it
        (``kind`` None: the retry offer goes)."""
        self._failed_export = kind
        self.retry_button.layout.display = "none" if kind is None else ""
        if kind is not None:
            reason = _export_reason(kind, exc)
            self.export_note.value = messages_html([f"Export {kind} failed: {reason}. Click retry to try again."])

    def _retry_export(self) -> None:
        if self._failed_export is not None:
            self._export_clicked(self._failed_export)

    def _deliver(self, name: str, mime: str, data: bytes, state: int) -> None:
        """Offer ``data`` as a browser download named ``name`` and write it into ``export_dir``."""

        ext = name.rsplit(".", 1)[-1]
        data = settled_bytes(ext, data)
        if ext == "svg":  # the same bytes as a file written by `ctrlmem draw --state`
            with tempfile.TemporaryDirectory(prefix="ctrlmem-svg-") as tmpdir:
                path = os.path.join(tmpdir, name)
                with open(path, "wb") as fh:
                    fh.write(data)
                stabilize_svg(path)
                with open(path, "rb") as fh:
                    data = fh.read()
        written = None
        if self.export_dir:

            make_output_folder(self.export_dir)
            written = str(atomic_write(os.path.join(self.export_dir, name), data))
        self.downloads.offer(name, mime, data)
        where = f" (also written to {html.escape(written)})" if written else ""
        self.export_note.value = (f"<small class='ctrlmem-exported' style='color:#1c5e20'>state {state}: "
                                  f"{html.escape(name)} downloaded{where}</small>")
        log.info("exported %s (%d bytes)%s", name, len(data), where)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """End the background builds, the Chromium of static exports, the timers and the
        widgets (idempotent). Also done when the kernel exits."""
        self._closed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self.background is not None:
            self.background.close()
        if self._renderer is not None:
            self._renderer.close()
        _close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _close_tree(widget) -> None:
    """Close a widget and every widget inside it (their front-end views go too)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    try:
        widget.close()
    except Exception:  # noqa: BLE001  (closing twice, or a widget without a comm)
        pass


def _coarse_first(limits: Sequence[float], first: float | None = None) -> list[float]:
    """``limits`` (sorted) with ``first`` (the current budget) leading, then the two ends, then
    midpoints of the gaps left, so that a sweep drawn as its builds finish shows its shape early."""
    rest = [x for x in limits if x != first]
    order = [first] if first is not None and first in limits else []
    if rest:
        order += [rest[-1]] + ([rest[0]] if len(rest) > 1 else [])
        spans = [(0, len(rest) - 1)]
        while spans:
            lo, hi = spans.pop(0)
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            order.append(rest[mid])
            spans += [(lo, mid), (mid, hi)]
    return order


def _point(name: str, limit, r, reference, ref_peak: float) -> dict:
    peak = max(r.peak_memory)
    return {"name": name, "memory_limit": limit, "peak": peak, "memory": peak / ref_peak,
            "bubble_rate": r.bubble_rate, "makespan": r.makespan,
            "throughput": r.schedule.num_microbatches / r.makespan, "speedup": reference.makespan / r.makespan}


def _note_figure(text: str) -> dict:
    """An empty figure that says ``text`` (a comparison not available yet, or why not)."""
    return {"data": [], "layout": {"height": 160, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "plot_bgcolor": "white", "paper_bgcolor": "white",
                                   "margin": {"l": 20, "r": 20, "t": plot.MODEBAR_PX + 10, "b": 10},
                                   "annotations": [{"text": html.escape(text), "showarrow": False, "x": 0.5, "y": 0.5,
                                                    "xref": "paper", "yref": "paper", "font": {"size": 13}}]}}


def _first_upload(files):
    if not files:
        return None
    item = files[0] if isinstance(files, (list, tuple)) else next(iter(files.values()))
    name = item.get("name", "uploaded") if isinstance(item, dict) else getattr(item, "name", "uploaded")
    content = item.get("content") if isinstance(item, dict) else item.content
    return name, bytes(content)


_DOWNLOAD_ESM = r"""
export default {
  render({ model, el }) {
    el.classList.add("ctrlmem-downloads");
    const urls = [];
    let newest = Math.max(0, ...model.get("files").map(f => f.id));  // files from before this view: no auto-download
    const draw = () => {
      urls.splice(0).forEach(u => URL.revokeObjectURL(u));
      el.innerHTML = "";
      for (const f of model.get("files")) {
        const bytes = Uint8Array.from(atob(f.b64), c => c.charCodeAt(0));
        const url = URL.createObjectURL(new Blob([bytes], {type: f.mime}));
        urls.push(url);
        const a = document.createElement("a");
        a.href = url; a.download = f.name; a.textContent = "⤓ " + f.name; a.className = "ctrlmem-download";
        a.title = "download " + f.name + " (" + bytes.length + " bytes)";
        a.style.marginRight = "12px";
        el.appendChild(a);
        if (f.id > newest) { newest = f.id; a.click(); }
      }
    };
    model.on("change:files", draw);
    draw();
    return () => urls.forEach(u => URL.revokeObjectURL(u));
  }
};
"""

_DOWNLOADS = None


def _downloads_class():
    """An anywidget holding the latest exports as download links; a new one downloads at once."""
    global _DOWNLOADS
    if _DOWNLOADS is not None:
        return _DOWNLOADS
    import anywidget  # noqa: PLC0415 - only inside Jupyter
    import traitlets  # noqa: PLC0415 - only inside Jupyter

    class Downloads(anywidget.AnyWidget):
        _esm = _DOWNLOAD_ESM
        files = traitlets.List().tag(sync=True)
        keep = 4

        def offer(self, name: str, mime: str, data: bytes) -> None:
            last = max((f["id"] for f in self.files), default=0)
            entry = {"id": last + 1, "name": name, "mime": mime, "b64": base64.b64encode(data).decode("ascii")}
            self.files = [f for f in self.files if f["name"] != name][-(self.keep - 1):] + [entry]

    _DOWNLOADS = Downloads
    return Downloads


_COPY_ESM = r"""
export default {
  render({ model, el }) {
    const button = document.createElement("button");
    button.className = "jupyter-button widget-button " + (model.get("css") || "ctrlmem-copy");
    button.textContent = "copy";
    button.title = "copy the command to the clipboard";
    button.addEventListener("click", async () => {
      const text = model.get("text");
      try {
        await navigator.clipboard.writeText(text);
      } catch (e) {  // no clipboard API (an insecure origin): copy through a selected text area
        const area = document.createElement("textarea");
        area.value = text; document.body.appendChild(area); area.select();
        document.execCommand("copy"); area.remove();
      }
      button.textContent = "copied";
      setTimeout(() => { button.textContent = "copy"; }, 1500);
      model.set("copies", model.get("copies") + 1); model.save_changes();
    });
    el.appendChild(button);
  }
};
"""


def _copy_button(text_widget, css: str = "ctrlmem-copy"):
    """A button that copies ``text_widget.value`` to the clipboard (an anywidget; ``css``: its
    class), or None."""
    try:
        import anywidget  # noqa: PLC0415 - only inside Jupyter
        import traitlets  # noqa: PLC0415 - only inside Jupyter
    except ImportError:
        return None

    class CopyButton(anywidget.AnyWidget):
        _esm = _COPY_ESM
        text = traitlets.Unicode("").tag(sync=True)
        copies = traitlets.Int(0).tag(sync=True)
        css = traitlets.Unicode("ctrlmem-copy").tag(sync=True)

    button = CopyButton(text=text_widget.value, css=css)
    text_widget.observe(lambda change: setattr(button, "text", change["new"]), names="value")
    return button


_CSS = """<style>
.ctrlmem-explorer .ctrlmem-busy-note { display: none; }
.ctrlmem-explorer.ctrlmem-pending .ctrlmem-busy-note, .ctrlmem-explorer.ctrlmem-drawing .ctrlmem-busy-note {
  display: inline-block; color: #8a5a00; font-weight: bold; margin-right: 10px; }
.ctrlmem-explorer.ctrlmem-pending .ctrlmem-results > :not(:first-child),
.ctrlmem-explorer.ctrlmem-drawing .ctrlmem-plots { opacity: 0.45; transition: opacity 0.1s; }
.ctrlmem-explorer .ctrlmem-formulas td, .ctrlmem-explorer .ctrlmem-formulas th { padding: 1px 8px; text-align: left; }
.ctrlmem-explorer .ctrlmem-diagram, .ctrlmem-explorer .ctrlmem-memory { min-height: 120px; }
.ctrlmem-explorer .ctrlmem-stats td, .ctrlmem-explorer .ctrlmem-stats th { padding: 1px 8px; }
.ctrlmem-explorer .ctrlmem-progress-line { color: #5a4a00; }
.ctrlmem-explorer .ctrlmem-waiting td { color: #8a5a00; }
</style>"""

_CHECKLIST = None


def _checklist_class():
    """A checkbox per schedule whose ``value`` is the tuple of ticked names, in the order they
    were ticked (which is the order the panels are stacked in)."""
    global _CHECKLIST
    if _CHECKLIST is not None:
        return _CHECKLIST
    import ipywidgets as W  # noqa: PLC0415 - only inside Jupyter
    import traitlets  # noqa: PLC0415 - only inside Jupyter

    class ScheduleChecklist(W.GridBox):
        value = traitlets.Tuple()

        def __init__(self, options: Sequence[str], value: Sequence[str] = (), columns: int = 4, dispatch=None):
            self.boxes = {n: W.Checkbox(value=n in value, description=n, indent=False,
                                        layout=W.Layout(width="auto", margin="0 14px 0 0"))
                          for n in options}
            super().__init__(children=list(self.boxes.values()), layout=W.Layout(
                grid_template_columns=f"repeat({columns}, max-content)", grid_gap="0px 4px"))
            self._syncing = False
            self.value = tuple(n for n in value if n in self.boxes)
            on_box = dispatch(self._box_changed) if dispatch is not None else self._box_changed
            for box in self.boxes.values():  # ``dispatch``: the thread the owner's state lives on
                box.observe(on_box, names="value")
            self.observe(self._sync_boxes, names="value")
            self.add_class("ctrlmem-schedules")

        def _box_changed(self, change) -> None:
            if self._syncing:
                return
            name = change["owner"].description
            current = [n for n in self.value if n != name]
            self.value = tuple(current + [name]) if change["new"] else tuple(current)

        def _sync_boxes(self, change) -> None:
            self._syncing = True
            try:
                for n, box in self.boxes.items():
                    box.value = n in change["new"]
            finally:
                self._syncing = False

    _CHECKLIST = ScheduleChecklist
    return _CHECKLIST


def _preset_of(model: str | None) -> str | None:
    """The model dropdown's entry for ``model`` (a paper preset, any case), or None (no model, or
    a config.json path: the path field shows it)."""
    if not model:
        return None
    return PRESET_NAMES.get(str(model).lower())


def _parse_weights(text: str) -> tuple[float, ...]:
    parts = [x.strip() for x in str(text).replace(";", ",").split(",") if x.strip()]
    try:
        return tuple(float(x) for x in parts)
    except ValueError:
        raise ValueError(f"per-stage weights must be numbers separated by commas, got {text!r}") from None


def explorer(schedules: Sequence[str] | None = None, num_devices: int = 4, num_microbatches: int = 12,
             f: float = 1.0, b: float = 1.0, w: float = 1.0, comm: float = 0.0,
             first_stage_extra: float = 0.0, last_stage_extra: float = 0.0,
             memory_limit: float | None = None, stage_weights: Sequence[float] = (),
             load: Sequence[str] = (), state: str | None = None, optimize: float = 0.0, improve: str | None = None,
             recompute: str = "none", offload: float | None = None, offload_cost: float = 0.0,
             model: str | None = None, microbatch_size: int | None = None, fb_overlap: float = 1.0,
             **kwargs) -> Explorer:
    """An :class:`Explorer` with these initial settings (display it in a notebook cell);
    ``load``: schedule files (torch / torchtitan CSV or text form) to compare as well;
    ``optimize``: seconds of :func:`ctrlmem.improve` for the schedule ``improve`` (default: the first
    other than 1F1B; 0: off); ``recompute``, ``offload``, ``offload_cost``: the memory levers;
    ``model`` (a paper preset or a Hugging Face ``config.json`` path) and ``microbatch_size``: the
    memory panel's GB axis; ``fb_overlap``: DualPipe's overlapped F&B pair time as a fraction of
    F + B (:class:`~ctrlmem.explorer.views.Settings`);
    ``state``: a state to show instead: a state file, its data (``views.plan_state(df)``: a plan's
    winner) or a state link (see :meth:`Explorer.apply_state`)."""
    settings = Settings(
        schedules=tuple(schedules) if schedules is not None else default_schedules(),
        num_devices=num_devices, num_microbatches=num_microbatches, f=f, b=b, w=w, comm=comm,
        first_stage_extra=first_stage_extra, last_stage_extra=last_stage_extra,
        memory_limit=memory_limit, stage_weights=tuple(stage_weights),
        loaded=tuple(Schedule.load(x) for x in load), optimize=optimize, improve=improve,
        recompute=recompute, offload=offload, offload_cost=offload_cost,
        model=model, microbatch_size=microbatch_size, fb_overlap=fb_overlap,
    )
    ex = Explorer(settings, **kwargs)
    if state:
        ex.apply_state(state)
    return ex
