"""Static images (PNG, SVG, PDF) from one Chromium kept open, off the caller's thread.

kaleido draws plotly figures in a headless Chromium. Its one-shot API starts a browser per call
(7-10 s here) and blocks the caller meanwhile; the explorer instead keeps one
:class:`StaticRenderer`: one kaleido session (one Chromium) started on the first export, running
in a thread of its own with its own event loop, reused by every later export, and stopped by
:meth:`StaticRenderer.close` (or at interpreter exit). :meth:`StaticRenderer.submit` returns a
``concurrent.futures.Future`` at once, so the widgets stay responsive while an image is drawn;
the thread spends its time waiting on Chromium (I/O), so it does not hold the GIL.

Every image has a deadline (``deadline`` seconds from the submit, Chromium's start included):
past it the future fails with :class:`ExportTimeout`, one line naming what did not answer. A
session that failed once is never reused: kaleido's own time limit covers only the drawing
itself, while its wait for a free tab and its reload of the tab afterwards have none, so a
Chromium that died (killed, out of memory) or a tab whose page crashed left every later image
waiting forever behind it (a killed browser: the next image never answered; a crashed tab:
every later image failed). After a failure or a deadline the session is stopped (its Chromium
killed if it does not close) and the next :meth:`submit` starts a fresh one; a browser found
dead before a submit is replaced the same way.

Nothing global is changed: this is not kaleido's process-wide "sync server".
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import re
import threading
import time
import weakref
from typing import Any
from ctrlmem.util.fileio import atomic_write
from ctrlmem.plots.figio import stabilize_svg
from importlib.resources import files

__all__ = ["StaticRenderer", "ExportTimeout", "render_file", "settled_bytes", "DEADLINE_SECONDS"]

log = logging.getLogger(__name__)

DEADLINE_SECONDS = 90.0
"""Seconds one static image may take, Chromium's start included (a p = 32, m = 256 PNG takes
5-6 s from a cold start on 2 busy cores)."""


class ExportTimeout(TimeoutError):
    """A static image did not arrive within its deadline (the message names the stage)."""


class _Session:
    """One kaleido session: its event loop, the thread running it, and the opened Kaleido."""

    def __init__(self, timeout: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ctrlmem-static-images", daemon=True)
        self.thread.start()
        self.kaleido = None
        self.opened = asyncio.run_coroutine_threadsafe(self._open(timeout), self.loop)

    async def _open(self, timeout: float):
        import kaleido  # noqa: PLC0415 - static export only (it drives a browser)

        plotly_js = files("plotly") / "package_data" / "plotly.min.js"
        k = kaleido.Kaleido(n=1, timeout=timeout, plotlyjs=str(plotly_js), mathjax=False)
        await k.open()
        self.kaleido = k
        return k

    async def render(self, fig: Any, opts: dict) -> bytes:
        k = await asyncio.wrap_future(self.opened)
        return await k.calc_fig(fig, opts=opts)

    def browser_alive(self) -> bool:
        """False once the started Chromium (its wrapper process) has ended or its pipe closed."""
        proc = getattr(self.kaleido, "subprocess", None)
        channel = getattr(self.kaleido, "_channel", None)
        ready = getattr(channel, "is_ready", None)
        return (proc is None or proc.poll() is None) and (ready is None or bool(ready()))

    def stop(self, wait: float = 20) -> None:
        """Close kaleido (kill its browser when closing does not answer), end the loop."""
        k = self.kaleido
        if k is not None:
            try:
                asyncio.run_coroutine_threadsafe(k.close(), self.loop).result(timeout=wait)
            except Exception as exc:  # noqa: BLE001  (a browser that is already gone or stuck)
                log.info("closing kaleido: %s", exc)
            proc = getattr(k, "subprocess", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
        try:
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), self.loop).result(timeout=5)
        except Exception as exc:  # noqa: BLE001
            log.info("stopping the static-image loop: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class StaticRenderer:
    """One kaleido session in a thread; :meth:`submit` figures, get bytes back.

    Args:
        timeout: seconds kaleido itself gives the drawing.
        deadline: seconds an image may take from :meth:`submit` to its bytes (see the module doc).
    """

    def __init__(self, timeout: float = 120, deadline: float = DEADLINE_SECONDS) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self.renders = 0
        self.restarts = 0
        self._atexit = weakref.WeakMethod(self.close)
        atexit.register(_close_at_exit, self._atexit)

    def _current(self) -> _Session:
        with self._lock:
            old = self._session
            if old is not None and old.opened.done() and not old.browser_alive():
                log.info("the export Chromium has ended: starting a fresh one")
                self._session = None
                self.restarts += 1
                _stop_later(old)
            if self._session is None:
                self._session = _Session(self.timeout)
            return self._session

    def _discard(self, session: _Session) -> None:
        """Never reuse ``session`` again (it failed); it is stopped in the background."""
        with self._lock:
            if self._session is not session:
                return
            self._session = None
            self.restarts += 1
        _stop_later(session)

    def submit(self, fig, fmt: str, *, width: int | None = None, height: int | None = None,
               scale: float = 2.0, deadline: float | None = None) -> concurrent.futures.Future:
        """Draw ``fig`` (a plotly figure or figure dict) as ``fmt`` (``png``, ``svg``, ``pdf``);
        the future's result is the file's bytes, or :class:`ExportTimeout` past ``deadline``
        (default :attr:`deadline`) seconds. The first call starts Chromium."""
        if fmt not in ("png", "svg", "pdf"):
            raise ValueError(f"static formats are png, svg and pdf, got {fmt!r}")
        spec = fig.to_dict() if hasattr(fig, "to_dict") else fig
        layout = spec.get("layout", {})
        opts = {"format": fmt, "width": width or layout.get("width") or 1100,
                "height": height or layout.get("height") or 500, "scale": scale if fmt == "png" else 1}
        session = self._current()
        self.renders += 1
        inner = asyncio.run_coroutine_threadsafe(session.render(spec, opts), session.loop)
        return self._watched(inner, session, fmt, self.deadline if deadline is None else deadline)

    def _watched(self, inner: concurrent.futures.Future, session: _Session, fmt: str,
                 deadline: float) -> concurrent.futures.Future:
        """A future that gets ``inner``'s outcome, or :class:`ExportTimeout` at the deadline; a
        failure of either kind retires the session."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        started = time.monotonic()

        # The outcome is set before the session is retired: stopping it fails the image still
        # being drawn (its tab's pipe closes), and that failure must not overtake the deadline's.
        def settle(fut: concurrent.futures.Future) -> None:
            exc = fut.exception() if not fut.cancelled() else concurrent.futures.CancelledError()
            try:
                if exc is None:
                    out.set_result(fut.result())
                    return
                out.set_exception(exc)
            except concurrent.futures.InvalidStateError:
                return  # the deadline came first
            self._discard(session)

        def expire() -> None:
            stage = ("starting Chromium (kaleido)" if not session.opened.done()
                     else f"drawing the {fmt.upper()} in Chromium (kaleido)")
            try:
                out.set_exception(ExportTimeout(
                    f"{stage} did not finish within {deadline:g} s (after {time.monotonic() - started:.0f} s); "
                    "that Chromium was stopped and the next try starts a fresh one"))
            except concurrent.futures.InvalidStateError:
                return  # the image (or its failure) came first
            # stopping the session ends the drawing too; cancelling ``inner`` instead would leave
            # the drawing task's own failure (its closed pipe) unread, logged at exit
            self._discard(session)

        timer = threading.Timer(deadline, expire)
        timer.daemon = True
        timer.start()
        out.add_done_callback(lambda _f: timer.cancel())
        inner.add_done_callback(settle)
        return out

    @property
    def running(self) -> bool:
        return self._session is not None

    def close(self) -> None:
        """Stop Chromium and the thread (idempotent); later submits start them again."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.stop()


async def _cancel_tasks() -> None:
    """Cancel what the session's loop still runs (choreographer's watchdog), so it ends quietly."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _stop_later(session: _Session) -> None:
    threading.Thread(target=session.stop, name="ctrlmem-static-images-stop", daemon=True).start()


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
