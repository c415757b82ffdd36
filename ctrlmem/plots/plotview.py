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

const TYPED = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array,
               u1: Uint8Array, u2: Uint16Array, u4: Uint32Array};
function typed(spec) {  // a typed-array spec {dtype, bdata} (or a plain list) as an array
  if (!spec || !spec.bdata) return spec || [];
  const raw = atob(spec.bdata), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new TYPED[spec.dtype](bytes.buffer);
}
const g4 = x => Number(x).toPrecision(4);  // plotly's ":.4g"

// the hover of a raster overview drawn with its table (figures.schedule_spec overview_hover="table"):
// plotly reports the cell under the mouse, the label is drawn here with plotly's own hover box
function hoverTables(gd, Plotly, tables) {
  gd.__ctrlmemHover = tables || [];  // decoded on the first hover (not on the way to the screen)
  if (gd.__ctrlmemHooked || !gd.on) return;
  gd.__ctrlmemHooked = true;
  const layer = () => gd._fullLayout && gd._fullLayout._hoverlayer && gd._fullLayout._hoverlayer.node();
  gd.on("plotly_hover", ev => {
    const pt = ev && ev.points && ev.points[0];
    const raw = pt && (gd.__ctrlmemHover || []).find(t => t.trace === pt.curveNumber);
    if (!raw || !Array.isArray(pt.pointNumber)) return;
    if (!raw.decoded) raw.decoded = {stage: typed(raw.stage), microbatch: typed(raw.microbatch),
                                     start: typed(raw.start), end: typed(raw.end)};
    const table = Object.assign({template: raw.template, columns: raw.columns}, raw.decoded);
    const [d, j] = pt.pointNumber, k = d * table.columns + j;
    if (!(table.microbatch[k] >= 0)) return;  // idle
    const full = pt.fullData || {}, kind = Math.floor((pt.z - 1) / 2);
    const code = ((full.meta || {}).codes || [])[kind] || ["?", 0];
    const fields = {op: code[0], chunk: code[1], stage: table.stage[k], microbatch: table.microbatch[k],
                    device: d, start: g4(table.start[k]), end: g4(table.end[k])};
    const text = table.template.replace(/\{(\w+)\}/g, (m, key) => key in fields ? String(fields[key]) : m);
    const fill = ((full.colorscale || [])[2 * (Math.round(pt.z) - 1)] || [0, "#444"])[1];
    const xa = pt.xaxis, ya = pt.yaxis;
    Plotly.Fx.loneHover({x: xa._offset + xa.l2p(pt.x), y: ya._offset + ya.l2p(d), text: text, color: fill},
                        {container: layer(), outerContainer: gd._fullLayout._paperdiv.node(), gd: gd});
  });
  gd.on("plotly_unhover", () => { const c = layer(); if (c) Plotly.Fx.loneUnhover(c); });
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
    const decode = v => v instanceof DataView ? new TextDecoder().decode(v) : (v || "[]");
    // each state's figures are taken in as it arrives: a slot sent as {"keep": true} keeps what an
    // earlier state (drawn or not yet) put there, so a state that only changes the comparisons,
    // arriving before the browser drew the one before, does not lose that one's main plots
    const pending = gds.map(() => undefined);  // per slot: a figure to draw, null to hide, undefined: nothing new
    let takenSeq = null, drawnSeq = null, received = 0;
    const take = () => {
      const seq = model.get("seq");
      if (seq === takenSeq) return;
      takenSeq = seq;
      received = performance.now();
      JSON.parse(decode(model.get("figures"))).forEach((f, i) => {
        if (i < pending.length && !(f && f.keep)) pending[i] = f || null;
      });
    };
    let busy = Promise.resolve();
    const draw = () => { busy = busy.then(async () => {
      const seq = takenSeq;
      if (seq === drawnSeq) return;  // drawn already (several messages, one drawing)
      const t0 = Math.min(received, performance.now());
      const slots = [];
      // "drawing" (dims the plots) while the browser draws; an explorer marked pending since the
      // edit shows them dimmed already (no frame to wait for)
      const shell = el.closest(".ctrlmem-explorer");
      if (shell) {
        const dimmed = shell.classList.contains("ctrlmem-pending");
        shell.classList.add("ctrlmem-drawing");
        if (!dimmed) await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
      }
      try {
      for (let i = 0; i < gds.length; i++) {
        const f = pending[i];
        if (f === undefined) { slots.push(0); continue; }  // unchanged since it was drawn
        pending[i] = undefined;
        if (i === model.get("main") && slots.some(x => x > 0)) {
          // the slots before are on screen first: the rest (comparisons) follow a frame later
          await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
        }
        if (!f) { Plotly.purge(gds[i]); gds[i].parentNode.style.display = "none"; slots.push(0); continue; }
        gds[i].parentNode.style.display = "";
        const t1 = performance.now();
        await Plotly.react(gds[i], f.data, f.layout, f.config || {});
        hoverTables(gds[i], Plotly, f.hover);
        slots.push(performance.now() - t1);
      }
      } catch (e) {
        console.error("ctrlmem plot", e);
        model.set("drawn", {seq: seq, ms: performance.now() - t0, error: String(e)});
        model.save_changes();
        return;
      } finally {
        if (shell) shell.classList.remove("ctrlmem-drawing");
      }
      if (pending.some(f => f !== undefined)) { drawnSeq = seq; return; }  // a newer state came meanwhile: its drawing reports
      drawnSeq = takenSeq;
      el.dataset.ctrlmemState = String(takenSeq);
      await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));  // on screen
      model.set("drawn", {seq: takenSeq, ms: performance.now() - t0, slots: slots});
      model.save_changes();
    }).catch(e => console.error("ctrlmem plot", e)); };
    model.on("change:seq", () => { take(); draw(); });
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
    take();
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
    (a slot sent as ``{"keep": true}`` stays as drawn), so an update is drawn once; the first
    ``main`` slots are put on screen before the others are drawn. The figures travel as one
    binary buffer of JSON text (not a JSON string inside the widget message, which the kernel,
    the server and the browser would each escape or parse again). An overview drawn with its
    hover as a table (:func:`ctrlmem.plots.figures.schedule_spec` ``overview_hover="table"``) is
    sent without it and the table beside the figure: the view shows that hover itself, in
    plotly's hover box. plotly.js comes from the installed plotly package (no network), sent once
    per view; the browser reports each state drawn back in ``drawn`` (``seq``, ``ms`` from the
    message to the plots on screen, ``slots``: each slot's drawing in ms) and marks the element
    with its number.
    """
    global _PLOT_VIEW
    if _PLOT_VIEW is not None:
        return _PLOT_VIEW
    import anywidget  # noqa: PLC0415 - only inside Jupyter
    import traitlets  # noqa: PLC0415 - only inside Jupyter

    class PlotView(anywidget.AnyWidget):
        _esm = PLOT_ESM
        names = traitlets.List(traitlets.Unicode()).tag(sync=True)
        figures = traitlets.Bytes(b"[]").tag(sync=True)
        seq = traitlets.Int(0).tag(sync=True)
        main = traitlets.Int(0).tag(sync=True)
        drawn = traitlets.Dict().tag(sync=True)
        plotly_js = traitlets.Unicode("").tag(sync=True)
        width = traitlets.Int(0).tag(sync=True)

        def show(self, figures: Sequence[dict | None], seq: int | None = None,
                 keep: Sequence[bool] | None = None) -> None:
            """Send ``figures`` (JSON-ready dicts; ``None`` hides a slot) as state ``seq``;
            ``keep[i]``: slot ``i`` is unchanged (not sent again)."""
            keep = list(keep) if keep is not None else [False] * len(figures)
            sent = [{"keep": True} if k else _hover_aside(f) for f, k in zip(figures, keep)]
            with self.hold_sync():
                self.figures = json.dumps(sent, separators=(",", ":"), allow_nan=False).encode("utf-8")
                self.seq = seq if seq is not None else self.seq + 1

        @property
        def shown(self) -> list:
            """The figures of the last :meth:`show`, decoded (an overview's hover table under the
            figure's ``"hover"``)."""
            return json.loads(self.figures) if self.figures else []

    _PLOT_VIEW = PlotView
    return PlotView


def _hover_aside(fig: dict | None) -> dict | None:
    """``fig`` with each overview hover table (a trace's ``meta["hover"]``) moved beside the
    figure, as ``fig["hover"]`` entries naming their trace: plotly.js never walks them."""
    if fig is None:
        return None
    data, hover = [], []
    for i, tr in enumerate(fig.get("data", ())):
        meta = tr.get("meta")
        if isinstance(meta, dict) and "hover" in meta:
            hover.append({**meta["hover"], "trace": i})
            tr = {**tr, "meta": {k: v for k, v in meta.items() if k != "hover"}}
        data.append(tr)
    return {**fig, "data": data, "hover": hover} if hover else fig


def plotly_js() -> str:

    return (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
