"""Static images (PNG, SVG, PDF) from one Chromium kept open, off the caller's thread.

kaleido draws plotly figures in a headless Chromium. Its one-shot API starts a browser per call
(7-10 s here) and blocks the caller meanwhile; the explorer instead keeps one
:class:`StaticRenderer`: one kaleido session (one Chromium) started on the first export, running
in a thread of its own with its own event loop, reused by every later export, and stopped by
:meth:`StaticRenderer.close` (or at interpreter exit). :meth:`StaticRenderer.submit` returns a
``concurrent.futures.Future`` at once, so the widgets stay responsive while an image is drawn;
the thread spends its time waiting on Chromium (I/O), so it does not hold the GIL.

Nothing global is changed: this is not kaleido's process-wide "sync server".
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import re
import threading
import weakref
from typing import Any
from ctrlmem.util.fileio import atomic_write
from ctrlmem.plots.figio import stabilize_svg
from importlib.resources import files

__all__ = ["StaticRenderer", "render_file", "settled_bytes"]

log = logging.getLogger(__name__)


class StaticRenderer:
    """One kaleido session in a thread; :meth:`submit` figures, get bytes back.

    Args:
        timeout: seconds one image may take (kaleido's own limit).
    """

    def __init__(self, timeout: float = 120) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._kaleido = None
        self._opened: concurrent.futures.Future | None = None
        self.renders = 0
        self._atexit = weakref.WeakMethod(self.close)
        atexit.register(_close_at_exit, self._atexit)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="ctrlmem-static-images", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            self._opened = asyncio.run_coroutine_threadsafe(self._open(), loop)

    async def _open(self):
        import kaleido  # noqa: PLC0415 - static export only (it drives a browser)

        plotly_js = files("plotly") / "package_data" / "plotly.min.js"
        k = kaleido.Kaleido(n=1, timeout=self.timeout, plotlyjs=str(plotly_js), mathjax=False)
        await k.open()
        self._kaleido = k
        return k

    async def _render(self, fig: Any, opts: dict) -> bytes:
        k = await asyncio.wrap_future(self._opened)
        return await k.calc_fig(fig, opts=opts)

    def submit(self, fig, fmt: str, *, width: int | None = None, height: int | None = None,
               scale: float = 2.0) -> concurrent.futures.Future:
        """Draw ``fig`` (a plotly figure or figure dict) as ``fmt`` (``png``, ``svg``, ``pdf``);
        the future's result is the file's bytes. The first call starts Chromium."""
        if fmt not in ("png", "svg", "pdf"):
            raise ValueError(f"static formats are png, svg and pdf, got {fmt!r}")
        self._start()
        spec = fig.to_dict() if hasattr(fig, "to_dict") else fig
        layout = spec.get("layout", {})
        opts = {"format": fmt, "width": width or layout.get("width") or 1100,
                "height": height or layout.get("height") or 500, "scale": scale if fmt == "png" else 1}
        self.renders += 1
        return asyncio.run_coroutine_threadsafe(self._render(spec, opts), self._loop)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def close(self) -> None:
        """Stop Chromium and the thread (idempotent); later submits start them again."""
        with self._lock:
            loop, thread, k = self._loop, self._thread, self._kaleido
            self._loop = self._thread = self._kaleido = self._opened = None
        if loop is None:
            return
        if k is not None:
            try:
                asyncio.run_coroutine_threadsafe(k.close(), loop).result(timeout=20)
            except Exception as exc:  # noqa: BLE001  (a browser that is already gone)
                log.info("closing kaleido: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def _close_at_exit(ref) -> None:
    close = ref()
    if close is not None:
        close()


_PDF_DATE = re.compile(rb"/(CreationDate|ModDate) \(D:[0-9]{14}[^)]*\)")


def settled_bytes(fmt: str, data: bytes) -> bytes:
    """Image bytes that depend on the figure only: Chromium stamps a PDF with the time it was
    drawn (``/CreationDate``, ``/ModDate``), which is replaced by a fixed date of the same
    length (SVG ids are settled by :func:`ctrlmem.plots.figio.stabilize_svg` on the file)."""
    if fmt == "pdf":
        return _PDF_DATE.sub(lambda mt: b"/" + mt.group(1) + b" (D:20000101000000+00'00')", data)
    return data


def render_file(fig, path: str, *, scale: float = 2.0, renderer: StaticRenderer | None = None) -> str:
    """Draw ``fig`` into ``path`` (format from the extension: png, svg, pdf) the way the
    explorer's exports are drawn, byte for byte: one kaleido session (``renderer``, else a
    fresh one closed afterwards), settled bytes, then :func:`ctrlmem.plots.figio.stabilize_svg`."""

    fmt = path.rsplit(".", 1)[-1].lower()
    own = renderer is None
    renderer = renderer or StaticRenderer()
    try:
        data = renderer.submit(fig, fmt, scale=scale).result()
    finally:
        if own:
            renderer.close()
    atomic_write(path, settled_bytes(fmt, data))
    if fmt == "svg":
        stabilize_svg(path)
    return path
