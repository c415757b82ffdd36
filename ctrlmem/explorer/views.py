"""What the explorer shows, as plain functions (no widgets, no kernel): testable, and shared by
``ctrlmem draw --state``.

* :class:`Settings`: what the user picked (schedules, ``p``, ``m``, F/B/W/comm, extra work on the
  first and last stage, per-stage weights, memory limit, loaded schedule files).
* :class:`BuildCache`: schedules already built, exact per costs, plus the latest order of each
  schedule for re-simulation under new costs.
* :func:`compute` turns settings into a :class:`View`: the simulations, 1F1B under the same
  settings as reference, the stats table (with how each shown order was obtained), the figure
  specs, readable messages for anything that went wrong (bad input never raises out of
  :func:`compute`). With ``adapt=False`` it never searches: a cost-adapted schedule not yet
  built for these costs is shown with the order it had (re-simulated), and the builds still to
  do come back as :attr:`View.jobs` (the explorer runs them in the background,
  :mod:`ctrlmem.explorer.background`).
* :func:`verdict`, :func:`formula_html`, :func:`stats_html`, :func:`command_line`: the lines and
  tables next to the plots.
* The state file (:func:`state_dict`, :func:`write_state`, :func:`read_state`): everything the
  explorer shows (settings, loaded files and the very orders shown) as JSON;
  ``ctrlmem draw --state FILE`` redraws it exactly.
* :func:`report_html`: one self-contained HTML page holding the diagram, the memory curves, the
  comparisons, the stats and the settings (and the state, to load again).
* :func:`export_view`: a view written as PNG / SVG / PDF (diagram above memory, one file), the
  HTML report, torch CSV or the state file.
* :func:`state_link`: a state as one line of text to share (``ctrlmem-state=1.…``), read back
  wherever a state is (:func:`read_state`).
* :func:`settings_from_plan`, :func:`plan_state`: a plan's row (:func:`ctrlmem.plan`) as the
  explorer's settings and order, its per-stage costs given whole (:attr:`Settings.stage_costs`).
* :attr:`Settings.measured`, :func:`measured_costs`: real runs' measured steps drawn under their
  simulations.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import logging
import math
import os
import re
import time
import zlib
from dataclasses import dataclass, field, fields, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ctrlmem.plots import figures as plot
from ctrlmem.plots.figio import without_hover_marks
from ctrlmem.explorer.background import Job, improved_name, lever_kwargs, levered_name
from ctrlmem.model.costs import Costs
from ctrlmem.util.fileio import atomic_write, make_output_folder
from ctrlmem.util.htmlsafe import script_json
from ctrlmem.model.ir import Schedule
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.schedules.registry import apply_levers
from ctrlmem.model.levers import lever_mode, offload_choice
from ctrlmem.model.simulate import SimResult, simulate
from ctrlmem.model.validate import ScheduleError
from ctrlmem.explorer.background import improve_built
from ctrlmem.planner.gb import bytes_per_a, default_microbatch
from ctrlmem.planner.model import PRESET_NAMES, model_spec
from ctrlmem.planner.core import row_schedule
from ctrlmem.util.userfile import b64_inflate
from ctrlmem.util.userfile import read_text
from ctrlmem.util.userfile import parse_json
from ctrlmem.plots.render import render_file
from ctrlmem.plots.trace import MeasuredRun, trace_events
import inspect
from importlib.resources import files

__all__ = ["Settings", "View", "BuildCache", "compute", "stats_table", "stats_html", "verdict", "formula_html",
           "command_line", "messages_html", "jsonable", "mime_bundle", "export_view", "save_view",
           "state_dict", "write_state", "read_state", "state_view", "draw_state", "report_html", "comparison_specs", "default_schedules",
           "EXPORT_KINDS", "export_files", "ORIGIN_ADAPTED", "ORIGIN_FIXED", "ORIGIN_FILE", "ORIGIN_STATE",
           "settings_from_plan", "plan_state", "state_link", "STATE_LINK_KEY", "measured_costs"]

log = logging.getLogger(__name__)

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: What a view can be exported as: one image of the diagram above the memory curves (png, svg,
#: pdf), the HTML report, each schedule's torch CSV, the state file.
EXPORT_KINDS = ("png", "svg", "pdf", "html", "csv", "trace", "state")
STATE_VERSION = 1

#: How a shown order was obtained (the table's "order" column).
ORIGIN_FIXED = "fixed (takes no costs)"
ORIGIN_ADAPTED = "adapted for these costs"
ORIGIN_PATTERN = "not adapted yet: its unit-cost pattern, re-simulated"
ORIGIN_REUSED = "not adapted yet: the order adapted for {costs}, re-simulated"
ORIGIN_FILE = "from a file"
ORIGIN_STATE = "as saved in the state file"
ORIGIN_IMPROVED = "improved: {note}"
#: The label of the first schedule's improved order (``optimize``), after its name.
IMPROVED_SUFFIX = "+improved"


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
        stage_weights: see :meth:`costs`.
        stage_costs: ``(f, b, w)`` or ``(f, b, w, r)``, each a tuple of the times of ``K``
            model-order stages (the per-stage costs a plan simulated its winner with,
            :func:`settings_from_plan`; ``r`` the ``R`` passes' times of a row that recomputes with
            a split backward, ``Costs.recompute``), or ``()``. When given they are the costs:
            ``f``, ``b``, ``w``, the weights and the first/last-stage extras are not used (``comm``
            still is); a schedule of ``S`` stages gets them summed over ``K / S`` neighbours or
            split into ``S / K`` equal parts.
        loaded: schedule files loaded into the comparison (simulated as they are).
        measured: measured steps of real runs (:class:`ctrlmem.plots.trace.MeasuredRun`, from
            ``ctrlmem run``'s ``trace-measured.json``), each drawn as a panel right under the
            simulation of its schedule, in milliseconds from the step's start, on the same time
            axis (comparable when F, B, W are the run's times in ms: :func:`measured_costs`).
        model: a model whose activation bytes give the memory panel a GB axis — a paper preset
            (``"9.6B"``, ...) or the path of a Hugging Face ``config.json`` (Llama, Mistral, Qwen,
            Mixtral, DeepSeek: :func:`ctrlmem.planner.model.model_spec`) — or ``None``;
            microbatch_size: its microbatch (``None``: the paper's for a preset, else 1).
        fb_overlap: the time of an overlapped forward + backward pair (DualPipe's F&B, the
            ``dualpipe`` and ``dualpipe-v`` schedules) as a fraction of ``F + B``, in (0, 1]
            (``Costs.fb_overlap``; 1.0, the default, is no gain). Schedules without overlapped
            pairs do not change with it.
        optimize: seconds of :func:`ctrlmem.improve` for one shown schedule (0: off, the
            default): its improved order is shown right below it (``NAME+improved``, its panel
            titled so), within the memory limit when the schedule fits it, else within its own peak.
        improve: the schedule ``optimize`` improves (``None``: :func:`improve_target`'s
            default, the first selected schedule other than 1F1B, which is often optimal already).
        recompute: the memory lever of docs/theory.md §13 for every registered schedule shown:
            ``"none"`` (default), ``"selective"`` or ``"full"`` (an ``R`` before each backward).
        offload: ``None`` (default) or the fraction in (0, 1] of every forward's activation
            copied to host memory and back; offload_cost: the time of one ``a`` copied, each way
            (``Costs.offload``). Both levers are applied as ``cm.build(..., recompute=,
            offload=)`` applies them: onto every forward of the order, and for a budgeted
            schedule with recompute on, to orders chosen for the memory recomputing frees
            (built in the background like any budgeted order); loaded files are shown as they
            are, and the 1F1B reference (the memory limit's unit) has no levers. ``optimize`` improves the
            levered order with a lever on (the same forwards recomputed and offloaded,
            :func:`ctrlmem.improve`), as on the command line.
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
    stage_costs: tuple[tuple[float, ...], ...] = ()
    loaded: tuple[Schedule, ...] = ()
    measured: tuple[MeasuredRun, ...] = ()
    model: str | None = None
    microbatch_size: int | None = None
    optimize: float = 0.0
    improve: str | None = None
    recompute: str = "none"
    offload: float | None = None
    offload_cost: float = 0.0
    fb_overlap: float = 1.0

    @property
    def levers(self) -> bool:
        """Whether a memory lever (recompute, offload) is on."""
        return self.recompute != "none" or self.offload is not None

    def levers_text(self) -> str:
        """``recompute full, offload 0.5 of each forward (copy 0.3 per a)``, or ``none``."""
        parts = [f"recompute {self.recompute}"] if self.recompute != "none" else []
        if self.offload is not None:
            parts.append(f"offload {self.offload:g} of each forward (copy {self.offload_cost:g} per a)")
        return ", ".join(parts) or "none"

    @property
    def per_stage(self) -> bool:
        """Whether stages cost different amounts (weights or first/last-stage extras)."""
        return bool(self.stage_weights or self.first_stage_extra or self.last_stage_extra or self.stage_costs)

    def costs(self, num_stages: int | None = None) -> Costs:
        """The costs for a schedule with ``num_stages`` stages: uniform, or per-stage lists
        with the per-stage weights and the extra first/last-stage work. Raises ``ValueError``
        on bad numbers.

        ``stage_weights`` (empty: all 1): the relative cost of each of ``p`` equal slices of
        the model in model order (slice ``i`` is what a one-stage-per-device schedule puts on
        device ``i``); a schedule with ``v`` stages per device splits each slice into ``v``
        equal stages."""
        base = Costs(self.f, self.b, self.w, self.comm, offload=self.offload_cost, fb_overlap=self.fb_overlap)
        if self.stage_costs:
            return self._given_costs(base, num_stages)
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
        return Costs(*lists, comm=base.comm, offload=base.offload, fb_overlap=base.fb_overlap)

    def _given_costs(self, base: Costs, num_stages: int | None) -> Costs:
        """:attr:`stage_costs` for a schedule of ``num_stages`` stages (see there); ``None``: one
        time per pass kind, a full device-stage's on average (what a search starts from before
        it knows its stage count)."""
        lists = [tuple(float(x) for x in part) for part in self.stage_costs]
        if len(lists) not in (3, 4) or len({len(x) for x in lists}) != 1 or not lists[0]:
            raise ValueError("per-stage costs: give three lists (F, B, W), or four (and R), of one time per stage each, "
                             "of one length")
        if any(not math.isfinite(x) or x < 0 for part in lists for x in part):
            raise ValueError("per-stage costs must be numbers >= 0")
        if num_stages is None:
            p = self.num_devices if isinstance(self.num_devices, int) and self.num_devices > 0 else 1
            avg = [math.fsum(part) / p for part in lists]
            return Costs(*avg[:3], comm=base.comm, offload=base.offload, fb_overlap=base.fb_overlap,
                         recompute=avg[3] if len(avg) == 4 else None)
        k = len(lists[0])
        if num_stages % k and k % num_stages:
            raise ValueError(f"per-stage costs of {k} stages cannot time a schedule of {num_stages} stages (one "
                             "must divide the other); choose schedules with as many stages per device as the plan's")
        if num_stages >= k:
            parts = [[x / (num_stages // k) for x in part for _ in range(num_stages // k)] for part in lists]
        else:
            g = k // num_stages
            parts = [[math.fsum(part[i * g:(i + 1) * g]) for i in range(num_stages)] for part in lists]
        return Costs(*parts[:3], comm=base.comm, offload=base.offload, fb_overlap=base.fb_overlap,
                     recompute=tuple(parts[3]) if len(parts) == 4 else None)

    def to_dict(self) -> dict:
        """The settings as JSON-ready values (loaded files as ``{"name", "text"}``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("loaded", "measured")}
        out["measured"] = [run.to_dict() for run in self.measured]
        out["schedules"] = list(self.schedules)
        out["stage_weights"] = list(self.stage_weights)
        out["stage_costs"] = [list(part) for part in self.stage_costs]
        out["loaded"] = [_schedule_record(s) for s in self.loaded]
        return out

    @classmethod
    def from_dict(cls, data: Mapping, budget: list[int] | None = None) -> "Settings":
        """The inverse of :meth:`to_dict`; unknown keys are an error naming them (``budget``:
        what is left of :data:`MAX_STATE_TEXT` for loaded files' text)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown settings {unknown}; known: {sorted(known)}")
        values = dict(data)
        if "schedules" in values:
            values["schedules"] = tuple(values["schedules"])
        if "stage_weights" in values:
            values["stage_weights"] = tuple(float(x) for x in values["stage_weights"])
        if "measured" in values:
            if not isinstance(values["measured"], (list, tuple)):
                raise ValueError("settings: measured must be a list of measured runs")
            values["measured"] = tuple(MeasuredRun.from_dict(x) if isinstance(x, Mapping) else x
                                       for x in values["measured"])
        if "stage_costs" in values:
            parts = values["stage_costs"]
            if not isinstance(parts, (list, tuple)) or not all(isinstance(x, (list, tuple)) for x in parts):
                raise ValueError("settings: stage_costs must be three lists (F, B, W) of numbers, four with R, or empty")
            values["stage_costs"] = tuple(tuple(float(x) for x in part) for part in parts)
        if "loaded" in values:
            if not isinstance(values["loaded"], (list, tuple)):
                raise ValueError(f"settings: loaded must be a list of schedule records, got "
                                 f"{type(values['loaded']).__name__}")
            values["loaded"] = tuple(_schedule_from_record(x, budget) for x in values["loaded"])
        return cls(**values)


@dataclass(frozen=True)
class StageCosts:
    """``Settings.costs`` as a picklable, comparable function of the number of stages (what a
    background :class:`~ctrlmem.explorer.background.Job` calls once the stage count is known)."""

    settings: Settings

    def __call__(self, num_stages: int) -> Costs:
        return self.settings.costs(num_stages)


@dataclass
class View:
    """Everything the explorer shows for one :class:`Settings`.

    Attributes:
        results: simulation per schedule that could be shown, in the order asked.
        reference: 1F1B under the same ``p``, ``m`` and costs (the table's baseline).
        stats: one row per schedule (see :func:`stats_table`).
        messages: readable problems (bad input, a schedule that cannot be built, a memory limit
            nothing meets); empty when all is well.
        diagram_spec, memory_spec: plotly figure dicts (``None`` when nothing could be built);
            a raster overview in ``diagram_spec`` keeps its hover as a table for the explorer's
            viewer (``overview_hover="table"``): :attr:`diagram` and the HTML report carry it as
            plotly's own hover (:func:`ctrlmem.plots.figures.hover_on_cells`).
        seconds: wall time :func:`compute` took.
        origins: how each shown order was obtained (``ORIGIN_*``).
        jobs: builds still to do for these settings (``adapt=False``): cost-adapted schedules
            not built for these costs yet.
        waiting: schedules with nothing to show until their build finishes.
    """

    settings: Settings
    results: dict[str, SimResult]
    reference: SimResult | None
    stats: pd.DataFrame
    messages: list[str]
    diagram_spec: dict | None
    memory_spec: dict | None
    seconds: float = 0.0
    origins: dict[str, str] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    @property
    def diagram(self) -> go.Figure | None:
        """The schedule diagram as a validated plotly figure (an overview with plotly's own hover)."""
        return go.Figure(plot.hover_on_cells(self.diagram_spec)) if self.diagram_spec is not None else None

    @property
    def memory(self) -> go.Figure | None:
        """The memory curves as a validated plotly figure."""
        return go.Figure(self.memory_spec) if self.memory_spec is not None else None

    @property
    def provisional(self) -> list[str]:
        """Shown schedules whose order is not adapted to these costs yet."""
        return [n for n, o in self.origins.items() if o.startswith("not adapted yet")]


STATS_COLUMNS = ["schedule", "makespan", "bubble rate", "peak (a)", "peak / 1F1B",
                 "speed-up over 1F1B", "peak per device (a)", "fits limit", "order"]


def stats_table(results: dict[str, SimResult], reference: SimResult | None,
                memory_limit: float | None = None, origins: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per schedule: makespan, bubble rate, peak memory (max over devices, in ``a``),
    that peak as a fraction of 1F1B's, the speed-up over 1F1B (its makespan over ours), the
    peak of every device, whether it fits ``memory_limit``, and how its order was obtained."""
    ref_peak = max(reference.peak_memory) if reference is not None else math.nan
    ref_span = reference.makespan if reference is not None else math.nan
    origins = origins or {}
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
            "order": origins.get(name, ""),
        })
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ScheduleError):
        return exc.reason
    msg = exc.args[0] if exc.args else str(exc)
    return str(msg).splitlines()[0] if str(msg) else type(exc).__name__


class BuildCache:
    """Schedules already built, keyed by everything their generator sees: ``(name, p, m,
    memory_limit, costs)``, costs only for cost-aware generators (``None``: built without
    costs, the unit-cost pattern). Changing F/B/W/comm then only re-simulates the cost-free
    generators; a cost-aware one is found again only for the very same costs.

    :meth:`latest` gives the order last built for a schedule at ``(p, m, budget)`` whatever its
    costs (or one built for a smaller budget, which fits a larger one: peak memory depends on
    the order only): what the explorer re-simulates while the build for new costs runs."""

    def __init__(self, max_entries: int = 64):
        self.max_entries = max_entries
        self._items: dict[tuple, Schedule] = {}
        self._latest: dict[tuple, tuple[Schedule, Costs | None]] = {}
        self.failed: dict[tuple, str] = {}
        self.notes: dict[tuple, str] = {}  # an improved order's summary (before/after, bound, gap)
        self._levered: dict[tuple, tuple[Schedule, Schedule]] = {}  # (order, levers) -> (order, levered)
        self._sims: dict[tuple, tuple[Schedule, SimResult]] = {}  # (order, costs) -> (order, simulation)
        self.hits = self.misses = 0

    @staticmethod
    def key(name: str, p: int, m: int, costs: Costs | None, memory_limit: float | None) -> tuple:
        # an improved order (not a registered name) always depends on the costs
        takes = name not in SCHEDULES or SCHEDULES[name].uses_costs
        return (name, p, m, memory_limit, costs if takes else None)

    def get(self, name: str, p: int, m: int, costs: Costs | None, memory_limit: float | None) -> Schedule | None:
        """The schedule built for exactly these arguments, or None (never builds)."""
        return self._items.get(self.key(name, p, m, costs, memory_limit))

    def put(self, name: str, p: int, m: int, costs: Costs | None, memory_limit: float | None,
            schedule: Schedule) -> None:
        key = self.key(name, p, m, costs, memory_limit)
        if key not in self._items and len(self._items) >= self.max_entries:
            old = next(iter(self._items))
            self._items.pop(old)
        self._items[key] = schedule
        if key[4] is not None or (name, p, m, memory_limit) not in self._latest:
            self._latest[(name, p, m, memory_limit)] = (schedule, key[4])

    def build(self, name: str, p: int, m: int, costs: Costs | None, memory_limit: float | None,
              levers: tuple = ()) -> Schedule:
        """The schedule for these arguments, built (and kept) on a miss; with ``levers``
        ``(recompute, offload)`` built with them (kept under :func:`levered_name`)."""
        kept = levered_name(name, levers)
        found = self.get(kept, p, m, costs, memory_limit)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        schedule = build(name, p, m, costs=costs, memory_limit=memory_limit, **lever_kwargs(levers))
        self.put(kept, p, m, costs, memory_limit, schedule)
        return schedule

    def with_levers(self, schedule: Schedule, recompute: str, offload: object, costs: Costs) -> Schedule:
        """``apply_levers(schedule, recompute, offload, costs)``, kept for the very same order
        (recomputation does not depend on the costs; an offload's reload points do)."""
        key = (id(schedule), recompute, offload, costs if offload != "none" else None)
        found = self._levered.get(key)
        if found is not None and found[0] is schedule:
            return found[1]
        levered = apply_levers(schedule, recompute, offload, costs)
        if len(self._levered) >= self.max_entries:
            self._levered.pop(next(iter(self._levered)))
        self._levered[key] = (schedule, levered)
        return levered

    #: Simulations kept by :meth:`simulate`: what one state shows (up to a few schedules and the
    #: 1F1B reference) and the one before.
    MAX_SIMULATIONS = 12

    def simulate(self, schedule: Schedule, costs: Costs) -> SimResult:
        """``simulate(schedule, costs)``, kept for the very same order and costs: a state that
        changes one schedule (an adapted build arriving, a budget or lever edit) re-simulates
        that one only."""
        key = (id(schedule), costs)
        found = self._sims.pop(key, None)
        if found is None or found[0] is not schedule:
            found = (schedule, simulate(schedule, costs))
            while len(self._sims) >= self.MAX_SIMULATIONS:
                self._sims.pop(next(iter(self._sims)))
        self._sims[key] = found  # the newest last
        return found[1]

    def latest(self, name: str, p: int, m: int, memory_limit: float | None) -> tuple[Schedule, Costs | None] | None:
        """The last order built for ``name`` at ``(p, m, memory_limit)`` and the costs it was
        built for; for a budget, else the one of the largest smaller budget."""
        found = self._latest.get((name, p, m, memory_limit))
        if found is not None or memory_limit is None:
            return found
        smaller = [(k[3], v) for k, v in self._latest.items()
                   if k[:3] == (name, p, m) and k[3] is not None and k[3] <= memory_limit]
        return max(smaller, key=lambda kv: kv[0])[1] if smaller else None

    def num_stages(self, name: str, p: int, m: int, memory_limit: float | None) -> int | None:
        found = self.latest(name, p, m, memory_limit)
        return found[0].num_stages if found is not None else None


def _check(settings: Settings) -> Costs:
    base_costs = settings.costs()
    p, m = settings.num_devices, settings.num_microbatches
    if not isinstance(p, int) or p < 1 or not isinstance(m, int) or m < 1:
        raise ValueError(f"p and m must be positive integers, got p={p!r}, m={m!r}")
    limit = settings.memory_limit
    if limit is not None and not (isinstance(limit, (int, float)) and 0 < limit and math.isfinite(limit)):
        raise ValueError(f"the memory limit must be a positive fraction of 1F1B's peak, got {limit!r}")
    off = settings.offload
    if off is not None and (isinstance(off, bool) or not isinstance(off, (int, float))):
        raise ValueError(f"offload must be None (off) or a fraction in (0, 1] of each forward's activation, got {off!r}")
    if lever_mode(settings.recompute) == "auto" or offload_choice(off) == "auto":
        raise ValueError("recompute/offload 'auto' is a search of the command line (ctrlmem draw --recompute auto "
                         "--memory-limit X); the explorer takes none, selective or full, and an offload fraction")
    return base_costs


def order_levers(settings: Settings, budget: float | None) -> tuple:
    """``(recompute, offload)`` a budgeted schedule is built with (``cm.build`` then orders for
    the memory recomputing frees, docs/theory.md §13), or ``()``: with no budget or no recompute
    the levers go onto the order as it is (:func:`_with_levers`), as ``cm.build`` puts them."""
    if budget is None or settings.recompute == "none":
        return ()
    return (settings.recompute, "none" if settings.offload is None else float(settings.offload))


def _with_levers(schedule: Schedule, settings: Settings, cache: BuildCache) -> Schedule:
    """``schedule`` with the settings' recompute and offload (as ``cm.build`` applies them)."""
    if not settings.levers:
        return schedule
    offload = "none" if settings.offload is None else float(settings.offload)
    return cache.with_levers(schedule, settings.recompute, offload, settings.costs(schedule.num_stages))


def compute(settings: Settings, *, style: dict | None = None, cache: BuildCache | None = None,
            adapt: bool = True, orders: Mapping[str, Schedule] | None = None,
            order_origins: Mapping[str, str] | None = None) -> View:
    """Build, simulate and draw every selected schedule. Never raises for bad input: problems
    become :attr:`View.messages` and the schedules that did build are still shown. ``cache``
    reuses schedules built by earlier calls (see :class:`BuildCache`).

    ``adapt=False``: nothing is searched here. A cost-aware schedule not built for these costs
    yet shows its latest order (or its unit-cost pattern) re-simulated under the new costs, and
    its build comes back in :attr:`View.jobs`; a budgeted one with no order yet is listed in
    :attr:`View.waiting`. ``orders``: schedules to show as they are instead of building them
    (a state file's), with how they were obtained in ``order_origins`` (default
    ``ORIGIN_STATE``)."""
    cache = cache if cache is not None else BuildCache()
    orders = dict(orders or {})
    t0 = time.perf_counter()
    style = style or {}
    messages: list[str] = []
    results: dict[str, SimResult] = {}
    origins: dict[str, str] = {}
    jobs: list[Job] = []
    waiting: list[str] = []
    reference = None
    empty = View(settings, {}, None, stats_table({}, None), messages, None, None)
    p, m = settings.num_devices, settings.num_microbatches
    try:
        base_costs = _check(settings)
    except (ValueError, TypeError) as exc:
        messages.append(f"Cannot compute: {_reason(exc)}")
        empty.seconds = time.perf_counter() - t0
        return empty
    limit = settings.memory_limit
    names = list(dict.fromkeys(settings.schedules))
    if not names:
        messages.append("Choose at least one schedule to show.")
    job_settings = replace(settings, loaded=(), schedules=())
    for name in names:
        if name not in SCHEDULES:
            messages.append(f"{name}: not a registered schedule (available: {', '.join(SCHEDULES)}).")
            continue
        spec = SCHEDULES[name]
        budget = limit if spec.memory_limit else None
        lev = order_levers(settings, budget)
        kept = levered_name(name, lev)
        try:
            if name in orders:
                sched, origin = orders[name], (order_origins or {}).get(name, ORIGIN_STATE)
            elif not spec.uses_costs:
                sched, origin = cache.build(name, p, m, None, budget), ORIGIN_FIXED
            else:
                stages = cache.num_stages(kept, p, m, budget)
                if stages is None and not adapt and not spec.memory_limit:
                    stages = cache.build(name, p, m, None, None).num_stages  # the pattern: cheap
                want = settings.costs(stages) if stages is not None else base_costs
                failed = cache.failed.get(cache.key(kept, p, m, want, budget))
                if failed is not None:
                    raise ValueError(failed)
                sched = cache.get(kept, p, m, want, budget)
                if sched is not None and settings.costs(sched.num_stages) != want:
                    want, sched = settings.costs(sched.num_stages), None
                if sched is not None:
                    origin = ORIGIN_ADAPTED
                elif adapt:
                    sched = cache.build(name, p, m, want, budget, lev)
                    if settings.costs(sched.num_stages) != want:
                        sched = cache.build(name, p, m, settings.costs(sched.num_stages), budget, lev)
                    origin = ORIGIN_ADAPTED
                else:
                    jobs.append(Job(name, p, m, want, budget,
                                    None if stages is not None else StageCosts(job_settings), levers=lev))
                    previous = cache.latest(kept, p, m, budget)
                    if previous is None:
                        waiting.append(name)
                        continue
                    sched, built_for = previous
                    origin = (ORIGIN_PATTERN if built_for is None
                              else ORIGIN_REUSED.format(costs=plot.costs_label(built_for)))
            if name not in orders and not lev:  # a state's orders carry their levers, a levered build too
                sched = _with_levers(sched, settings, cache)
            results[name] = cache.simulate(sched, settings.costs(sched.num_stages))
            origins[name] = origin
        except (ValueError, ScheduleError, KeyError) as exc:
            messages.append(f"{name}: {_reason(exc)}")
    for sched in settings.loaded:
        label = f"{sched.name} (file)"
        if (sched.num_devices, sched.num_microbatches) != (p, m):
            messages.append(f"{label}: has p={sched.num_devices}, m={sched.num_microbatches}; set p and m "
                            "to those to compare it")
            continue
        try:
            results[label] = cache.simulate(sched, settings.costs(sched.num_stages))
            origins[label] = ORIGIN_FILE
        except (ValueError, ScheduleError) as exc:
            messages.append(f"{label}: {_reason(exc)}")
    if settings.optimize:
        results, origins = _with_improved(settings, results, origins, jobs, waiting, messages, cache, adapt,
                                          orders, order_origins or {})
    try:
        ref_costs = settings.costs(p)
        if "1f1b" in results and results["1f1b"].costs == ref_costs and not settings.levers:
            reference = results["1f1b"]
        else:
            reference = cache.simulate(cache.build("1f1b", p, m, None, None), ref_costs)
    except (ValueError, ScheduleError) as exc:
        messages.append(f"1F1B reference: {_reason(exc)}")
    stats = stats_table(results, reference, limit, origins)
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
    if settings.fb_overlap != 1.0 and results and not any(r.schedule.overlaps for r in results.values()):
        messages.append(f"F&B overlap {settings.fb_overlap:g}: no shown schedule overlaps a forward with a backward, "
                        "so nothing changes; tick dualpipe or dualpipe-v to see it")
    panels = _with_measured(settings, results, messages)
    diagram_spec = memory_spec = None
    if results:
        rs = list(results.values())
        title = plot.setting_label(p, m, settings.costs(p) if settings.per_stage else base_costs, limit)
        # the overview's hover as a table the explorer's viewer reads (hover_on_cells for other pages)
        diagram_spec = plot.schedule_spec(panels, title=f"schedules: {title}", **{
            "overview_hover": "table", "tick_overflow": "allow", **style.get("diagram", {})})
        memory_spec = plot.memory_spec(
            rs, reference_peak=max(reference.peak_memory) if reference is not None else None,
            title=f"activation memory per device: {title}", **{"tick_overflow": "allow", **style.get("memory", {})})
        if settings.model:
            _add_gb_axis(memory_spec, settings, messages)
    view = View(settings, results, reference, stats, messages, diagram_spec, memory_spec,
                origins=origins, jobs=jobs, waiting=waiting)
    view.seconds = time.perf_counter() - t0
    return view


def _with_measured(settings: Settings, results: dict[str, SimResult], messages: list[str]) -> list:
    """The diagram's panels: each simulation, and right under the simulation of its schedule
    each measured run of it (a timeline in ms); a run whose schedule is not shown, or of
    another p or m, is a message saying what to do."""
    under: dict[str, list] = {}
    p, m = settings.num_devices, settings.num_microbatches
    for run in settings.measured:
        if (run.num_devices, run.num_microbatches) != (p, m):
            messages.append(f"measured {run.name}: has p={run.num_devices}, m={run.num_microbatches}; set p and m to "
                            "those to compare it with its simulation")
            continue
        shown = next((label for label, r in results.items() if r.schedule.name == run.name), None)
        if shown is None:
            messages.append(f"measured {run.name}: tick {run.name} (or load its schedule file) to draw the run under "
                            "its simulation")
            continue
        sim = results[shown]
        f, b, w = measured_costs(run, sim.schedule)
        messages.append(f"measured {run.name}: step {run.step_ms:.4g} ms, its passes {f:.4g} / {b:.4g} / {w:.4g} ms "
                        f"(F / B / W per device-stage, mean); simulated {sim.makespan:.4g} with these costs (the same "
                        "unit when F, B, W are in ms)")
        under.setdefault(shown, []).append(plot.PassTimeline(
            f"measured {run.name}: step {run.step_ms:.4g} ms ({run.source}; ms from the step's start)",
            p, sim.schedule.placement, run.passes))
    out: list = []
    for label, r in results.items():
        out.append(r)
        out += under.get(label, [])
    return out


def measured_costs(run: MeasuredRun, schedule: Schedule) -> tuple[float, float, float]:
    """The run's mean F, B, W pass times (ms) per full device-stage (a chunk's pass times the
    chunks per device; a fused ``BW``'s mean split evenly between B and W): what to give as F,
    B, W for its simulation to be in ms too."""
    v = schedule.num_stages / schedule.num_devices
    times: dict[str, list[float]] = {}
    for tp in run.passes:
        times.setdefault(tp.op.value, []).append(tp.end - tp.start)
    mean = {op: math.fsum(xs) / len(xs) * v for op, xs in times.items() if xs}
    f = mean.get("F", 0.0)
    if "B" in mean or "W" in mean:
        return f, mean.get("B", 0.0), mean.get("W", 0.0)
    bw = mean.get("BW", 0.0)
    return f, bw / 2, bw / 2


def _with_improved(settings: Settings, results: dict[str, SimResult], origins: dict[str, str], jobs: list[Job],
                   waiting: list[str], messages: list[str], cache: BuildCache, adapt: bool,
                   orders: Mapping[str, Schedule], order_origins: Mapping[str, str]):
    """``results`` and ``origins`` with the first registered schedule's improved order
    (``settings.optimize`` seconds of :func:`ctrlmem.improve`) right after it: from ``orders``
    (a state file), the cache, at once (``adapt``) or as a background job (listed in ``waiting``
    until it is done). The improvement starts from the schedule adapted for these costs."""
    seconds = settings.optimize
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
        messages.append(f"optimize: give the solver's seconds, a number in (0, 3600], got {seconds!r}")
        return results, origins
    first = improve_target(settings, results)
    if first is None:
        messages.append(f"optimize: {settings.improve} is not shown; tick it, or choose a shown schedule to improve"
                        if settings.improve else "optimize improves a selected registered schedule; none is shown")
        return results, origins
    label = first + IMPROVED_SUFFIX
    p, m = settings.num_devices, settings.num_microbatches
    spec = SCHEDULES[first]
    budget = settings.memory_limit if spec.memory_limit else None
    costs = results[first].costs
    # with a lever on, the shown (levered) order is improved: cm.build(..., recompute=, offload=) as on the
    # command line; cm.improve keeps its recomputed and offloaded forwards
    off = "none" if settings.offload is None else settings.offload
    lev = (settings.recompute, off) if settings.recompute != "none" or off != "none" else ()
    name = levered_name(improved_name(first, float(seconds)), lev)
    sched, origin = None, None
    if label in orders:
        sched, origin = orders[label], order_origins.get(label, ORIGIN_STATE)
    else:
        key = cache.key(name, p, m, costs, budget)
        if key in cache.failed:
            messages.append(f"optimize {first}: {cache.failed[key]}")
            return results, origins
        sched = cache.get(name, p, m, costs, budget)
        if sched is None and adapt:

            try:
                base = cache.build(first, p, m, costs if spec.uses_costs else None, budget, lev)
                sched, note = improve_built(base, costs, settings.memory_limit, float(seconds))
            except (ValueError, TypeError, ScheduleError) as exc:
                cache.failed[key] = _reason(exc)
                messages.append(f"optimize {first}: {_reason(exc)}")
                return results, origins
            cache.put(name, p, m, costs, budget, sched)
            cache.notes[key] = note
        if sched is not None:
            origin = ORIGIN_IMPROVED.format(note=cache.notes.get(key, f"cm.improve {seconds:g} s"))
        else:
            jobs.append(Job(first, p, m, costs, budget, None, optimize=float(seconds),
                            improve_limit=settings.memory_limit, levers=lev))
            waiting.append(label)
    if sched is None:
        return results, origins
    if sched.name != label:  # the solver hands back its input when it finds nothing better
        sched = replace(sched, name=label)
    try:
        improved = cache.simulate(sched, costs)
    except (ValueError, ScheduleError) as exc:
        messages.append(f"optimize {first}: {_reason(exc)}")
        return results, origins
    out_results, out_origins = {}, {}
    for n, r in results.items():
        out_results[n], out_origins[n] = r, origins[n]
        if n == first:
            out_results[label], out_origins[label] = improved, origin
    return out_results, out_origins


def improve_target(settings: Settings, names) -> str | None:
    """The shown schedule the solver option improves: ``settings.improve`` when it is among
    ``names`` (None when it is not), else the first registered one other than 1F1B, else 1F1B."""
    shown = [n for n in names if n in SCHEDULES]
    if settings.improve:
        return settings.improve if settings.improve in shown else None
    return next((n for n in shown if n != "1f1b"), shown[0] if shown else None)


def _add_gb_axis(memory_spec: dict, settings: Settings, messages: list[str]) -> None:
    """The memory panel's GB axis for the chosen model (``a`` in GB: :func:`ctrlmem.planner.gb.bytes_per_a`)."""

    try:
        spec = model_spec(settings.model)
        mb = settings.microbatch_size or default_microbatch(spec)
        a = bytes_per_a(spec, settings.num_devices, mb) / 1e9
    except (ValueError, TypeError) as exc:
        messages.append(f"GB axis: {_reason(exc)}")
        return
    plot.add_gb_axis(memory_spec, a, f"GB: {spec.name}, mb {mb}")


# -- the lines and tables around the plots ------------------------------------------------------

def stats_html(stats: pd.DataFrame, waiting: Sequence[str] = ()) -> str:
    """The stats table as HTML (numbers rounded for reading; the DataFrame keeps them exact);
    ``waiting``: schedules still being built, one row each saying so."""
    if stats.empty and not waiting:
        return "<i>no schedule to show</i>"
    shown = stats.copy()
    shown["peak per device (a)"] = shown["peak per device (a)"].map(_per_device)
    if shown["fits limit"].isna().all():
        shown = shown.drop(columns=["fits limit"])
    else:
        shown["fits limit"] = shown["fits limit"].map({True: "yes", False: "NO"})
    fmt = {"makespan": plot.fmt_time, "peak (a)": plot.fmt_time, "bubble rate": plot.fmt_ratio,
           "peak / 1F1B": plot.fmt_ratio, "speed-up over 1F1B": plot.fmt_ratio}
    table = shown.to_html(index=False, formatters=fmt, float_format=plot.fmt_time, classes="ctrlmem-stats",
                          border=0)
    if waiting:
        cells = len(shown.columns)
        rows = "".join(f"<tr class='ctrlmem-waiting'><td>{html.escape(n)}</td><td colspan='{cells - 1}'>"
                       "<i>building for these settings (nothing to show until it is done)</i></td></tr>"
                       for n in waiting)
        table = table.replace("</tbody>", rows + "</tbody>") if "</tbody>" in table else table + rows
    return table


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


def _simulated_bubble(r: SimResult, s: Settings) -> str:
    """The largest per-device bubble (span − work) of ``r``; in τ (half of F) when the costs are
    the closed forms' (F=B=W, comm=0, no per-stage differences), else in time units."""
    worst = max(r.device_bubbles)
    if float(s.f) == float(s.b) == float(s.w) > 0 and not s.comm and not s.per_stage:
        return f"{worst / (float(s.f) / 2):.4g}τ"
    return plot.fmt_time(worst)


def formula_html(view: View) -> str:
    """The closed forms of the shown schedules at this p next to the simulated numbers, and the
    V-Half / V-ZB conditions W+2B ≥ 2F and W+2F ≥ 2B evaluated on the current costs (per-stage
    weights and extras scale F, B and W of a stage alike, so the ratios are the base ones)."""
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
                    f"<td>{forms[1]}</td><td>{_simulated_bubble(r, s)}</td>"
                    f"<td>{html.escape(view.origins.get(name, ''))}</td></tr>")
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
                 "<th>peak, closed form (a)</th><th>peak, simulated</th><th>bubble per device, closed form</th>"
                 "<th>bubble per device, simulated (largest)</th><th>order</th></tr>"
                 + "".join(rows) + "</table><small>closed forms: the paper's unit-cost patterns at F=B=W, comm=0 "
                 "(Sec. 3 and Table 1); τ is one pass over half a device-stage. An order searched for the costs "
                 "(\"adapted\") can be shorter than its pattern at the same peak: at F=B=W the V-Min search finds "
                 "V-Shape's order under a budget of 0.5</small><br>")
    stage_table = ""
    if s.per_stage:
        try:
            costs = s.costs(p)
            cells = "".join(f"<tr><td>{st}</td><td>{plot.fmt_time(fv)}</td><td>{plot.fmt_time(bv)}</td>"
                            f"<td>{plot.fmt_time(wv)}</td></tr>" for st, fv, bv, wv in plot.costs_table(costs, p, p))
            stage_table = ("<details class='ctrlmem-stage-costs'><summary>per-stage costs (one device-stage each; "
                           f"{plot.costs_label(costs)})</summary><table class='ctrlmem-formulas'><tr><th>stage</th>"
                           f"<th>F</th><th>B</th><th>W</th></tr>{cells}</table><small>a schedule with v stages per "
                           "device splits each row into v equal stages</small></details>")
        except ValueError:
            stage_table = ""
    return f"<div class='ctrlmem-formula' style='font-size:90%'>{table}{cond}{stage_table}</div>"


def verdict(view: View) -> str:
    """One line: the fastest schedule (within the memory budget when one is set, naming the
    schedules it left out for exceeding it), the fastest at each lower memory, every V schedule
    that is slower than 1F1B under these costs, and which shown orders are not adapted to these
    costs yet (the line is provisional until they are)."""
    st = view.stats
    if st.empty or view.reference is None:
        return ""
    limit = view.settings.memory_limit
    rows = st.sort_values(["peak / 1F1B", "makespan"]).to_dict("records")
    pool, left_out, head = rows, [], ""
    if limit is not None:
        pool = [r for r in rows if r["fits limit"]]
        left_out = [r for r in rows if not r["fits limit"]]
        head = f"Within the budget of {limit:g} × 1F1B's peak: "
    parts = []
    if pool:
        best = min(pool, key=lambda r: (r["makespan"], r["peak / 1F1B"]))
        parts.append(f"{head}Fastest: {best['schedule']} ({plot.fmt_ratio(best['speed-up over 1F1B'])}× 1F1B's "
                     f"speed, peak {plot.fmt_ratio(best['peak / 1F1B'])} × 1F1B).")
        front, fastest = [], math.inf
        for r in pool:  # Pareto front over (memory, makespan), lowest memory first
            if r["makespan"] < fastest - 1e-12:
                front.append(r)
                fastest = r["makespan"]
        lower = [r for r in front if r["schedule"] != best["schedule"]]
        if lower:
            parts.append("With less memory: " + "; ".join(
                f"≤ {plot.fmt_ratio(r['peak / 1F1B'])} × 1F1B: {r['schedule']} "
                f"({plot.fmt_ratio(r['speed-up over 1F1B'])}×)" for r in lower) + ".")
    else:
        parts.append(f"No shown schedule fits the budget of {limit:g} × 1F1B's peak.")
    if left_out:
        parts.append("Left out, over the budget: " + ", ".join(
            f"{r['schedule']} ({plot.fmt_ratio(r['peak / 1F1B'])} × 1F1B, "
            f"{plot.fmt_ratio(r['speed-up over 1F1B'])}×)" for r in left_out) + ".")
    losers = [r for r in rows if str(r["schedule"]).startswith(("v-", "zb-v")) and r["speed-up over 1F1B"] < 1 - 1e-9]
    for r in losers:
        parts.append(f"{r['schedule']} loses to 1F1B here ({plot.fmt_ratio(r['speed-up over 1F1B'])}× its speed): "
                     "its memory saving costs more bubble than 1F1B's at these costs.")
    pending = view.provisional + list(view.waiting)
    if pending:
        parts.append(f"Provisional: {', '.join(pending)} not adapted to these costs yet.")
    return " ".join(parts)


def command_line(settings: Settings, output: str | None = None) -> str:
    """The ``ctrlmem draw`` command that draws what the explorer shows (per-stage weights,
    first/last-stage extras and loaded files have no command-line form: they are named in a
    trailing comment, and the explorer's state file carries them, ``ctrlmem draw --state``)."""
    s = settings
    names = [n for n in s.schedules if n in SCHEDULES]
    if not names:
        return ""
    optimize = s.optimize
    target = improve_target(s, names) if optimize else None
    if target is not None:  # `ctrlmem draw --optimize` improves the first schedule it is given
        names = [target] + [n for n in names if n != target]
    costs = ",".join(f"{x:g}" for x in (s.f, s.b, s.w, s.comm))
    out = output or f"{_slug_of(names, s)}.html"
    cmd = f"ctrlmem draw {names[0]}"
    if len(names) > 1:
        cmd += f" --compare {','.join(names[1:])}"
    cmd += f" -p {s.num_devices} -m {s.num_microbatches} --costs {costs}"
    if s.memory_limit is not None:
        cmd += f" --memory-limit {s.memory_limit:g}"
    if optimize:
        cmd += f" --optimize {s.optimize:g}"
    if s.recompute != "none":
        cmd += f" --recompute {s.recompute}"
    if s.offload is not None:
        cmd += f" --offload {s.offload:g} --offload-cost {s.offload_cost:g}"
    if s.fb_overlap != 1.0:
        cmd += f" --fb-overlap {s.fb_overlap:g}"
    cmd += f" -o {out}"
    missing = []
    if s.stage_costs:
        missing.append(f"per-stage costs of {len(s.stage_costs[0])} stages")
    if s.stage_weights:
        missing.append("per-stage weights " + ",".join(f"{x:g}" for x in s.stage_weights))
    if s.first_stage_extra or s.last_stage_extra:
        missing.append(f"first/last-stage extra {s.first_stage_extra:g}/{s.last_stage_extra:g}")
    if s.measured:
        missing.append("measured runs " + ", ".join(x.name for x in s.measured))
    if s.loaded:
        missing.append("loaded files " + ", ".join(x.name for x in s.loaded)
                       + (" (shown without the levers)" if s.levers else ""))
    if missing:
        cmd += ("  # not expressible on the command line: " + "; ".join(missing)
                + " (save the state and use ctrlmem draw --state FILE)")
    return cmd


# -- figures to the browser --------------------------------------------------------------------

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
        if obj and isinstance(obj[0], str) and all(type(v) is str for v in obj):  # labels: nothing to convert
            return list(obj)
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def mime_bundle(spec: dict, label: str) -> dict:
    """A display_data bundle plotly's JupyterLab extension renders, from a figure dict."""
    fig_json = jsonable(spec)
    # not "responsive": plotly would size the height from a container sized by the plot, which
    # collapsed plots to zero height when the window grew; the explorer's view follows the width
    fig_json["config"] = {"responsive": False, "displaylogo": False}
    return {PLOTLY_MIME: fig_json, "text/plain": f"<{label}: {len(spec['data'])} traces>"}


# -- comparisons -------------------------------------------------------------------------------

def comparison_specs(view: View) -> tuple[dict | None, dict | None]:
    """The built-in comparisons of the shown schedules: their peak memory over devices against
    time, overlaid (:func:`ctrlmem.plots.figures.peak_memory_spec`), and memory against speed-up with
    the Pareto frontier (:func:`ctrlmem.plots.figures.pareto_figure`), as figure dicts."""
    if not view.results or view.reference is None:
        return None, None
    s = view.settings
    ref_peak = max(view.reference.peak_memory)
    label = plot.setting_label(s.num_devices, s.num_microbatches,
                               s.costs(s.num_devices) if s.per_stage else s.costs(), s.memory_limit)
    peaks = plot.peak_memory_spec(list(view.results.values()), reference_peak=ref_peak, budget=s.memory_limit,
                                  title=f"peak memory over devices: {label}")
    points = [{"name": name, "memory_limit": None, "peak": max(r.peak_memory),
               "memory": max(r.peak_memory) / ref_peak, "bubble_rate": r.bubble_rate, "makespan": r.makespan,
               "throughput": s.num_microbatches / r.makespan, "speedup": view.reference.makespan / r.makespan}
              for name, r in view.results.items()]
    pareto = plot.pareto_figure(points, title=f"memory vs speed-up: {label}").to_plotly_json()
    return peaks, pareto


# -- state file --------------------------------------------------------------------------------

def _schedule_record(schedule: Schedule, **extra) -> dict:
    """A schedule as JSON: its text form, zlib+base64 when long (p = 32, m = 256: 316 kB → 150 kB)."""
    text = schedule.to_text()
    record: dict = {"name": schedule.name}
    if len(text) > 64_000:
        record["text_zlib_base64"] = base64.b64encode(zlib.compress(text.encode("utf-8"), 6)).decode("ascii")
    else:
        record["text"] = text
    record.update(extra)
    return record


MAX_STATE_BYTES = 64 << 20
"""Largest state file (or HTML report) read: a p = 32, m = 256 state is about 150 kB."""

MAX_STATE_TEXT = 32 << 20
"""Most schedule text one state may hold once inflated, all its orders together (a schedule of
:data:`ctrlmem.model.ir.MAX_PASSES` passes is about 16 MB of text)."""


def _schedule_from_record(record: Mapping, budget: list[int] | None = None) -> Schedule:
    """The schedule of a state record; ``budget`` (one number, in a list) is what is left of
    :data:`MAX_STATE_TEXT`, and shrinks by this record's text."""

    if not isinstance(record, Mapping):
        raise ValueError(f"state file: a schedule record must be an object with 'name' and 'text', got "
                         f"{type(record).__name__}; save the state again")
    name = str(record.get("name"))[:40]
    left = MAX_STATE_TEXT if budget is None else budget[0]
    if "text" in record:
        text = record["text"]
        if not isinstance(text, str):
            raise ValueError(f"state file: the text of {name!r} must be text, got {type(text).__name__}")
    elif "text_zlib_base64" in record:
        raw = b64_inflate(record["text_zlib_base64"], f"state file: the text_zlib_base64 of {name!r}", left)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"state file: the text of {name!r} is not UTF-8 text") from None
    else:
        raise ValueError(f"schedule record {name!r} has no 'text' or 'text_zlib_base64'")
    if len(text) > left:
        raise ValueError(f"state file: its schedules hold more than {MAX_STATE_TEXT:,} characters of text, more "
                         f"than any state the explorer saves")
    if budget is not None:
        budget[0] -= len(text)
    return Schedule.from_text(text)


def _state_text(source) -> str:
    """The JSON text of a state (a path, the text itself or its bytes, a state link), out of an
    HTML report when it is one; read through :func:`ctrlmem.util.userfile.read_text` (a regular file of at
    most :data:`MAX_STATE_BYTES`)."""

    if isinstance(source, Mapping):  # a state as data (plan_state, state_dict)
        text = json.dumps(source)
    elif isinstance(source, (bytes, bytearray)):
        try:
            text = bytes(source).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("not a ctrlmem state file (not UTF-8 text)") from None
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        text = source
    elif isinstance(source, str) and STATE_LINK_KEY in source:  # a state link (from state_link)
        text = _link_text(source)
        if text is None:
            raise ValueError("a state link is ctrlmem-state=1. followed by its letters; copy the whole link again")
    else:
        text = read_text(source, "state file", MAX_STATE_BYTES, fix="give a state the explorer saved")
    if len(text) > MAX_STATE_BYTES:
        raise ValueError(f"state text of {len(text):,} characters is more than a state file can be")
    if text.lstrip()[:15].lower().startswith("<!doctype html"):  # an HTML report: the state inside it
        start = text.find("<script type='application/json' id='ctrlmem-state'>")
        if start < 0:
            raise ValueError("an HTML file without a ctrlmem state inside (not an explorer report)")
        start = text.index(">", start) + 1
        end = text.find("</script>", start)
        text = text[start:end if end >= 0 else len(text)]  # JSON reads the escapes it was written with
    return text


_STYLE_PARTS = ("diagram", "memory")


def _check_style(style) -> dict:
    """A state's figure style: ``{"diagram": {...}, "memory": {...}}`` whose keys are keyword
    arguments of :func:`~ctrlmem.plots.figures.schedule_spec` / ``memory_spec`` and whose values
    are JSON scalars; ``ValueError`` names the first that is not."""

    if style is None:
        return {}
    if not isinstance(style, Mapping):
        raise ValueError(f"state file: 'style' must be an object, got {type(style).__name__}")
    for part, options in style.items():
        if part not in _STYLE_PARTS:
            continue  # written by a newer explorer (and "label_width" hints): not passed to a plot
        if not isinstance(options, Mapping):
            raise ValueError(f"state file: style[{part!r}] must be an object, got {type(options).__name__}")
        fn = plot.schedule_spec if part == "diagram" else plot.memory_spec
        known = [k for k, v in inspect.signature(fn).parameters.items() if v.kind is v.KEYWORD_ONLY]
        for key, value in options.items():
            if key not in known:
                raise ValueError(f"state file: style[{part!r}] has {str(key)[:40]!r}, not an option of the "
                                 f"{part} figure ({', '.join(known[:8])}, ...)")
            if not (value is None or isinstance(value, (str, int, float, bool))):
                raise ValueError(f"state file: style[{part!r}][{key!r}] must be a number, text or a bool, got "
                                 f"{type(value).__name__}")
    return dict(style)


def _costs_json(costs: Costs | None):
    if costs is None:
        return None
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in costs.to_dict().items()}


def state_dict(view: View, style: dict | None = None) -> dict:
    """The explorer's whole state as JSON-ready data: the settings (loaded files inline), the
    very orders shown (so a redraw never depends on a search finding the same schedule again),
    how each was obtained, and the figure style (which sets the label rule's width)."""
    orders = {}
    for name, r in view.results.items():
        if name.endswith(" (file)"):
            continue
        orders[name] = _schedule_record(r.schedule, origin=view.origins.get(name, ""))
    return {"ctrlmem_state": STATE_VERSION, "settings": view.settings.to_dict(), "orders": orders,
            "style": style or {}}


#: What starts a state link's text: ``ctrlmem-state=1.<base64url of the zlib'd state JSON>``, to
#: paste as it is or after a URL's ``#`` or ``?`` (anything around it is ignored).
STATE_LINK_KEY = "ctrlmem-state="
#: Longest link :func:`state_link` writes with the orders inside (browsers and chat programs keep
#: URLs of a few thousand characters); a longer state's link holds its settings alone.
MAX_LINK_CHARS = 8000
_LINK = re.compile(r"ctrlmem-state=(\d+)\.([A-Za-z0-9_-]+)")


def state_link(view: View, style: dict | None = None, max_chars: int = MAX_LINK_CHARS) -> tuple[str, bool]:
    """A state as one line of text to share: ``(link, exact)``. The link holds the settings, the
    figure style and, when they fit in ``max_chars``, the very orders shown (``exact``); without
    them, whoever opens it builds the orders again for the same settings (a searched order is
    found again; an order improved by the solver within a time limit may differ: share the state
    file for those). The explorer's *open link* field, ``explorer(state=LINK)`` and ``ctrlmem
    draw --state LINK`` open it; a settings-only link longer than ``max_chars`` (large loaded
    files) raises ``ValueError``."""
    data = state_dict(view, style)
    link = _encode_link(data)
    if len(link) <= max_chars:
        return link, True
    data["orders"] = {}
    link = _encode_link(data)
    if len(link) > max_chars:
        raise ValueError(f"this state needs {len(link):,} characters even without its orders (loaded schedule files "
                         f"are inside it), more than a link of {max_chars:,} holds; save the state file instead")
    return link, False


def _encode_link(data: dict) -> str:
    raw = zlib.compress(json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8"), 9)
    return f"{STATE_LINK_KEY}{STATE_VERSION}.{base64.urlsafe_b64encode(raw).decode('ascii').rstrip('=')}"


def _link_text(text: str) -> str | None:
    """The state JSON inside a state link (anywhere in ``text``), or None when there is none."""
    found = _LINK.search(text)
    if found is None:
        return None
    version, payload = found.groups()
    if int(version) != STATE_VERSION:
        raise ValueError(f"state link version {version} is not supported (this ctrlmem reads {STATE_VERSION})")
    padded = payload + "=" * (-len(payload) % 4)
    standard = padded.replace("-", "+").replace("_", "/")
    raw = b64_inflate(standard, "the state link", MAX_STATE_BYTES)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the state link does not hold text; copy the whole link again") from None


def write_state(view: View, path: str | os.PathLike, style: dict | None = None) -> str:
    """Write :func:`state_dict` as JSON to ``path``; returns the path."""
    path = str(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(state_dict(view, style), indent=1, sort_keys=True).encode("utf-8"))
    return path


def read_state(source) -> tuple[Settings, dict[str, Schedule], dict]:
    """``(settings, orders, style)`` from a state file or an HTML report holding one (a path, or
    its text / bytes); how each order was obtained is ``style["origins"]``. Raises
    ``ValueError`` naming what is wrong."""

    text = _state_text(source)
    try:
        data = parse_json(text, "the state")
    except ValueError as exc:
        raise ValueError(f"not a ctrlmem state file ({exc})") from None
    if not isinstance(data, dict) or "ctrlmem_state" not in data:
        raise ValueError("not a ctrlmem state file (no 'ctrlmem_state' key); save one with the explorer's "
                         "'save state' button")
    if data["ctrlmem_state"] != STATE_VERSION:
        raise ValueError(f"state file version {data['ctrlmem_state']!r} is not supported (this ctrlmem reads "
                         f"{STATE_VERSION})")
    records = data.get("orders", {})
    if not isinstance(records, dict) or not isinstance(data.get("settings", {}), dict):
        raise ValueError("state file: 'settings' and 'orders' must be objects (orders: name -> {name, text}); save "
                         "the state again with the explorer")
    p = data.get("settings", {}).get("num_devices")
    if isinstance(p, int) and p > plot.MAX_DRAWN_DEVICES:  # said before anything that large is built
        raise ValueError(f"state file: p={p:,} is more than the {plot.MAX_DRAWN_DEVICES:,} devices a figure draws")
    budget = [MAX_STATE_TEXT]
    settings = Settings.from_dict(data.get("settings", {}), budget)
    orders = {str(name): _schedule_from_record(rec, budget) for name, rec in records.items()}
    for name, sched in orders.items():
        if (sched.num_devices, sched.num_microbatches) != (settings.num_devices, settings.num_microbatches):
            raise ValueError(f"state file: the order of {name} has p={sched.num_devices}, m={sched.num_microbatches}, "
                             f"the settings p={settings.num_devices}, m={settings.num_microbatches}")
    style = _check_style(data.get("style"))
    style["origins"] = {str(name): str(rec.get("origin", ORIGIN_STATE)) for name, rec in records.items()}
    return settings, orders, style


def state_view(source) -> tuple[View, dict]:
    """The view a state file records, exactly: its settings, its very orders (how each was
    obtained as it was then) and its figure style; schedules it has no order for (still being
    built when it was saved) are listed as waiting, not built. A state without any order (a
    state link of its settings alone, :func:`state_link`) has them built, as the explorer would.
    Returns ``(view, style)``."""
    settings, orders, style = read_state(source)
    origins = style.pop("origins", {})
    view = compute(settings, style=style, adapt=not orders, orders=orders, order_origins=origins)
    view.jobs = []
    return view, style


ORIGIN_PLAN = "the plan's order: {what}"


def settings_from_plan(df, index: int | None = None) -> tuple[Settings, dict[str, Schedule], dict[str, str]]:
    """A plan's row (:func:`ctrlmem.plan`; default: the fastest that fits) as explorer settings and
    the order to show: ``(settings, orders, origins)``, what :func:`plan_state` saves. The
    settings are the row's pipeline (``p`` = its PP, ``m`` its microbatches per pipeline), its
    schedule next to 1F1B, the per-stage pass costs it was simulated with (ms;
    :attr:`Settings.stage_costs`, its recomputation already in them: in ``B`` with a fused
    backward, as its ``R`` passes' times with a split one), its hop, budget, offload
    and host copy time, and its model and microbatch for the memory panel's GB axis (the
    explorer's GB: activation of one pipeline stage at TP 1, not the plan's per-GPU total). The
    order is the very one the plan simulated."""
    if index is None:
        ok = [i for i, status in enumerate(df["status"]) if status == "ok"]
        if not ok:
            raise ValueError("no configuration of the plan fits: nothing to show (raise the GPU memory or the GPUs)")
        index = ok[0]
    if not 0 <= int(index) < len(df):
        raise ValueError(f"the plan has rows 0..{len(df) - 1}, got {index}")
    index = int(index)
    sched, costs = row_schedule(df, index)
    row = df.iloc[index]
    name = str(row["schedule"]).partition("@")[0]
    limit = row["memory_limit"]
    limit = None if limit is None or (isinstance(limit, float) and math.isnan(limit)) else float(limit)
    offload = float(row["offload"]) if row.get("offload") == row.get("offload") and row.get("offload") else None
    model = str(df.attrs.get("settings", {}).get("model", {}).get("name") or "")
    model = PRESET_NAMES.get(model.lower())  # a paper preset gives the GB axis; another model none
    settings = Settings(
        schedules=tuple(dict.fromkeys((name, "1f1b"))), num_devices=int(row["pp"]), num_microbatches=int(row["m"]),
        f=float(sum(costs.f)) / int(row["pp"]), b=float(sum(costs.b)) / int(row["pp"]),
        w=float(sum(costs.w)) / int(row["pp"]), comm=float(costs.comm),
        stage_costs=(tuple(costs.f), tuple(costs.b), tuple(costs.w))
        + ((tuple(costs.recompute),) if sched.recomputes and isinstance(costs.recompute, tuple) else ()),
        memory_limit=limit,
        offload=offload, offload_cost=float(costs.offload) if offload else 0.0, fb_overlap=float(costs.fb_overlap),
        model=model, microbatch_size=int(row["microbatch_size"]))
    what = (f"rank {int(row['rank']) if row['rank'] == row['rank'] else index + 1}, DP {row['dp']}, TP {row['tp']}, "
            f"PP {row['pp']}, microbatch {row['microbatch_size']}"
            + ((f", recompute {row['recompute']} (its R passes)" if sched.recomputes else
                f", recompute {row['recompute']} (in its costs)") if str(row.get("recompute")) not in ("none", "nan")
               else ""))
    sched = replace(sched, name=name) if sched.name != name else sched
    return settings, {name: sched}, {name: ORIGIN_PLAN.format(what=what)}


def plan_state(df, index: int | None = None) -> dict:
    """The explorer state of a plan's row (:func:`settings_from_plan`), as :func:`state_dict`
    gives it: ``explorer(state=...)`` (a dict, its JSON or a file holding it), the explorer's
    *load state* and ``ctrlmem draw --state`` show it; ``ctrlmem plan --emit DIR`` writes it as
    ``explorer.state.json``."""
    settings, orders, origins = settings_from_plan(df, index)
    view = compute(settings, adapt=False, orders=orders, order_origins=origins)
    return state_dict(view)


def draw_state(source, output: str, view: str = "explorer", width: int | None = None, scale: float = 2.0) -> str:
    """Draw a state file (``ctrlmem draw --state``) to ``output`` by its extension: ``view``
    ``"explorer"`` gives what the explorer's exports give (``.html``: :func:`report_html`;
    ``.png`` / ``.svg`` / ``.pdf``: :func:`static_figure`), ``"schedule"`` / ``"memory"`` one
    of its two figures. Returns the path."""
    shown, style = state_view(source)
    if not shown.results:
        raise ValueError("the state file shows no schedule: " + ("; ".join(shown.messages) or "none was saved"))
    ext = output.rsplit(".", 1)[-1].lower() if "." in os.path.basename(output) else ""
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    if view == "explorer" and ext == "html":
        atomic_write(output, report_html(shown, style).encode("utf-8"))
        return output
    if view == "explorer":
        if ext not in ("png", "svg", "pdf"):
            raise ValueError(f"the file name must end in .html, .png, .svg or .pdf, got {output!r}")

        return render_file(static_figure(shown, width or 1100), output, scale=scale)
    if view in ("schedule", "memory"):
        fig = shown.diagram if view == "schedule" else shown.memory
        if width:
            fig.update_layout(width=width)
    else:
        raise ValueError(f"--state draws the views explorer, schedule and memory, not {view!r}")
    return plot.write_figures([(fig, output)], scale=scale)[0]


# -- export ------------------------------------------------------------------------------------

def _slug_of(names: Sequence[str], s: Settings) -> str:
    """A file stem carrying everything that changes the picture: schedules, p, m, costs, budget."""
    costs = "-".join(f"{k}{v:g}" for k, v in (("F", s.f), ("B", s.b), ("W", s.w), ("c", s.comm)))
    stem = f"{'-vs-'.join(names) or 'none'}_p{s.num_devices}_m{s.num_microbatches}_{costs}"
    if s.memory_limit is not None:
        stem += f"_lim{s.memory_limit:g}"
    if s.stage_costs:  # a plan's: named by a digest of its times (a stem stays short)
        digest = zlib.crc32(json.dumps([list(x) for x in s.stage_costs]).encode("utf-8"))
        stem += f"_sc{len(s.stage_costs[0])}-{digest:08x}"
    if s.stage_weights:
        stem += "_w" + "-".join(f"{x:g}" for x in s.stage_weights)
    if s.first_stage_extra or s.last_stage_extra:
        stem += f"_x{s.first_stage_extra:g}-{s.last_stage_extra:g}"
    if s.recompute != "none":
        stem += f"_r{s.recompute}"
    if s.offload is not None:
        stem += f"_off{s.offload:g}-{s.offload_cost:g}"
    if s.fb_overlap != 1.0:
        stem += f"_fb{s.fb_overlap:g}"
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)


def slug(view: View) -> str:
    """The file stem of a view's exports."""
    return _slug_of([n.replace(" (file)", "") for n in view.results], view.settings)


def static_figure(view: View, width: int = 1100) -> go.Figure:
    """The diagram above the memory curves, one figure at ``width`` pixels with the label rule
    applied there: what a PNG, SVG or PDF export draws."""
    spec = plot.stack_specs([plot.without_hover_tables(view.diagram_spec), view.memory_spec])
    fig = go.Figure(spec).update_layout(width=width)
    for i, tr in enumerate(fig.data):  # fixed trace ids: the SVG holds no random one
        if tr.uid is None:
            tr.uid = f"t{i}"
    return without_hover_marks(plot.static_labels(fig, width))


#: Bytes of an HTML report per pass drawn and beyond plotly.js, measured on reports of 1F1B,
#: V-Half and V-Min at p = 8-32 (41-68 bytes a pass over 60-250 KB of tables and comparisons);
#: tests/test_ui.py checks the estimate against real reports.
REPORT_BYTES_PER_PASS = 45
REPORT_BYTES_FIXED = 60_000


@functools.cache
def _plotly_js_bytes() -> int:
    return len((files("plotly") / "package_data" / "plotly.min.js").read_bytes())


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} KB"


def export_hints(view: View, scale: float = 2.0, width: int = 1100) -> dict[str, str]:
    """What each export of ``view`` will be, said before the click (the buttons' tooltips):
    the HTML report's size (plotly.js inside plus the passes drawn), the image's pixels
    (what :func:`static_figure` draws, at ``scale``). Cheap: it counts, it draws nothing."""
    if not view.results:
        return {}
    passes = sum(r.schedule.num_passes for r in view.results.values())
    report = _plotly_js_bytes() + REPORT_BYTES_FIXED + REPORT_BYTES_PER_PASS * passes
    height = plot.stacked_height([view.diagram_spec, view.memory_spec])
    px = f"{round(width * scale)} × {round(height * scale)} px"
    return {"html": f"about {_megabytes(report)} ({passes:,} passes drawn, plotly.js inside)",
            "png": px, "svg": f"{px}, {passes:,} passes as vector shapes",
            "pdf": f"{passes:,} passes as vector shapes",
            "csv": f"{len(view.results)} schedule{'s' if len(view.results) != 1 else ''}, one row per device"}


def _report_plot(div_id: str, spec: dict) -> str:
    payload = jsonable(spec)
    data = script_json(payload.get("data", []), separators=(",", ":"))  # names stay text: see util.htmlsafe
    layout = script_json(payload.get("layout", {}), separators=(",", ":"))
    return (f"<div id='{div_id}' class='ctrlmem-report-plot'></div><script>Plotly.newPlot('{div_id}', {data}, "
            f"{layout}, {{\"displaylogo\": false, \"responsive\": true}});</script>")


def report_html(view: View, style: dict | None = None) -> str:
    """One self-contained HTML page (plotly.js inside, opens offline): the settings, the
    verdict, the stats table, the closed forms, the command line, the diagram, the memory
    curves, the comparisons (peak memory over time, memory vs speed-up), and the state file
    inside (``<script type="application/json" id="ctrlmem-state">``) to load again."""
    if not view.results:
        raise ValueError("nothing to export: no schedule could be built for these settings")

    plotly_js = (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    s = view.settings
    rows = [("schedules", ", ".join(s.schedules) or "—"), ("p (devices)", s.num_devices),
            ("m (microbatches)", s.num_microbatches),
            ("costs", plot.costs_label(s.costs(s.num_devices) if s.per_stage else s.costs())),
            ("memory limit", "none" if s.memory_limit is None else f"{s.memory_limit:g} × 1F1B's peak")]
    if s.stage_costs:
        rows.append(("per-stage costs", "; ".join(f"{k} " + ", ".join(f"{x:.4g}" for x in part)
                                                  for k, part in zip("FBW", s.stage_costs))))
    if s.stage_weights:
        rows.append(("per-stage weights", ", ".join(f"{x:g}" for x in s.stage_weights)))
    if s.first_stage_extra or s.last_stage_extra:
        rows.append(("first / last-stage extra", f"{s.first_stage_extra:g} / {s.last_stage_extra:g}"))
    if s.levers:
        rows.append(("memory levers", s.levers_text()))
    if s.loaded:
        rows.append(("loaded files", ", ".join(x.name for x in s.loaded)))
    if s.measured:
        rows.append(("measured runs", ", ".join(f"{x.name} ({x.source}, step {x.step_ms:.4g} ms)" for x in s.measured)))
    settings_table = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    peaks, pareto = comparison_specs(view)
    plots = [_report_plot("ctrlmem-report-diagram", plot.hover_on_cells(view.diagram_spec)),
             _report_plot("ctrlmem-report-memory", view.memory_spec)]
    plots += [_report_plot(f"ctrlmem-report-{k}", sp) for k, sp in (("peaks", peaks), ("pareto", pareto)) if sp]
    state = script_json(state_dict(view, style), sort_keys=True)
    command = command_line(s)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>ctrlmem: {html.escape(slug(view))}</title><style>"
        "body{font-family:Helvetica,Arial,sans-serif;margin:20px;max-width:1400px}"
        "table{border-collapse:collapse}th,td{padding:2px 10px;text-align:left}"
        ".ctrlmem-stats td,.ctrlmem-stats th{border-bottom:1px solid #ddd}"
        "code{background:#f4f4f4;padding:2px 4px}</style>"
        f"<script type='text/javascript'>{plotly_js}</script></head><body>"
        "<h1>ctrlmem explorer report</h1>"
        + ("<p>Everything here is simulated by ctrlmem's exact simulator from the settings below; nothing is "
           "measured." if not s.measured else
           "<p>Everything here is simulated by ctrlmem's exact simulator from the settings below, except the panels "
           "titled <i>measured</i>: a real run's measured step (<code>ctrlmem run</code>'s trace-measured.json).")
        + " The explorer's state is inside this page: <code>ctrlmem draw --state THIS.html -o "
        "OUT.png</code> draws it again, and the explorer's <i>load state</i> takes this file.</p>"
        f"<h2>Settings</h2><table class='ctrlmem-settings'>{settings_table}</table>"
        f"<h2>Verdict</h2><p class='ctrlmem-verdict'>{html.escape(verdict(view))}</p>"
        f"{messages_html(view.messages)}"
        f"<h2>Schedules</h2>{stats_html(view.stats, view.waiting)}{formula_html(view)}"
        f"<p>As a command: <code>{html.escape(command)}</code></p>"
        "<h2>Diagram and memory</h2>" + plots[0] + plots[1]
        + ("<h2>Comparisons</h2>" + "".join(plots[2:]) if len(plots) > 2 else "")
        + f"<script type='application/json' id='ctrlmem-state'>{state}</script></body></html>"
    )


def export_files(view: View, kind: str) -> dict[str, bytes]:
    """One file per schedule of the view, by name suffix: its torch CSV (``kind="csv"``,
    ``NAME.csv``) or its simulated trace (``kind="trace"``, ``NAME.trace.json``)."""
    out = {}
    for name, r in view.results.items():
        base = name.replace(" (file)", "")
        if kind == "csv":
            out[f"{base}.csv"] = r.schedule.to_torch_csv().encode("utf-8")
        else:

            out[f"{base}.trace.json"] = json.dumps(trace_events(r)).encode("utf-8")
    return out


def export_view(view: View, kind: str, directory: str | os.PathLike = "build/explorer",
                style: dict | None = None) -> list[str]:
    """Write ``view`` into ``directory`` (created; default ``build/explorer`` under the current
    directory): ``png`` / ``svg`` / ``pdf`` (the diagram above the memory curves, one file,
    :func:`static_figure`, kaleido), ``html`` (:func:`report_html`), ``csv`` (each schedule in
    torch's pipelining CSV), ``trace`` (each schedule's simulated timeline as Chrome / Perfetto
    trace-event JSON, :mod:`ctrlmem.plots.trace`) or ``state`` (:func:`write_state`). Returns the
    paths written."""
    if kind not in EXPORT_KINDS:
        raise ValueError(f"export kind must be one of {EXPORT_KINDS}, got {kind!r}")
    if not view.results:
        raise ValueError("nothing to export: no schedule could be built for these settings")
    make_output_folder(directory)
    stem = os.path.join(str(directory), slug(view))
    paths: list[str] = []
    if kind in ("csv", "trace"):
        for suffix, data in export_files(view, kind).items():
            path = f"{stem}_{suffix}"
            atomic_write(path, data)
            paths.append(path)
    elif kind == "html":
        path = f"{stem}.html"
        atomic_write(path, report_html(view, style).encode("utf-8"))
        paths.append(path)
    elif kind == "state":
        paths.append(write_state(view, f"{stem}.state.json", style))
    else:

        paths.append(render_file(static_figure(view), f"{stem}.{kind}"))
    log.info("exported %s", paths)
    return paths


def save_view(view: View, out_dir: str | os.PathLike) -> str:
    """Write the view's settings, stats and messages to ``out_dir/explore.json`` (what a
    notebook run records); returns the path."""
    make_output_folder(out_dir)
    path = os.path.join(str(out_dir), "explore.json")
    stats = view.stats.astype(object).where(view.stats.notna(), None)
    atomic_write(path, json.dumps({"settings": view.settings.to_dict(), "stats": stats.to_dict(orient="records"),
                                   "messages": view.messages}, indent=2))
    return path
