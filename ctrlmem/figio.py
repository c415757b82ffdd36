"""Deterministic figure files: the same figure gives the same bytes, every time.

plotly writes a random ``uuid4`` as the ``<div id>`` of every HTML figure, and kaleido's SVGs
carry a random 6-hex id (``defs-1a2b3c``, ``clip1a2b3cxyplot`` ...) and a random ``uid`` per
trace (``trace6723e6``). Regenerating an unchanged
figure then rewrites the file, and a committed ``figures/`` folder is dirty after every run. This
module replaces these ids with ones derived from the figure's content (traces without a ``uid``
get ``t0``, ``t1``, ... on a copy; the caller's figure is not changed), so regeneration from
unchanged inputs is byte-identical (PNG bytes from kaleido's Chromium are already stable).

API (every figure file of the package is written here: :mod:`ctrlmem.plot` (``draw``, ``figures``, the
explorer's export) after applying its label rule, :mod:`ctrlmem.memory_curves`, :mod:`ctrlmem.reproduce`):

* :func:`write_figures` ``(items, *, scale=2.0, include_plotlyjs=True) -> list[str]`` — write each
  ``(figure, path)``; the format comes from the extension (``.html``, ``.png``, ``.svg``, ``.pdf``); all
  static images go through one kaleido session; returns the paths as strings.
* :func:`write_figure` ``(fig, path, **kw) -> str`` — one figure.
* :func:`figure_html` ``(fig, include_plotlyjs=True, full_html=True) -> str`` — the HTML text
  with a content-derived div id (e.g. for embedding).
* :func:`stable_div_id` ``(fig) -> str`` and :func:`stabilize_svg` ``(path)`` — the two fixes alone.

``include_plotlyjs`` is plotly's: ``True`` embeds plotly.js (works offline, ~4.7 MB), ``"cdn"``
loads it from the CDN (small file, needs a network to view). Static export needs kaleido's
Chromium (Debian's ``chromium`` works); without it kaleido raises and nothing static is written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Sequence

__all__ = ["write_figures", "write_figure", "figure_html", "stable_div_id", "stabilize_svg"]

log = logging.getLogger(__name__)

_FORMATS = ("html", "png", "svg", "pdf")


def _extension(path: str) -> str:
    ext = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if ext not in _FORMATS:
        raise ValueError(f"cannot write {path!r}: the file name must end in .html, .png, .svg or .pdf")
    return ext


def _with_trace_uids(fig):
    """A copy of ``fig`` whose traces without a ``uid`` get ``t<index>`` (plotly/kaleido would
    otherwise draw a random one into every SVG)."""
    import plotly.graph_objects as go

    if all(tr.uid is not None for tr in fig.data):
        return fig
    fig = go.Figure(fig)
    for i, tr in enumerate(fig.data):
        if tr.uid is None:
            tr.uid = f"t{i}"
    return fig


def stable_div_id(fig) -> str:
    """A div id derived from the figure's JSON (the same figure always gets the same id)."""
    return "fig-" + hashlib.sha1(fig.to_json().encode()).hexdigest()[:12]


def figure_html(fig, include_plotlyjs: bool | str = True, full_html: bool = True) -> str:
    """``fig.to_html`` with :func:`stable_div_id` instead of plotly's random one."""
    return fig.to_html(include_plotlyjs=include_plotlyjs, full_html=full_html, div_id=stable_div_id(fig))


_SVG_ID = re.compile(r'id="defs-([0-9a-f]{6})"')


def stabilize_svg(path: str | Path) -> None:
    """Replace kaleido's random per-figure id in an SVG file by one derived from the rest of
    its content (no change when the file has no such id)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    match = _SVG_ID.search(text)
    if not match:
        return
    uid = match.group(1)
    stable = hashlib.sha1(text.replace(uid, "").encode()).hexdigest()[:6]
    path.write_text(text.replace(uid, stable), encoding="utf-8")


def write_figures(items: Sequence[tuple[object, object]], *, scale: float = 2.0,
                  include_plotlyjs: bool | str = True) -> list[str]:
    """Write each ``(figure, path)`` by extension, deterministically (see the module doc);
    parent folders are created. Raises ``ValueError`` for an unknown extension before writing."""
    import plotly.io as pio

    items = [(_with_trace_uids(fig), str(path)) for fig, path in items]
    exts = [_extension(path) for _, path in items]
    static = []
    for (fig, path), ext in zip(items, exts):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if ext == "html":
            Path(path).write_text(figure_html(fig, include_plotlyjs=include_plotlyjs), encoding="utf-8")
        else:
            static.append((fig, path, ext))
    if static:
        pio.write_images(
            [f for f, _, _ in static], [p for _, p, _ in static], format=[e for _, _, e in static],
            scale=[scale if e == "png" else 1 for _, _, e in static],
            width=[f.layout.width or 1100 for f, _, _ in static],
            height=[f.layout.height or 500 for f, _, _ in static],
        )
    for _, path, ext in static:
        if ext == "svg":
            stabilize_svg(path)
    for _, path in items:
        log.info("wrote %s", path)
    return [path for _, path in items]


def write_figure(fig, path, **kw) -> str:
    """Write one figure (see :func:`write_figures`); returns the path."""
    return write_figures([(fig, path)], **kw)[0]
