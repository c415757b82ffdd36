"""Fig. 9 and Fig. 10 as figures: bubble rate against the memory limit (docs/theory.md §9.6).

Both figures are **simulated** on the A100 cost model of :mod:`ctrlmem.model.paper` (per-pass times
from FLOPs at 65 % of peak, ``comm`` from a 25 GB/s hop; the paper's own curves use profiled
costs that were not recovered), never measured:

* **Fig. 9**: the adaptive V-shape scheduler (``v-shape``) for the three models of Table 4 and
  ``m = 2p, 4p, 8p, 16p``, one panel per model; plus a check panel with docs/theory.md §9.6's
  points (the authors' ``v_auto_schedule.py`` at p = 16, m = 64 and the example costs), the
  only readings of this figure that compare number for number.
* **Fig. 10**: a grid, rows ``m = 2p … 16p``, columns the three models: the V scheduler
  (``v-shape``), the ZB scheduler (``zb``) and a dashed 1F1B reference line.

``quick=True`` keeps every model's cost ratios (its hidden size, heads, microbatch and sequence
length) but cuts its layers over :data:`QUICK_P` devices, so ``p`` and ``m`` are CPU-sized; a
full run uses each model's own ``p`` (16, 24, 32). The ``v-shape`` search simulates its whole
family once per ``(p, m, costs)`` (cached), which is what dominates the time.

Figures need plotly (imported only when a figure is made); the numbers need only the core.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ctrlmem.model import paper
from ctrlmem.model.costs import Costs
from ctrlmem.schedules import build
from ctrlmem.model.simulate import simulate
from ctrlmem.plots.figio import write_files
from ctrlmem.experiments import simulate_point
from ctrlmem.schedules import SCHEDULES

__all__ = [
    "LIMITS",
    "QUICK_P",
    "M_PER_P",
    "MODELS",
    "Panel",
    "panels",
    "curve",
    "steepest_drop",
    "fig9_data",
    "fig10_data",
    "fig9_figure",
    "fig10_figure",
]

log = logging.getLogger(__name__)

LIMITS: tuple[float, ...] = (0.125, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.5625, 0.625, 0.6875, 0.75, 0.875, 1.0,
                             1.125, 1.25, 1.5, 1.75, 2.0)
"""Memory limits (fractions of 1F1B's peak activation) every curve is evaluated at: steps of
1/16 from 0.25 to 0.75 (fine where the paper's drop is), coarser elsewhere, up to 2.0. Each
curve also starts at its scheduler's smallest feasible limit (one microbatch per device,
``1/p``) when that is below the first of these."""
QUICK_P = 8
DROP_FROM = 0.25
"""The drop of a curve is located from this limit on: the paper's Fig. 9 x axis starts at 0.25,
and below it (down to one microbatch per device) every curve falls steeply for want of memory."""
M_PER_P = (2, 4, 8, 16)
MODELS = ("9.6B", "21B", "38.5B")
CALC_COSTS = (9918, 10434, 7038, 213)
"""docs/theory.md §9.6's example costs (4959, 5217, 3519 per chunk pass, 213 comm) as full
device-stage times, the key of :data:`ctrlmem.model.paper.FIG9_CALC`."""


@dataclass(frozen=True)
class Panel:
    """One panel: a model at pipeline size ``p`` and ``m`` microbatches, priced by ``costs``."""

    model: str
    p: int
    m: int
    microbatch_size: int
    costs: Costs
    how: str


def panels(quick: bool) -> list[Panel]:
    """The (model, m) panels of Fig. 9–10: each model's Table 4 setting (``p`` = its GPUs,
    its microbatch size), or ``p = QUICK_P`` with the same per-layer costs when ``quick``."""
    out = []
    for name in MODELS:
        p_full, mb, _ms = paper.TABLE4_SETUP[name]
        p = QUICK_P if quick else p_full
        costs = paper.paper_costs(name, p, mb)
        how = (f"simulated, A100 cost model (ctrlmem.model.paper, {paper.DEFAULT_EFFICIENCY:.0%} of peak, "
               f"seq {paper.ASSUMED_SEQ_LEN}, mb {mb}), p = {p}"
               + (f" (quick: the paper's p = {p_full} cut to {p})" if quick else ""))
        for k in M_PER_P:
            out.append(Panel(name, p, k * p, mb, costs, how))
    return out


def curve(schedule: str, p: int, m: int, costs: Costs, limits: Sequence[float] = LIMITS,
          from_smallest: bool = True) -> list[dict[str, Any]]:
    """Build and simulate ``schedule`` at each memory limit; one record per limit:
    ``limit``, ``bubble_rate`` and ``memory`` (the simulated peak / 1F1B's ``p·a``), both
    ``None`` where no schedule of the family fits the limit. With ``from_smallest`` the curve of
    ``v-shape`` / ``zb`` starts at their smallest feasible limit ``1/p`` (limits below it are
    dropped).

    ``zb`` depends on the limit only through its activation cap ``⌊limit·p⌋`` (its docstring),
    so limits with the same cap are built once."""

    points = []
    seen: dict[Any, dict[str, Any]] = {}
    if from_smallest and schedule in ("v-shape", "zb") and limits and 1 / p < max(limits):
        # start at the smallest feasible limit (one microbatch per device), not below it
        limits = [1 / p, *(x for x in limits if x > 1 / p + 1e-12)]
    for limit in limits:
        key = math.floor(limit * p + 1e-9) if schedule == "zb" else limit
        if key not in seen:
            try:
                r = simulate(build(schedule, p, m, costs=costs, memory_limit=limit), costs)
                seen[key] = {"bubble_rate": r.bubble_rate, "memory": max(r.peak_memory) / p}
            except ValueError as exc:
                log.debug("%s p=%d m=%d limit %g infeasible: %s", schedule, p, m, limit, exc)
                seen[key] = {"bubble_rate": None, "memory": None}
        points.append({"limit": limit, **seen[key]})
    return points


def reference_1f1b(p: int, m: int, costs: Costs) -> float:
    """1F1B's simulated bubble rate (Fig. 10's dashed line; its memory is 1.0 by definition)."""

    return simulate(build("1f1b", p, m), costs).bubble_rate


def steepest_drop(points: Sequence[dict]) -> dict[str, float] | None:
    """The largest fall of the bubble rate between two neighbouring feasible limits:
    ``{"from": limit before, "to": limit after, "at": their midpoint, "drop": fall}``;
    ``None`` when the curve never falls."""
    feasible = [q for q in points if q["bubble_rate"] is not None]
    best = None
    for a, b in zip(feasible, feasible[1:]):
        fall = a["bubble_rate"] - b["bubble_rate"]
        if fall > 1e-12 and (best is None or fall > best["drop"] + 1e-12):
            best = {"from": a["limit"], "to": b["limit"], "at": (a["limit"] + b["limit"]) / 2, "drop": fall}
    return best


def _from(points: Sequence[dict]) -> list[dict]:
    return [q for q in points if q["limit"] >= DROP_FROM - 1e-12]


def fig9_data(quick: bool, limits: Sequence[float] = LIMITS) -> dict[str, Any]:
    """Fig. 9's curves (``v-shape``) per panel, and the [CALC] check curves of docs/theory.md §9.6."""
    data: dict[str, Any] = {"limits": list(limits), "quick": quick, "panels": [], "calc": []}
    todo = panels(quick)
    for i, pn in enumerate(todo, start=1):
        log.info("fig09: panel %d of %d (%s, p=%d, m=%d)", i, len(todo), pn.model, pn.p, pn.m)
        pts = curve("v-shape", pn.p, pn.m, pn.costs, limits)
        data["panels"].append({"model": pn.model, "p": pn.p, "m": pn.m, "microbatch_size": pn.microbatch_size,
                               "costs": pn.costs.to_dict(), "how": pn.how, "v": pts, "drop": steepest_drop(_from(pts))})
    for (p, m, costs), readings in paper.FIG9_CALC.items():
        c = Costs(*costs)
        pts = curve("v-shape", p, m, c, sorted(readings), from_smallest=False)
        data["calc"].append({"p": p, "m": m, "costs": list(costs), "paper": {str(k): v for k, v in readings.items()},
                             "v": pts, "how": f"simulated, costs {costs} (full device-stage; docs/theory.md §9.6)"})
    return data


def fig10_data(quick: bool, limits: Sequence[float] = LIMITS) -> dict[str, Any]:
    """Fig. 10's curves: ``v-shape`` and ``zb`` per panel, and 1F1B's bubble rate."""
    data: dict[str, Any] = {"limits": list(limits), "quick": quick, "panels": []}
    todo = panels(quick)
    for i, pn in enumerate(todo, start=1):
        log.info("fig10: panel %d of %d (%s, p=%d, m=%d)", i, len(todo), pn.model, pn.p, pn.m)
        v = curve("v-shape", pn.p, pn.m, pn.costs, limits)
        z = curve("zb", pn.p, pn.m, pn.costs, limits)
        both = [(a["bubble_rate"], b["bubble_rate"]) for a, b in zip(v, z)
                if a["bubble_rate"] is not None and b["bubble_rate"] is not None]
        data["panels"].append({
            "model": pn.model, "p": pn.p, "m": pn.m, "microbatch_size": pn.microbatch_size,
            "costs": pn.costs.to_dict(), "how": pn.how, "v": v, "zb": z,
            "bubble_rate_1f1b": reference_1f1b(pn.p, pn.m, pn.costs),
            "v_not_above_zb": (sum(1 for a, b in both if a <= b + 1e-9) / len(both)) if both else None,
            "v_drop": steepest_drop(_from(v)), "zb_drop": steepest_drop(_from(z)),
        })
    return data


# ------------------------------------------------------------------------------------------
# figures (plotly)

V_COLOR, ZB_COLOR, ONE_COLOR = "#1F77B4", "#FF7F0E", "#555555"
M_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728")
CALC_COLORS = ("#9467BD", "#8C564B")


def _xy(points: Sequence[dict]) -> tuple[list[float], list[float]]:
    pts = [q for q in points if q["bubble_rate"] is not None]
    return [q["limit"] for q in pts], [q["bubble_rate"] for q in pts]


def fig9_figure(data: dict[str, Any], font_family: str = "Helvetica, Arial, sans-serif"):
    """Fig. 9: one panel per model (a line per m), plus the [CALC] check panel."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help
    from plotly.subplots import make_subplots  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    models = list(dict.fromkeys(pn["model"] for pn in data["panels"]))
    titles = []
    for name in models:
        p = next(pn["p"] for pn in data["panels"] if pn["model"] == name)
        titles.append(f"{name}, p = {p}")
    titles.append("check: p = 16, m = 64 (our calculation)")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.06)
    for col, name in enumerate(models, start=1):
        for i, pn in enumerate(pn for pn in data["panels"] if pn["model"] == name):
            x, y = _xy(pn["v"])
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"m = {pn['m'] // pn['p']}p",
                                     legendgroup=f"m{i}", showlegend=col == 1,
                                     line=dict(color=M_COLORS[i % len(M_COLORS)], shape="hv"),
                                     marker=dict(size=5),
                                     hovertemplate=f"{name} m={pn['m']}<br>limit %{{x}}<br>bubble %{{y:.4f}}<extra></extra>",
                                     meta={"kind": "v", "model": name, "m": pn["m"]}), row=1, col=col)
    col = len(titles)
    for j, cc in enumerate(data["calc"]):
        label = "F=B=W" if len(set(cc["costs"][:3])) == 1 else "example costs"
        x, y = _xy(cc["v"])
        color = CALC_COLORS[j % len(CALC_COLORS)]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"ours, {label}", line=dict(color=color),
                                 meta={"kind": "calc-ours", "costs": cc["costs"]}), row=1, col=col)
        fig.add_trace(go.Scatter(x=[float(k) for k in cc["paper"]], y=list(cc["paper"].values()), mode="markers",
                                 name=f"authors' scheduler, {label}",
                                 marker=dict(symbol="x", size=9, color=color),
                                 meta={"kind": "calc-paper", "costs": cc["costs"]}), row=1, col=col)
    scale = "quick: CPU-sized p" if data["quick"] else "paper p"
    fig.update_layout(
        title=f"Fig. 9 (simulated, A100 cost model; {scale}) — V scheduler: bubble rate vs memory limit",
        height=380, width=330 * len(titles), plot_bgcolor="white", font=dict(family=font_family, size=11),
        margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.18))
    fig.update_xaxes(title_text="memory limit / 1F1B", range=[0, 2.05], showgrid=True, gridcolor="#EEEEEE")
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", rangemode="tozero")
    fig.update_yaxes(title_text="bubble rate", row=1, col=1)
    return fig


def fig10_figure(data: dict[str, Any], font_family: str = "Helvetica, Arial, sans-serif"):
    """Fig. 10: rows m = 2p … 16p, columns the models; V vs ZB scheduler, 1F1B dashed."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help
    from plotly.subplots import make_subplots  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    models = list(dict.fromkeys(pn["model"] for pn in data["panels"]))
    ks = sorted({pn["m"] // pn["p"] for pn in data["panels"]})
    grid = {(pn["m"] // pn["p"], pn["model"]): pn for pn in data["panels"]}
    titles = [f"{name}, p = {grid[k, name]['p']}, m = {grid[k, name]['m']}" for k in ks for name in models]
    fig = make_subplots(rows=len(ks), cols=len(models), subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.07)
    first = True
    for r, k in enumerate(ks, start=1):
        for c, name in enumerate(models, start=1):
            pn = grid[k, name]
            for key, label, color in (("v", "V Scheduler", V_COLOR), ("zb", "ZB Scheduler", ZB_COLOR)):
                x, y = _xy(pn[key])
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=label, legendgroup=key, showlegend=first,
                                         line=dict(color=color, shape="hv"),
                                         meta={"kind": key, "model": name, "m": pn["m"]}), row=r, col=c)
            fig.add_trace(go.Scatter(x=[0, 2], y=[pn["bubble_rate_1f1b"]] * 2, mode="lines", name="1F1B",
                                     legendgroup="1f1b", showlegend=first, line=dict(color=ONE_COLOR, dash="dash"),
                                     meta={"kind": "1f1b", "model": name, "m": pn["m"]}), row=r, col=c)
            first = False
    scale = "quick: CPU-sized p" if data["quick"] else "paper p"
    fig.update_layout(
        title=f"Fig. 10 (simulated, A100 cost model; {scale}) — V vs ZB scheduler: bubble rate vs memory limit",
        height=230 * len(ks) + 110, width=1150, plot_bgcolor="white", font=dict(family=font_family, size=11),
        margin=dict(l=60, r=20, t=80, b=50), legend=dict(orientation="h", y=-0.06))
    fig.update_xaxes(range=[0, 2.05], showgrid=True, gridcolor="#EEEEEE")
    fig.update_xaxes(title_text="memory limit / 1F1B", row=len(ks))
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", rangemode="tozero")
    for r in range(1, len(ks) + 1):
        fig.update_yaxes(title_text="bubble rate", row=r, col=1)
    return fig


def write(fig, out: str | Path, stem: str, formats: Sequence[str] = ("png", "svg", "html")) -> list[str]:
    """Write ``fig`` as ``out/stem.{png,svg,html}`` (static formats need kaleido's Chromium; the HTML
    loads plotly.js from its CDN, which keeps the committed file small but needs a network to view).
    Deterministic: unchanged inputs give byte-identical files (:mod:`ctrlmem.plots.figio`)."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return write_files([(fig, out / f"{stem}.{ext}") for ext in formats], include_plotlyjs="cdn")


# ------------------------------------------------------------------------------------------
# Fig. 7: MFU against activation memory, with the Pareto frontier

FIG7_METHODS = {
    # the paper's label -> (registered schedule, build kwargs)
    "1F1B": ("1f1b", {}),
    "1F1B-R": ("1f1b-r", {}),
    "ZB-1P": ("zb", {"memory_limit": 1.0}),
    "ZB-2P": ("zb", {"memory_limit": 2.0}),
    "Interleaved 1F1B": ("interleaved-1f1b", {}),
    "V-Min": ("v-min", {}),
    "V-Half": ("v-half", {}),
    "V-ZB": ("v-zb", {}),
}


def fig7_data() -> dict[str, Any]:
    """Fig. 7's points: for each panel of docs/theory.md §9.3 and each method, the predicted MFU
    (%) and activation memory (GB) from :func:`ctrlmem.experiments.simulate_point` on the A100
    cost model (``None`` with the reason for a schedule that is not registered), and the Pareto
    frontier of ours among the points whose total memory fits an A100 80 GB."""
    from ctrlmem.plots.figures import pareto_frontier  # noqa: PLC0415 - imports plotly; loaded on first drawing, not with ctrlmem --help

    panels_out = []
    for i, ((model, p, m, mb), readings) in enumerate(paper.FIG7_POINTS.items(), start=1):
        log.info("fig07: panel %d of %d (%s, p=%d, m=%d)", i, len(paper.FIG7_POINTS), model, p, m)
        pts = []
        for label, (name, kw) in FIG7_METHODS.items():
            if name not in SCHEDULES:
                pts.append({"name": label, "schedule": name, "mfu": None, "gb": None,
                            "reason": f"schedule {name!r} not registered"})
                continue
            r = simulate_point(name, p, m, costs="paper", model=model, microbatch_size=mb, **kw)
            pts.append({"name": label, "schedule": name, "mfu": 100 * r["mfu_predicted"], "gb": r["activation_gb"],
                        "total_gb": r["total_memory_gb"], "fits_a100_80gb": r["fits_a100_80gb"]})
        fits = [q for q in pts if q["mfu"] is not None and q["fits_a100_80gb"]]  # the paper: OOM is not plotted
        frontier = [q["name"] for q in pareto_frontier(fits, x="gb", y="mfu")]
        panels_out.append({"model": model, "p": p, "m": m, "microbatch_size": mb, "points": pts,
                           "frontier": frontier, "paper": {k: list(v) for k, v in readings.items()},
                           "paper_frontier": list(paper.FIG7_FRONTIER.get((model, p, m, mb), ())),
                           "how": f"simulated, A100 cost model (ctrlmem.model.paper, {paper.DEFAULT_EFFICIENCY:.0%} of "
                                  f"peak, seq {paper.ASSUMED_SEQ_LEN}, mb {mb}); MFU omits the optimizer step"})
    return {"panels": panels_out}


def fig7_figure(data: dict[str, Any], font_family: str = "Helvetica, Arial, sans-serif"):
    """Fig. 7: one panel per model, MFU against activation GB, our frontier in red and the
    paper's approximate readings as grey crosses."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help
    from plotly.subplots import make_subplots  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    from ctrlmem.plots.figures import DEVICE_COLORS  # noqa: PLC0415 - imports plotly; loaded on first drawing, not with ctrlmem --help

    pns = data["panels"]
    fig = make_subplots(rows=1, cols=len(pns), horizontal_spacing=0.06,
                        subplot_titles=[f"{pn['model']}, p = {pn['p']}, m = {pn['m']}, mb = {pn['microbatch_size']}"
                                        for pn in pns])
    names = list(FIG7_METHODS)
    for col, pn in enumerate(pns, start=1):
        ok = {q["name"]: q for q in pn["points"] if q["mfu"] is not None}
        for i, name in enumerate(names):
            color = DEVICE_COLORS[i % len(DEVICE_COLORS)]
            if name in ok:
                fits = ok[name]["fits_a100_80gb"]
                fig.add_trace(go.Scatter(x=[ok[name]["gb"]], y=[ok[name]["mfu"]], mode="markers",
                                         name=name if fits else f"{name} (over 80 GB)", legendgroup=name,
                                         showlegend=col == 1 or not fits,
                                         marker=dict(size=10, color=color, symbol="circle" if fits else "circle-open"),
                                         meta={"kind": "ours", "name": name, "fits_a100_80gb": fits}), row=1, col=col)
            elif name in pn["paper"] and col == 1:
                fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name} (paper only: not registered)",
                                         legendgroup=name, marker=dict(size=9, color=color, symbol="x-thin",
                                                                       line=dict(width=2, color=color)),
                                         meta={"kind": "legend", "name": name}), row=1, col=col)
            if name in pn["paper"]:
                mfu, gb = pn["paper"][name]
                fig.add_trace(go.Scatter(x=[gb], y=[mfu], mode="markers", name=f"{name} (paper)",
                                         legendgroup=name, showlegend=False,
                                         marker=dict(size=9, color=color, symbol="x-thin", line=dict(width=2, color=color)),
                                         meta={"kind": "paper", "name": name}), row=1, col=col)
        front = [ok[n] for n in pn["frontier"]]
        fig.add_trace(go.Scatter(x=[q["gb"] for q in front], y=[q["mfu"] for q in front], mode="lines",
                                 line=dict(color="#C23B3B", width=1.5, shape="hv"), name="Pareto frontier (ours)",
                                 showlegend=col == 1, hoverinfo="skip", meta={"kind": "frontier"}), row=1, col=col)
    fig.update_layout(
        title="Fig. 7 (simulated, A100 cost model) — MFU vs activation memory; dots ours, thin crosses the "
              "paper's approximate readings",
        height=420, width=1250, plot_bgcolor="white", font=dict(family=font_family, size=11),
        margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(title_text="activation memory (GB)", showgrid=True, gridcolor="#EEEEEE", rangemode="tozero")
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE")
    fig.update_yaxes(title_text="MFU (%)", row=1, col=1)
    return fig
