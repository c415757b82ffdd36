"""Plotly figures of schedules: Gantt diagrams, memory curves, building blocks, trade-offs.

Every function takes data (a :class:`~ctrlmem.SimResult`, a :class:`~ctrlmem.Schedule`, or a
:class:`PassTimeline`) plus its style as keyword arguments, and returns a new
``plotly.graph_objects.Figure``; nothing here touches global state (no templates, no renderers).

* :func:`schedule_figure`: one row per device, one box per pass at the simulator's start and end
  times, coloured by pass kind (F, B, W, BW) and shaded by chunk, microbatch number in the box
  when it fits (:func:`label_fits`, the same rule in every view and export), idle time in grey;
  several schedules stacked on one shared time axis. Above :data:`OVERVIEW_PASSES` passes a
  panel is drawn as a raster overview (one heatmap, a column per time interval, with hover),
  which keeps a p = 32, m = 256 figure to a few hundred kB and fast to draw.
* :func:`memory_figure`: activation memory of every device over time (units of ``a``), with the
  schedule's theoretical peak and 1F1B's peak as reference lines.
* :func:`block_figure` / :func:`lifespan_figure`: the paper's building-block views (Fig. 1, 3,
  11, 18: block → repeat → squeeze → reorder) and per-device lifespan bars (Fig. 2).
* :func:`tradeoff_points`, :func:`bubble_memory_figure`, :func:`pareto_figure`: bubble rate
  against memory limit, and throughput against memory with the Pareto frontier (Fig. 7, 9).

Units follow time in the units of :class:`~ctrlmem.Costs`, memory in ``a``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Mapping, Sequence, Union

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ctrlmem.util import checks
from ctrlmem.util.checks import short_repr
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import Op, Placement, Schedule
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.model.simulate import SimResult, TimedPass, simulate
from ctrlmem.search import buildingblock as blocks
from ctrlmem.plots.figio import write_files
from plotly.colors import sample_colorscale

__all__ = [
    "DEFAULT_COLORS",
    "IDLE_COLOR",
    "PassTimeline",
    "pass_color",
    "schedule_figure",
    "schedule_spec",
    "hover_on_cells",
    "without_hover_tables",
    "OVERVIEW_HOVER",
    "step_grid_spec",
    "memory_figure",
    "memory_spec",
    "theoretical_peak",
    "one_f_one_b_peak",
    "repeat_block",
    "squeeze_passes",
    "paper_block",
    "slot_timeline",
    "block_timelines",
    "block_figure",
    "lifespans",
    "lifespan_figure",
    "TRADEOFF_LIMITS",
    "tradeoff_points",
    "bubble_memory_figure",
    "pareto_figure",
    "pareto_frontier",
    "point_label",
    "peak_memory_curve",
    "peak_memory_spec",
    "stack_specs",
    "colors_for_devices",
    "schedule_budget",
    "costs_label",
    "costs_hover",
    "setting_label",
    "write_figure",
    "write_figures",
    "static_labels",
]

log = logging.getLogger(__name__)

#: Colour of each pass kind, one shade per chunk (chunk 0 dark, chunk 1 light, ...).
DEFAULT_COLORS: Mapping[Op, tuple[str, ...]] = {
    Op.F: ("#3A6EA5", "#8DB8E6", "#1F4670", "#C3DBF3"),
    Op.B: ("#E07B1A", "#F7BE7E", "#9E520C", "#FBDDB9"),
    Op.W: ("#3F9142", "#99D296", "#24622A", "#CBEBC8"),
    Op.BW: ("#8E5BA8", "#CFA9E0", "#5E3A72", "#E8D6F0"),
    Op.R: ("#C9A227", "#E9D58A", "#8A6D12", "#F3E8BD"),  # recompute (docs/theory.md §13)
}
#: Background of a device row: what shows through where the device is idle.
IDLE_COLOR = "#E6E6E6"
#: Default line colours of devices in memory plots (cycled).
DEVICE_COLORS = (
    "#3A6EA5", "#E07B1A", "#3F9142", "#C23B3B", "#8E5BA8", "#8C6D4F", "#D46FB4", "#7F7F7F",
    "#B5B829", "#2AB3C4",
)

Item = Union[SimResult, Schedule, "PassTimeline"]


def pass_color(op: Op, chunk: int, colors: Mapping[Op, Sequence[str]] = DEFAULT_COLORS) -> str:
    """The fill colour of a pass of kind ``op`` on ``chunk`` (shades cycle over chunks)."""
    shades = colors[Op(op)]
    return shades[chunk % len(shades)]


@dataclass(frozen=True)
class PassTimeline:
    """Timed passes to draw: what :func:`schedule_figure` needs from a simulation.

    A :class:`SimResult` converts with :meth:`of`; the building-block views build timelines
    that are not simulations (a raw repetition of a block may overlap itself on purpose).
    """

    title: str
    num_devices: int
    placement: Placement
    passes: tuple[TimedPass, ...]

    @property
    def makespan(self) -> float:
        return max((tp.end for tp in self.passes), default=0.0)

    @classmethod
    def of(cls, item: Item, costs: Costs | None = None, title: str | None = None) -> "PassTimeline":
        """A timeline from a SimResult, a Schedule (simulated under ``costs``) or a PassTimeline."""
        if isinstance(item, PassTimeline):
            return item if title is None else cls(title, item.num_devices, item.placement, item.passes)
        if isinstance(item, Schedule):
            item = simulate(item, costs)
        if not isinstance(item, SimResult):
            raise TypeError(f"expected a SimResult, Schedule or PassTimeline, got {type(item).__name__}")
        s = item.schedule
        return cls(title if title is not None else _default_title(item), s.num_devices,
                   s.placement, tuple(item.passes))


def _default_title(result: SimResult) -> str:
    s = result.schedule
    return (f"{s.name} (p={s.num_devices}, m={s.num_microbatches}): makespan {fmt_time(result.makespan)}, "
            f"bubble rate {fmt_ratio(result.bubble_rate)}, peak {fmt_time(max(result.peak_memory))} a")


def _as_list(items: Item | Sequence[Item]) -> list:
    if isinstance(items, (SimResult, Schedule, PassTimeline)):
        return [items]
    return list(items)


def _check_items(func: str, items, kinds: tuple = (SimResult, Schedule, PassTimeline), blocks: bool = False,
                 arg: str = "items") -> None:
    """``TypeError`` naming ``func``'s first argument unless it is one of ``kinds`` (or a building
    block with ``lifespans()``, when ``blocks``) or a list of them (checked at entry: the same
    rule for every figure function)."""
    def ok(x) -> bool:
        return isinstance(x, kinds) or (blocks and hasattr(x, "lifespans") and hasattr(x, "placement"))

    names = " or ".join(k.__name__ for k in kinds) + (" or a building block" if blocks else "")
    if ok(items):
        return
    if items is None or isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{func}: {arg} must be a {names}, or a list of them; got {type(items).__name__} "
                        f"{short_repr(items, 60)}")
    for i, x in enumerate(items):
        if not ok(x):
            raise TypeError(f"{func}: {arg}[{i}] must be a {names}; got {type(x).__name__} {short_repr(x, 60)}")


def _check_size(func: str, style: Mapping) -> None:
    """``width`` / ``height`` of a figure, when given: whole numbers of pixels, 10 to 16384."""
    for key in ("width", "height"):
        if style.get(key) is not None:
            checks.integer(f"{func}: {key}", style[key], minimum=10, maximum=16384, what="pixels")


# -- schedule diagram ------------------------------------------------------------------------

_OPS = tuple(Op)


@dataclass(frozen=True)
class _Columns:
    """A timeline as numpy columns (what the figure needs, without one object per pass)."""

    title: str
    num_devices: int
    placement: Placement
    device: np.ndarray
    op: np.ndarray  # index into _OPS
    stage: np.ndarray
    microbatch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    pair: np.ndarray | None = None  # per pass: 1 first / 2 second of an overlapped pair, 0 alone (None: no pairs)

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self.end) else 0.0


def _pair_column(sched: Schedule) -> np.ndarray | None:
    """:attr:`_Columns.pair` of a schedule's passes in device-major order (None without pairs)."""
    if not sched.overlaps:
        return None
    out = np.zeros(sched.num_passes, np.int8)
    k = 0
    for d, row in enumerate(sched.device_passes):
        for i in sched.overlap_starts(d):
            out[k + i], out[k + i + 1] = 1, 2
        k += len(row)
    return out


_ORDERS: dict[int, tuple] = {}


def _order_columns(sched: Schedule) -> tuple[np.ndarray, ...]:
    """``(device, op, stage, microbatch)`` of every pass in device-major order, once per
    schedule object (a cost edit re-simulates the same orders; the last few are remembered,
    by identity)."""
    found = _ORDERS.get(id(sched))
    if found is not None and found[0] is sched:
        return found[1]
    n = sched.num_passes
    dev, op, stage, mb = (np.empty(n, np.int32) for _ in range(4))
    op_index = {o: i for i, o in enumerate(_OPS)}
    k = 0
    for d, row in enumerate(sched.device_passes):
        for ps in row:
            dev[k], op[k], stage[k], mb[k] = d, op_index[ps.op], ps.stage, ps.microbatch
            k += 1
    if len(_ORDERS) >= 16:
        _ORDERS.pop(next(iter(_ORDERS)))
    _ORDERS[id(sched)] = (sched, (dev, op, stage, mb))
    return dev, op, stage, mb


_FLAT_KEYS: dict[int, tuple] = {}


def _flat_keys(index) -> np.ndarray:
    """The simulator's pass keys in device-major order, once per schedule index (kept for the
    last few, by identity: a cost edit re-simulates the same orders)."""
    found = _FLAT_KEYS.get(id(index))
    if found is not None and found[0] is index:
        return found[1]
    flat = np.fromiter(chain.from_iterable(index.device_keys), np.int64)
    if len(_FLAT_KEYS) >= 16:
        _FLAT_KEYS.pop(next(iter(_FLAT_KEYS)))
    _FLAT_KEYS[id(index)] = (index, flat)
    return flat


def _times(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every pass in device-major order."""
    sched = result.schedule
    index, start_of, end_of = (getattr(result, a, None) for a in ("_index", "_start", "_end"))
    keys = getattr(index, "device_keys", None)
    if keys is not None and start_of is not None and end_of is not None:  # the simulator's own arrays
        flat = _flat_keys(index)
        return np.asarray(start_of, float)[flat], np.asarray(end_of, float)[flat]
    start, end = np.empty(sched.num_passes), np.empty(sched.num_passes)
    k = 0
    for d, row in enumerate(sched.device_passes):
        for pos in range(len(row)):
            start[k], end[k] = result.timing(d, pos)
            k += 1
    return start, end


def _columns(item: Item, costs: Costs | None, title: str | None) -> _Columns:
    if isinstance(item, Schedule):
        item = simulate(item, costs)
    if isinstance(item, SimResult):
        sched = item.schedule
        dev, op, stage, mb = _order_columns(sched)
        start, end = _times(item)
        return _Columns(title if title is not None else _default_title(item), sched.num_devices,
                        sched.placement, dev, op, stage, mb, start, end, _pair_column(sched))
    tl = PassTimeline.of(item, costs, title)
    n = len(tl.passes)
    op_index = {o: i for i, o in enumerate(_OPS)}
    return _Columns(
        tl.title, tl.num_devices, tl.placement,
        np.fromiter((tp.device for tp in tl.passes), np.int32, n),
        np.fromiter((op_index[tp.op] for tp in tl.passes), np.int32, n),
        np.fromiter((tp.stage for tp in tl.passes), np.int32, n),
        np.fromiter((tp.microbatch for tp in tl.passes), np.int32, n),
        np.fromiter((tp.start for tp in tl.passes), float, n),
        np.fromiter((tp.end for tp in tl.passes), float, n),
    )


def _stacked_layout(panel_px: Sequence[int], titles: Sequence[str], *, gap_px: int, top_px: int,
                    bottom_px: int, hovers: Sequence[str | None] | None = None) -> tuple[dict, int]:
    """Layout of panels stacked top to bottom on one shared x axis (what ``make_subplots``
    builds, but as a plain dict: constructing the figure once is several times faster).
    ``hovers``: a hover text per panel title (``None``: none); a title with one ends in "(i)"."""
    area = sum(panel_px) + gap_px * (len(panel_px) - 1)  # the plot area, between the margins
    height = top_px + area + bottom_px
    layout: dict = {"annotations": []}
    y_top = area
    hovers = list(hovers) if hovers is not None else [None] * len(panel_px)
    for i, (px, ttl, hover) in enumerate(zip(panel_px, titles, hovers)):
        suffix = "" if i == 0 else str(i + 1)
        lo, hi = max(0.0, (y_top - px) / area), y_top / area
        layout[f"yaxis{suffix}"] = {"domain": [lo, hi], "anchor": f"x{suffix}"}
        layout[f"xaxis{suffix}"] = {"anchor": f"y{suffix}", "domain": [0.0, 1.0]}
        if i > 0:
            layout[f"xaxis{suffix}"]["matches"] = "x"
        if i < len(panel_px) - 1:
            layout[f"xaxis{suffix}"]["showticklabels"] = False
        note = {
            "text": ttl + (" (i)" if hover else ""), "x": 0.5, "y": hi, "xref": "paper", "yref": "paper",
            "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 14},
        }
        if hover:
            note.update(hovertext=hover, hoverlabel={"bgcolor": "white",
                                                     "font": {"family": "monospace", "size": 11}})
        layout["annotations"].append(note)
        y_top -= px + gap_px
    return layout, height


def _axis_names(panel: int) -> tuple[str, str]:
    return ("x", "y") if panel == 0 else (f"x{panel + 1}", f"y{panel + 1}")


def add_gb_axis(spec: dict, gb_per_a: float, title: str = "GB") -> dict:
    """Give every memory panel of a :func:`memory_spec` figure a second y axis on the right in
    GB (``gb_per_a`` GB per ``a``), on the same scale as its ``a`` axis; returns ``spec``."""
    layout, data = spec["layout"], spec["data"]
    panels = sorted((k for k in list(layout) if k.startswith("yaxis") and "overlaying" not in layout[k]
                     and layout[k].get("range")), key=lambda k: int(k[5:] or 1))
    if not panels:
        return spec
    free = 1 + max(int(k[5:] or 1) for k in layout if k.startswith("yaxis"))
    for key in panels:
        ref = "y" + key[5:]
        name = f"yaxis{free}"
        lo, hi = layout[key]["range"]
        layout[name] = {"overlaying": ref, "side": "right", "anchor": layout[key].get("anchor", "x"),
                        "range": [lo * gb_per_a, hi * gb_per_a], "title": {"text": title}, "showgrid": False,
                        "zeroline": False}
        # an invisible point puts the axis on the panel (plotly draws axes that carry a trace)
        data.append({"type": "scatter", "x": [0], "y": [0], "xaxis": layout[key].get("anchor", "x"),
                     "yaxis": f"y{free}", "mode": "markers", "marker": {"opacity": 0}, "showlegend": False,
                     "hoverinfo": "skip", "meta": {"kind": "gb-axis"}})
        free += 1
    layout["legend"] = {**(layout.get("legend") or {}), "x": 1.07, "xanchor": "left"}
    return spec


def schedule_figure(items: Item | Sequence[Item], **style) -> go.Figure:
    """Gantt diagram of one or several schedules on a shared time axis; ``style`` takes the
    keyword arguments of :func:`schedule_spec`, which documents them and the trace layout."""
    _check_items("schedule_figure", items)
    _check_size("schedule_figure", style)
    return go.Figure(schedule_spec(items, **style))


#: Time axis title of views timed in the paper's slots (building blocks and their steps).
SLOTS_TITLE = "time (slots: one pass over one chunk)"
#: Font size of the labels inside boxes, and the smallest size a label may be drawn at: a
#: label is shown at this size if it fits inside its box, else not at all (the label rule).
LABEL_SIZE = 10
#: Above this many steps, a memory curve is reduced per time column (see :func:`memory_spec`).
MEMORY_POINTS = 800
#: Above this many memory points in one figure, curves are sent as float32.
COMPACT_POINTS = 20000
#: Above this many passes in one figure, :func:`schedule_spec` draws a raster overview.
OVERVIEW_PASSES = 3000
#: Most time columns of the raster overview (about one per pixel of a wide figure).
OVERVIEW_COLUMNS = 1200
#: Most device rows (or curves) one figure draws: 4,096 rows take about 0.5 s; 100,000 took 35 s
#: and several GB (the raster is rows × columns), for a picture no screen can show.
MAX_DRAWN_DEVICES = 4096


def _check_drawable(num_devices: int) -> None:
    if num_devices > MAX_DRAWN_DEVICES:
        raise ValueError(f"a figure of {num_devices:,} devices is more than the {MAX_DRAWN_DEVICES:,} rows one figure "
                         "draws (ctrlmem.plots.figures.MAX_DRAWN_DEVICES); simulate it instead (ctrlmem simulate), or "
                         "draw fewer devices")
#: Pixels kept free at the top of a figure for plotly's toolbar (the mode bar), above the title:
#: a title never runs under it.
MODEBAR_PX = 30
#: Up to this many devices, memory curves take the categorical :data:`DEVICE_COLORS`; deeper
#: pipelines take a sequential scale (device 0 dark, the last light) with a colour bar.
CATEGORICAL_DEVICES = len(DEVICE_COLORS)
#: The sequential scale of deep pipelines' devices (plotly's Plasma without its pale yellow end,
#: which does not show on white).
DEVICE_SCALE = ("#0D0887", "#46039F", "#7201A8", "#9C179E", "#BD3786", "#D8576B", "#ED7953", "#F89540",
                "#E3A21A")


def colors_for_devices(num_devices: int, palette: Sequence[str] = DEVICE_COLORS,
                  scale: Sequence[str] = DEVICE_SCALE) -> list[str]:
    """A colour per device: ``palette`` when it has enough colours, else ``scale`` sampled evenly
    (device order stays readable: neighbours have neighbouring colours, no colour repeats)."""
    if num_devices <= len(palette):
        return list(palette[:num_devices])

    points = [[i / (len(scale) - 1), c] for i, c in enumerate(scale)]
    rgb = sample_colorscale(points, [d / max(num_devices - 1, 1) for d in range(num_devices)])
    return ["#{:02X}{:02X}{:02X}".format(*(round(float(x)) for x in c[4:-1].split(","))) for c in rgb]


def _title(text: str, height: int) -> dict:
    """A figure title below the toolbar's strip (:data:`MODEBAR_PX`), left-aligned."""
    return {"text": text, "x": 0.0, "xref": "paper", "xanchor": "left",
            "y": 1 - (MODEBAR_PX + 2) / height, "yanchor": "top", "font": {"size": 15}}


def _panel_hover(item) -> str | None:
    """The per-stage cost table of a simulation result (its panel title's hover), or None."""
    if isinstance(item, SimResult):
        s = item.schedule
        return costs_hover(item.costs, s.num_stages, s.num_devices)
    return None


def fmt_time(x: float) -> str:
    """A time or memory amount as every figure, title and table prints it (4 significant digits)."""
    return f"{x:.4g}"


def fmt_ratio(x: float) -> str:
    """A rate or ratio (bubble rate, peak / 1F1B, speed-up) as every view prints it."""
    return f"{x:.3f}"


def costs_label(costs: Costs | None) -> str:
    """``F=6 B=8 W=4 comm=0.2`` (and ``F&B=0.8·(F+B)`` with an overlap gain); per-stage lists as their range and flagged, e.g.
    ``F=0.5–2.55 B=0.5–1.5 W=0.5–1.5 (per stage) comm=0`` (a list whose stages are all equal is
    one number; the first and last stage alone would hide the middle ones)."""
    c = costs if costs is not None else Costs()
    per_stage = False

    def one(v) -> str:
        nonlocal per_stage
        if isinstance(v, (int, float)):
            return f"{v:g}"
        v = list(v)
        lo, hi = min(v), max(v)
        if lo == hi:
            return f"{lo:g}"
        per_stage = True
        return f"{lo:g}–{hi:g}"

    text = f"F={one(c.f)} B={one(c.b)} W={one(c.w)}"
    overlap = f" F&B={c.fb_overlap:g}·(F+B)" if c.fb_overlap != 1.0 else ""
    return f"{text}{' (per stage)' if per_stage else ''} comm={c.comm:g}{overlap}"


def costs_table(costs: Costs | None, num_stages: int, num_devices: int | None = None) -> list[tuple]:
    """The time of each stage's F, B and W pass under ``costs``: ``[(stage, f, b, w), ...]``
    (what a per-stage title's hover shows)."""
    c = costs if costs is not None else Costs()
    f, b, w = c.stage_times(num_stages, num_devices or num_stages)
    return [(s, f[s], b[s], w[s]) for s in range(num_stages)]


def costs_hover(costs: Costs | None, num_stages: int, num_devices: int | None = None) -> str | None:
    """A hover text (plotly's ``<br>`` lines) listing each stage's F, B, W when ``costs`` are
    per stage; ``None`` when they are uniform."""
    c = costs if costs is not None else Costs()
    if all(isinstance(v, (int, float)) for v in (c.f, c.b, c.w)):
        return None
    rows = costs_table(c, num_stages, num_devices)
    lines = ["per-stage pass times (stage: F, B, W)"] + [
        f"{s}: {fmt_time(f)}, {fmt_time(b)}, {fmt_time(w)}" for s, f, b, w in rows]
    return "<br>".join(lines)


def setting_label(num_devices: int, num_microbatches: int, costs: Costs | None = None,
                  memory_limit: float | None = None) -> str:
    """``p=8, m=32, F=1 B=1 W=1 comm=0, memory limit 0.5 × 1F1B``: what a title carries."""
    out = f"p={num_devices}, m={num_microbatches}, {costs_label(costs)}"
    if memory_limit is not None:
        out += f", memory limit {memory_limit:g} × 1F1B"
    return out


def _row_height(num_devices: int) -> int:
    """Pixels per device row: 26 for small pipelines, thinner for deep ones (12 at p=32)."""
    return max(10, min(26, 400 // max(num_devices, 1)))


def schedule_spec(
    items: Item | Sequence[Item],
    *,
    costs: Costs | None = None,
    titles: Sequence[str] | None = None,
    colors: Mapping[Op, Sequence[str]] = DEFAULT_COLORS,
    idle_color: str = IDLE_COLOR,
    show_labels: bool = True,
    label_size: int = LABEL_SIZE,
    text_color: str = "#1A1A1A",
    light_text_color: str = "#FFFFFF",
    row_height: int | None = None,
    box_gap: float = 0.15,
    width: int | None = None,
    title: str | None = None,
    x_title: str = "time (cost units)",
    label_width: int | None = None,
    overview: bool | None = None,
    overview_passes: int = OVERVIEW_PASSES,
    overview_columns: int = OVERVIEW_COLUMNS,
    overview_hover: str = "cells",
    tick_overflow: str | None = None,
    font_family: str = "Helvetica, Arial, sans-serif",
) -> dict:
    """Gantt diagram of one or several schedules on a shared time axis, as the plain dict behind
    :func:`schedule_figure` (what the explorer sends to the browser without plotly's
    per-property validation).

    Args:
        items: SimResults (or Schedules, simulated under ``costs``, or Timelines), one panel
            each, stacked top to bottom; device 0 is the top row of each.
        titles: panel titles (default: name, p, m, makespan, bubble rate and peak).
        colors: fill colours per pass kind, one shade per chunk.
        idle_color: row background, visible wherever the device is idle.
        show_labels: write the microbatch number in each box. The label rule, the same in every
            figure: a box gets its label, at ``label_size`` points, only if the whole label fits
            inside it with 3 px to spare on each side at the figure's width (``width``, else
            ``label_width``: the width the figure will be drawn at, which the explorer learns
            from the browser; else any width up to :data:`LABEL_MAX_PLOT_PX`); plotly's
            ``uniformtext`` (``minsize`` = font size) then hides any label that would still
            have to shrink. Static exports re-apply the rule at their own width.
        text_color, light_text_color: label colour on light and on dark boxes.
        row_height: pixels per device row (default: 26, thinner for p > 15; the height follows).
        box_gap: fraction of a row left empty between rows.
        x_title: the time axis title (its unit).
        overview: draw each panel as a raster (a heatmap with one column per time interval,
            at most ``overview_columns``, each cell the pass running at its middle) instead of
            one box per pass. Default: when the figure holds more than ``overview_passes``
            passes, where boxes would be too narrow to see and too many to draw quickly.
        overview_hover: where an overview keeps what its cells show on hover: ``"cells"``
            (plotly's per-cell ``customdata`` and ``text``, for any plotly page) or ``"table"``
            (flat per-cell columns in the heatmap's ``meta["hover"]``, for a viewer that shows
            the hover itself, as the explorer's does: a fraction of the time to draw;
            :func:`hover_on_cells` gives the ``"cells"`` form of such a figure).
        tick_overflow: plotly's ``ticklabeloverflow`` of the device axes (``None``: plotly's
            default, "hide past div", which measures every label again after placing each one:
            3/4 of drawing a p = 32 diagram in a browser; the explorer gives ``"allow"``, as its
            device labels sit in the left margin).

    Boxes: trace ``meta`` carries ``{"kind": "pass", "op", "chunk", "panel"}``, ``y`` the device,
    ``base`` the start, ``x`` the duration, and ``customdata`` rows ``[stage, microbatch, start,
    end]``. Idle rows are traces with ``meta["kind"] == "idle"``. A schedule with activation
    copies (docs/theory.md §13) gets each device's offload and reload lanes as thin strips along
    the bottom of its row (``meta["kind"] == "copy"``, box view only). Overview: one heatmap per
    panel, ``meta`` ``{"kind": "overview", "panel", "codes"}`` where ``codes[k]`` names the
    ``[op, chunk]`` of ``z`` in ``(2k+1, 2k+2)`` (even and odd microbatches; 0 is idle),
    ``customdata[d][j]`` ``[stage, chunk, microbatch, start, end]`` (or ``meta["hover"]``, see
    ``overview_hover``); the white lines between its rows are a trace with ``meta["kind"] ==
    "rows"``; legend entries are traces with ``meta["kind"] == "legend"``.
    """
    items = _as_list(items)
    if not items:
        raise ValueError("schedule_figure needs at least one schedule or simulation result")
    if titles is not None and len(titles) != len(items):
        raise ValueError(f"got {len(titles)} titles for {len(items)} schedules")
    timelines = [_columns(it, costs, None if titles is None else str(titles[i]))
                 for i, it in enumerate(items)]
    _check_drawable(sum(t.num_devices for t in timelines))
    n = len(timelines)
    if overview_hover not in ("cells", "table"):
        raise ValueError(f"overview_hover must be 'cells' or 'table', got {overview_hover!r}")
    if overview is None:
        overview = sum(len(t.start) for t in timelines) > overview_passes
    row_px = row_height or _row_height(max(t.num_devices for t in timelines))
    top = MODEBAR_PX + (56 if title else 30)
    layout, height = _stacked_layout([t.num_devices * row_px for t in timelines],
                                     [t.title for t in timelines], gap_px=44, top_px=top, bottom_px=50,
                                     hovers=[_panel_hover(it) for it in items])
    horizon = max(t.makespan for t in timelines)
    data: list[dict] = []
    shown: set[str] = set()
    for panel, tl in enumerate(timelines):
        p = tl.num_devices
        chunk_of_stage = np.array([tl.placement.chunk_of(x) for x in range(tl.placement.num_stages)],
                                  np.int32)
        chunk = chunk_of_stage[tl.stage] if len(tl.stage) else tl.stage
        if overview:
            data += _overview_traces(tl, chunk, panel, horizon, colors, idle_color, row_px,
                                     overview_columns, shown, overview_hover)
        else:
            drawn = width or label_width
            plot_px = max(drawn - 70, 1) if drawn else LABEL_MAX_PLOT_PX
            data += _box_traces(tl, chunk, panel, horizon, colors, idle_color, box_gap, show_labels,
                                label_size, text_color, light_text_color, shown, plot_px)
            data += _copy_traces(_copies_of(items[panel], costs), panel, box_gap, shown)
        layout[f"yaxis{'' if panel == 0 else panel + 1}"].update(
            tickmode="array", tickvals=list(range(p)), ticktext=[f"d{d}" for d in range(p)],
            range=[p - 0.5, -0.5], showgrid=False, zeroline=False, ticks="",
            tickfont={"size": 12 if row_px >= 14 else 9},
        )
        if tick_overflow is not None:
            layout[f"yaxis{'' if panel == 0 else panel + 1}"]["ticklabeloverflow"] = tick_overflow
    for panel in range(n):
        layout[f"xaxis{'' if panel == 0 else panel + 1}"].update(
            range=[0, horizon * 1.005 if horizon else 1], showgrid=False, zeroline=False)
    layout[f"xaxis{'' if n == 1 else n}"]["title"] = {"text": x_title}
    layout.update(
        barmode="overlay", bargap=0, height=height, width=width,
        title=_title(title, height) if title else None,
        plot_bgcolor="white", paper_bgcolor="white",
        font={"family": font_family, "size": 12},
        legend={"traceorder": "normal"},
        margin={"l": 50, "r": 20, "t": top, "b": 50},
        hoverlabel={"font": {"size": 12}},
    )
    if show_labels and not overview:
        layout["uniformtext"] = {"minsize": label_size, "mode": "hide"}
    if title is None:
        del layout["title"]
    return {"data": data, "layout": layout}


#: Fill of the copy lanes (docs/theory.md §13): offloads (device to host), reloads (host to device).
COPY_COLORS = {"O": "#6A3D9A", "L": "#1B9E77"}
_COPY_NAMES = {"O": "offload (to host)", "L": "reload (from host)"}


def _copies_of(item: Item, costs: Costs | None) -> list:
    """The timed copies of a schedule or simulation (none for a timeline)."""
    if isinstance(item, Schedule):
        return simulate(item, costs).copies if any(item.copies) else []
    return item.copies if isinstance(item, SimResult) else []


def _copy_traces(copies: list, panel: int, box_gap: float, shown: set[str]) -> list[dict]:
    """Each device's two copy lanes as thin strips along the bottom of its row (offloads above
    reloads), over the passes they run beside: ``meta`` ``{"kind": "copy", "op": "O" | "L",
    "panel"}``, ``customdata`` rows ``[stage, microbatch, start, end]``."""
    xa, ya = _axis_names(panel)
    lane = (1 - box_gap) / 5
    out = []
    for i, kind in enumerate(("O", "L")):
        mine = [c for c in copies if c.op == kind]
        if not mine:
            continue
        name = _COPY_NAMES[kind]
        out.append({
            "type": "bar", "orientation": "h", "xaxis": xa, "yaxis": ya,
            "y": np.array([c.device + (1 - box_gap) / 2 - lane * (1.5 - i) for c in mine]),
            "base": np.array([c.start for c in mine]), "x": np.array([c.end - c.start for c in mine]),
            "width": lane, "marker": {"color": COPY_COLORS[kind], "line": {"width": 0}},
            "customdata": np.array([[c.stage, c.microbatch, c.start, c.end] for c in mine], float),
            "name": name, "legendgroup": name, "showlegend": name not in shown, "textposition": "none",
            "hovertemplate": (f"<b>{name}</b> stage %{{customdata[0]}}, microbatch %{{customdata[1]}}"
                              "<br>start %{customdata[2]:.4g}, end %{customdata[3]:.4g}<extra></extra>"),
            "meta": {"kind": "copy", "op": kind, "panel": panel},
        })
        shown.add(name)
    return out


def _kind_name(op: Op, chunk: int, num_chunks: int) -> str:
    return f"{op.value} chunk {chunk}" if num_chunks > 1 else op.value


def _box_traces(tl: _Columns, chunk: np.ndarray, panel: int, horizon: float, colors, idle_color: str,
                box_gap: float, show_labels: bool, label_size: int, text_color: str,
                light_text_color: str, shown: set[str], plot_px: float = 0.0) -> list[dict]:
    xa, ya = _axis_names(panel)
    p = tl.num_devices
    out = [{
        "type": "bar", "orientation": "h", "xaxis": xa, "yaxis": ya,
        "y": np.arange(p, dtype=np.int32), "x": np.full(p, float(horizon)), "base": np.zeros(p),
        "marker": {"color": idle_color, "line": {"width": 0}}, "width": 1 - box_gap,
        "name": "idle", "legendgroup": "idle", "showlegend": "idle" not in shown, "hoverinfo": "skip",
        "meta": {"kind": "idle", "panel": panel},
    }]
    shown.add("idle")
    for oi, op in enumerate(_OPS):
        for c in range(tl.placement.num_chunks):
            sel = np.flatnonzero((tl.op == oi) & (chunk == c))
            if not len(sel):
                continue
            start, end = tl.start[sel], tl.end[sel]
            y, width = _box_rows(tl, sel, 1 - box_gap)
            custom = np.column_stack([tl.stage[sel], tl.microbatch[sel], start, end]).astype(float)
            name = _kind_name(op, c, tl.placement.num_chunks)
            fill = pass_color(op, c, colors)
            chunk_text = f", chunk {c}" if tl.placement.num_chunks > 1 else ""
            trace = {
                "type": "bar", "orientation": "h", "xaxis": xa, "yaxis": ya,
                "y": y, "base": start, "x": end - start, "width": width,
                "marker": {"color": fill, "line": {"color": "white", "width": 0.6}},
                "customdata": custom,
                "name": name, "legendgroup": name, "showlegend": name not in shown,
                "hovertemplate": (
                    f"<b>{op.value}</b> stage %{{customdata[0]}}, microbatch %{{customdata[1]}}"
                    f"<br>device %{{y}}{chunk_text}<br>start %{{customdata[2]:.4g}}, "
                    "end %{customdata[3]:.4g}<extra></extra>"
                ),
                "meta": {"kind": "pass", "op": op.value, "chunk": c, "panel": panel},
            }
            fits = label_fits(end - start, tl.microbatch[sel], horizon * 1.005, label_size,
                            plot_px or LABEL_MAX_PLOT_PX) if show_labels else None
            if show_labels and fits.any():
                if fits.all():
                    trace["texttemplate"] = "%{customdata[1]}"
                else:  # boxes no screen could label get none (plotly then measures fewer texts)
                    trace["text"] = [str(mb) if ok else "" for mb, ok in zip(tl.microbatch[sel].tolist(), fits)]
                trace.update(textposition="inside", insidetextanchor="middle", textangle=0, constraintext="both",
                             textfont={"color": _text_on(fill, text_color, light_text_color), "size": label_size})
            else:
                trace["textposition"] = "none"
            out.append(trace)
            shown.add(name)
    return out + _pair_outlines(tl, panel, 1 - box_gap, shown)


def _box_rows(tl: _Columns, sel: np.ndarray, height: float) -> tuple[np.ndarray, float | np.ndarray]:
    """Row positions and heights of the boxes ``sel``: an overlapped pair's two passes share their
    slot, the first in the upper half of the device's row, the second in the lower half."""
    if tl.pair is None:
        return tl.device[sel], height
    pair = tl.pair[sel]
    offset = np.where(pair == 1, -height / 4, np.where(pair == 2, height / 4, 0.0))  # rows run downwards
    return tl.device[sel] + offset, np.where(pair > 0, height / 2, height)


def _pair_outlines(tl: _Columns, panel: int, height: float, shown: set[str]) -> list[dict]:
    """One black frame around each overlapped pair (DualPipe's drawing of F&B)."""
    if tl.pair is None:
        return []
    sel = np.flatnonzero(tl.pair == 1)
    xa, ya = _axis_names(panel)
    name = "F&B overlapped"
    trace = {
        "type": "bar", "orientation": "h", "xaxis": xa, "yaxis": ya, "y": tl.device[sel],
        "base": tl.start[sel], "x": tl.end[sel] - tl.start[sel], "width": height,
        "marker": {"color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 1.2}},
        "name": name, "legendgroup": name, "showlegend": name not in shown, "hoverinfo": "skip",
        "textposition": "none", "meta": {"kind": "overlap", "panel": panel},
    }
    shown.add(name)
    return [trace]


#: The widest plot area (pixels) a label is assumed to get: boxes too narrow for their label
#: even then carry none; the browser decides for the rest (see :func:`schedule_spec`).
LABEL_MAX_PLOT_PX = 1800


#: Width of a digit in em in the fonts a browser picks for "Helvetica, Arial, sans-serif"
#: (0.556 in Helvetica/Arial/Liberation Sans, 0.636 in DejaVu Sans): the larger.
DIGIT_EM = 0.64


def label_fits(durations: np.ndarray, microbatches: np.ndarray, span: float, label_size: int,
               plot_px: float) -> np.ndarray:
    """The label rule: whether each box (its duration, on an axis of ``span`` time units drawn
    ``plot_px`` pixels wide) holds its microbatch label whole, with 3 px to spare each side."""
    if span <= 0:
        return np.zeros(len(durations), bool)
    digits = np.floor(np.log10(np.maximum(np.asarray(microbatches), 1))) + 1
    need = digits * DIGIT_EM * label_size + 6
    return np.asarray(durations) / span * plot_px >= need




def _shade(color: str, factor: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#{:02X}{:02X}{:02X}".format(*(max(0, min(255, round(x * factor))) for x in (r, g, b)))


def _overview_edges(tl: _Columns, horizon: float, max_columns: int) -> np.ndarray:
    """The overview's column edges: always equally spaced (plotly.js then draws the raster as one
    small image scaled up, instead of a rectangle per cell: 20 times faster at p = 32, m = 256).
    When every pass boundary lies on a grid of at most ``max_columns`` steps (unit costs, costs
    in halves), that grid: each column is then exactly one interval between boundaries;
    otherwise ``max_columns`` equal columns."""
    if horizon <= 0:
        return np.array([0.0, 1.0])
    # passes that take time start at distinct times on their device: more of them than columns,
    # no such grid (a grid missed this way is only drawn with max_columns columns instead)
    busiest = int(np.bincount(tl.device).max()) if len(tl.device) else 0
    edges = np.unique(np.concatenate([[0.0, horizon], tl.start, tl.end])) if busiest <= max_columns else ()
    if 0 < len(edges) - 1 <= max_columns:
        step = float(np.min(np.diff(edges)))
        steps = round(horizon / step)
        units = edges / step
        if steps <= max_columns and np.allclose(units, np.round(units), rtol=0, atol=1e-6):
            return np.arange(steps + 1) * (horizon / steps)
    return np.linspace(0.0, horizon, max_columns + 1)


#: What a cell of the overview says on hover; ``{name}`` fields are the cell's pass (the same
#: text whether plotly shows it from per-cell data, :func:`hover_on_cells`, or a viewer does from
#: the hover table, as the explorer's does).
OVERVIEW_HOVER = ("<b>{op}</b> stage {stage}{chunk_part}, microbatch {microbatch}<br>device {device}, "
                  "start {start}, end {end}")
_PLOTLY_FIELDS = {"{op}": "%{text}", "{stage}": "%{customdata[0]}", "{chunk}": "%{customdata[1]}",
                  "{microbatch}": "%{customdata[2]}", "{device}": "%{y}", "{start}": "%{customdata[3]:.4g}",
                  "{end}": "%{customdata[4]:.4g}"}


def _overview_template(num_chunks: int) -> str:
    """:data:`OVERVIEW_HOVER` for a panel of ``num_chunks`` chunks (the chunk named when > 1)."""
    return OVERVIEW_HOVER.replace("{chunk_part}", ", chunk {chunk}" if num_chunks > 1 else "")


def _plotly_template(template: str) -> str:
    out = template
    for field_, plotly_field in _PLOTLY_FIELDS.items():
        out = out.replace(field_, plotly_field)
    return out + "<extra></extra>"


def _overview_traces(tl: _Columns, chunk: np.ndarray, panel: int, horizon: float, colors,
                     idle_color: str, row_px: int, max_columns: int, shown: set[str],
                     hover: str = "cells") -> list[dict]:
    """The panel as a raster: an idle row per device, one heatmap above it whose columns are
    equally spaced (:func:`_overview_edges`; each cell: the pass running at its middle; idle
    cells are gaps, so the row's idle colour shows through and hovering them shows nothing),
    and white lines between the device rows. Odd microbatches are drawn a shade darker so that
    neighbouring passes of one kind stay apart.

    Hovering a cell names its pass: kind, stage, chunk, microbatch, start and end. ``hover``
    ``"cells"``: as plotly data (``customdata[d][j]`` is ``[stage, chunk, microbatch, start,
    end]``, ``text[d][j]`` the kind); ``"table"``: as ``meta["hover"]``, flat per-cell columns
    (``stage``, ``microbatch`` (-1 where idle), ``start``, ``end``; ``columns`` per row) and the
    ``template`` (:data:`OVERVIEW_HOVER`), for a
    viewer that shows the hover itself (the explorer's; the kind and chunk come from ``z`` and
    ``meta["codes"]``); :func:`hover_on_cells` turns it into the ``"cells"`` form."""
    xa, ya = _axis_names(panel)
    p, v = tl.num_devices, tl.placement.num_chunks
    kinds = [(oi, c) for oi in range(len(_OPS)) for c in range(v)
             if np.any((tl.op == oi) & (chunk == c))]
    code_of = {k: i + 1 for i, k in enumerate(kinds)}
    code = np.zeros(len(tl.op), np.int32)
    for (oi, c), k in code_of.items():
        code[(tl.op == oi) & (chunk == c)] = k
    code = 2 * code - 1 + (tl.microbatch % 2)  # two shades per kind: 1..2K
    edges = _overview_edges(tl, horizon, max_columns)
    mid = (edges[:-1] + edges[1:]) / 2
    ncol = len(mid)
    z = np.full((p, ncol), np.nan, np.float32)
    pick_of = np.full((p, ncol), -1, np.int64)  # the pass of each cell, -1 where idle
    for d in range(p):
        sel = np.flatnonzero(tl.device == d)
        if not len(sel):
            continue
        sel = sel[np.argsort(tl.start[sel], kind="stable")]
        idx = np.searchsorted(tl.start[sel], mid, side="right") - 1
        ok = idx >= 0
        ok[ok] = tl.end[sel][idx[ok]] > mid[ok]
        pick_of[d, ok] = sel[idx[ok]]
    busy = pick_of >= 0
    pick = pick_of[busy]
    z[busy] = code[pick]
    ncodes = 2 * len(kinds)
    fills = []
    for oi, c in kinds:
        base = pass_color(_OPS[oi], c, colors)
        fills += [base, _shade(base, 0.82) if base.startswith("#") and len(base) == 7 else base]
    scale = []
    for k, fill in enumerate(fills):
        lo, hi = k / max(ncodes, 1), (k + 1) / max(ncodes, 1)
        scale += [[lo, fill], [hi, fill]]
    if not scale:
        scale = [[0, idle_color], [1, idle_color]]
    gap = 2 if row_px >= 12 else 1
    template = _overview_template(v)
    heat = {
        "type": "heatmap", "xaxis": xa, "yaxis": ya, "x": edges, "y": np.arange(p, dtype=np.int32),
        "z": z, "zmin": 0.5, "zmax": ncodes + 0.5, "colorscale": scale, "showscale": False,
        "hoverongaps": False, "name": "passes", "showlegend": False,
        "meta": {"kind": "overview", "panel": panel, "codes": [[_OPS[oi].value, c] for oi, c in kinds]},
    }
    small = np.int16 if max(tl.placement.num_stages, int(tl.microbatch.max(initial=0)) + 1) < 2 ** 15 else np.int32
    table = {"stage": np.where(busy, tl.stage[pick_of], -1).astype(small),
             "microbatch": np.where(busy, tl.microbatch[pick_of], -1).astype(small),
             "start": np.where(busy, tl.start[pick_of], np.nan).astype(np.float32),
             "end": np.where(busy, tl.end[pick_of], np.nan).astype(np.float32),
             "columns": ncol, "template": template}
    if hover == "table":
        heat["hoverinfo"] = "none"  # the viewer shows it: plotly still reports the cell hovered
        heat["meta"]["hover"] = table
    else:
        heat.update(_cell_hover(z, heat["meta"]["codes"], table))
    out = [{  # the idle rows: a one-column heatmap under the passes (a bar would be drawn above them)
        "type": "heatmap", "xaxis": xa, "yaxis": ya, "x": np.array([0.0, horizon]),
        "y": np.arange(p, dtype=np.int32), "z": np.zeros((p, 1), np.uint8), "zmin": 0, "zmax": 1,
        "colorscale": [[0, idle_color], [1, idle_color]], "showscale": False,
        "name": "idle", "showlegend": False, "hoverinfo": "skip", "meta": {"kind": "idle", "panel": panel},
    }, heat]
    if p > 1:  # the rows apart: white lines on the row boundaries (gaps between cells would cost a
        # rectangle per cell to draw)
        ys = np.repeat(np.arange(p - 1) + 0.5, 3)
        ys[2::3] = np.nan
        xs = np.tile(np.array([0.0, horizon, np.nan]), p - 1)
        out.append({"type": "scatter", "xaxis": xa, "yaxis": ya, "x": xs, "y": ys, "mode": "lines",
                    "line": {"color": "white", "width": gap}, "connectgaps": False, "showlegend": False,
                    "hoverinfo": "skip", "name": "rows", "meta": {"kind": "rows", "panel": panel}})
    if "idle" not in shown:
        shown.add("idle")
        out.append({
            "type": "scatter", "xaxis": xa, "yaxis": ya, "x": [None], "y": [None], "mode": "markers",
            "marker": {"symbol": "square", "size": 12, "color": idle_color}, "name": "idle",
            "legendgroup": "idle", "showlegend": True, "hoverinfo": "skip",
            "meta": {"kind": "legend", "op": None, "chunk": None, "panel": panel},
        })
    for oi, c in kinds:
        name = _kind_name(_OPS[oi], c, v)
        if name in shown:
            continue
        shown.add(name)
        out.append({
            "type": "scatter", "xaxis": xa, "yaxis": ya, "x": [None], "y": [None], "mode": "markers",
            "marker": {"symbol": "square", "size": 12, "color": pass_color(_OPS[oi], c, colors)},
            "name": name, "legendgroup": name, "showlegend": True, "hoverinfo": "skip",
            "meta": {"kind": "legend", "op": _OPS[oi].value, "chunk": c, "panel": panel},
        })
    return out


def _cell_hover(z: np.ndarray, codes: Sequence, table: Mapping) -> dict:
    """An overview heatmap's plotly hover from its hover table: ``customdata`` ``[stage, chunk,
    microbatch, start, end]`` per cell (NaN where idle), ``text`` the pass kind ("" where idle)
    and the ``hovertemplate``."""
    z = np.asarray(z, np.float32)
    busy = ~np.isnan(z)
    kind = np.where(busy, (np.nan_to_num(z, nan=1.0).astype(np.int64) - 1) // 2, len(codes))
    chunks = np.array([c for _, c in codes] + [np.nan], np.float32)
    names = np.array([op for op, _ in codes] + [""], dtype=object)
    stage = np.asarray(table["stage"], np.float32)
    micro = np.asarray(table["microbatch"], np.float32)
    custom = np.stack([np.where(busy, stage, np.nan), chunks[kind], np.where(busy, micro, np.nan),
                       np.asarray(table["start"], np.float32), np.asarray(table["end"], np.float32)],
                      axis=-1).astype(np.float32)
    return {"customdata": custom, "text": names[kind].tolist(), "hovertemplate": _plotly_template(table["template"])}


def hover_on_cells(spec: dict) -> dict:
    """``spec`` (a :func:`schedule_spec` figure) with the hover of every overview drawn with
    ``overview_hover="table"`` as plotly's own per-cell hover data (what a page without the
    explorer's viewer needs: the HTML report, ``ctrlmem draw --state -o x.html``); a shallow
    copy where something changes, ``spec`` itself otherwise."""
    data = spec.get("data", [])
    if not any(isinstance(tr.get("meta"), dict) and "hover" in tr["meta"] for tr in data):
        return spec
    out = []
    for tr in data:
        meta = tr.get("meta")
        if isinstance(meta, dict) and "hover" in meta:
            tr = dict(tr, meta={k: v for k, v in meta.items() if k != "hover"})
            tr.pop("hoverinfo", None)
            tr.update(_cell_hover(tr["z"], meta["codes"], meta["hover"]))
        out.append(tr)
    return dict(spec, data=out)


def without_hover_tables(spec: dict) -> dict:
    """``spec`` without the overview hover tables (a static image shows no hover; a shallow copy
    where something changes)."""
    data = spec.get("data", [])
    if not any(isinstance(tr.get("meta"), dict) and "hover" in tr["meta"] for tr in data):
        return spec
    return dict(spec, data=[dict(tr, meta={k: v for k, v in tr["meta"].items() if k != "hover"})
                            if isinstance(tr.get("meta"), dict) and "hover" in tr["meta"] else tr for tr in data])


def _text_on(fill: str, dark: str, light: str) -> str:
    """A readable label colour on ``fill`` (``#RRGGBB``): light text on dark fills."""
    if not (fill.startswith("#") and len(fill) == 7):
        return dark
    r, g, b = (int(fill[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return light if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else dark


# -- memory ------------------------------------------------------------------------------------

def one_f_one_b_peak(num_devices: int, num_microbatches: int, costs: Costs | None = None,
                     memory: MemoryModel | None = None) -> float:
    """1F1B's simulated peak activation memory (``p·a`` for m ≥ p): the reference line."""
    return max(simulate(build("1f1b", num_devices, num_microbatches), costs, memory).peak_memory)


def theoretical_peak(schedule: Schedule) -> float | None:
    """The schedule's peak activation memory from theory, in ``a``, or ``None`` if unknown.

    Closed forms of docs/theory.md §5 / the exact-values table (default memory model; the steady state needs
    enough microbatches, so each is capped by what ``m`` microbatches can hold):
    GPipe ``m``; 1F1B, ZB-H1, ZB-V, V-ZB ``p``; ZB-H2 ``2p−1``; V-Min ``⌊(p+4)/3⌋``; V-Half
    ``⌊(p+2)/2⌋``. Memory-budgeted schedules give their budget (``memory_limit`` × ``p``).
    Other schedules with a paper building block give its Eq. 1 bound.
    """
    p, m = schedule.num_devices, schedule.num_microbatches
    params = dict(schedule.params)
    forms = {
        "gpipe": m, "1f1b": p, "zb-h1": p, "zb-v": p, "v-zb": p, "zb-h2": 2 * p - 1,
        "v-min": (p + 4) // 3, "v-half": (p + 2) // 2,
    }
    if schedule.name in forms:
        return float(min(forms[schedule.name], m))
    limit = params.get("memory_limit")
    if isinstance(limit, (int, float)):
        return float(limit) * min(p, m)
    try:
        block = paper_block(schedule.name, p, m)
    except ValueError:
        block = None
    return float(max(block.memory_bound())) if block is not None else None


def memory_figure(results: SimResult | Sequence[SimResult], **style) -> go.Figure:
    """Activation memory (``a``) of every device over time, one panel per result; ``style``
    takes the keyword arguments of :func:`memory_spec`.

    Each device is a step line taken verbatim from ``SimResult.memory_curve`` (``line_shape
    'hv'``, held at its last level until the makespan; trace ``meta`` is ``{"kind": "memory",
    "device", "panel"}``). Dashed lines mark the theoretical peak of each schedule (default
    :func:`theoretical_peak`; ``None`` skips it; ``meta["kind"] == "theory"``) and
    ``reference_peak`` (default: 1F1B's simulated peak for the first result's p, m and costs;
    ``meta["kind"] == "1f1b"``); a budgeted schedule's line is its budget, labelled so
    (``meta["kind"] == "budget"``).
    """
    _check_items("memory_figure", results, (SimResult,), arg="results")
    _check_size("memory_figure", style)
    return go.Figure(memory_spec(results, **style))


_CURVES: dict[int, tuple] = {}


def _memory_curves(result: SimResult) -> list[tuple[np.ndarray, np.ndarray]]:
    """``result.memory_curve(d)`` for every device as arrays, computed once per result (the
    memory plot and the peak-memory comparison of one update draw the same curves; the last few
    results are remembered, by identity). The same steps as ``memory_curve``, at once per
    device instead of one event at a time (levels rounded to 1e-9 as there, by numpy)."""
    found = _CURVES.get(id(result))
    if found is not None and found[0] is result:
        return found[1]
    curves = [_curve_arrays(events) for events in result._events]
    if len(_CURVES) >= 16:
        _CURVES.pop(next(iter(_CURVES)))
    _CURVES[id(result)] = (result, curves)
    return curves


def _curve_arrays(events: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The step curve of one device's sorted ``(time, delta)`` memory events, from ``(0, 0)``:
    the level after the last event of each distinct time."""
    n = len(events)
    flat = np.fromiter(chain.from_iterable(events), float, 2 * n)
    times = np.concatenate([[0.0], flat[0::2]])
    levels = np.concatenate([[0.0], np.cumsum(flat[1::2])])  # sequential sums, as level += delta
    last = np.r_[times[1:] != times[:-1], True]  # the last of each run of equal times
    return times[last], np.round(levels[last], 9) + 0.0


#: Line colour of the host-memory curve (offloaded activations, docs/theory.md §13).
HOST_COLOR = "#6A3D9A"


def host_memory_curve(result: SimResult) -> tuple[list[float], list[float]] | None:
    """Activation held in host memory over time, all devices together (in ``a``): an offloaded
    share arrives when its offload ends and leaves when its reload starts; ``None`` without
    copies."""
    copies = result.copies
    if not copies:
        return None
    sched = result.schedule
    act = result.memory.stage_activation(sched.num_stages, sched.num_devices)
    share = {(c.stage, c.microbatch): c.fraction * act[c.stage] for row in sched.copies for c in row if c.kind == "O"}
    events = sorted((c.end, share[(c.stage, c.microbatch)]) if c.op == "O" else (c.start, -share[(c.stage, c.microbatch)])
                    for c in copies)
    t, v, level = [0.0], [0.0], 0.0
    for time_, delta in events:
        level += delta
        t.append(time_)
        v.append(max(0.0, level) if abs(level) > 1e-12 else 0.0)
    t.append(result.makespan)
    v.append(v[-1])
    return t, v


def schedule_budget(schedule: Schedule) -> float | None:
    """The memory budget a schedule was built for, as a fraction of 1F1B's peak (its
    ``memory_limit`` parameter), or ``None``."""
    limit = dict(schedule.params).get("memory_limit")
    return float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None


def memory_spec(
    results: SimResult | Sequence[SimResult],
    *,
    titles: Sequence[str] | None = None,
    theoretical_peaks: Sequence[float | None] | None = None,
    budgets: Sequence[float | None] | None = None,
    reference_peak: float | None = None,
    device_colors: Sequence[str] | None = None,
    theory_color: str = "#C23B3B",
    budget_color: str = "#B0500F",
    reference_color: str = "#555555",
    line_width: float = 1.6,
    panel_height: int = 200,
    width: int | None = None,
    title: str | None = None,
    x_title: str = "time (cost units)",
    max_points: int = MEMORY_POINTS,
    tick_overflow: str | None = None,
    font_family: str = "Helvetica, Arial, sans-serif",
) -> dict:
    """The plain-dict figure behind :func:`memory_figure` (same arguments, plus ``max_points``:
    a device curve with more steps than this is reduced to the first, lowest, highest and last
    point of each of ``max_points / 4`` time columns, which draws the same picture at screen
    resolution and keeps every peak; ``meta["reduced"]`` says so; ``tick_overflow``: the memory
    axes' ``ticklabeloverflow``, as in :func:`schedule_spec`).

    ``budgets``: each panel's memory budget as a fraction of 1F1B's peak (default: the
    schedule's ``memory_limit`` parameter, :func:`schedule_budget`), drawn as a dashed line
    labelled "budget" (``meta["kind"] == "budget"``) at that fraction of ``reference_peak``; a
    budgeted panel has no "theory" line (its only theory is the budget). ``device_colors``:
    a colour per device (cycled); default :func:`colors_for_devices` (categorical up to
    :data:`CATEGORICAL_DEVICES` devices, else a sequential scale with a colour bar "device"
    instead of one legend entry per device)."""
    results = [results] if isinstance(results, SimResult) else list(results)
    if not results:
        raise ValueError("memory_figure needs at least one simulation result")
    _check_drawable(sum(getattr(getattr(r, "schedule", None), "num_devices", 0) for r in results))
    if budgets is None:
        budgets = [schedule_budget(r.schedule) for r in results]
    if theoretical_peaks is None:
        theoretical_peaks = [None if budget is not None else theoretical_peak(r.schedule)
                             for r, budget in zip(results, budgets)]
    if reference_peak is None:  # peak memory follows the order alone: any costs give 1F1B's
        r0 = results[0]
        reference_peak = one_f_one_b_peak(r0.schedule.num_devices, r0.schedule.num_microbatches,
                                          None, r0.memory)
    n = len(results)
    if titles is None:
        titles = [f"{r.schedule.name}: peak {fmt_time(max(r.peak_memory))} a "
                  f"({fmt_ratio(max(r.peak_memory) / reference_peak)} of 1F1B)" if reference_peak else
                  r.schedule.name for r in results]
    top = MODEBAR_PX + (56 if title else 30)
    layout, height = _stacked_layout([panel_height] * n, list(titles), gap_px=44, top_px=top,
                                     bottom_px=50, hovers=[_panel_hover(r) for r in results])
    data: list[dict] = []
    horizon = max(r.makespan for r in results)
    curves = sum(r.schedule.num_devices for r in results)
    deepest = max(r.schedule.num_devices for r in results)
    sequential = device_colors is None and deepest > CATEGORICAL_DEVICES
    palette = list(device_colors) if device_colors is not None else colors_for_devices(deepest)
    for panel, r in enumerate(results):
        xa, ya = _axis_names(panel)
        for d, (t, v) in enumerate(_memory_curves(r)):
            if t[-1] < r.makespan:  # hold the last level until the end of the schedule
                t, v = np.append(t, r.makespan), np.append(v, v[-1])
            reduced = len(t) > max_points
            if reduced:
                t, v = _m4(t, v, max_points // 4, horizon)
            # float32 where it loses nothing, or where the figure is large (a screen picture
            # needs no more, at half the bytes); the exact curves stay in the SimResult
            t32, v32 = t.astype(np.float32), v.astype(np.float32)
            if reduced or len(t) * curves > COMPACT_POINTS or (
                    np.array_equal(t32, t) and np.array_equal(v32, v)):
                t, v = t32, v32
            data.append({
                "type": "scatter", "xaxis": xa, "yaxis": ya,
                "x": t, "y": v, "mode": "lines",
                "line": {"shape": "hv", "width": line_width, "color": palette[d % len(palette)]},
                "name": f"d{d}", "legendgroup": f"d{d}", "showlegend": panel == 0 and not sequential,
                "hovertemplate": f"d{d}: %{{y:g}} a at t=%{{x:g}}<extra></extra>",
                "meta": {"kind": "memory", "device": d, "panel": panel, "reduced": reduced},
            })
        theory = theoretical_peaks[panel]
        if theory is not None:
            data.append(_hline(theory, r.makespan, theory_color, f"theory {theory:g} a", "theory",
                               panel, at_start=True))
        budget = budgets[panel]
        budget_a = None
        if budget is not None and reference_peak is not None:
            budget_a = budget * reference_peak
            data.append(_hline(budget_a, r.makespan, budget_color,
                               f"budget {budget_a:g} a ({budget:g} × 1F1B)", "budget", panel, at_start=True))
        if reference_peak is not None:
            data.append(_hline(reference_peak, r.makespan, reference_color,
                               f"1F1B peak {reference_peak:g} a", "1f1b", panel))
        host = host_memory_curve(r)
        if host is not None:
            data.append({"type": "scatter", "xaxis": xa, "yaxis": ya, "x": host[0], "y": host[1], "mode": "lines",
                         "line": {"shape": "hv", "width": line_width, "color": HOST_COLOR, "dash": "dot"},
                         "name": "on host (all devices)", "legendgroup": "host", "showlegend": panel == 0,
                         "hovertemplate": "on host: %{y:g} a at t=%{x:g}<extra></extra>",
                         "meta": {"kind": "host", "panel": panel}})
        top_value = max([max(r.peak_memory), theory or 0.0, budget_a or 0.0, reference_peak or 0.0,
                         max(host[1]) if host else 0.0, 1e-9])
        layout[f"yaxis{'' if panel == 0 else panel + 1}"].update(
            title={"text": "memory (a)"}, range=[0, top_value * 1.18], showgrid=True,
            gridcolor="#EEEEEE", **({"ticklabeloverflow": tick_overflow} if tick_overflow is not None else {}))
        layout[f"xaxis{'' if panel == 0 else panel + 1}"].update(showgrid=True, gridcolor="#EEEEEE")
    if sequential:
        ticks = sorted({0, deepest - 1, *range(0, deepest, max(1, deepest // 8))})
        data.append({
            "type": "scatter", "x": [None], "y": [None], "mode": "markers", "showlegend": False,
            "hoverinfo": "skip", "name": "device",
            "marker": {"color": [0], "cmin": 0, "cmax": deepest - 1, "showscale": True,
                       "colorscale": [[i / (len(palette) - 1), c] for i, c in enumerate(palette)]
                       if len(palette) > 1 else [[0, palette[0]], [1, palette[0]]],
                       "colorbar": {"title": {"text": "device"}, "tickvals": ticks,
                                    "ticktext": [f"d{d}" for d in ticks], "thickness": 12, "len": 0.9,
                                    "outlinewidth": 0}},
            "meta": {"kind": "device-scale", "devices": deepest},
        })
    for panel in range(n):
        layout[f"xaxis{'' if panel == 0 else panel + 1}"]["range"] = [0, horizon * 1.005 if horizon else 1]
    layout[f"xaxis{'' if n == 1 else n}"]["title"] = {"text": x_title}
    layout.update(
        height=height, width=width, plot_bgcolor="white", paper_bgcolor="white",
        font={"family": font_family, "size": 12}, margin={"l": 60, "r": 20, "t": top, "b": 50},
    )
    if title:
        layout["title"] = _title(title, height)
    return {"data": data, "layout": layout}


def _m4(t: np.ndarray, v: np.ndarray, columns: int, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first, lowest, highest and last point of each of ``columns`` equal time columns
    (M4 reduction; the first lowest and first highest where several tie): the drawn step line is
    unchanged at that resolution and every peak stays."""
    col = np.minimum((t / (horizon or 1.0) * columns).astype(np.int64), columns - 1)
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    ends = np.r_[starts[1:], len(t)] - 1
    seg = np.repeat(np.arange(len(starts)), ends - starts + 1)

    def first_where(hit: np.ndarray) -> np.ndarray:  # the first index of each column where hit
        idx = np.flatnonzero(hit)
        return idx[np.r_[True, seg[idx][1:] != seg[idx][:-1]]]

    lo = first_where(v == np.minimum.reduceat(v, starts)[seg])
    hi = first_where(v == np.maximum.reduceat(v, starts)[seg])
    idx = np.unique(np.concatenate([starts, ends, lo, hi]))
    return t[idx], v[idx]


def _hline(y: float, x1: float, color: str, label: str, kind: str, panel: int,
           at_start: bool = False) -> dict:
    xa, ya = _axis_names(panel)
    return {
        "type": "scatter", "xaxis": xa, "yaxis": ya, "x": [0.0, x1], "y": [y, y],
        "mode": "lines+text", "text": [label, ""] if at_start else ["", label],
        "textposition": "top right" if at_start else "top left",
        "textfont": {"color": color, "size": 11}, "line": {"color": color, "dash": "dash", "width": 1.2},
        "name": label, "showlegend": False, "hoverinfo": "skip",
        "meta": {"kind": kind, "value": y, "panel": panel},
    }


# -- building blocks ---------------------------------------------------------------------------

def repeat_block(block: Sequence[TimedPass], num_microbatches: int, interval: float) -> list[TimedPass]:
    """Copies of a one-microbatch block, microbatch ``k`` shifted by ``k·interval`` (no squeeze:
    copies may collide when the block is not valid for that interval)."""
    return [tp._replace(microbatch=k, start=tp.start + k * interval, end=tp.end + k * interval)
            for k in range(num_microbatches) for tp in block]


def squeeze_passes(passes: Sequence[TimedPass], placement: Placement, num_microbatches: int,
            costs: Costs | None = None, name: str = "squeezed") -> SimResult:
    """The paper's *squeeze*: keep each device's order (by start time), run every pass as early
    as dependencies allow. This is exactly what :func:`ctrlmem.simulate` does to an order."""
    rows: list[list[TimedPass]] = [[] for _ in range(placement.num_devices)]
    for tp in passes:
        rows[tp.device].append(tp)
    orders = [[(tp.op, tp.stage, tp.microbatch)
               for tp in sorted(r, key=lambda t: (t.start, t.end, t.stage))] for r in rows]
    return simulate(Schedule.from_orders(name, placement, num_microbatches, orders), costs)


def paper_block(name: str, num_devices: int, num_microbatches: int | None = None):
    """The paper's building block for ``name`` from :data:`ctrlmem.search.buildingblock.GALLERY`, or ``None``
    when the gallery has no block of that name."""
    if name not in blocks.GALLERY:
        return None
    make = blocks.GALLERY[name]
    return make(num_devices, num_microbatches) if name == "gpipe" else make(num_devices)


def slot_timeline(passes: Iterable, placement: Placement, title: str, slot: float = 1.0) -> PassTimeline:
    """A :class:`PassTimeline` from slot-timed passes (``ctrlmem.search.buildingblock.SlotPass``: start, length,
    op, stage, microbatch), one slot lasting ``slot`` time units."""
    tps = tuple(TimedPass(placement.device_of(sp.stage), sp.op, sp.stage, sp.microbatch,
                          sp.start * slot, (sp.start + sp.length) * slot) for sp in passes)
    return PassTimeline(title, placement.num_devices, placement, tps)


def _fallback_block(name: str, num_devices: int, costs: Costs | None,
                    num_microbatches: int = 2) -> tuple[list[TimedPass], Placement, float]:
    """(block, placement, interval) without :mod:`ctrlmem.search.buildingblock`: the schedule built for one
    microbatch, every pass as early as possible, repeated every ``f+b+w`` of one device."""
    costs = costs if costs is not None else Costs()
    try:
        one = simulate(build(name, num_devices, 1, costs=costs), costs)
    except ValueError:
        # a schedule that takes no single microbatch (v-shape and zb need two, DualPipe-V 2p):
        # microbatch 0 of its schedule for ``num_microbatches``, in its order on each device, is
        # the same one-microbatch chain
        full = build(name, num_devices, max(2, num_microbatches), costs=costs)
        if full.model_copies > 1:
            raise ValueError(f"{name} runs {full.model_copies} model copies, each on its own share of the "
                             f"microbatches: it has no one-microbatch building block to repeat; its schedule view "
                             f"shows the whole order") from None
        rows = [[ps for ps in row if ps.microbatch == 0] for row in full.device_passes]
        one = simulate(Schedule.from_orders(name, full.placement, 1, rows, model_copies=full.model_copies), costs)
    f, b, w = costs.stage_times(one.schedule.num_stages, num_devices)
    interval = max(sum(f[s] + b[s] + w[s] for s in one.schedule.placement.stages_of(d))
                   for d in range(num_devices))
    return list(one.passes), one.schedule.placement, interval


def block_timelines(name: str, num_devices: int, num_microbatches: int,
                    costs: Costs | None = None) -> list[PassTimeline]:
    """The steps of the paper's construction (docs/theory.md §2) as timelines, first to last.

    With the paper's block for ``name`` (:func:`paper_block`, in slots of one chunk pass): the
    block, then every step of :func:`ctrlmem.search.buildingblock.pipeline_steps` (repeat, W placed,
    reordered, squeezed). Otherwise (a schedule without a paper block): the schedule built for
    one microbatch, its repetition every ``T = f+b+w``, that repetition squeezed, and the
    registered (reordered) schedule, all under ``costs``.
    """
    p, m = num_devices, num_microbatches
    try:
        block = paper_block(name, p, m)
        steps = blocks.pipeline_steps(block, m) if block is not None else None
    except ValueError as exc:
        if name not in SCHEDULES:
            raise
        log.warning("paper block of %s unavailable (%s); showing the registered schedule's steps", name, exc)
        block = None
    if block is not None:
        out = [slot_timeline(block.passes, block.placement,
                             f"{name}: building block (T = {block.interval} slots, Eq. 1 bound "
                             f"{max(block.memory_bound()):g} a)")]
        for step, tl in steps.items():
            rows = [sp for row in tl.rows for sp in row]
            peak = max(tl.peak_memory())
            label = {"place_w": "place W"}.get(step, step)  # the step's name, in words
            out.append(slot_timeline(rows, tl.placement, f"{label}: {tl.end} slots, peak {peak:g} a"))
        return out
    block_passes, placement, interval = _fallback_block(name, p, costs, m)
    rep = repeat_block(block_passes, m, interval)
    squeezed = squeeze_passes(rep, placement, m, costs, name=f"{name}-squeezed")
    final = simulate(build(name, p, m, costs=costs), costs)
    return [
        PassTimeline(f"{name}: one microbatch as early as possible (T = {interval:g})", p, placement,
                 tuple(block_passes)),
        PassTimeline(f"repeated every T (m={m})", p, placement, tuple(rep)),
        PassTimeline(f"squeezed: makespan {squeezed.makespan:g}, peak {max(squeezed.peak_memory):g} a",
                 p, placement, tuple(squeezed.passes)),
        PassTimeline(f"{name} as registered: makespan {final.makespan:g}, peak {max(final.peak_memory):g} a",
                 p, placement, tuple(final.passes)),
    ]


def block_figure(name: str, num_devices: int, num_microbatches: int, *,
                 costs: Costs | None = None, steps: Sequence[int] | None = None,
                 **style) -> go.Figure:
    """Building block → repeat → squeeze → reorder, stacked on one time axis (Fig. 1, 11, 18
    style). ``steps`` picks panels of :func:`block_timelines` by index (default all);
    ``style`` goes to :func:`schedule_figure`."""
    num_devices = checks.integer("block_figure: num_devices", num_devices)
    num_microbatches = checks.integer("block_figure: num_microbatches", num_microbatches)
    tls = block_timelines(name, num_devices, num_microbatches, costs)
    if steps is not None:
        tls = [tls[i] for i in steps]
    try:
        in_slots = paper_block(name, num_devices, num_microbatches) is not None
    except ValueError:
        in_slots = False
    style.setdefault("x_title", SLOTS_TITLE if in_slots else "time (cost units)")
    return schedule_figure(tls, **style)


def lifespans(item, microbatch: int = 0) -> list[dict]:
    """Lifespan of every stage (docs/theory.md §3): from the start of its F to the end of the pass
    that releases its activation (W, or BW when fused).

    ``item`` is a :class:`SimResult` (microbatch ``microbatch`` of the simulated timeline, an
    integer in ``0..m-1``) or a building block with ``lifespans()`` and ``placement``
    (``ctrlmem.search.buildingblock.BuildingBlock``)."""
    if not (isinstance(item, SimResult) or (hasattr(item, "lifespans") and hasattr(item, "placement"))):
        raise TypeError(f"lifespans: item must be a SimResult or a building block, got {type(item).__name__} "
                        f"{short_repr(item, 60)}")
    if isinstance(item, SimResult):
        m = item.schedule.num_microbatches
        microbatch = checks.integer("lifespans: microbatch", microbatch, minimum=0, maximum=m - 1,
                                    what=f"the schedule has microbatches 0..{m - 1}")
    if not isinstance(item, SimResult):
        placement = item.placement
        return [{"stage": s, "device": placement.device_of(s), "lifespan": float(life)}
                for s, life in sorted(item.lifespans().items())]
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    dev: dict[int, int] = {}
    for tp in item.passes:
        if tp.microbatch != microbatch:
            continue
        dev[tp.stage] = tp.device
        if tp.op is Op.F:
            start[tp.stage] = tp.start
        elif tp.op in (Op.W, Op.BW):
            end[tp.stage] = max(end.get(tp.stage, tp.end), tp.end)
    return [{"stage": s, "device": dev[s], "start": start[s], "end": end[s],
             "lifespan": end[s] - start[s]} for s in sorted(start) if s in end]


def lifespan_figure(
    items,
    *,
    microbatch: int = 0,
    titles: Sequence[str] | None = None,
    stage_colors: Sequence[str] = DEVICE_COLORS,
    height: int = 320,
    width: int | None = None,
    title: str | None = None,
    font_family: str = "Helvetica, Arial, sans-serif",
) -> go.Figure:
    """Per-device lifespan bars (Fig. 2): each device's bar stacks the lifespans of the stages
    it holds (labelled ``l<stage>``), so the tallest bar is the memory bottleneck (Eq. 1).
    ``items``: SimResults and/or building blocks (see :func:`lifespans`), one panel each."""
    _check_items("lifespan_figure", items, (SimResult,), blocks=True)
    _check_size("lifespan_figure", {"width": width, "height": height})
    items = [items] if isinstance(items, SimResult) or hasattr(items, "lifespans") else list(items)
    if not items:
        raise ValueError("lifespan_figure needs at least one simulation result or building block")
    if titles is None:
        titles = [it.schedule.name if isinstance(it, SimResult) else str(getattr(it, "name", "block"))
                  for it in items]
    fig = make_subplots(rows=1, cols=len(items), shared_yaxes=True, subplot_titles=list(titles))
    legend: set[int] = set()
    for i, it in enumerate(items):
        placement = it.schedule.placement if isinstance(it, SimResult) else it.placement
        spans = lifespans(it, microbatch)
        for chunk in range(placement.num_chunks):
            sel = sorted((s for s in spans if placement.chunk_of(s["stage"]) == chunk),
                         key=lambda s: s["device"])
            fig.add_trace(go.Bar(
                x=[f"d{s['device']}" for s in sel], y=[s["lifespan"] for s in sel],
                text=[f"l{s['stage']}" for s in sel], textposition="inside", textangle=0,
                textfont=dict(size=LABEL_SIZE), constraintext="both",
                marker_color=stage_colors[chunk % len(stage_colors)],
                name=f"chunk {chunk}", legendgroup=f"chunk {chunk}", showlegend=chunk not in legend,
                hovertemplate="stage %{text}: lifespan %{y:.4g}<extra></extra>",
                meta={"kind": "lifespan", "chunk": chunk, "panel": i},
            ), row=1, col=i + 1)
            legend.add(chunk)
        fig.update_xaxes(categoryorder="array",
                         categoryarray=[f"d{d}" for d in range(placement.num_devices)], row=1, col=i + 1)
    fig.update_layout(uniformtext=dict(minsize=LABEL_SIZE, mode="hide"))  # the label rule
    fig.update_yaxes(title_text="summed lifespan (time)", row=1, col=1)
    total = height + (30 if title else 0) + MODEBAR_PX
    fig.update_layout(barmode="stack", height=total, width=width, plot_bgcolor="white",
                      font=dict(family=font_family, size=12),
                      margin=dict(l=60, r=20, t=MODEBAR_PX + (80 if title else 50), b=40))
    if title:
        fig.update_layout(title=_title(title, total))
    return fig


# -- trade-offs --------------------------------------------------------------------------------

#: Memory limits (fractions of 1F1B's peak) a budgeted schedule is swept over by default.
TRADEOFF_LIMITS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def tradeoff_points(
    names: Iterable[str],
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limits: Sequence[float] = TRADEOFF_LIMITS,
    memory: MemoryModel | None = None,
) -> list[dict]:
    """Simulate every schedule (budgeted ones once per memory limit) and return one record per
    point: ``name, memory_limit, peak (a), memory (fraction of 1F1B's peak), bubble_rate,
    makespan, throughput`` (microbatches per time unit) and ``speedup`` over 1F1B. Limits a
    budgeted schedule cannot meet are skipped (logged)."""
    if names is None or isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"tradeoff_points: names must be a list of schedule names, got {short_repr(names, 60)}")
    costs = Costs.coerce(costs, "costs")
    p = checks.integer("tradeoff_points: num_devices", num_devices)
    m = checks.integer("tradeoff_points: num_microbatches", num_microbatches)
    ref = simulate(build("1f1b", p, m), costs, memory)
    ref_peak = max(ref.peak_memory)
    points = []
    for name in names:
        spec = SCHEDULES[name]
        for limit in (memory_limits if spec.memory_limit else (None,)):
            try:
                r = simulate(build(name, p, m, costs=costs, memory_limit=limit), costs, memory)
            except ValueError as exc:
                log.info("skipping %s at memory limit %s: %s", name, limit, exc)
                continue
            peak = max(r.peak_memory)
            points.append({
                "name": name, "memory_limit": limit, "peak": peak, "memory": peak / ref_peak,
                "bubble_rate": r.bubble_rate, "makespan": r.makespan,
                "throughput": m / r.makespan, "speedup": ref.makespan / r.makespan,
            })
    return points


def _series(points: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for pt in points:
        out.setdefault(pt["name"], []).append(pt)
    return out


#: Marker symbols of the series of the trade-off views (a point hidden under another of the
#: same position still shows its own outline).
SERIES_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "hexagon",
                  "star", "cross", "x")


def _nested_sizes(points: Sequence[dict], x: str, y: str, largest: int) -> dict[int, int]:
    """A marker size per point (by ``id``): points at one position get smaller the later they
    come, so each shows as an outline around the next."""
    seen: dict[tuple, int] = {}
    sizes = {}
    for pt in points:
        key = (round(pt[x], 6), round(pt[y], 6))
        rank = seen.get(key, 0)
        seen[key] = rank + 1
        sizes[id(pt)] = max(5, largest - 4 * rank)
    return sizes


def bubble_memory_figure(points: Sequence[dict], *, colors: Sequence[str] = DEVICE_COLORS,
                         height: int = 380, width: int | None = None, title: str | None = None,
                         font_family: str = "Helvetica, Arial, sans-serif", steps: bool = True) -> go.Figure:
    """Bubble rate against activation memory (fraction of 1F1B) for each schedule (Fig. 9).

    A budgeted schedule swept over memory limits is a step curve: at any memory budget the best
    it reaches is the point at or left of that budget, so the line holds each point's bubble
    rate until the next point (``line.shape = "hv"``) and on to the largest limit swept (trace
    ``meta["kind"] == "steps"``); the points themselves carry the hover
    (``meta["kind"] == "bubble"``). A schedule without a budget is a single marker.

    ``steps=False``: the budgets swept are a few samples, not every budget, so the points are
    joined by a dotted line in memory order (``meta["kind"] == "samples"``), claiming nothing
    about the budgets in between (what the explorer draws)."""
    fig = go.Figure()
    sizes = _nested_sizes(points, "memory", "bubble_rate", 13)
    for i, (name, pts) in enumerate(_series(points).items()):
        pts = sorted(pts, key=lambda q: (q["memory"], q["bubble_rate"]))
        color = colors[i % len(colors)]
        limits = [q["memory_limit"] for q in pts if q.get("memory_limit") is not None]
        if (len(pts) > 1 or limits) and not steps:
            fig.add_trace(go.Scatter(
                x=[q["memory"] for q in pts], y=[q["bubble_rate"] for q in pts], mode="lines", name=name,
                line=dict(color=color, width=1.5, dash="dot"), legendgroup=name, showlegend=False,
                hoverinfo="skip", meta={"kind": "samples", "name": name}))
        elif len(pts) > 1 or limits:
            xs = [q["memory"] for q in pts]
            ys = [q["bubble_rate"] for q in pts]
            best = []
            for y in ys:  # a larger budget never needs a worse schedule: the running best
                best.append(min(y, best[-1]) if best else y)
            if limits and max(limits) > xs[-1]:
                xs, best = xs + [max(limits)], best + [best[-1]]
            fig.add_trace(go.Scatter(
                x=xs, y=best, mode="lines", line=dict(color=color, width=2, shape="hv"), name=name,
                legendgroup=name, showlegend=False, hoverinfo="skip", meta={"kind": "steps", "name": name},
            ))
        fig.add_trace(go.Scatter(
            x=[q["memory"] for q in pts], y=[q["bubble_rate"] for q in pts],
            mode="markers", name=name, legendgroup=name,
            marker=dict(size=[sizes[id(q)] for q in pts], color=color, symbol=SERIES_SYMBOLS[i % len(SERIES_SYMBOLS)],
                        line=dict(color="white", width=1.5)),
            customdata=[[q["memory_limit"] if q.get("memory_limit") is not None else math.nan, q["peak"]]
                        for q in pts],
            hovertemplate=f"{name}<br>budget %{{customdata[0]:.3g}} × 1F1B<br>memory %{{x:.3f}} of 1F1B "
                          "(%{customdata[1]:.4g} a)<br>bubble rate %{y:.3f}<extra></extra>",
            meta={"kind": "bubble", "name": name},
        ))
    fig.update_layout(xaxis_title="peak activation memory / 1F1B " + ("(budgets: steps)" if steps else
                                                                       "(sampled budgets, dotted: joined in order)"),
                      yaxis_title="bubble rate",
                      height=height, width=width, plot_bgcolor="white", legend=dict(itemsizing="constant"),
                      font=dict(family=font_family, size=12),
                      margin=dict(l=60, r=20, t=MODEBAR_PX + (56 if title else 20), b=50))
    if title:
        fig.update_layout(title=_title(title, height))
    fig.update_xaxes(showgrid=True, gridcolor="#EEEEEE")
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", rangemode="tozero")
    return fig


def pareto_frontier(points: Sequence[dict], x: str = "memory", y: str = "throughput") -> list[dict]:
    """Points not dominated by another (no other has ``x`` ≤ and ``y`` ≥ with one strict),
    sorted by ``x``."""
    front = []
    for pt in sorted(points, key=lambda q: (q[x], -q[y])):
        if not front or pt[y] > front[-1][y]:
            front.append(pt)
    return front


def point_label(pt: dict) -> str:
    """A trade-off point's name as its label: the schedule, and its budget when it has one."""
    limit = pt.get("memory_limit")
    return f"{pt['name']} @{limit:g}" if limit is not None else str(pt["name"])


def pareto_figure(points: Sequence[dict], *, colors: Sequence[str] = DEVICE_COLORS,
                  frontier_color: str = "#C23B3B", height: int = 380, width: int | None = None,
                  title: str | None = None, labels: bool = True,
                  font_family: str = "Helvetica, Arial, sans-serif") -> go.Figure:
    """Throughput against activation memory (Fig. 7), with the Pareto frontier as a line.
    Throughput is shown as speed-up over 1F1B (same p, m, costs).

    Every point is labelled (:func:`point_label`) when ``labels``; points at the same position
    share one label naming all of them (an annotation named ``"label"``), and each series has
    its own marker symbol, drawn smaller the later it comes, so coinciding points stay visible
    as nested outlines."""
    fig = go.Figure()
    at: dict[tuple, list[dict]] = {}
    for pt in points:
        at.setdefault((round(pt["memory"], 6), round(pt["speedup"], 6)), []).append(pt)
    sizes = _nested_sizes(points, "memory", "speedup", 15)
    for i, (name, pts) in enumerate(_series(points).items()):
        fig.add_trace(go.Scatter(
            x=[q["memory"] for q in pts], y=[q["speedup"] for q in pts], mode="markers", name=name,
            marker=dict(size=[sizes[id(q)] for q in pts], color=colors[i % len(colors)],
                        symbol=SERIES_SYMBOLS[i % len(SERIES_SYMBOLS)], opacity=0.85,
                        line=dict(color="white", width=1.5)),
            customdata=[[q.get("memory_limit") if q.get("memory_limit") is not None else math.nan]
                        for q in pts],
            hovertemplate=f"{name}<br>memory %{{x:.3f}} of 1F1B<br>speed-up %{{y:.3f}}<extra></extra>",
            meta={"kind": "point", "name": name},
        ))
    front = pareto_frontier(points, "memory", "speedup")
    fig.add_trace(go.Scatter(
        x=[q["memory"] for q in front], y=[q["speedup"] for q in front], mode="lines",
        line=dict(color=frontier_color, width=2, shape="hv"), name="Pareto frontier",
        hoverinfo="skip", meta={"kind": "frontier"},
    ))
    if labels and at:  # one label per position: above and below in turn, towards the middle
        groups = sorted(at.values(), key=lambda g: (g[0]["memory"], g[0]["speedup"]))
        xs = [g[0]["memory"] for g in groups]
        middle = (min(xs) + max(xs)) / 2
        for k, g in enumerate(groups):
            right = g[0]["memory"] <= middle
            fig.add_annotation(x=g[0]["memory"], y=g[0]["speedup"],
                               text=", ".join(dict.fromkeys(point_label(q) for q in g)),
                               showarrow=True, arrowhead=0, arrowwidth=1, arrowcolor="#999999",
                               ax=16 if right else -16, ay=-24 if k % 2 == 0 else 24,
                               xanchor="left" if right else "right", font=dict(size=11, color="#333333"),
                               name="label")
    fig.update_layout(xaxis_title="peak activation memory / 1F1B", yaxis_title="speed-up over 1F1B",
                      height=height, width=width, plot_bgcolor="white",
                      font=dict(family=font_family, size=12),
                      margin=dict(l=60, r=20, t=MODEBAR_PX + (56 if title else 20), b=50),
                      legend=dict(itemwidth=40, itemsizing="constant"))
    if title:
        fig.update_layout(title=_title(title, height))
    fig.update_xaxes(showgrid=True, gridcolor="#EEEEEE")
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE")
    if points:  # room for the labels above and below the points
        ys = [q["speedup"] for q in points]
        lo, hi = min(ys), max(ys)
        pad = max(0.08 * (hi - lo), 0.02 * max(abs(hi), 1e-9))
        fig.update_yaxes(range=[lo - 2 * pad, hi + 2 * pad])
        xs = [q["memory"] for q in points]
        xpad = max(0.08 * (max(xs) - min(xs)), 0.05)
        fig.update_xaxes(range=[min(xs) - xpad, max(xs) + xpad])
    return fig


#: Steps a step grid shows at most (torch's visualizer draws whole small schedules; a deep
#: pipeline's grid shows its start, where the warm-up's sends are).
GRID_STEPS = 32


def step_grid_spec(result: SimResult, *, max_steps: int = GRID_STEPS, colors: Mapping[Op, Sequence[str]] = DEFAULT_COLORS,
                   arrow_color: str = "#333333", width: int | None = None, title: str | None = None,
                   font_family: str = "Helvetica, Arial, sans-serif") -> dict:
    """A schedule as a device × step grid with its cross-device sends as arrows (the view of
    torch's pipelining visualizer), as a plain figure dict: cell ``(d, k)`` is the ``k``-th pass
    of device ``d``'s order, labelled ``<stage><kind><microbatch>`` (``0F3``, ``5BW2``; an ``R``,
    a recomputed forward) in its kind's colour; an arrow runs from each pass whose output
    another device needs (a forward's activation, a backward's gradient) to the pass that needs
    it. Only the first ``max_steps`` steps are drawn (an arrow when both its ends are). Hover
    names the pass and its simulated start and end.

    Traces: one heatmap of the cells (``meta`` ``{"kind": "grid", "codes"}``, ``customdata``
    rows ``[stage, microbatch, start, end]``), one scatter of the arrows (``meta`` ``{"kind":
    "sends", "count"}``: line segments from sender to receiver, an arrowhead at each receiver).
    """
    if not isinstance(result, SimResult):
        raise TypeError(f"step_grid_spec needs a SimResult (cm.simulate(...)), got {type(result).__name__}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    sched = result.schedule
    p = sched.num_devices
    _check_drawable(p)
    steps = min(max_steps, max((len(row) for row in sched.device_passes), default=0))
    placement = sched.placement
    where = {(d, ps.op, ps.stage, ps.microbatch): k
             for d, row in enumerate(sched.device_passes) for k, ps in enumerate(row[:steps])}
    kinds: list[tuple[Op, int]] = []
    z = np.full((p, steps), np.nan, np.float32)
    text = [[""] * steps for _ in range(p)]
    custom = np.full((p, steps, 4), np.nan, np.float32)
    times = {(tp.device, tp.op, tp.stage, tp.microbatch): (tp.start, tp.end) for tp in result.passes}
    for d, row in enumerate(sched.device_passes):
        for k, ps in enumerate(row[:steps]):
            kind = (ps.op, placement.chunk_of(ps.stage))
            if kind not in kinds:
                kinds.append(kind)
            z[d, k] = kinds.index(kind) + 1
            text[d][k] = f"{ps.stage}{ps.op.value}{ps.microbatch}"
            start, end = times.get((d, ps.op, ps.stage, ps.microbatch), (np.nan, np.nan))
            custom[d, k] = (ps.stage, ps.microbatch, start, end)
    n = max(len(kinds), 1)
    scale = []
    for i, (op, chunk) in enumerate(kinds):
        fill = pass_color(op, chunk, colors)
        scale += [[i / n, fill], [(i + 1) / n, fill]]
    xs, ys, sizes = [], [], []
    for tr in result.transfers():
        a = where.get((tr.sender.device, tr.sender.op, tr.sender.stage, tr.sender.microbatch))
        b = where.get((tr.receiver.device, tr.receiver.op, tr.receiver.stage, tr.receiver.microbatch))
        if a is None or b is None:
            continue
        xs += [a, b, None]
        ys += [tr.sender.device, tr.receiver.device, None]
        sizes += [0, 9, 0]
    height = MODEBAR_PX + 40 + max(p * 34, 120) + 60
    data = [{
        "type": "heatmap", "x": np.arange(steps, dtype=np.int32), "y": np.arange(p, dtype=np.int32), "z": z,
        "zmin": 0.5, "zmax": n + 0.5, "colorscale": scale or [[0, IDLE_COLOR], [1, IDLE_COLOR]], "showscale": False,
        "xgap": 2, "ygap": 2, "text": text, "texttemplate": "%{text}", "textfont": {"size": 9},
        "customdata": custom, "hoverongaps": False, "name": "passes", "showlegend": False,
        "hovertemplate": ("<b>%{text}</b>: stage %{customdata[0]}, microbatch %{customdata[1]}<br>device %{y}, "
                          "step %{x}; simulated %{customdata[2]:.4g} to %{customdata[3]:.4g}<extra></extra>"),
        "meta": {"kind": "grid", "codes": [[op.value, chunk] for op, chunk in kinds]},
    }, {
        "type": "scatter", "x": xs, "y": ys, "mode": "lines+markers", "name": "sends", "showlegend": False,
        "line": {"color": arrow_color, "width": 1}, "hoverinfo": "skip", "connectgaps": False,
        "marker": {"symbol": "arrow", "angleref": "previous", "size": sizes, "color": arrow_color},
        "meta": {"kind": "sends", "count": len(xs) // 3},
    }]
    more = max((len(row) for row in sched.device_passes), default=0) - steps
    label = title if title is not None else f"{sched.name} (p={p}, m={sched.num_microbatches})"
    label += (f": the first {steps} steps of {steps + more}" if more > 0 else f": {steps} steps")
    label += "; arrows: the sends between devices"
    layout = {
        "height": height, "width": width,
        "plot_bgcolor": "white", "paper_bgcolor": "white", "font": {"family": font_family, "size": 12},
        "margin": {"l": 50, "r": 20, "t": MODEBAR_PX + 40, "b": 50},
        "title": _title(label, height),
        "xaxis": {"title": {"text": "step (position in the device's order)"}, "range": [-0.5, steps - 0.5],
                  "showgrid": False, "zeroline": False, "dtick": 1 if steps <= 24 else 4},
        "yaxis": {"tickmode": "array", "tickvals": list(range(p)), "ticktext": [f"d{d}" for d in range(p)],
                  "range": [p - 0.5, -0.5], "showgrid": False, "zeroline": False, "ticklabeloverflow": "allow"},
    }
    return {"data": data, "layout": layout}


def peak_memory_curve(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """The largest activation memory over all devices at every moment: ``(t, v)`` steps, held
    from each ``t`` to the next, until the makespan."""
    times, values = [], []
    for t, v in _memory_curves(result):
        times.append(t)
        values.append(v)
    grid = np.unique(np.concatenate(times + [np.array([0.0, result.makespan])]))
    peak = np.zeros(len(grid))
    for t, v in zip(times, values):
        if not len(t):
            continue
        idx = np.searchsorted(t, grid, side="right") - 1
        peak = np.maximum(peak, np.where(idx >= 0, v[np.maximum(idx, 0)], 0.0))
    return grid, peak


def peak_memory_spec(results: Sequence[SimResult], *, reference_peak: float | None = None,
                     budget: float | None = None, colors: Sequence[str] = DEVICE_COLORS,
                     reference_color: str = "#555555", budget_color: str = "#B0500F",
                     line_width: float = 2.0, height: int = 340, width: int | None = None,
                     title: str | None = None, x_title: str = "time (cost units)",
                     max_points: int = MEMORY_POINTS,
                     font_family: str = "Helvetica, Arial, sans-serif") -> dict:
    """The peak activation memory over devices against time, one step line per schedule
    overlaid on one axis (:func:`peak_memory_curve`; trace ``meta`` ``{"kind": "peak",
    "name"}``), with 1F1B's peak and the budget (``budget`` × ``reference_peak``) as dashed
    lines. A plain dict (see :func:`schedule_spec`)."""
    results = list(results)
    if not results:
        raise ValueError("peak_memory_spec needs at least one simulation result")
    horizon = max(r.makespan for r in results)
    data = []
    for i, r in enumerate(results):
        t, v = peak_memory_curve(r)
        if len(t) > max_points:
            t, v = _m4(t, v, max_points // 4, horizon)
        name = r.schedule.name
        data.append({
            "type": "scatter", "x": t.astype(np.float32), "y": v.astype(np.float32), "mode": "lines",
            "line": {"shape": "hv", "width": line_width, "color": colors[i % len(colors)]},
            "name": f"{name} (peak {fmt_time(max(r.peak_memory))} a)", "legendgroup": name,
            "hovertemplate": f"{name}: %{{y:g}} a at t=%{{x:g}}<extra></extra>",
            "meta": {"kind": "peak", "name": name},
        })
    top = max(max(max(r.peak_memory) for r in results), reference_peak or 0.0,
              (budget or 0.0) * (reference_peak or 0.0), 1e-9)
    if reference_peak is not None:
        data.append(_hline(reference_peak, horizon, reference_color, f"1F1B peak {reference_peak:g} a", "1f1b", 0,
                           at_start=True))
        if budget is not None:
            data.append(_hline(budget * reference_peak, horizon, budget_color,
                               f"budget {budget * reference_peak:g} a ({budget:g} × 1F1B)", "budget", 0,
                               at_start=True))
    layout = {
        "height": height, "width": width, "plot_bgcolor": "white", "paper_bgcolor": "white",
        "font": {"family": font_family, "size": 12},
        "margin": {"l": 60, "r": 20, "t": MODEBAR_PX + (56 if title else 20), "b": 50},
        "xaxis": {"title": {"text": x_title}, "range": [0, horizon * 1.005 if horizon else 1], "showgrid": True,
                  "gridcolor": "#EEEEEE"},
        "yaxis": {"title": {"text": "peak over devices (a)"}, "range": [0, top * 1.18], "showgrid": True,
                  "gridcolor": "#EEEEEE"},
    }
    if title:
        layout["title"] = _title(title, height)
    return {"data": data, "layout": layout}


def _stack_parts(specs: Sequence[dict]) -> list[int]:
    # each part's own toolbar strip (MODEBAR_PX at its top) is dropped: the stack has one
    return [int(sp["layout"].get("height") or 500) - MODEBAR_PX for sp in specs if sp is not None]


def stacked_height(specs: Sequence[dict | None], *, gap_px: int = 30, title: str | None = None) -> int:
    """The height in pixels of :func:`stack_specs` of ``specs``, without stacking them."""
    heights = _stack_parts(specs)
    return MODEBAR_PX + (40 if title else 0) + sum(heights) + gap_px * (len(heights) - 1)


def stack_specs(specs: Sequence[dict], *, gap_px: int = 30, title: str | None = None) -> dict:
    """Plain-dict figures (:func:`schedule_spec`, :func:`memory_spec`, ...) stacked top to
    bottom into one figure (one image holding a diagram and its memory curves): axes are
    renumbered, vertical domains and paper-anchored annotations rescaled into each part's band;
    heights add up. Each part keeps its own title as an annotation at the top of its band."""
    specs = [sp for sp in specs if sp is not None]
    if not specs:
        raise ValueError("stack_specs needs at least one figure")
    heights = _stack_parts(specs)
    head = MODEBAR_PX + (40 if title else 0)
    total = stacked_height(specs, gap_px=gap_px, title=title)
    data: list[dict] = []
    layout: dict = {"annotations": [], "height": total, "width": specs[0]["layout"].get("width"),
                    "plot_bgcolor": "white", "paper_bgcolor": "white",
                    "font": specs[0]["layout"].get("font", {}), "margin": {"l": 60, "r": 20, "t": 0, "b": 0},
                    "showlegend": True, "legend": {"tracegroupgap": 20}}
    offset = 0
    top_px = head
    for k, sp in enumerate(specs):
        lay = sp["layout"]
        h = heights[k]
        margin = lay.get("margin", {})
        t_px, b_px = margin.get("t", 80) - MODEBAR_PX, margin.get("b", 80)
        axes = [key for key in lay if key.startswith(("xaxis", "yaxis"))]
        count = max([int(key[5:] or 1) for key in axes] or [1])
        band_lo = 1 - (top_px + h - b_px) / total  # this part's plot area in the stack's paper coordinates
        band_hi = 1 - (top_px + t_px) / total

        def renumber(letter: str, n: int) -> str:
            return letter if n + offset == 1 else f"{letter}{n + offset}"

        def ref(name: str) -> str:  # "x", "y2", ... -> the same axis in the stack
            return renumber(name[0], int(name[1:] or 1))

        def scale_y(y: float) -> float:
            return band_lo + y * (band_hi - band_lo)

        for key in axes:
            axis = dict(lay[key])
            if axis.get("anchor") not in (None, "free"):
                axis["anchor"] = ref(axis["anchor"])
            if "matches" in axis:
                axis["matches"] = ref(axis["matches"])
            if axis.get("overlaying") not in (None, "free"):  # a second axis (the memory panel's GB) stays on its panel
                axis["overlaying"] = ref(axis["overlaying"])
            if key.startswith("yaxis"):
                lo, hi = axis.get("domain", [0.0, 1.0])
                axis["domain"] = [scale_y(lo), scale_y(hi)]
            layout[key[:5] + renumber(key[0], int(key[5:] or 1))[1:]] = axis
        for tr in sp["data"]:
            tr = dict(tr)
            tr["xaxis"] = ref(tr.get("xaxis", "x"))
            tr["yaxis"] = ref(tr.get("yaxis", "y"))
            if "legendgroup" in tr:
                tr["legendgroup"] = f"{k}:{tr['legendgroup']}"
            if isinstance(tr.get("marker"), dict) and "colorbar" in tr["marker"]:
                bar = dict(tr["marker"]["colorbar"])
                bar.update(y=(band_lo + band_hi) / 2, len=band_hi - band_lo, yanchor="middle")
                tr["marker"] = dict(tr["marker"], colorbar=bar)
            data.append(tr)
        for note in lay.get("annotations", []):
            note = dict(note)
            if note.get("yref", "paper") == "paper":
                note["y"] = scale_y(note["y"])
            layout["annotations"].append(note)
        own = lay.get("title")
        if own:
            text = own.get("text") if isinstance(own, dict) else str(own)
            layout["annotations"].append({"text": text, "x": 0.0, "xref": "paper", "xanchor": "left",
                                          "y": 1 - (top_px + 2) / total, "yref": "paper", "yanchor": "top",
                                          "showarrow": False, "font": {"size": 14}})
        offset += count
        top_px += h + gap_px
    if title:
        layout["title"] = _title(title, total)
    return {"data": data, "layout": layout}


# -- export ------------------------------------------------------------------------------------

def write_figures(items: Sequence[tuple[go.Figure, object]], *, scale: float = 2.0,
                  include_plotlyjs: bool | str = True) -> list[str]:
    """Write each ``(figure, path)`` by extension: ``.html`` (plotly.js embedded, works
    offline), ``.png``, ``.svg`` or ``.pdf`` (kaleido, which drives a Chromium: Debian's
    ``chromium`` works). Schedule diagrams are drawn at a fixed width (1100 px unless the figure
    sets one) with the label rule applied for that width; the files themselves are written by
    :func:`ctrlmem.plots.figio.write_files` (one kaleido session, byte-identical on regeneration).
    Returns the paths."""
    prepared = []
    for fig, path in items:
        width = fig.layout.width or 1100
        fig = static_labels(fig, width)
        if (str(path).lower().endswith(".html") and fig.layout.width is None
                and any((tr.meta or {}).get("kind") == "pass" for tr in fig.data)):
            fig = go.Figure(fig).update_layout(width=width)
        prepared.append((fig, path))
    return write_files(prepared, scale=scale, include_plotlyjs=include_plotlyjs)


def static_labels(fig: go.Figure, width: int) -> go.Figure:
    """The label rule (:func:`label_fits`) for a static image ``width`` pixels wide (a copy of
    ``fig`` when a label changes)."""
    boxes = [tr for tr in fig.data if (tr.meta or {}).get("kind") == "pass" and tr.textposition != "none"
             and (tr.texttemplate or tr.text is not None)]
    if not boxes:
        return fig
    fig = go.Figure(fig)
    lay = fig.layout
    margin = (lay.margin.l if lay.margin.l is not None else 80) + (lay.margin.r if lay.margin.r is not None else 80)
    span = lay.xaxis.range[1] - lay.xaxis.range[0] if lay.xaxis.range else None
    if not span:
        return fig
    for tr in fig.data:
        if (tr.meta or {}).get("kind") != "pass" or tr.textposition == "none":
            continue
        size = (tr.textfont.size if tr.textfont and tr.textfont.size else LABEL_SIZE)
        custom = np.asarray(tr.customdata)
        mbs = custom[:, 1].astype(int)
        fits = label_fits(np.asarray(tr.x, float), mbs, span, size, width - margin)
        if tr.text is not None:
            old = list(tr.text)
            tr.text = [t if ok else "" for t, ok in zip(old, fits)]
        else:
            tr.text = [str(mb) if ok else "" for mb, ok in zip(mbs.tolist(), fits)]
            tr.texttemplate = None
    return fig


def write_figure(fig: go.Figure, path, *, scale: float = 2.0, include_plotlyjs: bool | str = True) -> str:
    """Write one figure (see :func:`write_figures`); returns the path."""
    return write_figures([(fig, path)], scale=scale, include_plotlyjs=include_plotlyjs)[0]
