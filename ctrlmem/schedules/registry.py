"""The schedule registry: every generator is a pure function registered under a name.

A generator is ``func(num_devices, num_microbatches, **params) -> Schedule``. Generators that
adapt to pass costs declare ``uses_costs`` and receive ``costs``; those that take a memory budget
declare ``memory_limit`` and receive it as a fraction of 1F1B's peak activation memory.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from ctrlmem.model.costs import Costs
from ctrlmem.model import ir
from ctrlmem.model.ir import Schedule
from ctrlmem.util.checks import memory_fraction
import numbers
from ctrlmem.model.levers import apply_levers, lever_mode, offload_choice
from ctrlmem.schedules.auto_levers import every_forward_levered, search_with_levers

__all__ = ["ScheduleSpec", "SCHEDULES", "register", "build", "is_schedule_file"]


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered generator and what it accepts."""

    name: str
    func: Callable[..., Schedule]
    summary: str
    source: str
    uses_costs: bool
    memory_limit: bool
    params: Mapping[str, object]

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.func) or ""


class _Registry(Mapping[str, ScheduleSpec]):
    """Read-only mapping ``name -> ScheduleSpec``; ``list(SCHEDULES)`` gives the names."""

    def __init__(self) -> None:
        self._specs: dict[str, ScheduleSpec] = {}

    def __getitem__(self, name: str) -> ScheduleSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise KeyError(unknown_schedule_message(name)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"SCHEDULES({', '.join(self._specs)})"

    def _add(self, spec: ScheduleSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"schedule {spec.name!r} is registered twice")
        self._specs[spec.name] = spec


SCHEDULES = _Registry()


def unknown_schedule_message(name: object) -> str:
    return f"unknown schedule {name!r}; valid names: {', '.join(SCHEDULES)}"


def register(name: str, source: str) -> Callable[[Callable[..., Schedule]], Callable[..., Schedule]]:
    """Register ``func`` under ``name``; ``source`` cites where the schedule comes from."""

    def wrap(func: Callable[..., Schedule]) -> Callable[..., Schedule]:
        sig = inspect.signature(func)
        names = list(sig.parameters)
        if names[:2] != ["num_devices", "num_microbatches"]:
            raise TypeError(f"generator {func.__name__} must take (num_devices, num_microbatches, ...)")
        extra = {
            k: v.default
            for k, v in sig.parameters.items()
            if k not in ("num_devices", "num_microbatches", "costs", "memory_limit")
        }
        doc = inspect.getdoc(func) or ""
        SCHEDULES._add(
            ScheduleSpec(
                name=name,
                func=func,
                summary=doc.splitlines()[0] if doc else name,
                source=source,
                uses_costs="costs" in sig.parameters,
                memory_limit="memory_limit" in sig.parameters,
                params=extra,
            )
        )
        return func

    return wrap


# ---- argument checks of build() (kept together so the generators can change independently) ----

def _positive_int(field: str, value: object) -> int:
    """``value`` as an ``int`` >= 1: any ``numbers.Integral`` (numpy too) or an integral real;
    ``TypeError`` for a bool or a non-number, ``ValueError`` for a fraction or < 1."""

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{field} must be a positive integer, got {type(value).__name__} {value!r}")
    if not isinstance(value, numbers.Integral):
        if not float(value).is_integer():
            raise ValueError(f"{field} must be a positive integer, got {value!r}")
    value = int(value)
    if value < 1:
        raise ValueError(f"{field} must be >= 1, got {value}")
    return value


def _fraction(field: str, value: object) -> float:
    """A memory budget, checked as everywhere else (:func:`ctrlmem.util.checks.memory_fraction`:
    finite, > 0, and no larger than any schedule can use)."""

    return memory_fraction(field, value)


def _check_size(name: str, spec: ScheduleSpec, p: int, m: int, params: Mapping[str, object]) -> None:
    """``ValueError`` when the schedule would exceed :data:`ctrlmem.model.ir.MAX_PASSES` passes. A pass count is
    (passes per stage and microbatch) x stages x m; the per-device stage count is ``num_chunks``
    where the generator takes it, else measured on a small instance."""
    chunks = params.get("num_chunks", spec.params.get("num_chunks"))
    v = _positive_int("num_chunks", chunks) if chunks is not None else None
    if 3 * p * m * max(2, v or 2) <= ir.MAX_PASSES:
        return
    per = 3
    if v is None:
        try:
            small = spec.func(4, 8, **({"costs": Costs()} if spec.uses_costs else {}))
            v = max(1, small.num_stages // 4)
            per = max(2, -(-small.num_passes // (small.num_stages * 8)))
        except Exception:  # noqa: BLE001 - fall back to the upper bound
            v = 2
    passes = per * p * v * m
    if passes > ir.MAX_PASSES:
        raise ValueError(
            f"schedule {name!r} with num_devices={p}, num_microbatches={m}"
            + (f", {v} stages per device" if v > 1 else "")
            + f" has about {passes:.3g} passes, more than the limit of {ir.MAX_PASSES:.0e} (ctrlmem.model.ir.MAX_PASSES); "
              f"use smaller sizes, or pass allow_large=True (--allow-large) to build it anyway")


def build(
    name: str,
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    allow_large: bool = False,
    *,
    recompute: str | None = None,
    offload: object = None,
    **params: object,
) -> Schedule:
    """Build the schedule registered as ``name`` for ``num_devices`` devices and
    ``num_microbatches`` microbatches.

    ``costs`` is used by cost-aware generators (others ignore it: their order does not depend on
    costs); it may be a :class:`Costs`, ``"F,B,W[,COMM]"`` text or an ``(F, B, W[, COMM])``
    tuple; without it the V patterns are the exact unit-cost ones and the searches assume
    F = B = W = 1, comm 0. ``memory_limit`` (a fraction of 1F1B's peak activation) is accepted only by
    memory-budgeted generators. Extra keyword ``params`` go to the generator (e.g.
    ``num_chunks=2`` for ``interleaved-1f1b``). Numbers may be any ``numbers.Integral`` /
    ``numbers.Real`` (numpy scalars too), never ``bool``. Schedules of more than
    :data:`ctrlmem.model.ir.MAX_PASSES` passes are refused unless ``allow_large=True``.

    The memory levers (docs/theory.md §13), for every schedule: ``recompute`` is ``"none"``
    (default), ``"selective"`` or ``"full"`` (an ``R`` of every forward right before its
    backward); ``offload`` is ``"none"`` (default) or a fraction in (0, 1] of every forward's
    activation copied to host memory (``costs.offload`` per ``a``). ``"auto"`` for either, with a
    ``memory_limit`` on a budgeted schedule (``v-shape``, ``zb``), lets the search choose per
    stage and microbatch what to recompute or offload when that is faster than reordering alone
    (:mod:`ctrlmem.schedules.auto_levers`).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a schedule name (str), got {type(name).__name__} {name!r}; "
                        f"valid names: {', '.join(SCHEDULES)}")
    if name not in SCHEDULES:
        raise ValueError(unknown_schedule_message(name))
    spec = SCHEDULES[name]
    p = _positive_int("num_devices", num_devices)
    m = _positive_int("num_microbatches", num_microbatches)
    kwargs: dict[str, object] = {}
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        accepted = ", ".join(spec.params) or "none"
        raise ValueError(f"schedule {name!r} does not take parameter(s) {unknown}; it accepts: {accepted}")
    kwargs.update(params)
    if "num_chunks" in kwargs:
        kwargs["num_chunks"] = _positive_int("num_chunks", kwargs["num_chunks"])
    costs = Costs.coerce(costs, "costs") if costs is not None else None
    if spec.uses_costs:
        kwargs["costs"] = costs  # None: the generator's cost-free form (e.g. the unit-cost pattern)
    if memory_limit is not None:
        limit = _fraction("memory_limit", memory_limit)
        if not spec.memory_limit:
            budgeted = [n for n, s in SCHEDULES.items() if s.memory_limit] or ["(none registered yet)"]
            raise ValueError(
                f"schedule {name!r} has a fixed memory footprint and takes no memory_limit; "
                f"memory-budgeted schedules: {', '.join(budgeted)}"
            )
        kwargs["memory_limit"] = limit
    if not isinstance(allow_large, bool):
        raise TypeError(f"allow_large must be True or False, got {allow_large!r}")
    if not allow_large:
        _check_size(name, spec, p, m, params)

    recompute, offload = lever_mode(recompute), offload_choice(offload)
    if "auto" in (recompute, offload):
        return _auto(name, spec, p, m, kwargs, recompute, offload)
    if recompute != "none" and spec.memory_limit and kwargs.get("memory_limit") is not None:
        # every forward recomputed: the order may use the memory that frees (not the budget's alone)
        generate, patterns = _generators(name, spec, p, m, kwargs)
        return every_forward_levered(generate, kwargs["memory_limit"], costs or Costs(), recompute, offload,
                                     patterns=patterns)
    return apply_levers(spec.func(p, m, **kwargs), recompute, offload, costs)


def _auto(name: str, spec: ScheduleSpec, p: int, m: int, kwargs: dict, recompute: str, offload: object) -> Schedule:
    """``recompute``/``offload="auto"``: the budgeted search with levers chosen on top."""
    if not spec.memory_limit or kwargs.get("memory_limit") is None:
        budgeted = ", ".join(n for n, s in SCHEDULES.items() if s.memory_limit)
        raise ValueError(f"recompute/offload='auto' chooses levers under a memory budget: give memory_limit= and a "
                         f"budgeted schedule ({budgeted}), or a fixed lever (none, selective, full; an offload "
                         f"fraction) for {name!r}")

    generate, patterns = _generators(name, spec, p, m, kwargs)
    return search_with_levers(generate, kwargs["memory_limit"], kwargs.get("costs") or Costs(), recompute, offload,
                              patterns=patterns)


def _generators(name: str, spec: ScheduleSpec, p: int, m: int, kwargs: dict):
    """``(generate, patterns)`` of a budgeted search: its order at a budget, and the fixed
    patterns of its placement (:data:`LEVER_SEEDS`) that the levers bring under a budget."""

    def generate(limit: float) -> Schedule:
        return spec.func(p, m, **{**kwargs, "memory_limit": limit})

    def patterns() -> Iterator[Schedule]:
        # the placement's fixed patterns, whose W follows its B: every lever frees what they hold
        for other in LEVER_SEEDS.get(name, ()):
            if other in SCHEDULES:
                o = SCHEDULES[other]
                yield o.func(p, m, **({"costs": kwargs["costs"]} if o.uses_costs and "costs" in kwargs else {}))

    return generate, patterns


LEVER_SEEDS: Mapping[str, tuple[str, ...]] = {"zb": ("1f1b",), "v-shape": ("v-min", "v-half")}
"""Per budgeted search, the fixed patterns of its placement that ``recompute``/``offload="auto"``
also brings under the budget with levers (:func:`ctrlmem.schedules.auto_levers.search_with_levers`):
their ``W`` follows its ``B``, so a lever frees all a forward holds (the search's own schedules at
looser budgets defer ``W`` passes, which no lever frees). 1F1B with every forward recomputed is
1F1B-R."""


def is_schedule_file(name: str) -> bool:
    """Whether a schedule argument names a file (or a folder, a FIFO: anything at that path)
    rather than a registered schedule."""
    return name not in SCHEDULES and (os.path.lexists(name) or os.sep in name
                                      or name.lower().endswith((".csv", ".txt", ".sched")))
