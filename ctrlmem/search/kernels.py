"""Compiled loops for the search engine: numba when it is installed, plain Python otherwise.

The search's inner loops (timing a candidate, the list scheduler, the App. A grid steps, the
greedy schedulers) are sequential: each pass depends on the one before it, so numpy cannot
vectorize them. They are written once, as plain Python over numpy arrays and scalars, and
decorated with :func:`kernel`. With numba (pinned in ``requirements.txt``) a kernel is compiled
on its first call (``nopython``, ``cache=True``: the machine code is kept in ``__pycache__`` next
to the source, so later processes load it in milliseconds; ``nogil=True``: a search in a
background thread leaves the interpreter free). Without numba, or with ``CTRLMEM_JIT=0`` in the
environment, the same functions run as Python and give identical results (the tests compare the
two); only slower, by one to two orders of magnitude.

Rules a kernel keeps, so that both forms agree bit for bit: integers stay well inside int64;
floats only meet ``+``, ``-``, ``max``, ``min`` and comparisons (no ``fastmath``, no reductions
whose order numba may change); arrays come in as ``int64`` / ``float64`` numpy arrays of fixed
dimension (see :func:`ints`, :func:`floats`).

Measured on the 2-core development machine (``benchmarks/bench_v_shape.py --jit-compare``): the
whole ``v-shape`` search at p = 16, m = 128 takes tens of times longer in the Python form.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from typing import Callable

import numpy as np

__all__ = ["kernel", "jit_enabled", "ints", "floats", "lex_less3"]

log = logging.getLogger(__name__)

_KERNELS: list["_Kernel"] = []
_STATE: dict[str, object] = {"ready": False, "numba": None}
_LOCK = threading.RLock()


def jit_enabled() -> bool:
    """Whether kernels run compiled: numba importable and ``CTRLMEM_JIT`` not ``0``."""
    _prepare()
    return _STATE["numba"] is not None


class _Kernel:
    """A function that runs compiled once numba is swapped in (on the first call of any kernel).

    Calling it compiles every kernel lazily (numba compiles each on its first call).
    ``py_func`` is the plain Python function (what runs without numba); ``inline``: compiled
    into its callers (small helpers called in inner loops: a call with array arguments costs
    reference counting)."""

    def __init__(self, fn: Callable, inline: bool = False) -> None:
        self.py_func = fn
        self.inline = inline
        self._impl: Callable | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        impl = self._impl
        if impl is None:
            _prepare()
            impl = self._impl
        return impl(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.py_func.__module__}.{self.py_func.__qualname__}>"


def kernel(fn: Callable | None = None, *, inline: bool = False):
    """Mark ``fn`` as a compiled loop (see the module docstring); ``@kernel(inline=True)`` for
    a small helper compiled into its callers."""
    if fn is None:
        return functools.partial(kernel, inline=inline)
    k = _Kernel(fn, inline)
    with _LOCK:
        _KERNELS.append(k)
        if _STATE["ready"]:  # a module imported after the swap: wrap it now
            _wrap(k)
            return k._impl
    return k


def _prepare() -> None:
    """Import numba (once) and give every kernel its implementation. Inside compiled code a
    kernel calls other kernels through module globals: those are rebound to the numba
    dispatchers, so compiled kernels call each other directly. (Thread-safe: a search may start
    in a background thread.)"""
    if _STATE["ready"]:
        return
    with _LOCK:
        if not _STATE["ready"]:
            _prepare_locked()


def _prepare_locked() -> None:
    numba = None
    if os.environ.get("CTRLMEM_JIT", "1").strip() not in ("0", "false", "no", "off"):
        try:
            import numba  # noqa: PLC0415 - optional dependency: without numba the kernels run as Python
        except ImportError:  # pragma: no cover - numba is pinned in requirements.txt
            log.info("numba is not installed: the search's loops run as plain Python (slower, same results)")
            numba = None
    _STATE["numba"] = numba
    for k in list(_KERNELS):
        _wrap(k)
    _STATE["ready"] = True


def _wrap(k: _Kernel) -> None:
    numba = _STATE["numba"]
    if numba is None:
        k._impl = k.py_func
        return
    opts = {"inline": "always"} if k.inline else {}
    k._impl = numba.njit(cache=True, nogil=True, **opts)(k.py_func)
    # rebind the module-level name (and any `from module import name` elsewhere in ctrlmem) so
    # compiled callers reach the dispatcher, not this wrapper
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "")
        if not name.startswith("ctrlmem"):
            continue
        for attr, val in list(vars(mod).items()):
            if val is k:
                setattr(mod, attr, k._impl)


def ints(values) -> np.ndarray:
    """``values`` as a contiguous ``int64`` array (the kernels' one integer type)."""
    return np.ascontiguousarray(values, dtype=np.int64)


def floats(values) -> np.ndarray:
    """``values`` as a contiguous ``float64`` array (the kernels' one float type)."""
    return np.ascontiguousarray(values, dtype=np.float64)


@kernel(inline=True)
def lex_less3(a0, a1, a2, b0, b1, b2):  # pragma: no cover - compiled
    """(a0, a1, a2) < (b0, b1, b2), each compared with a 1e-9 tolerance."""
    if a0 < b0 - 1e-9:
        return True
    if a0 > b0 + 1e-9:
        return False
    if a1 < b1 - 1e-9:
        return True
    if a1 > b1 + 1e-9:
        return False
    return a2 < b2 - 1e-9
