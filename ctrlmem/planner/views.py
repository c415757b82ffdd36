"""What ``notebooks/30_plan.ipynb`` shows of a plan: the Pareto front of predicted throughput
against memory per GPU, the figure of every simulated configuration, the winner's schedule
diagram, and a small widget form (model — a preset or a config.json path —, GPUs, GB, batch,
cost source) that re-plans."""

from __future__ import annotations

import html
import logging
from ctrlmem.model.simulate import simulate
from ctrlmem.planner.core import row_schedule
from ctrlmem.planner.model import PRESET_NAMES
from ctrlmem.planner.core import plan

__all__ = ["pareto_front", "throughput_memory_figure", "winner_figure", "table_html", "PlanForm"]

log = logging.getLogger(__name__)

TABLE_COLUMNS = ["rank", "schedule", "dp", "tp", "pp", "ep", "recompute", "microbatch_size", "m", "samples_per_s", "mfu",
                 "bubble_rate", "total_gb", "activation_gb", "layer_split", "status"]


def pareto_front(df):
    """The simulated configurations that fit and that no other beats on both counts (more
    samples/s with no more GB per GPU), by increasing memory."""
    ok = df[df["status"] == "ok"].sort_values(["total_gb", "samples_per_s"], ascending=[True, False])
    keep, best = [], -1.0
    for i, r in ok.iterrows():
        if r["samples_per_s"] > best:
            keep.append(i)
            best = r["samples_per_s"]
    return ok.loc[keep]


def throughput_memory_figure(df, title: str | None = None):
    """Predicted samples/s against GB per GPU, one point per simulated configuration (coloured by
    schedule), the Pareto front as a line, the GPU's memory as a dashed line."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    ok = df[df["status"] == "ok"]
    s = df.attrs.get("settings", {})
    fig = go.Figure()
    for name, rows in ok.groupby("schedule", sort=False):
        text = [f"{name}: DP {r.dp}, TP {r.tp}, PP {r.pp}, mb {r.microbatch_size}<br>{r.samples_per_s:.4g} samples/s, "
                f"{r.total_gb:.1f} GB" for r in rows.itertuples()]
        fig.add_trace(go.Scatter(x=rows["total_gb"], y=rows["samples_per_s"], mode="markers", name=name,
                                 text=text, hovertemplate="%{text}<extra></extra>", marker={"size": 8, "opacity": 0.8}))
    front = pareto_front(df)
    if len(front):
        fig.add_trace(go.Scatter(x=front["total_gb"], y=front["samples_per_s"], mode="lines+markers",
                                 name="Pareto front", line={"color": "black", "width": 2, "shape": "hv"},
                                 marker={"size": 12, "symbol": "circle-open", "color": "black"}, hoverinfo="skip"))
    gpu = s.get("gpu_memory_gb")
    if gpu:
        fig.add_vline(x=gpu, line={"dash": "dash", "color": "#C23B3B"},
                      annotation_text=f"{gpu:g} GB per GPU", annotation_position="top left")
    model = s.get("model", {}).get("name", "")
    fig.update_layout(title=title or f"{model} on {s.get('gpus')} GPUs, batch {s.get('global_batch')}: predicted "
                                     f"throughput against memory ({s.get('costs_description', '')})",
                      xaxis_title="memory per GPU (GB, the fullest device)", yaxis_title="predicted samples/s",
                      template="plotly_white", height=480, legend={"title": "schedule"})
    return fig


def winner_figure(df, index: int | None = None):
    """The schedule diagram of row ``index`` (default: the fastest that fits), simulated with its
    own per-stage costs (ms)."""
    from ctrlmem.plots import figures as plot  # noqa: PLC0415 - imports plotly; loaded on first drawing, not with ctrlmem --help

    if index is None:
        ok = df.index[df["status"] == "ok"]
        if not len(ok):
            raise ValueError("no configuration of the plan fits; nothing to draw")
        index = int(ok[0])
    sched, costs = row_schedule(df, index)
    r = df.iloc[index]
    return plot.schedule_figure(simulate(sched, costs), title=(
        f"{r['method']}: DP {r['dp']}, TP {r['tp']}, PP {r['pp']}, microbatch {r['microbatch_size']}, m = {r['m']} "
        f"(one pipeline; time in ms)"))


def table_html(df, rows: int = 12) -> str:
    """The first ``rows`` rows as an HTML table, numbers rounded for reading."""
    shown = df.head(rows)[TABLE_COLUMNS].copy()
    shown["mfu"] = (100 * shown["mfu"]).round(1)
    for col in ("samples_per_s", "total_gb", "activation_gb"):
        shown[col] = shown[col].round(2)
    shown["bubble_rate"] = shown["bubble_rate"].round(3)
    shown = shown.rename(columns={"mfu": "MFU %", "microbatch_size": "mb", "total_gb": "GB/GPU",
                                  "activation_gb": "activation GB", "samples_per_s": "samples/s"})
    return shown.to_html(index=False, na_rep="–")


class PlanForm:
    """Widgets for the model, GPUs, GB per GPU, global batch and cost source; **plan** re-runs
    :func:`ctrlmem.plan` with them (the other arguments fixed by ``plan_kwargs``) and shows the
    ranked table, the throughput–memory figure and the winner's diagram. ``form.df`` holds the
    last plan. The two figures are outputs with display ids, updated in place (an ``Output``
    widget holding plotly figures made papermill runs hang now and then)."""

    def __init__(self, model: str = "9.6b", gpus: int = 8, gpu_memory_gb: float = 40.0, global_batch: int = 256,
                 costs: str = "h200", **plan_kwargs) -> None:
        import ipywidgets as W  # noqa: PLC0415 - only inside Jupyter


        style = {"description_width": "initial"}
        # a preset from the list, or the path of a Hugging Face config.json typed in
        self.model = W.Combobox(options=list(PRESET_NAMES), value=str(model), description="model (preset or config.json)",
                                ensure_option=False, style=style, layout=W.Layout(width="360px"))
        self.gpus = W.BoundedIntText(value=gpus, min=1, max=100000, description="GPUs", style=style,
                                     layout=W.Layout(width="150px"))
        self.gb = W.BoundedFloatText(value=gpu_memory_gb, min=0.1, max=10000, description="GB per GPU", style=style,
                                     layout=W.Layout(width="170px"))
        self.batch = W.BoundedIntText(value=global_batch, min=1, max=10 ** 7, description="global batch",
                                      style=style, layout=W.Layout(width="190px"))
        self.costs = W.Dropdown(options=[("A100 cost model", "a100"), ("H200 rank replay", "h200")], value=costs,
                                description="costs", style=style)
        self.button = W.Button(description="plan", button_style="primary")
        self.button.on_click(lambda _b: self.run())
        self.message = W.HTML()
        self.table = W.HTML()
        self.kwargs = plan_kwargs
        self.df = None
        self._handles = None  # display handles of the two figures, made when the form is shown
        self.widget = W.VBox([W.HBox([self.model, self.gpus, self.gb, self.batch, self.costs, self.button]),
                              self.message, self.table])

    def run(self):
        """Plan with the widgets' values; a bad value shows a message instead of a traceback."""
        from IPython.display import HTML  # noqa: PLC0415 - only inside Jupyter


        self.message.value = "<i>planning…</i>"
        try:
            df = plan(self.model.value, int(self.gpus.value), float(self.gb.value), int(self.batch.value),
                      costs=self.costs.value, **self.kwargs)
        except (ValueError, TypeError) as exc:
            self.message.value = f"<b>Cannot plan:</b> {html.escape(str(exc))}"
            return None
        self.df = df
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in df.attrs["notes"])
        self.message.value = (f"<small>{len(df)} configurations in {df.attrs['seconds']:.1f} s, "
                              f"{df.attrs['builds']} schedule builds</small><ul>{notes}</ul>")
        self.table.value = table_html(df)
        if self._handles is not None:  # replace the figures in place (display handles, no Output widget)
            ok = (df["status"] == "ok").any()
            none = HTML("<i>nothing fits: no figure</i>")
            self._handles[0].update(throughput_memory_figure(df) if ok else none)
            self._handles[1].update(winner_figure(df) if ok else HTML(""))
        return df

    def _ipython_display_(self):
        from IPython.display import HTML, display  # noqa: PLC0415 - only inside Jupyter

        display(self.widget)
        self._handles = (display(HTML(""), display_id=True), display(HTML(""), display_id=True))
