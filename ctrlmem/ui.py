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
from dataclasses import dataclass, field, fields
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
EXPORT_KINDS = ("png", "svg", "pdf", "html", "csv")


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
        optimize: seconds of :func:`ctrlmem.improve` for the first selected schedule (0: off, the
            default); its improved schedule is shown right below it, within the memory limit (or
            its own peak).
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
    stage_weights: tuple[float, ...] = ()
    loaded: tuple[Schedule, ...] = ()
    optimize: float = 0.0

    def costs(self, num_stages: int | None = None) -> Costs:
        """The costs for a schedule with ``num_stages`` stages: uniform, or per-stage lists
        with the per-stage weights and the extra first/last-stage work. Raises ``ValueError``
        on bad numbers.

        ``stage_weights`` (empty: all 1): the relative cost of each of ``p`` equal slices of
        the model in model order (slice ``i`` is what a one-stage-per-device schedule puts on
        device ``i``); a schedule with ``v`` stages per device splits each slice into ``v``
        equal stages."""
        base = Costs(self.f, self.b, self.w, self.comm)
        extra_first, extra_last = float(self.first_stage_extra), float(self.last_stage_extra)
        for label, x in (("first-stage extra", extra_first), ("last-stage extra", extra_last)):
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"{label} must be a number >= 0 (a fraction of one device-stage), got {x:g}")
        p = self.num_devices
        weights = tuple(float(x) for x in self.stage_weights)
        if weights:
            if len(weights) != p:
                raise ValueError(f"per-stage weights: give {p} numbers (one per device-stage, model "
                                 f"order), got {len(weights)}")
            if any(not math.isfinite(x) or x <= 0 for x in weights):
                raise ValueError("per-stage weights must be numbers > 0")
        if not (extra_first or extra_last or weights) or num_stages is None:
            return base
        if num_stages % p:
            raise ValueError(f"per-stage costs need a whole number of stages per device, got {num_stages} on {p}")
        v = num_stages // p
        lists = []
        for full in (base.f, base.b, base.w):
            per = [full * (weights[s // v] if weights else 1.0) / v for s in range(num_stages)]
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


def _with_improved(results: dict[str, SimResult], seconds: float, limit: float | None,
                   messages: list[str]) -> dict[str, SimResult]:
    """``results`` with the first schedule improved by :func:`ctrlmem.improve` for ``seconds``
    inserted right after it (``NAME+improved``); a problem becomes a message."""
    from .improve import improve

    first, r = next(iter(results.items()))
    p = r.schedule.num_devices
    budget = limit if limit is not None and max(r.peak_memory) <= limit * p + 1e-9 else None
    try:
        res = improve(r.schedule, r.costs, budget, time_limit=seconds)
    except (ValueError, TypeError) as exc:
        messages.append(f"optimize {first}: {_reason(exc)}")
        return results
    messages.append(f"optimize {first} ({res.wall_s:.1f} s): makespan {res.seed[1]:g} -> {res.makespan:g}, "
                    f"lower bound {res.lower_bound:.6g}, gap {100 * res.gap:.2f} % ({res.status})")
    out = {}
    for name, x in results.items():
        out[name] = x
        if name == first:
            out[f"{first}+improved"] = simulate(res.schedule, r.costs)
    return out


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
    for sched in settings.loaded:
        label = f"{sched.name} (file)"
        if (sched.num_devices, sched.num_microbatches) != (p, m):
            messages.append(f"{label}: has p={sched.num_devices}, m={sched.num_microbatches}; set p and m "
                            "to those to compare it")
            continue
        try:
            results[label] = simulate(sched, settings.costs(sched.num_stages))
        except (ValueError, ScheduleError) as exc:
            messages.append(f"{label}: {_reason(exc)}")
    try:
        ref_costs = settings.costs(p)
        if "1f1b" in results and results["1f1b"].costs == ref_costs:
            reference = results["1f1b"]
        else:
            reference = simulate(cache.build("1f1b", p, m, ref_costs, None), ref_costs)
    except (ValueError, ScheduleError) as exc:
        messages.append(f"1F1B reference: {_reason(exc)}")
    if settings.optimize and results:
        results = _with_improved(results, settings.optimize, limit, messages)
    stats = stats_table(results, reference, limit)
    if limit is not None and results and reference is not None:
        over = stats[~stats["fits limit"].astype(bool)]
        ref_peak = max(reference.peak_memory)
        if len(over) == len(stats):
            needs = ", ".join(f"{r['schedule']} needs {plot.fmt_ratio(r['peak / 1F1B'])}" for _, r in over.iterrows())
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
                limit, ", ".join(f"{r['schedule']} ({plot.fmt_ratio(r['peak / 1F1B'])})" for _, r in over.iterrows())))
    diagram_spec = memory_spec = None
    if results:
        rs = list(results.values())
        title = plot.setting_label(p, m, base_costs if not (settings.stage_weights or settings.first_stage_extra
                                                            or settings.last_stage_extra) else settings.costs(p),
                                   limit)
        diagram_spec = plot.schedule_spec(rs, title=f"schedules: {title}", **style.get("diagram", {}))
        memory_spec = plot.memory_spec(
            rs, reference_peak=max(reference.peak_memory) if reference is not None else None,
            title=f"activation memory per device: {title}", **style.get("memory", {}))
    view = View(settings, results, reference, stats, messages, diagram_spec, memory_spec)
    view.seconds = time.perf_counter() - t0
    return view


def stats_html(stats: pd.DataFrame) -> str:
    """The stats table as HTML (numbers rounded for reading; the DataFrame keeps them exact)."""
    if stats.empty:
        return "<i>no schedule to show</i>"
    shown = stats.copy()
    shown["peak per device (a)"] = shown["peak per device (a)"].map(_per_device)
    if shown["fits limit"].isna().all():
        shown = shown.drop(columns=["fits limit"])
    else:
        shown["fits limit"] = shown["fits limit"].map({True: "yes", False: "NO"})
    fmt = {"makespan": plot.fmt_time, "peak (a)": plot.fmt_time, "bubble rate": plot.fmt_ratio,
           "peak / 1F1B": plot.fmt_ratio, "speed-up over 1F1B": plot.fmt_ratio}
    return shown.to_html(index=False, formatters=fmt, float_format=plot.fmt_time, classes="ctrlmem-stats",
                         border=0)


def _per_device(peaks: Sequence[float]) -> str:
    """Every device's peak for small pipelines; the extremes (and where) for deep ones."""
    if len(peaks) <= 8:
        return ", ".join(plot.fmt_time(x) for x in peaks)
    hi, lo = int(np.argmax(peaks)), int(np.argmin(peaks))
    return (f"d0 {plot.fmt_time(peaks[0])} … d{len(peaks) - 1} {plot.fmt_time(peaks[-1])}; "
            f"max {plot.fmt_time(peaks[hi])} (d{hi}), min {plot.fmt_time(peaks[lo])} (d{lo})")


def messages_html(messages: Sequence[str]) -> str:
    if not messages:
        return ""
    items = "".join(f"<li>{html.escape(m)}</li>" for m in messages)
    return ("<div class='ctrlmem-message' style='color:#8a1c1c;background:#fdf0f0;border:1px solid "
            f"#e8b4b4;padding:4px 10px;border-radius:4px'><ul style='margin:4px 0'>{items}</ul></div>")


def _closed_forms(name: str, p: int) -> tuple[str, str] | None:
    """(peak activation in ``a``, bubble per device) in closed form for F=B=W, comm=0, as the
    paper gives them (Sec. 3, Table 1; bubbles in unit passes τ, one F, B or W over half a
    device-stage, so a full-stage F+B+W is 6τ), or None when the paper gives none."""
    forms = {
        "1f1b": (f"p = {p}", f"6(p−1) = {6 * (p - 1)}τ"),
        "zb-h1": (f"p = {p}", f"2(p−1) = {2 * (p - 1)}τ"),
        "zb-v": (f"p = {p}", "0"),
        "v-zb": (f"p = {p}", "0"),
        "v-half": (f"⌊(p+2)/2⌋ = {(p + 2) // 2}",
                   f"3p−7 = {3 * p - 7}τ" if p % 2 == 0 else f"3p−4 = {3 * p - 4}τ"),
        "v-min": (f"⌊(p+4)/3⌋ = {(p + 4) // 3}",
                  f"4p−5 = {4 * p - 5}τ" if p % 3 else f"4p−7 = {4 * p - 7}τ"),
    }
    return forms.get(name)


def formula_html(view: View) -> str:
    """The closed forms of the shown schedules at this p next to the simulated numbers, and the
    V-Half / V-ZB conditions W+2B ≥ 2F and W+2F ≥ 2B evaluated on the current costs."""
    s = view.settings
    if not view.results:
        return ""
    p = s.num_devices
    rows = []
    for name, r in view.results.items():
        forms = _closed_forms(name, p)
        if forms is None:
            continue
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{forms[0]}</td><td>{plot.fmt_time(max(r.peak_memory))}</td>"
                    f"<td>{forms[1]}</td></tr>")
    f, b, w = float(s.f), float(s.b), float(s.w)
    c1, c2 = w + 2 * b >= 2 * f - 1e-12, w + 2 * f >= 2 * b - 1e-12
    mark = lambda ok: "<b style='color:#1c5e20'>holds</b>" if ok else "<b style='color:#8a1c1c'>fails</b>"  # noqa: E731
    cond = (f"V-Half / V-ZB tile without a repeating bubble iff W+2B ≥ 2F and W+2F ≥ 2B: here "
            f"W+2B = {w + 2 * b:g} vs 2F = {2 * f:g} ({mark(c1)}), W+2F = {w + 2 * f:g} vs 2B = {2 * b:g} "
            f"({mark(c2)}).")
    if not (c1 and c2):
        cond += " Their bubble then grows with m."
    table = ""
    if rows:
        table = ("<table class='ctrlmem-formulas' style='border-collapse:collapse'><tr><th>schedule</th>"
                 "<th>peak, closed form (a)</th><th>peak, simulated</th><th>bubble per device, closed form</th></tr>"
                 + "".join(rows) + "</table><small>closed forms for F=B=W, comm=0 (the paper's Sec. 3 and "
                 "Table 1); τ is one pass over half a device-stage</small><br>")
    return f"<div class='ctrlmem-formula' style='font-size:90%'>{table}{cond}</div>"


def verdict(view: View) -> str:
    """One line: the fastest schedule, the fastest at each lower memory, and every V schedule
    that is slower than 1F1B under these costs."""
    st = view.stats
    if st.empty or view.reference is None:
        return ""
    rows = st.sort_values(["peak / 1F1B", "makespan"]).to_dict("records")
    best = min(rows, key=lambda r: (r["makespan"], r["peak / 1F1B"]))
    parts = [f"Fastest: {best['schedule']} ({plot.fmt_ratio(best['speed-up over 1F1B'])}× 1F1B's speed, "
             f"peak {plot.fmt_ratio(best['peak / 1F1B'])} × 1F1B)."]
    front, fastest = [], math.inf
    for r in rows:  # Pareto front over (memory, makespan), lowest memory first
        if r["makespan"] < fastest - 1e-12:
            front.append(r)
            fastest = r["makespan"]
    lower = [r for r in front if r["schedule"] != best["schedule"]]
    if lower:
        parts.append("With less memory: " + "; ".join(
            f"≤ {plot.fmt_ratio(r['peak / 1F1B'])} × 1F1B: {r['schedule']} ({plot.fmt_ratio(r['speed-up over 1F1B'])}×)"
            for r in lower) + ".")
    losers = [r for r in rows if str(r["schedule"]).startswith(("v-", "zb-v")) and r["speed-up over 1F1B"] < 1 - 1e-9]
    for r in losers:
        parts.append(f"{r['schedule']} loses to 1F1B here ({plot.fmt_ratio(r['speed-up over 1F1B'])}× its speed): "
                     "its memory saving costs more bubble than 1F1B's at these costs.")
    return " ".join(parts)


def command_line(settings: Settings, output: str | None = None) -> str:
    """The ``ctrlmem draw`` command that draws what the explorer shows (per-stage weights and
    first/last-stage extras have no command-line form and are named in a trailing comment)."""
    s = settings
    names = [n for n in s.schedules if n in SCHEDULES]
    if not names:
        return ""
    costs = ",".join(f"{x:g}" for x in (s.f, s.b, s.w, s.comm))
    out = output or f"{_slug_of(names, s)}.html"
    cmd = f"ctrlmem draw {names[0]}"
    if len(names) > 1:
        cmd += f" --compare {','.join(names[1:])}"
    cmd += f" -p {s.num_devices} -m {s.num_microbatches} --costs {costs}"
    if s.memory_limit is not None:
        cmd += f" --memory-limit {s.memory_limit:g}"
    if s.optimize:
        cmd += f" --optimize {s.optimize:g}"
    cmd += f" -o {out}"
    missing = []
    if s.stage_weights:
        missing.append("per-stage weights " + ",".join(f"{x:g}" for x in s.stage_weights))
    if s.first_stage_extra or s.last_stage_extra:
        missing.append(f"first/last-stage extra {s.first_stage_extra:g}/{s.last_stage_extra:g}")
    if s.loaded:
        missing.append("loaded files " + ", ".join(x.name for x in s.loaded))
    if missing:
        cmd += "  # not expressible on the command line: " + "; ".join(missing)
    return cmd


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
    # not "responsive": plotly would size the height from a container sized by the plot, which
    # collapsed plots to zero height when the window grew; the explorer's view follows the width
    fig_json["config"] = {"responsive": False, "displaylogo": False}
    return {PLOTLY_MIME: fig_json, "text/plain": f"<{label}: {len(spec['data'])} traces>"}


def _slug_of(names: Sequence[str], s: Settings) -> str:
    """A file stem carrying everything that changes the picture: schedules, p, m, costs, budget."""
    costs = "-".join(f"{k}{v:g}" for k, v in (("F", s.f), ("B", s.b), ("W", s.w), ("c", s.comm)))
    stem = f"{'-vs-'.join(names) or 'none'}_p{s.num_devices}_m{s.num_microbatches}_{costs}"
    if s.memory_limit is not None:
        stem += f"_lim{s.memory_limit:g}"
    if s.stage_weights:
        stem += "_w" + "-".join(f"{x:g}" for x in s.stage_weights)
    if s.first_stage_extra or s.last_stage_extra:
        stem += f"_x{s.first_stage_extra:g}-{s.last_stage_extra:g}"
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)


def _slug(view: View) -> str:
    return _slug_of([n.replace(" (file)", "") for n in view.results], view.settings)


def export_view(view: View, kind: str, directory: str | os.PathLike = "build/explorer") -> list[str]:
    """Write ``view``: ``png`` / ``svg`` / ``pdf`` (diagram and memory curves, one file each,
    kaleido),
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
            path = f"{stem}_{name.replace(' (file)', '')}.csv"
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
    settings = {f.name: getattr(view.settings, f.name) for f in fields(view.settings)}
    settings["loaded"] = [{"name": s.name, "text": s.to_text()} for s in view.settings.loaded]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"settings": settings, "stats": stats.to_dict(orient="records"),
                   "messages": view.messages}, fh, indent=2)
    return path


_PLOT_ESM = r"""
let loading = null;
function ensurePlotly(model) {
  if (globalThis.Plotly && globalThis.Plotly.react) return Promise.resolve(globalThis.Plotly);
  if (loading) return loading;
  const src = model.get("plotly_js");
  if (!src) {  // another view carries plotly.js: wait for it
    loading = new Promise(resolve => { const t = setInterval(() => {
      if (globalThis.Plotly && globalThis.Plotly.react) { clearInterval(t); resolve(globalThis.Plotly); } }, 50); });
    return loading;
  }
  loading = new Promise((resolve, reject) => {
    const amd = globalThis.define;  // keep plotly.js from registering as an AMD module
    globalThis.define = undefined;
    const s = document.createElement("script");
    s.src = URL.createObjectURL(new Blob([src], {type: "text/javascript"}));
    s.onload = () => { globalThis.define = amd; resolve(globalThis.Plotly); };
    s.onerror = (e) => { globalThis.define = amd; reject(e); };
    document.head.appendChild(s);
  });
  return loading;
}

export default {
  async render({ model, el }) {
    el.classList.add("ctrlmem-plots");
    const gds = model.get("names").map(name => {
      const box = document.createElement("div");
      box.className = name;
      const gd = document.createElement("div");
      box.appendChild(gd);
      el.appendChild(box);
      return gd;
    });
    const Plotly = await ensurePlotly(model);
    let busy = Promise.resolve();
    const draw = () => { busy = busy.then(async () => {
      const seq = model.get("seq"), figs = model.get("figures");
      const t0 = performance.now();
      // show "updating…" (and dim the plots) while the browser draws, not only while Python computes
      const shell = el.closest(".ctrlmem-explorer");
      if (shell) {
        shell.classList.add("ctrlmem-updating");
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
      }
      try {
      for (let i = 0; i < gds.length; i++) {
        const f = figs[i];
        if (!f) { Plotly.purge(gds[i]); gds[i].parentNode.style.display = "none"; continue; }
        gds[i].parentNode.style.display = "";
        await Plotly.react(gds[i], f.data, f.layout, f.config || {});
      }
      } catch (e) {
        console.error("ctrlmem plot", e);
        model.set("drawn", {seq: seq, ms: performance.now() - t0, error: String(e)});
        model.save_changes();
        return;
      } finally {
        if (shell) shell.classList.remove("ctrlmem-updating");
      }
      await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));  // on screen
      model.set("drawn", {seq: seq, ms: performance.now() - t0});
      model.save_changes();
    }).catch(e => console.error("ctrlmem plot", e)); };
    model.on("change:seq", draw);
    // follow the width only: plotly's own autosize would also take the height from a container
    // whose height is the plot's, and a plot could collapse to zero height when the window grows
    let lastWidth = el.clientWidth;
    model.set("width", lastWidth);  // the label rule needs the drawing's width (see Explorer)
    model.save_changes();
    const resize = new ResizeObserver(() => {
      const width = el.clientWidth;
      if (!width || Math.abs(width - lastWidth) < 2) return;
      lastWidth = width;
      model.set("width", width);
      model.save_changes();
      busy = busy.then(() => Promise.all(gds.map(gd => gd._fullLayout && gd.parentNode.style.display !== "none"
        ? Plotly.relayout(gd, {width: gd.parentNode.clientWidth}) : null))).catch(e => console.error(e));
    });
    resize.observe(el);
    draw();
    return () => { resize.disconnect(); gds.forEach(gd => Plotly.purge(gd)); };
  }
};
"""

_PLOT_VIEW = None


def _plot_view_class():
    """An anywidget that draws plotly figure dicts with one ``Plotly.react`` per update.

    JupyterLab's plotly mime renderer draws every new output three times (react, redraw,
    resize) and then renders it once more to a PNG it stores in the output; at thousands of
    boxes that is most of the wait. This view keeps one graph per figure and reacts to new
    data, so an update is drawn once. plotly.js comes from the installed plotly package (no
    network), sent once per explorer; the browser reports its drawing time back in ``drawn``.
    """
    global _PLOT_VIEW
    if _PLOT_VIEW is not None:
        return _PLOT_VIEW
    import anywidget  # noqa: PLC0415
    import traitlets  # noqa: PLC0415

    class PlotView(anywidget.AnyWidget):
        _esm = _PLOT_ESM
        names = traitlets.List(traitlets.Unicode()).tag(sync=True)
        figures = traitlets.List().tag(sync=True)
        seq = traitlets.Int(0).tag(sync=True)
        drawn = traitlets.Dict().tag(sync=True)
        plotly_js = traitlets.Unicode("").tag(sync=True)
        width = traitlets.Int(0).tag(sync=True)

        def show(self, figures: Sequence[dict | None]) -> None:
            with self.hold_sync():
                self.figures = list(figures)
                self.seq += 1

    _PLOT_VIEW = PlotView
    return PlotView


def _plotly_js() -> str:
    from importlib.resources import files  # noqa: PLC0415

    return (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


_COPY_ESM = r"""
export default {
  render({ model, el }) {
    const button = document.createElement("button");
    button.className = "jupyter-button widget-button ctrlmem-copy";
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


def _copy_button(text_widget):
    """A button that copies ``text_widget.value`` to the clipboard (an anywidget), or None."""
    try:
        import anywidget  # noqa: PLC0415
        import traitlets  # noqa: PLC0415
    except ImportError:
        return None

    class CopyButton(anywidget.AnyWidget):
        _esm = _COPY_ESM
        text = traitlets.Unicode("").tag(sync=True)
        copies = traitlets.Int(0).tag(sync=True)

    button = CopyButton(text=text_widget.value)
    text_widget.observe(lambda change: setattr(button, "text", change["new"]), names="value")
    return button


_CSS = """<style>
.ctrlmem-explorer .ctrlmem-busy-note { display: none; }
.ctrlmem-explorer.ctrlmem-updating .ctrlmem-busy-note { display: inline-block; color: #8a5a00; font-weight: bold; }
.ctrlmem-explorer.ctrlmem-updating .ctrlmem-diagram, .ctrlmem-explorer.ctrlmem-updating .ctrlmem-memory { opacity: 0.45; }
.ctrlmem-explorer .ctrlmem-formulas td, .ctrlmem-explorer .ctrlmem-formulas th { padding: 1px 8px; text-align: left; }
.ctrlmem-explorer .ctrlmem-diagram, .ctrlmem-explorer .ctrlmem-memory { min-height: 120px; }
</style>"""

_CHECKLIST = None


def _checklist_class():
    """A checkbox per schedule whose ``value`` is the tuple of ticked names, in the order they
    were ticked (which is the order the panels are stacked in)."""
    global _CHECKLIST
    if _CHECKLIST is not None:
        return _CHECKLIST
    import ipywidgets as W  # noqa: PLC0415
    import traitlets  # noqa: PLC0415

    class ScheduleChecklist(W.GridBox):
        value = traitlets.Tuple()

        def __init__(self, options: Sequence[str], value: Sequence[str] = (), columns: int = 4):
            self.boxes = {n: W.Checkbox(value=n in value, description=n, indent=False,
                                        layout=W.Layout(width="auto", margin="0 14px 0 0"))
                          for n in options}
            super().__init__(children=list(self.boxes.values()), layout=W.Layout(
                grid_template_columns=f"repeat({columns}, max-content)", grid_gap="0px 4px"))
            self._syncing = False
            self.value = tuple(n for n in value if n in self.boxes)
            for box in self.boxes.values():
                box.observe(self._box_changed, names="value")
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


def _parse_weights(text: str) -> tuple[float, ...]:
    parts = [x.strip() for x in str(text).replace(";", ",").split(",") if x.strip()]
    try:
        return tuple(float(x) for x in parts)
    except ValueError:
        raise ValueError(f"per-stage weights must be numbers separated by commas, got {text!r}") from None


class Explorer:
    """The ipywidgets explorer. ``explorer.widget`` is the layout; ``explorer.view`` the last
    :class:`View`; every widget change calls :meth:`update`.

    Args:
        settings: initial settings.
        export_dir: where the export buttons write.
        max_devices, max_microbatches: slider ranges.
        style: ``{"diagram": {...}, "memory": {...}}`` keyword arguments for
            :func:`ctrlmem.plot.schedule_spec` and :func:`ctrlmem.plot.memory_spec`.
    """

    def __init__(self, settings: Settings | None = None, *, export_dir: str = "build/explorer",
                 max_devices: int = 32, max_microbatches: int = 256, style: dict | None = None):
        import ipywidgets as W  # noqa: PLC0415  (optional dependency, only for the widgets)

        s = settings or Settings()
        self.style = style or {}
        self.export_dir = export_dir
        self.builds = BuildCache()
        self.loaded: list[Schedule] = list(s.loaded)
        names = list(SCHEDULES)
        self._unknown = [n for n in s.schedules if n not in SCHEDULES]
        label = {"style": {"description_width": "initial"}}
        self.schedules = _checklist_class()(names, [n for n in s.schedules if n in SCHEDULES])
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
        self.weights = W.Text(value=",".join(f"{x:g}" for x in s.stage_weights), description="per-stage weights",
                              placeholder="p numbers, model order, e.g. 1.3,1,1,1.6", continuous_update=False,
                              layout=W.Layout(width="420px"), **label)
        self.limit_on = W.Checkbox(value=s.memory_limit is not None, description="memory limit",
                                   indent=False, layout=W.Layout(width="110px"))
        self.limit = W.FloatSlider(value=s.memory_limit if s.memory_limit is not None else 0.5,
                                   min=0.05, max=2.0, step=0.05, description="× 1F1B peak",
                                   continuous_update=False, readout_format=".2f", **label)
        self.optimize = W.BoundedFloatText(value=s.optimize or 10.0, min=1.0, max=600.0, description="optimize s",
                                           layout=W.Layout(width="150px"), **label)
        self.optimize_on = W.Checkbox(value=bool(s.optimize), description="optimize (solver)", indent=False,
                                      layout=W.Layout(width="140px"))
        self.load_path = W.Text(placeholder="torch / torchtitan CSV or ctrlmem text file (path)",
                                description="load schedule", continuous_update=False,
                                layout=W.Layout(width="420px"), **label)
        self.load_button = W.Button(description="load", layout=W.Layout(width="70px"))
        self.upload = W.FileUpload(accept=".csv,.txt", multiple=False, description="upload",
                                   layout=W.Layout(width="110px"))
        self.clear_button = W.Button(description="clear loaded", layout=W.Layout(width="110px"))
        self.load_button.on_click(lambda _b: self.load(self.load_path.value))
        self.clear_button.on_click(lambda _b: self.clear_loaded())
        self.upload.observe(self._uploaded, names="value")
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
        try:
            self.plots = _plot_view_class()(names=["ctrlmem-diagram", "ctrlmem-memory"], plotly_js=_plotly_js())
            self.plots.observe(self._drawn, names="drawn")
            self.plots.observe(self._width_changed, names="width")
            self.diagram_out = self.memory_out = None
            outputs = [self.plots]
        except (ImportError, OSError):  # no anywidget: JupyterLab's plotly renderer, in Output widgets
            self.plots = None
            self.diagram_out = W.Output()
            self.diagram_out.add_class("ctrlmem-diagram")
            self.memory_out = W.Output()
            self.memory_out.add_class("ctrlmem-memory")
            outputs = [self.diagram_out, self.memory_out]
        self._sent: list[dict | None] = [None, None]
        self.buttons = {kind: W.Button(description=f"export {kind.upper() if kind != 'csv' else 'torch CSV'}",
                                       layout=W.Layout(width="150px" if kind == "csv" else "120px"))
                        for kind in EXPORT_KINDS}
        for kind, button in self.buttons.items():
            button.on_click(lambda _b, kind=kind: self._export_clicked(kind))
        self._inputs = [self.schedules, self.devices, self.microbatches, self.f, self.b, self.w,
                        self.comm, self.first_extra, self.last_extra, self.weights, self.limit_on, self.limit,
                        self.optimize_on, self.optimize]
        for wdg in self._inputs:
            wdg.observe(self.update, names="value")
        busy = W.HTML("<span class='ctrlmem-busy-note'>updating…</span>")
        controls = W.VBox([
            W.HTML(_CSS + "<b>schedules</b> <small>(tick to compare; panels stack in the order ticked)</small>"),
            self.schedules,
            W.HBox([self.devices, self.microbatches, self.limit_on, self.limit, self.optimize_on, self.optimize]),
            W.HBox([self.f, self.b, self.w, self.comm]),
            W.HBox([self.first_extra, self.last_extra, self.weights]),
            W.HBox([self.load_path, self.load_button, self.upload, self.clear_button]),
            W.HBox(list(self.buttons.values())),
        ])
        self.widget = W.VBox([controls, self.message, self.verdict, self.stats_out, self.formulas,
                              W.HBox([self.command] + ([self.copy_command] if self.copy_command else [])),
                              W.HBox([self.timing, busy]), *outputs])
        self.widget.add_class("ctrlmem-explorer")
        self.view: View | None = None
        self.update()

    def settings(self) -> Settings:
        """The settings the widgets show now (bad per-stage weights raise ``ValueError``)."""
        return Settings(
            schedules=tuple(self.schedules.value) + tuple(self._unknown),
            num_devices=int(self.devices.value), num_microbatches=int(self.microbatches.value),
            f=self.f.value, b=self.b.value, w=self.w.value, comm=self.comm.value,
            first_stage_extra=self.first_extra.value, last_stage_extra=self.last_extra.value,
            memory_limit=float(self.limit.value) if self.limit_on.value else None,
            stage_weights=_parse_weights(self.weights.value), loaded=tuple(self.loaded),
            optimize=float(self.optimize.value) if self.optimize_on.value else 0.0,
        )

    def update(self, *_change) -> View:
        """Recompute and redraw (called on every widget change). While it runs, the explorer
        carries the CSS class ``ctrlmem-updating`` (an "updating…" note, dimmed plots)."""
        if any(getattr(c, "owner", None) is self.schedules or (isinstance(c, dict) and c.get("owner") is self.schedules)
               for c in _change):
            self._unknown = []  # names from the initial settings that are not registered: reported until the user picks
        if hasattr(self, "widget"):
            self.widget.add_class("ctrlmem-updating")
        try:
            try:
                settings = self.settings()
            except ValueError as exc:
                self.message.value = messages_html([f"Cannot compute: {_reason(exc)}"])
                return self.view
            view = compute(settings, style=self._style(), cache=self.builds)
        except Exception as exc:  # an unexpected failure still shows a message, not a traceback
            log.exception("explorer update failed")
            self.message.value = messages_html([f"Unexpected error: {type(exc).__name__}: {exc}"])
            return self.view
        finally:
            if hasattr(self, "widget"):
                self.widget.remove_class("ctrlmem-updating")
        self.view = view
        self.render(view)
        return view

    def render(self, view: View) -> None:
        """Put ``view`` into the widgets."""
        t0 = time.perf_counter()
        self.message.value = messages_html(view.messages)
        self.verdict.value = f"<div style='margin:4px 0'>{html.escape(verdict(view))}</div>" if view.results else ""
        self.stats_out.value = stats_html(view.stats)
        self.formulas.value = formula_html(view)
        self.command.value = command_line(view.settings)
        bundles = [mime_bundle(spec, label) if spec is not None else None
                   for spec, label in ((view.diagram_spec, "schedule diagram"), (view.memory_spec, "memory curves"))]
        self._sent = [b[PLOTLY_MIME] if b is not None else None for b in bundles]
        if self.plots is not None:
            self.plots.show(self._sent)
        else:
            for out, bundle in zip((self.diagram_out, self.memory_out), bundles):
                out.outputs = (({"output_type": "display_data", "metadata": {}, "data": bundle},)
                               if bundle is not None else ())
        self.last_render_seconds = time.perf_counter() - t0
        self._python_ms = (view.seconds + self.last_render_seconds) * 1e3
        self.timing.value = (f"<small style='color:#777'>computed in {view.seconds * 1e3:.0f} ms, "
                             f"sent in {self.last_render_seconds * 1e3:.0f} ms; drawing…</small>")

    def _drawn(self, change) -> None:
        """The browser says it drew update ``seq`` in ``ms``: show the whole wait."""
        got = change["new"] or {}
        if self.plots is None or got.get("seq") != self.plots.seq or self.view is None:
            return
        if got.get("error"):
            self.message.value = messages_html([f"The browser could not draw the plots: {got['error']}"])
        self.timing.value = (f"<small style='color:#777'>computed in {self.view.seconds * 1e3:.0f} ms, "
                             f"sent in {self.last_render_seconds * 1e3:.0f} ms, drawn by the browser in "
                             f"{got.get('ms', 0):.0f} ms</small>")

    def _width_changed(self, change) -> None:
        """The drawing got wider or narrower: which labels fit changed, so redraw."""
        old, new = change["old"] or 0, change["new"] or 0
        if new and abs(new - old) > 0.04 * max(old, 1):
            self.update()

    def _style(self) -> dict:
        """The figure style, with the label rule at the drawing's width when the browser told it."""
        style = {k: dict(v) for k, v in self.style.items()}
        width = self.plots.width if self.plots is not None else 0
        if width:
            style.setdefault("diagram", {}).setdefault("label_width", width)
        return style

    def shown(self, which: str = "diagram") -> dict | None:
        """The figure JSON last sent to the browser: ``"diagram"`` or ``"memory"`` (None when
        nothing could be drawn)."""
        return self._sent[("diagram", "memory").index(which)]

    def load(self, source) -> Schedule | None:
        """Add a schedule file (torch / torchtitan CSV or ctrlmem's text form; a path, or
        ``(name, bytes)`` from the upload button) to the comparison; p and m follow the file."""
        try:
            if isinstance(source, tuple):
                name, raw = source
                from .ir import _clean_text  # noqa: PLC0415

                text = _clean_text(raw, name)
                stem = os.path.splitext(os.path.basename(name))[0] or "uploaded"
                sched = (Schedule.from_text(text) if text.lstrip().startswith("schedule ")
                         else Schedule.from_torch_csv_text(text, name=stem, source=name))
            else:
                path = str(source).strip()
                if not path:
                    raise ValueError("type the path of a schedule file first")
                sched = Schedule.load(path)
            from .validate import validate  # noqa: PLC0415

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
        self.loaded = []
        self.update()

    def _set_quietly(self, widget, value) -> None:
        widget.unobserve(self.update, names="value")
        try:
            widget.max = max(widget.max, value)
            widget.value = value
        finally:
            widget.observe(self.update, names="value")

    def _uploaded(self, change) -> None:
        files = change["new"]
        if not files:
            return
        item = files[0] if isinstance(files, (list, tuple)) else next(iter(files.values()))
        name = item.get("name", "uploaded.csv") if isinstance(item, dict) else getattr(item, "name", "uploaded.csv")
        content = item.get("content") if isinstance(item, dict) else getattr(item, "content")
        self.load((name, bytes(content)))

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
             memory_limit: float | None = None, stage_weights: Sequence[float] = (),
             load: Sequence[str] = (), **kwargs) -> Explorer:
    """An :class:`Explorer` with these initial settings (display it in a notebook cell);
    ``load``: schedule files (torch / torchtitan CSV or text form) to compare as well."""
    settings = Settings(
        schedules=tuple(schedules) if schedules is not None else default_schedules(),
        num_devices=num_devices, num_microbatches=num_microbatches, f=f, b=b, w=w, comm=comm,
        first_stage_extra=first_stage_extra, last_stage_extra=last_stage_extra,
        memory_limit=memory_limit, stage_weights=tuple(stage_weights),
        loaded=tuple(Schedule.load(x) for x in load),
    )
    return Explorer(settings, **kwargs)
