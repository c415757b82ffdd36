"""The memory levers below V-Min's memory (issue 26's figure; docs/theory.md §13): at p = 16,
m = 64, F = B = W = 1 and a copy of one ``a`` taking ½ F each way, the makespan of the budgeted
V-shape search against the budget (1/p … 1.0 of 1F1B's memory) without levers and with
``recompute="auto", offload="auto"``, next to 1F1B-R's point; and an offloading V schedule
(``offload="auto"``, no recomputation) against 1F1B-R as the copy cost grows, at 1F1B-R's own
memory and at it rounded up to whole V stage activations (``a/2`` each): the copy cost at which
offloading stops paying is our own claim line (``claims.md``).

Writes ``out/memory-levers.{png,svg,html}`` and ``out/memory-levers.json`` (read by ``claims``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ctrlmem.model.costs import Costs
from ctrlmem.model.paper import NOT_RECOVERED
from ctrlmem.model.simulate import simulate
from ctrlmem.reproduce.common import is_registered
from ctrlmem.reproduce.curves import write_curve_figure
from ctrlmem.reproduce.table import Cell, Table, pending, write_json
from ctrlmem.schedules import build

__all__ = ["memory_levers", "levers_data", "levers_figure", "P", "M", "OFFLOAD_COST"]

P, M = 16, 64
OFFLOAD_COST = 0.5
"""The copy of one ``a`` in units of F (one direction)."""

BUDGETS = (1 / 16, 1 / 8, 0.2, 1 / 4, 3 / 8, 1 / 2, 1.0)
COPY_COSTS = (0.0, 1 / 8, 1 / 2, 1.0, 2.0, 4.0)
QUICK_BUDGETS = (1 / 16, 0.2, 1 / 2, 1.0)
QUICK_COPY_COSTS = (0.0, 1 / 2, 2.0)

HOW = f"simulated, p = {P}, m = {M}, F = B = W = 1"


def _point(name: str, costs: Costs, **kw) -> dict[str, Any]:
    """Makespan, peak / 1F1B's ``p·a`` and the number of levers of one build (``None`` values when
    no schedule fits)."""
    try:
        s = build(name, P, M, costs=costs, **kw)
    except ValueError as exc:
        return {"makespan": None, "peak": None, "why": str(exc)}
    r = simulate(s, costs)
    recomputed = sum(1 for row in s.device_passes for ps in row if ps.op.name == "R")
    offloaded = sum(1 for row in s.copies for c in row if c.kind == "O")
    return {"makespan": r.makespan, "peak": r.max_peak_memory / P, "recomputed": recomputed, "offloaded": offloaded}


def levers_data(quick: bool) -> dict[str, Any]:
    """The curves: per budget, the V-shape search without and with levers; 1F1B-R's and 1F1B's
    points; per copy cost, the offloading V-shape search within 1F1B-R's memory."""
    costs = Costs(1, 1, 1, offload=OFFLOAD_COST)
    budgets = QUICK_BUDGETS if quick else BUDGETS
    data: dict[str, Any] = {"p": P, "m": M, "offload_cost": OFFLOAD_COST, "quick": quick,
                            "plain": [], "levers": [], "copy": []}
    for limit in budgets:
        data["plain"].append({"limit": limit, **_point("v-shape", costs, memory_limit=limit)})
        data["levers"].append({"limit": limit, **_point("v-shape", costs, memory_limit=limit, recompute="auto",
                                                        offload="auto")})
    data["1f1b"] = _point("1f1b", costs)
    data["1f1b-r"] = _point("1f1b-r", costs) if is_registered("1f1b-r") else None
    if data["1f1b-r"] is None:
        return data
    equal = data["1f1b-r"]["peak"]
    whole = math.ceil(equal * 2 * P - 1e-9) / (2 * P)  # whole V stage activations, a/2 each
    for limit, label in ((equal, "1F1B-R's memory"), (whole, "1F1B-R's memory in whole V stages")):
        pts = []
        for c in QUICK_COPY_COSTS if quick else COPY_COSTS:
            cc = Costs(1, 1, 1, offload=c)
            pts.append({"offload_cost": c, **_point("v-shape", cc, memory_limit=limit, offload="auto")})
        data["copy"].append({"limit": limit, "label": label, "points": pts,
                             "stops_paying": stops_paying(pts, data["1f1b-r"]["makespan"])})
    return data


def stops_paying(copy: list[dict], reference: float) -> dict[str, Any]:
    """The largest copy cost of the sweep at which the offloading V schedule is still faster than
    ``reference`` (1F1B-R's makespan), and the first at which it is not (``None`` when never)."""
    pays = [q["offload_cost"] for q in copy if q["makespan"] is not None and q["makespan"] < reference]
    stop = [q["offload_cost"] for q in copy if q["makespan"] is None or q["makespan"] >= reference]
    last = max(pays) if pays else None
    first = min((c for c in stop if last is None or c > last), default=None)
    return {"last_faster": last, "first_not": first}


def levers_figure(data: dict[str, Any], font_family: str = "Helvetica, Arial, sans-serif"):
    """Two panels: makespan against the budget (with, without levers; 1F1B-R, 1F1B), and against
    the copy cost within 1F1B-R's memory."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help
    from plotly.subplots import make_subplots  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "makespan against the budget (copy ½ F)", "V-shape + offload against the copy cost, vs 1F1B-R"))
    for key, name, color in (("plain", "V-shape, reordering only", "#1f77b4"),
                             ("levers", "V-shape + recompute/offload auto", "#d62728")):
        pts = [q for q in data[key] if q["makespan"] is not None]
        fig.add_trace(go.Scatter(x=[q["limit"] for q in pts], y=[q["makespan"] for q in pts], mode="lines+markers",
                                 name=name, line=dict(color=color), meta={"kind": key}), row=1, col=1)
    for key, name, symbol in (("1f1b-r", "1F1B-R", "diamond"), ("1f1b", "1F1B", "square")):
        q = data.get(key)
        if q:
            fig.add_trace(go.Scatter(x=[q["peak"]], y=[q["makespan"]], mode="markers", name=name,
                                     marker=dict(symbol=symbol, size=10, color="#2ca02c" if key == "1f1b-r" else "#555"),
                                     meta={"kind": key}), row=1, col=1)
    for sweep, color in zip(data["copy"], ("#9467bd", "#ff7f0e")):
        pts = [q for q in sweep["points"] if q["makespan"] is not None]
        fig.add_trace(go.Scatter(x=[q["offload_cost"] for q in pts], y=[q["makespan"] for q in pts],
                                 mode="lines+markers", line=dict(color=color), meta={"kind": "copy"},
                                 name=f"V-shape + offload at {sweep['limit']:.4g} ({sweep['label']})"), row=1, col=2)
    if data["copy"]:
        ref = data["1f1b-r"]["makespan"]
        xs = [q["offload_cost"] for q in data["copy"][0]["points"]]
        fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[ref, ref], mode="lines", name="1F1B-R",
                                 line=dict(color="#2ca02c", dash="dash"), showlegend=False,
                                 meta={"kind": "1f1b-r-line"}), row=1, col=2)
    fig.update_layout(title=f"Memory levers below V-Min's memory (simulated, p = {data['p']}, m = {data['m']}, "
                            "F = B = W)" + (" — quick" if data["quick"] else ""),
                      height=400, width=1000, plot_bgcolor="white", font=dict(family=font_family, size=11),
                      margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(showgrid=True, gridcolor="#EEEEEE")
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", rangemode="tozero", title_text="makespan (F = 1)")
    fig.update_xaxes(title_text="memory limit / 1F1B's peak", row=1, col=1)
    fig.update_xaxes(title_text="copy of one a, in F (each way)", row=1, col=2)
    return fig


def memory_levers(quick: bool, out: str | Path = "figures") -> Table:
    """The artifact (see the module doc)."""
    t = Table("memory-levers", "Memory levers below V-Min's memory — recompute and offload inside the V schedule "
              "(simulated, our own result)",
              f"Ran the budgeted V-shape search (v-shape) at p = {P}, m = {M}, F = B = W = 1, a copy of one a taking "
              f"{OFFLOAD_COST:g} F each way, at budgets from 1/p to 1.0 of 1F1B's memory without levers and with "
              "recompute='auto', offload='auto'; 1F1B-R and 1F1B at their own memory; and at 1F1B-R's memory, and "
              "at it rounded up to whole V stage activations (a/2), the offloading V-shape search (offload='auto', "
              "no recomputation) over copy costs; drew memory-levers.png/.svg/.html.")
    data = levers_data(quick)
    for a, b in zip(data["plain"], data["levers"]):
        row = f"budget {a['limit']:.4g}"
        for key, q in (("without levers", a), ("with levers", b)):
            ours = q["makespan"] if q["makespan"] is not None else "no schedule fits"
            t.cells.append(Cell(row, f"V-shape makespan, {key}", NOT_RECOVERED, ours, HOW))
        if b["makespan"] is not None:
            t.cells.append(Cell(row, "levers used (recomputed / offloaded forwards)", NOT_RECOVERED,
                                f"{b['recomputed']} / {b['offloaded']}, peak {b['peak']:.4f} × 1F1B's", HOW))
    for key in ("1f1b", "1f1b-r"):
        q = data[key]
        if q is None:
            t.cells.append(Cell(key, "makespan", NOT_RECOVERED, pending(key), "–"))
            continue
        t.cells.append(Cell(key, "makespan", NOT_RECOVERED, q["makespan"], HOW))
        t.cells.append(Cell(key, "peak / 1F1B's", NOT_RECOVERED, round(q["peak"], 4), HOW))
    for sweep in data["copy"]:
        for q in sweep["points"]:
            t.cells.append(Cell(f"budget {sweep['limit']:.4g} ({sweep['label']}), copy {q['offload_cost']:g} F",
                                "V-shape + offload makespan", NOT_RECOVERED,
                                q["makespan"] if q["makespan"] is not None else "no schedule fits",
                                HOW + f"; 1F1B-R: {data['1f1b-r']['makespan']:g}"))
    write_curve_figure(t, levers_figure(data), out, "memory-levers")
    write_json(Path(out) / "memory-levers.json", data)
    t.verdict = levers_summary(data)
    t.notes += [
        "Our own result (the paper has no levers inside its V schedules): not comparable with a paper value.",
        "The searches are greedy (ctrlmem.schedules.auto_levers): a budget's answer is the fastest of reordering "
        "alone and the looser budgets' schedules brought under it with levers, so it need not fall monotonically "
        "with the budget.",
        "Curve data: memory-levers.json.",
    ]
    return t


def levers_summary(data: dict[str, Any]) -> str:
    """One line: at the lowest budget with levers against without, and where offloading stops paying."""
    low = next((a, b) for a, b in zip(data["plain"], data["levers"]) if b["makespan"] is not None)
    parts = [f"budget {low[0]['limit']:.3g}: {low[0]['makespan']:g} without levers, {low[1]['makespan']:g} with"]
    at2 = next(((a, b) for a, b in zip(data["plain"], data["levers"]) if abs(a["limit"] - 0.2) < 1e-9), None)
    if at2 and at2[1]["makespan"] is not None:
        parts.append(f"budget 0.2: {at2[0]['makespan']:g} without, {at2[1]['makespan']:g} with")
    rec = data.get("1f1b-r")
    if rec:
        parts.append(f"1F1B-R {rec['makespan']:g} at {rec['peak']:.3f} × 1F1B's memory")
        parts += [f"offloading V at {sw['limit']:.4g} ({sw['label']}): {paying_words(sw['stops_paying'])}"
                  for sw in data["copy"]]
    return "; ".join(parts)


def paying_words(s: dict[str, Any]) -> str:
    """``stops_paying``'s bracket in words."""
    return ((f"faster than 1F1B-R up to a copy of {s['last_faster']:g} F" if s["last_faster"] is not None
             else "never faster than 1F1B-R")
            + (f", not from {s['first_not']:g} F" if s["first_not"] is not None else ", at every copy cost tried"))
