"""Deterministic figure files: the same figure gives the same bytes, every time.

plotly writes a random ``uuid4`` as the ``<div id>`` of every HTML figure, and kaleido's SVGs
carry a random 6-hex id (``defs-1a2b3c``, ``clip1a2b3cxyplot`` ...) and a random ``uid`` per
trace (``trace6723e6``). Regenerating an unchanged
figure then rewrites the file, and a committed ``figures/`` folder is dirty after every run. This
module replaces these ids with ones derived from the figure's content (traces without a ``uid``
get ``t0``, ``t1``, ... on a copy; the caller's figure is not changed), so regeneration from
unchanged inputs is byte-identical (PNG bytes from kaleido's Chromium are already stable).

API (every figure file of the package is written here: :mod:`ctrlmem.plots.figures` (``draw``, ``figures``, the
explorer's export) after applying its label rule, :mod:`ctrlmem.reproduce.memory_curves`, :mod:`ctrlmem.reproduce`):

* :func:`write_files` ``(items, *, scale=2.0, include_plotlyjs=True) -> list[str]`` — write each
  ``(figure, path)``; the format comes from the extension (``.html``, ``.png``, ``.svg``, ``.pdf``); all
  static images go through one kaleido session; returns the paths as strings.
* :func:`write_file` ``(fig, path, **kw) -> str`` — one figure.
* :func:`figure_html` ``(fig, include_plotlyjs=True, full_html=True) -> str`` — the HTML text
  with a content-derived div id (e.g. for embedding).
* :func:`stable_div_id` ``(fig) -> str`` and :func:`stabilize_svg` ``(path)`` — the two fixes alone.

``include_plotlyjs`` is plotly's: ``True`` embeds plotly.js (works offline, ~4.7 MB), ``"cdn"``
loads it from the CDN (small file, needs a network to view). Static export needs kaleido's
Chromium (Debian's ``chromium`` works); without it kaleido raises and nothing static is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Sequence

from ctrlmem.util.fileio import atomic_path, atomic_write
import math
import numbers

__all__ = ["write_files", "write_file", "figure_html", "stable_div_id", "stabilize_svg", "check_scale",
           "without_hover_marks", "HOVER_MARK", "MAX_SCALE", "MAX_IMAGE_SIDE"]

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
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    if all(tr.uid is not None for tr in fig.data):
        return fig
    fig = go.Figure(fig)
    for i, tr in enumerate(fig.data):
        if tr.uid is None:
            tr.uid = f"t{i}"
    return fig


HOVER_MARK = " (i)"
"""What ends a panel title that shows more on hover (:func:`ctrlmem.plots.figures.schedule_spec`)."""


def without_hover_marks(fig):
    """``fig`` for a static image: a title that ends in :data:`HOVER_MARK` because it shows more
    on hover loses the mark and the hover text (an image cannot hover). A copy when one
    changes; the caller's figure is not changed."""
    import plotly.graph_objects as go  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    notes = list(fig.layout.annotations or ())
    marked = [i for i, a in enumerate(notes) if a.hovertext and (a.text or "").endswith(HOVER_MARK)]
    if not marked:
        return fig
    fig = go.Figure(fig)
    for i in marked:
        note = fig.layout.annotations[i]
        note.text = note.text[: -len(HOVER_MARK)]
        note.hovertext = None
    return fig


def stable_div_id(fig) -> str:
    """A div id derived from the figure's JSON (the same figure always gets the same id)."""
    return "fig-" + hashlib.sha1(fig.to_json().encode()).hexdigest()[:12]


def figure_html(fig, include_plotlyjs: bool | str = True, full_html: bool = True) -> str:
    """``fig.to_html`` with :func:`stable_div_id` instead of plotly's random one."""
    return fig.to_html(include_plotlyjs=include_plotlyjs, full_html=full_html, div_id=stable_div_id(fig))


_SVG_ID = re.compile(r'id="defs-([0-9a-f]{6})"')


def _stable_svg_text(text: str) -> str:
    match = _SVG_ID.search(text)
    if not match:
        return text
    uid = match.group(1)
    stable = hashlib.sha1(text.replace(uid, "").encode()).hexdigest()[:6]
    return text.replace(uid, stable)


def stabilize_svg(path: str | Path) -> None:
    """Replace kaleido's random per-figure id in an SVG file by one derived from the rest of
    its content (no change when the file has no such id); the file is rewritten atomically."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    stable = _stable_svg_text(text)
    if stable != text:
        atomic_write(path, stable)


MAX_SCALE = 10.0
"""Largest ``scale`` of a static image (PNG pixels per layout pixel)."""

MAX_IMAGE_SIDE = 16384
"""Largest side of a static image in pixels (layout size × scale): Chromium draws nothing
usable beyond its canvas limits, and kaleido then returns a few bytes that are not an image."""

_MAGIC = {"png": (b"\x89PNG\r\n\x1a\n",), "pdf": (b"%PDF-",), "svg": (b"<svg", b"<?xml")}


def check_scale(scale: object, name: str = "scale") -> float:
    """``scale`` as a float in (0, :data:`MAX_SCALE`]; ``TypeError`` / ``ValueError`` naming ``name``."""

    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be a number (pixels per layout pixel), got {type(scale).__name__} {scale!r}")
    x = float(scale)
    if not (math.isfinite(x) and 0 < x <= MAX_SCALE):
        raise ValueError(f"{name} must be > 0 and at most {MAX_SCALE:g} (pixels per layout pixel), got {scale!r}; "
                         f"for a larger image give a larger width instead")
    return x


def _check_static(fig, path: str, ext: str, scale: float) -> tuple[int, int, float]:
    width = int(fig.layout.width or 1100)
    height = int(fig.layout.height or 500)
    s = scale if ext == "png" else 1.0
    if max(width, height) * s > MAX_IMAGE_SIDE:
        raise ValueError(f"cannot write {path}: {width} x {height} px at scale {s:g} is "
                         f"{width * s:.0f} x {height * s:.0f} pixels, more than {MAX_IMAGE_SIDE} on a side; "
                         f"lower the scale or the width, or write .html or .svg")
    return width, height, s


def _check_image(tmp: Path, path: str, ext: str) -> None:
    """``ValueError`` unless the file kaleido wrote starts like a ``ext`` file."""
    with open(tmp, "rb") as fh:
        head = fh.read(1024)
    ok = any(head.startswith(m) for m in _MAGIC[ext]) if ext != "svg" else any(m in head for m in _MAGIC[ext])
    if not ok:
        raise ValueError(f"cannot write {path}: the image exporter (kaleido) returned {len(head)} byte(s) that are "
                         f"not a {ext.upper()} file; {path} was left unchanged (lower the scale or the width?)")


def write_files(items: Sequence[tuple[object, object]], *, scale: float = 2.0,
                  include_plotlyjs: bool | str = True) -> list[str]:
    """Write each ``(figure, path)`` by extension, deterministically (see the module doc);
    parent folders are created. Raises ``ValueError`` for an unknown extension, a bad
    ``scale`` or an image larger than :data:`MAX_IMAGE_SIDE` before writing anything.

    Every file is written atomically (:mod:`ctrlmem.util.fileio`): a file is either the old one or
    the whole new one. Static images go to temporary files in the target folders, are checked
    to be images of their format, and only then replace their targets: when the exporter fails
    (or returns something that is not an image) no static target is touched, and no temporary
    file is left."""
    import plotly.io as pio  # noqa: PLC0415 - plotly (figures) loads on first drawing, not with ctrlmem --help

    scale = check_scale(scale)
    exts = [_extension(str(path)) for _, path in items]
    items = [(_with_trace_uids(fig if ext == "html" else without_hover_marks(fig)), str(path))
             for (fig, path), ext in zip(items, exts)]
    sizes = [_check_static(fig, path, ext, scale) if ext != "html" else None
             for (fig, path), ext in zip(items, exts)]
    static = []
    for (fig, path), ext, size in zip(items, exts, sizes):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if ext == "html":
            atomic_write(path, figure_html(fig, include_plotlyjs=include_plotlyjs))
        else:
            static.append((fig, path, ext, size))
    if static:
        with contextlib.ExitStack() as stack:
            tmps = [stack.enter_context(atomic_path(path, suffix=f".{ext}")) for _, path, ext, _ in static]
            pio.write_images(
                [f for f, _, _, _ in static], [str(t) for t in tmps], format=[e for _, _, e, _ in static],
                scale=[sz[2] for _, _, _, sz in static],
                width=[sz[0] for _, _, _, sz in static],
                height=[sz[1] for _, _, _, sz in static],
            )
            for tmp, (_, path, ext, _) in zip(tmps, static):
                _check_image(tmp, path, ext)
                if ext == "svg":
                    text = tmp.read_text(encoding="utf-8")
                    tmp.write_text(_stable_svg_text(text), encoding="utf-8")
    for _, path in items:
        log.info("wrote %s", path)
    return [path for _, path in items]


def write_file(fig, path, **kw) -> str:
    """Write one figure (see :func:`write_files`); returns the path."""
    return write_files([(fig, path)], **kw)[0]
