"""Argument checks shared by the library's entry points (``optimal``, the plot functions, real
runs, figure export) and the command line's argument types (:mod:`ctrlmem.cli.args`).

Every check takes the argument's name and its value, returns the value as the plain Python type
the code uses (numpy scalars are accepted wherever a number is: any ``numbers.Integral`` for an
integer, any ``numbers.Real`` for a number, never a ``bool``), and raises ``TypeError`` (not a
number at all) or ``ValueError`` (a number out of range, not finite, a fraction where an integer
is needed) whose message names the argument, what it must be and the value given. The rules are
those of :func:`ctrlmem.build` (``num_devices``, ``num_microbatches``, ``memory_limit``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any
import reprlib

__all__ = ["integer", "number", "memory_fraction", "flag", "MAX_MEMORY_LIMIT", "short_repr", "first_few"]

MAX_MEMORY_LIMIT = 1e6
"""Largest memory budget accepted (a fraction of 1F1B's peak ``p·a``). No schedule within
:data:`ctrlmem.model.ir.MAX_PASSES` passes holds more than about ``10^6 / p`` of it,
so a larger budget changes nothing; refusing it keeps ``2·p·limit`` a finite integer."""


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (an error message never repeats a huge input)."""

    r = reprlib.Repr()
    r.maxstring = r.maxother = limit
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 6
    r.maxlevel = 3
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_few(items, count: int | None = None, shown: int = 5) -> str:
    """``"a, b, c, ... (N in all)"``: the first ``shown`` items of a possibly long list and how
    many there are, so that an error message stays one short line."""
    items = list(items) if count is None else items
    n = len(items) if count is None else count
    head = ", ".join(str(x) for x in list(items[:shown]))
    return head if n <= shown else f"{head}, ... ({n} in all)"


def _kind(value: Any) -> str:
    return "a bool" if isinstance(value, bool) else f"{type(value).__name__} {short_repr(value)}"


def integer(name: str, value: Any, minimum: int = 1, maximum: int | None = None, what: str = "") -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``: an ``Integral`` (numpy too) or an integral
    real (``4.0``); ``TypeError`` for a bool, text or ``None``, ``ValueError`` otherwise."""
    kind = "a positive integer" if minimum == 1 else ("an integer >= 0" if minimum == 0 else f"an integer >= {minimum}")
    what = f" ({what})" if what else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {kind}{what}, got {_kind(value)}")
    if not isinstance(value, numbers.Integral):
        x = float(value)
        if not (math.isfinite(x) and x.is_integer()):
            raise ValueError(f"{name} must be {kind}{what}, got {short_repr(value)}")
    n = int(value)
    if n < minimum:
        raise ValueError(f"{name} must be {kind}{what}, got {n}")
    if maximum is not None and n > maximum:
        raise ValueError(f"{name} must be at most {maximum}{what}, got {n}")
    return n


def number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
           positive: bool = False, what: str = "") -> float:
    """``value`` as a finite ``float``; ``positive`` means ``> 0``; ``minimum`` / ``maximum`` are
    inclusive. ``TypeError`` for a bool, text or ``None``; ``ValueError`` for NaN, infinity or a
    value out of range."""
    what_s = f" ({what})" if what else ""
    kind = "a positive number" if positive else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {kind}{what_s}, got {_kind(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number{what_s}, got {short_repr(value)}")
    if positive and not x > 0:
        raise ValueError(f"{name} must be > 0{what_s}, got {short_repr(value)}")
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}{what_s}, got {short_repr(value)}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{name} must be at most {maximum:g}{what_s}, got {short_repr(value)}")
    return x


def memory_fraction(name: str, value: Any) -> float:
    """A memory budget: a finite number > 0 and at most :data:`MAX_MEMORY_LIMIT` (a fraction of
    1F1B's peak activation)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (a fraction of 1F1B's peak), got {_kind(value)}")
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive fraction of 1F1B's peak, got {short_repr(value)}")
    if x > MAX_MEMORY_LIMIT:
        raise ValueError(f"{name}={short_repr(value)} is larger than {MAX_MEMORY_LIMIT:g} "
                         f"(ctrlmem.util.checks.MAX_MEMORY_LIMIT), which no schedule can use; give a fraction of "
                         f"1F1B's peak such as 0.5 or 2")
    return x


def flag(name: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy bools too); anything else is a ``TypeError``."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_kind(value)}")
