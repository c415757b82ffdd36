"""What ``notebooks/30_plan.ipynb`` shows of a plan: the Pareto front of predicted throughput
against memory per GPU, the figure of every simulated configuration, the winner's schedule
diagram, and a small widget form (model — a preset or a config.json path —, GPUs, GB, batch,
cost source) that re-plans."""

from __future__ import annotations

import html
import json
import logging
import shlex

from ctrlmem.model.simulate import simulate
from ctrlmem.planner.core import row_schedule
from ctrlmem.planner.emit import emit
from ctrlmem.planner.model import PRESET_NAMES
from ctrlmem.planner.core import plan
from ctrlmem.plots.plotview import plot_view_class, plotly_js

__all__ = ["pareto_front", "throughput_memory_figure", "winner_figure", "table_html", "plan_command", "PlanForm"]

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


#: ``plan`` keyword -> ``ctrlmem plan`` option, for the keywords that take a value as it is
#: (lists joined with commas)
_CLI_VALUE = {"seq_len": "--seq-len", "layers": "--layers", "hidden": "--hidden", "heads": "--heads",
              "vocab": "--vocab", "schedules": "--schedules", "microbatch_sizes": "--microbatch-sizes", "tp": "--tp",
              "pp": "--pp", "min_pp": "--min-pp", "reserve_gb": "--reserve-gb", "dp_gbs": "--dp-gbs",
              "p2p_gbs": "--p2p-gbs", "gpus_per_node": "--gpus-per-node", "top": "--per-schedule",
              "layer_split": "--layer-split", "ep": "--ep", "recompute": "--recompute", "nvlink_gbs": "--nvlink-gbs",
              "ib_gbs": "--ib-gbs"}


def _cli_value(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cli_flag(key: str, value) -> list[str]:
    """The ``ctrlmem plan`` words for one keyword of :func:`ctrlmem.plan`."""
    if key in _CLI_VALUE:
        return [] if value is None else [_CLI_VALUE[key], _cli_value(value)]
    if key == "exhaustive":
        return ["--exhaustive"] if value else []
    if key == "flash_attention":
        return [] if value else ["--no-flash-attention"]
    if key == "distributed_optimizer":
        return ["--distributed-optimizer", {True: "yes", False: "no"}.get(value, str(value))]
    if key == "allocator":
        return ["--allocator-margin", "none" if value is None else str(value)]
    if key == "progress":
        return ["--no-progress"] if not value else []
    raise ValueError(f"plan keyword {key!r} has no `ctrlmem plan` option; plan without it to get a command line")


def plan_command(model: str, gpus: int, gpu_memory_gb: float, global_batch: int, costs: str,
                 emit_dir: str = "DIR", force: bool = False, **plan_kwargs) -> str:
    """The ``ctrlmem plan ... --emit DIR`` line that plans as ``ctrlmem.plan(model, gpus,
    gpu_memory_gb, global_batch, costs=costs, **plan_kwargs)`` does and writes its winner into
    ``emit_dir``. A keyword with no command-line option, or costs that are not a name or a
    path, raise ``ValueError``."""
    if not isinstance(costs, str):
        raise ValueError("costs given as an object have no command line; give a100, h200, a replay file or F,B,W")
    words = ["ctrlmem", "plan", "--model", str(model), "--gpus", str(int(gpus)), "--gpu-memory-gb",
             f"{float(gpu_memory_gb):g}", "--global-batch", str(int(global_batch)), "--costs-from", costs]
    for key, value in plan_kwargs.items():
        words += _cli_flag(key, value)
    words += ["--emit", str(emit_dir) or "DIR"] + (["--force"] if force else [])
    return " ".join(shlex.quote(w) for w in words)


def _figure_dict(fig) -> dict:
    """A plotly figure as a JSON-ready dict (numpy arrays as lists)."""
    return json.loads(fig.to_json())


class PlanForm:
    """Widgets for the model, GPUs, GB per GPU, global batch and cost source; **plan** re-runs
    :func:`ctrlmem.plan` with them (the other arguments fixed by ``plan_kwargs``) and shows the
    ranked table, the throughput–memory figure and the winner's diagram (both replaced by every
    plan, cleared when nothing fits), the ``ctrlmem plan ... --emit DIR`` line of the plan on
    screen, and **write emit files**, which writes its winner (:func:`ctrlmem.planner.emit.emit`)
    into the folder named beside it. ``form.df`` holds the last plan. The figures are a
    :func:`ctrlmem.plots.plotview.plot_view_class` widget inside the form: a button's callback
    reaches it through the widget state (a display handle's update from a callback had no cell to
    go to, so the first plan's figures stayed)."""

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
        self.plots = plot_view_class()(names=["ctrlmem-plan-front", "ctrlmem-plan-winner"], plotly_js=plotly_js())
        self.command = W.HTML()
        self.folder = W.Text(value="build/plan/emit", description="emit folder", style=style,
                             layout=W.Layout(width="360px"))
        self.force = W.Checkbox(value=False, description="replace files ctrlmem did not write (--force)",
                                indent=False)
        self.emit_button = W.Button(description="write emit files", disabled=True)
        self.emit_button.on_click(lambda _b: self.write_emit())
        self.emitted = W.HTML()
        for w in (self.folder, self.force):
            w.observe(lambda _c: self._show_command(), names="value")
        self.kwargs = plan_kwargs
        self.df = None
        self._planned = None  # the widget values of the plan on screen
        self.widget = W.VBox([W.HBox([self.model, self.gpus, self.gb, self.batch, self.costs, self.button]),
                              self.message, self.table, self.plots, self.command,
                              W.HBox([self.folder, self.force, self.emit_button]), self.emitted])

    def run(self):
        """Plan with the widgets' values; a bad value shows a message instead of a traceback (and
        leaves the last plan on screen)."""
        self.message.value = "<i>planning…</i>"
        values = (self.model.value, int(self.gpus.value), float(self.gb.value), int(self.batch.value),
                  self.costs.value)
        try:
            df = plan(*values[:4], costs=values[4], **self.kwargs)
        except (ValueError, TypeError) as exc:
            self.message.value = f"<b>Cannot plan:</b> {html.escape(str(exc))}"
            return None
        self.df, self._planned = df, values
        fits = bool((df["status"] == "ok").any())
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in df.attrs["notes"])
        self.message.value = (f"<small>{len(df)} configurations in {df.attrs['seconds']:.1f} s, "
                              f"{df.attrs['builds']} schedule builds</small><ul>{notes}</ul>"
                              + ("" if fits else "<b>nothing fits: no figure</b>"))
        self.table.value = table_html(df)
        self.plots.show([_figure_dict(throughput_memory_figure(df)), _figure_dict(winner_figure(df))] if fits
                        else [None, None])
        self.emit_button.disabled = not fits
        self.emitted.value = ""
        self._show_command()
        return df

    def command_line(self) -> str:
        """The ``ctrlmem plan ... --emit DIR`` line of the plan on screen (``DIR``: the emit
        folder's field)."""
        if self._planned is None:
            raise ValueError("nothing planned yet; press plan first")
        return plan_command(*self._planned, emit_dir=self.folder.value.strip() or "DIR", force=self.force.value,
                            **self.kwargs)

    def _show_command(self) -> None:
        if self._planned is None:
            return
        try:
            line = html.escape(self.command_line())
        except ValueError as exc:
            self.command.value = f"<small>no command line: {html.escape(str(exc))}</small>"
            return
        self.command.value = f"<small>the same plan from a shell (writes the winner into the folder):</small><br><code>{line}</code>"

    def write_emit(self) -> dict[str, str] | None:
        """Write the winner of the plan on screen into the emit folder (the files of ``ctrlmem plan
        --emit``; a file there that ctrlmem did not write is replaced only with the box ticked).
        Returns ``{kind: path}``, or ``None`` with the reason shown."""
        if self.df is None:
            self.emitted.value = "<b>Cannot write:</b> nothing planned yet; press plan first"
            return None
        try:
            paths = emit(self.df, self.folder.value.strip(), force=self.force.value)
        except (ValueError, OSError) as exc:
            self.emitted.value = f"<b>Cannot write:</b> {html.escape(str(exc))}"
            return None
        self.emitted.value = "wrote " + ", ".join(f"<code>{html.escape(p)}</code>" for p in paths.values())
        return paths

    def _ipython_display_(self):
        from IPython.display import display  # noqa: PLC0415 - only inside Jupyter

        display(self.widget)
