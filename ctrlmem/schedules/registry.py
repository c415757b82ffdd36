"""The schedule registry: every generator is a pure function registered under a name.

A generator is ``func(num_devices, num_microbatches, **params) -> Schedule``. Generators that
adapt to pass costs declare ``uses_costs`` and receive ``costs``; those that take a memory budget
declare ``memory_limit`` and receive it as a fraction of 1F1B's peak activation memory.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from ..costs import Costs
from ..ir import Schedule

__all__ = ["ScheduleSpec", "SCHEDULES", "register", "build"]


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


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{field} must be >= 1, got {value}")
    return value


def build(
    name: str,
    num_devices: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    **params: object,
) -> Schedule:
    """Build the schedule registered as ``name`` for ``num_devices`` devices and
    ``num_microbatches`` microbatches.

    ``costs`` is used by cost-aware generators (others ignore it: their order does not depend on
    costs). ``memory_limit`` (a fraction of 1F1B's peak activation) is accepted only by
    memory-budgeted generators. Extra keyword ``params`` go to the generator (e.g.
    ``num_chunks=2`` for ``interleaved-1f1b``).
    """
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
    if spec.uses_costs:
        kwargs["costs"] = costs if costs is not None else Costs()
    elif costs is not None and not isinstance(costs, Costs):
        raise ValueError(f"costs must be a ctrlmem.Costs, got {type(costs).__name__}")
    if memory_limit is not None:
        if not spec.memory_limit:
            budgeted = [n for n, s in SCHEDULES.items() if s.memory_limit] or ["(none registered yet)"]
            raise ValueError(
                f"schedule {name!r} has a fixed memory footprint and takes no memory_limit; "
                f"memory-budgeted schedules: {', '.join(budgeted)}"
            )
        limit = float(memory_limit)
        if not limit > 0 or limit != limit:
            raise ValueError(f"memory_limit must be a positive fraction of 1F1B's peak, got {memory_limit!r}")
        kwargs["memory_limit"] = limit
    return spec.func(p, m, **kwargs)
