"""Which stages torch / torchtitan put on each rank for a schedule class name, and the check that a
CSV runs under a name that places its stages the same way (without it the ranks build other stages
than the CSV drives, and the run is refused, aborts or hangs until the gloo / NCCL timeout).

torch's ``torch.distributed.pipelining`` (2.13) and torchtitan's ``pipeline_parallel_schedule``
choose the placement from the class: a single-stage class (``GPipe``, ``1F1B``) puts stage ``r``
on rank ``r``; ``ZBVZeroBubble`` and ``DualPipeV`` put stages ``r`` and ``2p − 1 − r`` there (the
V style); any other multi-stage class (``Interleaved1F1B``, ``LoopedBFS``,
``InterleavedZeroBubble``) puts stages ``r, r + p, …`` there (the loop style). Names are matched
case-insensitively, as torch's ``get_schedule_class`` does. Nothing here imports torch.
"""

from __future__ import annotations

from ctrlmem.model.ir import Placement, Schedule

__all__ = ["TORCH_CLASS_STYLE", "torch_placement", "classes_for", "check_torch_class", "placement_check"]

TORCH_CLASS_STYLE = {
    "GPipe": "sequential", "1F1B": "sequential", "PipelineScheduleSingle": "sequential",
    "Interleaved1F1B": "interleaved", "LoopedBFS": "interleaved", "InterleavedZeroBubble": "interleaved",
    "PipelineScheduleMulti": "interleaved", "ZBVZeroBubble": "v-shape", "DualPipeV": "v-shape",
}
"""torch's schedule class names (``get_schedule_class``) -> the placement they build."""

_STYLE_TEXT = {"sequential": "rank r builds stage r", "interleaved": "rank r builds stages r, r + p, …",
               "v-shape": "rank r builds stages r and 2p − 1 − r"}


def _canonical(name: str) -> str:
    found = {k.lower(): k for k in TORCH_CLASS_STYLE}.get(str(name).lower())
    if found is None:
        raise ValueError(f"unknown torch schedule class {name!r}; torch 2.13 knows {', '.join(TORCH_CLASS_STYLE)}")
    return found


def torch_placement(name: str, num_devices: int, num_stages: int) -> Placement | None:
    """The placement torch builds for class ``name`` with ``num_stages`` stages on ``num_devices``
    ranks; ``None`` when it cannot build that many (a single-stage class with more stages than
    ranks, a V class without exactly two per rank)."""
    style = TORCH_CLASS_STYLE[_canonical(name)]
    if num_stages % num_devices:
        return None
    v = num_stages // num_devices
    if style == "sequential":
        return Placement.sequential(num_devices) if v == 1 else None
    if style == "v-shape":
        return Placement.v_shape(num_devices) if v == 2 else None
    return Placement.interleaved(num_devices, v)


def classes_for(schedule: Schedule) -> list[str]:
    """The torch class names whose placement is the schedule's (empty for a custom placement, and
    for a schedule of two model copies, which torch's CSV cannot express)."""
    if schedule.model_copies != 1:
        return []
    p, S = schedule.num_devices, schedule.num_stages
    return [n for n in TORCH_CLASS_STYLE
            if (pl := torch_placement(n, p, S)) is not None and pl.stage_device == schedule.placement.stage_device]


def check_torch_class(schedule: Schedule, name: str) -> str:
    """``name`` (torch's spelling) when torch places the schedule's stages under it as the schedule
    does; otherwise a ``ValueError`` that says what that class builds and names the classes that fit."""
    canonical = _canonical(name)
    if canonical in classes_for(schedule):
        return canonical
    fits = classes_for(schedule)
    style = TORCH_CLASS_STYLE[canonical]
    right = (f"use {' or '.join(repr(n) for n in fits)}" if fits else
             "no torch class places stages that way (a custom placement): export another schedule")
    raise ValueError(f"schedule {schedule.name!r} has the {schedule.placement.kind} placement "
                     f"({schedule.num_stages} stages on {schedule.num_devices} ranks) but {canonical!r} builds "
                     f"another ({_STYLE_TEXT[style]}): the ranks would run other stages than the CSV drives and "
                     f"the run would fail or hang; {right}")


def placement_check(schedule: Schedule) -> str:
    """One sentence stating the placement check for the schedule's CSV."""
    fits = classes_for(schedule)
    if not fits:
        return ("no torch class runs this schedule (a custom placement, or two model copies)")
    style = TORCH_CLASS_STYLE[fits[0]]
    return (f"placement check: the CSV is {schedule.placement.kind} ({_STYLE_TEXT[style]}), which torch builds "
            f"only under {', '.join(fits)}")
