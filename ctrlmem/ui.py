"""The schedule explorer: widgets that rebuild, simulate and redraw on every change.

Plain functions do the work and are testable without a browser or a kernel:

* :class:`Settings`: what the user picked (schedules, ``p``, ``m``, F/B/W/comm, extra work on
  the first and last stage, memory limit).
* :func:`compute` turns settings into a :class:`View`: the simulations, 1F1B under the same
  settings as reference, the stats table, the figure specs, and readable messages for anything
  that went wrong (bad input never raises out of :func:`compute`).
* :func:`export_view` writes a view as PNG, SVG, HTML or torch CSV.

:class:`Explorer` lays out ipywidgets around them (``ui.explorer()`` in a notebook). Figures
are sent to the browser as plotly mime bundles in ``Output`` widgets, straight from the dict
specs of :mod:`ctrlmem.plot`, so an update costs a simulation plus a JSON encoding.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from . import plot
from .costs import Costs
from .schedules import SCHEDULES, build
from .ir import Schedule
from .simulate import SimResult, simulate
from .validate import ScheduleError

__all__ = ["Settings", "View", "BuildCache", "compute", "stats_table", "export_view", "save_view", "Explorer",
           "explorer", "default_schedules"]

log = logging.getLogger(__name__)

PLOTLY_MIME = "application/vnd.plotly.v1+json"
EXPORT_KINDS = ("png", "svg", "html", "csv")


def default_schedules() -> tuple[str, ...]:
    """1F1B next to V-Half when it is registered (else next to the lowest-memory V schedule
    there is, else ZB-V)."""
    for other in ("v-half", "v-min", "v-zb", "zb-v"):
        if other in SCHEDULES:
            return ("1f1b", other)
    return ("1f1b",)


@dataclass(frozen=True)
class Settings:
    """What the explorer shows.

    Attributes:
        schedules: registered names to compare, drawn top to bottom.
        num_devices: ``p``.
        num_microbatches: ``m``.
        f, b, w: pass times of one full device-stage; comm: latency of one hop.
        first_stage_extra: extra work on the first stage (embedding), as a fraction of one
            device-stage: stage 0's F, B and W times grow by this fraction of ``f``, ``b``, ``w``.
        last_stage_extra: the same for the last stage (LM head and loss).
        memory_limit: activation budget as a fraction of 1F1B's peak, or ``None``. Budgeted
            schedules are built for it; the others are checked against it.
    """

    schedules: tuple[str, ...] = field(default_factory=default_schedules)
    num_devices: int = 4
    num_microbatches: int = 12
    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    comm: float = 0.0
    first_stage_extra: float = 0.0
    last_stage_extra: float = 0.0
    memory_limit: float | None = None

    def costs(self, num_stages: int | None = None) -> Costs:
        """The costs for a schedule with ``num_stages`` stages: uniform, or per-stage lists
        with the extra first/last-stage work. Raises ``ValueError`` on bad numbers."""
        base = Costs(self.f, self.b, self.w, self.comm)
        extra_first, extra_last = float(self.first_stage_extra), float(self.last_stage_extra)
        for label, x in (("first-stage extra", extra_first), ("last-stage extra", extra_last)):
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"{label} must be a number >= 0 (a fraction of one device-stage), got {x:g}")
        if not (extra_first or extra_last) or num_stages is None:
            return base
        p = self.num_devices
        lists = []
        for full in (base.f, base.b, base.w):
            per = [full * p / num_stages] * num_stages
            per[0] += extra_first * full
            per[-1] += extra_last * full
            lists.append(per)
        return Costs(*lists, comm=base.comm)


@dataclass
class View:
    """Everything the explorer shows for one :class:`Settings`.

    Attributes:
        results: simulation per schedule that could be built, in the order asked.
        reference: 1F1B under the same ``p``, ``m`` and costs (the table's baseline).
        stats: one row per schedule (see :func:`stats_table`).
        messages: readable problems (bad input, a schedule that cannot be built, a memory limit
            nothing meets); empty when all is well.
        diagram_spec, memory_spec: plotly figure dicts (``None`` when nothing could be built).
        seconds: wall time :func:`compute` took.
    """

    settings: Settings
    results: dict[str, SimResult]
    reference: SimResult | None
    stats: pd.DataFrame
    messages: list[str]
    diagram_spec: dict | None
    memory_spec: dict | None
    seconds: float = 0.0

    @property
    def diagram(self) -> go.Figure | None:
        """The schedule diagram as a validated plotly figure."""
        return go.Figure(self.diagram_spec) if self.diagram_spec is not None else None

    @property
    def memory(self) -> go.Figure | None:
        """The memory curves as a validated plotly figure."""
        return go.Figure(self.memory_spec) if self.memory_spec is not None else None


STATS_COLUMNS = ["schedule", "makespan", "bubble rate", "peak (a)", "peak / 1F1B",
                 "speed-up over 1F1B", "peak per device (a)", "fits limit"]


def stats_table(results: dict[str, SimResult], reference: SimResult | None,
                memory_limit: float | None = None) -> pd.DataFrame:
    """One row per schedule: makespan, bubble rate, peak memory (max over devices, in ``a``),
    that peak as a fraction of 1F1B's, the speed-up over 1F1B (its makespan over ours), the
    peak of every device, and whether it fits ``memory_limit``."""
    ref_peak = max(reference.peak_memory) if reference is not None else math.nan
    ref_span = reference.makespan if reference is not None else math.nan
    rows = []
    for name, r in results.items():
        peak = max(r.peak_memory)
        frac = peak / ref_peak if ref_peak else math.nan
        rows.append({
            "schedule": name,
            "makespan": r.makespan,
            "bubble rate": r.bubble_rate,
            "peak (a)": peak,
            "peak / 1F1B": frac,
            "speed-up over 1F1B": ref_span / r.makespan if r.makespan else math.nan,
            "peak per device (a)": list(r.peak_memory),
            "fits limit": None if memory_limit is None else bool(frac <= memory_limit + 1e-9),
        })
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ScheduleError):
        return exc.reason
    msg = exc.args[0] if exc.args else str(exc)
    return str(msg).splitlines()[0] if str(msg) else type(exc).__name__


class BuildCache:
    """Schedules already built, keyed by everything their generator sees: ``(name, p, m,
    memory_limit, costs)`` with costs only for cost-aware generators. Changing F/B/W/comm then
    only re-simulates; the block-based generators take hundreds of ms at p=16, m=64."""

    def __init__(self, max_entries: int = 64):
        self.max_entries = max_entries
        self._items: dict[tuple, Schedule] = {}
        self.hits = self.misses = 0

    def build(self, name: str, p: int, m: int, costs: Costs, memory_limit: float | None) -> Schedule:
        key = (name, p, m, memory_limit, costs if SCHEDULES[name].uses_costs else None)
        if key in self._items:
            self.hits += 1
            return self._items[key]
        self.misses += 1
        schedule = build(name, p, m, costs=costs, memory_limit=memory_limit)
        if len(self._items) >= self.max_entries:
            self._items.pop(next(iter(self._items)))
        self._items[key] = schedule
        return schedule


def compute(settings: Settings, *, style: dict | None = None, cache: BuildCache | None = None) -> View:
    """Build, simulate and draw every selected schedule. Never raises for bad input: problems
    become :attr:`View.messages` and the schedules that did build are still shown. ``cache``
    reuses schedules built by earlier calls (see :class:`BuildCache`)."""
    cache = cache if cache is not None else BuildCache()
    t0 = time.perf_counter()
    style = style or {}
    messages: list[str] = []
    results: dict[str, SimResult] = {}
    reference = None
    empty = View(settings, {}, None, stats_table({}, None), messages, None, None)
    p, m = settings.num_devices, settings.num_microbatches
    try:
        base_costs = settings.costs()
        if not isinstance(p, int) or p < 1 or not isinstance(m, int) or m < 1:
            raise ValueError(f"p and m must be positive integers, got p={p!r}, m={m!r}")
        limit = settings.memory_limit
        if limit is not None and not (isinstance(limit, (int, float)) and 0 < limit and math.isfinite(limit)):
            raise ValueError(f"the memory limit must be a positive fraction of 1F1B's peak, got {limit!r}")
    except (ValueError, TypeError) as exc:
        messages.append(f"Cannot compute: {_reason(exc)}")
        empty.seconds = time.perf_counter() - t0
        return empty
    names = list(dict.fromkeys(settings.schedules))
    if not names:
        messages.append("Choose at least one schedule to show.")
    for name in names:
        if name not in SCHEDULES:
            messages.append(f"{name}: not a registered schedule (available: {', '.join(SCHEDULES)}).")
            continue
        spec = SCHEDULES[name]
        try:
            budget = limit if spec.memory_limit else None
            sched = cache.build(name, p, m, base_costs, budget)
            costs = settings.costs(sched.num_stages)
            if costs is not base_costs and spec.uses_costs:
                sched = cache.build(name, p, m, costs, budget)
            results[name] = simulate(sched, costs)
        except (ValueError, ScheduleError, KeyError) as exc:
            messages.append(f"{name}: {_reason(exc)}")
    try:
        ref_costs = settings.costs(p)
        if "1f1b" in results and results["1f1b"].costs == ref_costs:
            reference = results["1f1b"]
        else:
            reference = simulate(cache.build("1f1b", p, m, ref_costs, None), ref_costs)
    except (ValueError, ScheduleError) as exc:
        messages.append(f"1F1B reference: {_reason(exc)}")
    stats = stats_table(results, reference, limit)
    if limit is not None and results and reference is not None:
        over = stats[~stats["fits limit"].astype(bool)]
        ref_peak = max(reference.peak_memory)
        if len(over) == len(stats):
            needs = ", ".join(f"{r['schedule']} needs {r['peak / 1F1B']:.2f}" for _, r in over.iterrows())
            budgeted = [n for n, s in SCHEDULES.items() if s.memory_limit]
            hint = (f"memory-budgeted schedules: {', '.join(budgeted)}" if budgeted
                    else "no memory-budgeted schedule is registered")
            messages.append(
                f"No selected schedule fits a memory limit of {limit:g} × 1F1B's peak "
                f"({limit * ref_peak:g} a of {ref_peak:g} a): {needs}. Raise the limit, or pick a "
                f"schedule that needs less ({hint})."
            )
        elif len(over):
            messages.append("Over the memory limit of {:g} × 1F1B: {}.".format(
                limit, ", ".join(f"{r['schedule']} ({r['peak / 1F1B']:.2f})" for _, r in over.iterrows())))
    diagram_spec = memory_spec = None
    if results:
        rs = list(results.values())
        diagram_spec = plot.schedule_spec(rs, **style.get("diagram", {}))
        memory_spec = plot.memory_spec(
            rs, reference_peak=max(reference.peak_memory) if reference is not None else None,
            **style.get("memory", {}))
    view = View(settings, results, reference, stats, messages, diagram_spec, memory_spec)
    view.seconds = time.perf_counter() - t0
    return view


def stats_html(stats: pd.DataFrame) -> str:
    """The stats table as HTML (numbers rounded for reading; the DataFrame keeps them exact)."""
    if stats.empty:
        return "<i>no schedule to show</i>"
    shown = stats.copy()
    shown["peak per device (a)"] = shown["peak per device (a)"].map(lambda v: ", ".join(f"{x:g}" for x in v))
    if shown["fits limit"].isna().all():
        shown = shown.drop(columns=["fits limit"])
    else:
        shown["fits limit"] = shown["fits limit"].map({True: "yes", False: "NO"})
    return shown.to_html(index=False, float_format=lambda x: f"{x:.4g}", classes="ctrlmem-stats", border=0)


def messages_html(messages: Sequence[str]) -> str:
    if not messages:
        return ""
    items = "".join(f"<li>{html.escape(m)}</li>" for m in messages)
    return ("<div class='ctrlmem-message' style='color:#8a1c1c;background:#fdf0f0;border:1px solid "
            f"#e8b4b4;padding:4px 10px;border-radius:4px'><ul style='margin:4px 0'>{items}</ul></div>")


_TYPED_ARRAY = {"float64": "f8", "float32": "f4", "int32": "i4", "int16": "i2", "int8": "i1",
                "uint8": "u1", "uint16": "u2", "uint32": "u4"}


def jsonable(obj):
    """A figure dict made JSON-ready: numpy arrays become plotly.js typed-array specs
    (``{"dtype", "bdata", "shape"}``, base64 little-endian), which plotly.js reads directly and
    which encode far faster than lists of numbers."""
    if isinstance(obj, np.ndarray):
        arr = obj
        if arr.dtype == np.int64:
            arr = arr.astype(np.int32)
        code = _TYPED_ARRAY.get(str(arr.dtype))
        if code is None or arr.size == 0:
            return arr.tolist()
        out = {"dtype": code, "bdata": base64.b64encode(np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))
                                                        .tobytes()).decode("ascii")}
        if arr.ndim > 1:
            out["shape"] = ", ".join(map(str, arr.shape))
        return out
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def mime_bundle(spec: dict, label: str) -> dict:
    """A display_data bundle plotly's JupyterLab extension renders, from a figure dict."""
    fig_json = jsonable(spec)
    fig_json["config"] = {"responsive": True, "displaylogo": False}
    return {PLOTLY_MIME: fig_json, "text/plain": f"<{label}: {len(spec['data'])} traces>"}


def _slug(view: View) -> str:
    s = view.settings
    return f"{'-vs-'.join(view.results) or 'none'}_p{s.num_devices}_m{s.num_microbatches}"


def export_view(view: View, kind: str, directory: str | os.PathLike = "build/explorer") -> list[str]:
    """Write ``view``: ``png`` / ``svg`` (diagram and memory curves, one file each, kaleido),
    ``html`` (diagram, memory curves and stats in one offline page, plotly.js embedded), or
    ``csv`` (each schedule in torch's pipelining CSV). Returns the paths written."""
    if kind not in EXPORT_KINDS:
        raise ValueError(f"export kind must be one of {EXPORT_KINDS}, got {kind!r}")
    if not view.results:
        raise ValueError("nothing to export: no schedule could be built for these settings")
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(str(directory), _slug(view))
    paths: list[str] = []
    if kind == "csv":
        for name, r in view.results.items():
            path = f"{stem}_{name}.csv"
            r.schedule.to_torch_csv(path)
            paths.append(path)
    elif kind == "html":
        path = f"{stem}.html"
        parts = [pio.to_html(view.diagram, include_plotlyjs=True, full_html=False),
                 pio.to_html(view.memory, include_plotlyjs=False, full_html=False),
                 stats_html(view.stats)]
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("<!DOCTYPE html><html><head><meta charset='utf-8'><title>ctrlmem: "
                     f"{html.escape(_slug(view))}</title></head><body>{''.join(parts)}</body></html>")
        paths.append(path)
    else:
        paths += plot.write_figures([(view.diagram, f"{stem}_diagram.{kind}"),
                                     (view.memory, f"{stem}_memory.{kind}")])
    log.info("exported %s", paths)
    return paths


def save_view(view: View, out_dir: str | os.PathLike) -> str:
    """Write the view's settings, stats and messages to ``out_dir/explore.json`` (what a
    notebook run records); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(str(out_dir), "explore.json")
    stats = view.stats.astype(object).where(view.stats.notna(), None)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"settings": asdict(view.settings), "stats": stats.to_dict(orient="records"),
                   "messages": view.messages}, fh, indent=2)
    return path


class Explorer:
    """The ipywidgets explorer. ``explorer.widget`` is the layout; ``explorer.view`` the last
    :class:`View`; every widget change calls :meth:`update`.

    Args:
        settings: initial settings.
        export_dir: where the export buttons write.
        max_devices, max_microbatches: slider ranges.
        style: ``{"diagram": {...}, "memory": {...}}`` keyword arguments for
            :func:`ctrlmem.plot.schedule_figure` and :func:`ctrlmem.plot.memory_figure`.
    """

    def __init__(self, settings: Settings | None = None, *, export_dir: str = "build/explorer",
                 max_devices: int = 32, max_microbatches: int = 256, style: dict | None = None):
        import ipywidgets as W  # noqa: PLC0415  (optional dependency, only for the widgets)

        s = settings or Settings()
        self.style = style or {}
        self.export_dir = export_dir
        self.builds = BuildCache()
        names = list(SCHEDULES)
        self._unknown = [n for n in s.schedules if n not in SCHEDULES]
        label = {"style": {"description_width": "initial"}}
        self.schedules = W.SelectMultiple(
            options=names, value=tuple(n for n in s.schedules if n in SCHEDULES),
            rows=min(len(names), 8), description="schedules", **label)
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
        wide = W.Layout(width="230px")
        self.first_extra = W.FloatText(value=s.first_stage_extra, description="first-stage extra",
                                       layout=wide, **label)
        self.last_extra = W.FloatText(value=s.last_stage_extra, description="last-stage extra",
                                      layout=wide, **label)
        self.limit_on = W.Checkbox(value=s.memory_limit is not None, description="memory limit",
                                   indent=False, layout=W.Layout(width="110px"))
        self.limit = W.FloatSlider(value=s.memory_limit if s.memory_limit is not None else 0.5,
                                   min=0.05, max=2.0, step=0.05, description="× 1F1B peak",
                                   continuous_update=False, readout_format=".2f", **label)
        self.message = W.HTML()
        self.stats_out = W.HTML()
        self.timing = W.HTML()
        self.diagram_out = W.Output()
        self.diagram_out.add_class("ctrlmem-diagram")
        self.memory_out = W.Output()
        self.memory_out.add_class("ctrlmem-memory")
        self.buttons = {kind: W.Button(description=f"export {kind.upper() if kind != 'csv' else 'torch CSV'}",
                                       layout=W.Layout(width="140px")) for kind in EXPORT_KINDS}
        for kind, button in self.buttons.items():
            button.on_click(lambda _b, kind=kind: self._export_clicked(kind))
        self._inputs = [self.schedules, self.devices, self.microbatches, self.f, self.b, self.w,
                        self.comm, self.first_extra, self.last_extra, self.limit_on, self.limit]
        for wdg in self._inputs:
            wdg.observe(self.update, names="value")
        controls = W.VBox([
            W.HBox([self.schedules, W.VBox([self.devices, self.microbatches,
                                            W.HBox([self.limit_on, self.limit])])]),
            W.HBox([self.f, self.b, self.w, self.comm]),
            W.HBox([self.first_extra, self.last_extra]),
            W.HBox(list(self.buttons.values())),
        ])
        self.widget = W.VBox([controls, self.message, self.stats_out, self.timing,
                              self.diagram_out, self.memory_out])
        self.widget.add_class("ctrlmem-explorer")
        self.view: View | None = None
        self.update()

    def settings(self) -> Settings:
        """The settings the widgets show now."""
        return Settings(
            schedules=tuple(self.schedules.value) + tuple(self._unknown),
            num_devices=int(self.devices.value), num_microbatches=int(self.microbatches.value),
            f=self.f.value, b=self.b.value, w=self.w.value, comm=self.comm.value,
            first_stage_extra=self.first_extra.value, last_stage_extra=self.last_extra.value,
            memory_limit=float(self.limit.value) if self.limit_on.value else None,
        )

    def update(self, *_change) -> View:
        """Recompute and redraw (called on every widget change)."""
        if any(getattr(c, "owner", None) is self.schedules or (isinstance(c, dict) and c.get("owner") is self.schedules)
               for c in _change):
            self._unknown = []  # names from the initial settings that are not registered: reported until the user picks
        try:
            view = compute(self.settings(), style=self.style, cache=self.builds)
        except Exception as exc:  # an unexpected failure still shows a message, not a traceback
            log.exception("explorer update failed")
            self.message.value = messages_html([f"Unexpected error: {type(exc).__name__}: {exc}"])
            return self.view
        self.view = view
        self.render(view)
        return view

    def render(self, view: View) -> None:
        """Put ``view`` into the widgets."""
        t0 = time.perf_counter()
        self.message.value = messages_html(view.messages)
        self.stats_out.value = stats_html(view.stats)
        self.diagram_out.outputs = (
            ({"output_type": "display_data", "metadata": {},
              "data": mime_bundle(view.diagram_spec, "schedule diagram")},)
            if view.diagram_spec is not None else ())
        self.memory_out.outputs = (
            ({"output_type": "display_data", "metadata": {},
              "data": mime_bundle(view.memory_spec, "memory curves")},)
            if view.memory_spec is not None else ())
        self.last_render_seconds = time.perf_counter() - t0
        self.timing.value = (f"<small style='color:#777'>computed in {view.seconds * 1e3:.0f} ms, "
                             f"drawn in {self.last_render_seconds * 1e3:.0f} ms</small>")

    def export(self, kind: str, directory: str | None = None) -> list[str]:
        """Export the current view (see :func:`export_view`)."""
        return export_view(self.view, kind, directory or self.export_dir)

    def save(self, out_dir: str | os.PathLike) -> str:
        """Record the current view (see :func:`save_view`)."""
        return save_view(self.view, out_dir)

    def _export_clicked(self, kind: str) -> None:
        try:
            paths = self.export(kind)
        except Exception as exc:  # kaleido/Chromium missing, unwritable folder, nothing to export
            log.exception("export failed")
            self.message.value = messages_html([f"Export {kind} failed: {_reason(exc)}"])
            return
        self.message.value = ("<div class='ctrlmem-exported' style='color:#1c5e20'>wrote "
                              + ", ".join(html.escape(p) for p in paths) + "</div>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def explorer(schedules: Sequence[str] | None = None, num_devices: int = 4, num_microbatches: int = 12,
             f: float = 1.0, b: float = 1.0, w: float = 1.0, comm: float = 0.0,
             first_stage_extra: float = 0.0, last_stage_extra: float = 0.0,
             memory_limit: float | None = None, **kwargs) -> Explorer:
    """An :class:`Explorer` with these initial settings (display it in a notebook cell)."""
    settings = Settings(
        schedules=tuple(schedules) if schedules is not None else default_schedules(),
        num_devices=num_devices, num_microbatches=num_microbatches, f=f, b=b, w=w, comm=comm,
        first_stage_extra=first_stage_extra, last_stage_extra=last_stage_extra,
        memory_limit=memory_limit,
    )
    return Explorer(settings, **kwargs)
