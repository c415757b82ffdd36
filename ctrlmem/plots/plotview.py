"""A notebook widget that draws plotly figure dicts in place, one ``Plotly.react`` per update:
the explorer's plots and the planner form's figures (``notebooks/30_plan.ipynb``). An update
from a widget callback (a button) reaches the browser through the widget's state, where a
display handle's update would find no cell to go to."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Sequence

__all__ = ["PLOT_ESM", "plot_view_class", "plotly_js"]

PLOT_ESM = r"""
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
      const seq = model.get("seq"), figs = JSON.parse(model.get("figures") || "[]");
      if (seq !== model.get("seq")) return;
      const t0 = performance.now();
      // "drawing" (dims the plots) while the browser draws
      const shell = el.closest(".ctrlmem-explorer");
      if (shell) {
        shell.classList.add("ctrlmem-drawing");
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
      }
      try {
      for (let i = 0; i < gds.length; i++) {
        const f = figs[i];
        if (f && f.keep) continue;  // unchanged since the last state
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
        if (shell) shell.classList.remove("ctrlmem-drawing");
      }
      el.dataset.ctrlmemState = String(seq);
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


def plot_view_class():
    """An anywidget that draws plotly figure dicts with one ``Plotly.react`` per update.

    JupyterLab's plotly mime renderer draws every new output three times (react, redraw,
    resize) and then renders it once more to a PNG it stores in the output; at thousands of
    boxes that is most of the wait. This view keeps one graph per slot and reacts to new data
    (a slot sent as ``{"keep": true}`` stays as drawn), so an update is drawn once. plotly.js
    comes from the installed plotly package (no network), sent once per explorer; the browser
    reports each state drawn back in ``drawn`` and marks the element with its number.
    """
    global _PLOT_VIEW
    if _PLOT_VIEW is not None:
        return _PLOT_VIEW
    import anywidget  # noqa: PLC0415 - only inside Jupyter
    import traitlets  # noqa: PLC0415 - only inside Jupyter

    class PlotView(anywidget.AnyWidget):
        _esm = PLOT_ESM
        names = traitlets.List(traitlets.Unicode()).tag(sync=True)
        figures = traitlets.Unicode("[]").tag(sync=True)
        seq = traitlets.Int(0).tag(sync=True)
        drawn = traitlets.Dict().tag(sync=True)
        plotly_js = traitlets.Unicode("").tag(sync=True)
        width = traitlets.Int(0).tag(sync=True)

        def show(self, figures: Sequence[dict | None], seq: int | None = None,
                 keep: Sequence[bool] | None = None) -> None:
            """Send ``figures`` (JSON-ready dicts; ``None`` hides a slot) as state ``seq``;
            ``keep[i]``: slot ``i`` is unchanged (not sent again). One JSON text: the widget
            machinery then does not walk every number of the figures."""
            keep = list(keep) if keep is not None else [False] * len(figures)
            sent = [{"keep": True} if k else f for f, k in zip(figures, keep)]
            with self.hold_sync():
                self.figures = json.dumps(sent, separators=(",", ":"), allow_nan=False)
                self.seq = seq if seq is not None else self.seq + 1

        @property
        def shown(self) -> list:
            """The figures of the last :meth:`show`, decoded."""
            return json.loads(self.figures) if self.figures else []

    _PLOT_VIEW = PlotView
    return PlotView


def plotly_js() -> str:

    return (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
