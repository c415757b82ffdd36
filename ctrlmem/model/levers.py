"""The memory levers as transforms of a schedule: recomputation and activation offload
(docs/theory.md §13).

* :func:`with_recompute` puts an ``R`` of every chosen forward right before its ``B`` (or ``BW``),
  the place ``torch.utils.checkpoint`` recomputes at: the forward keeps only
  :meth:`ctrlmem.Costs.kept_fraction` of its activation until then.
* :func:`with_offload` copies a share of every chosen forward's activation to host memory as
  soon as the forward ends, and issues its reload as late as the pass times allow it to end
  before its ``B`` (one pass ahead without costs).

Neither changes what is computed: every ``F``, ``B``, ``W``, ``BW`` stays on its device in its order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import RECOMPUTE_MODES, Copy, Op, Pass, Schedule

__all__ = ["with_recompute", "with_offload", "apply_levers", "lever_mode", "offload_choice", "LEVER_CHOICES"]

LEVER_CHOICES = ("none", "selective", "full")
"""The values of ``recompute=`` on :func:`ctrlmem.build` (``"auto"`` too for a budgeted search)."""


def lever_mode(value: object) -> str:
    """``recompute=`` checked: one of ``none``, ``selective``, ``full``, ``auto``; a
    ``ValueError`` naming the choices otherwise."""
    if value is None:
        return "none"
    if value not in (*LEVER_CHOICES, "auto"):
        raise ValueError(f"recompute must be one of none, selective, full, auto, got {value!r}")
    return str(value)


def offload_choice(value: object) -> object:
    """``offload=`` checked: ``none`` (or ``None``, or a fraction of 0: nothing is copied, as
    ``ctrlmem run --offload 0``), ``auto``, or a fraction in (0, 1] (a number or its text); a
    ``ValueError`` naming the choices otherwise."""
    if value is None or value == "none":
        return "none"
    if value == "auto":
        return "auto"
    try:
        x = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        x = None
    if x == 0:
        return "none"
    if x is None or not 0 < x <= 1:
        raise ValueError(f"offload must be none, auto or a fraction in (0, 1] of each forward's activation, got {value!r}")
    return x


def _backward_steps(schedule: Schedule) -> list[dict[tuple[int, int], int]]:
    """Per device, ``(stage, mb) -> step`` of its ``B`` or ``BW``."""
    return [{(ps.stage, ps.microbatch): i for i, ps in enumerate(row) if ps.op in (Op.B, Op.BW)}
            for row in schedule.device_passes]


def with_recompute(schedule: Schedule, mode: str = "full",
                   which: Iterable[tuple[int, int]] | None = None) -> Schedule:
    """``schedule`` with an ``R`` of each ``(stage, microbatch)`` in ``which`` (default: every
    forward) right before its ``B``/``BW``; ``mode`` is ``"full"`` or ``"selective"``. A forward
    that is already recomputed or offloaded is left as it is."""
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute mode must be one of {RECOMPUTE_MODES}, got {mode!r}")
    chosen = None if which is None else set(which)
    taken = {(ps.stage, ps.microbatch) for row in schedule.device_passes for ps in row if ps.op is Op.R}
    taken |= {(c.stage, c.microbatch) for row in schedule.copies for c in row}
    rows, lanes, pairs = [], [], []
    for d in range(schedule.num_devices):
        out: list[Pass] = []
        moved: list[int] = []  # old step -> new step
        starts: list[int] = []
        # unit by unit: the R of a backward that is overlapped with a forward goes before the pair,
        # so the pair's two passes stay next to each other (one unit)
        for unit in schedule.units(d):
            for ps in unit:
                key = (ps.stage, ps.microbatch)
                if ps.op in (Op.B, Op.BW) and key not in taken and (chosen is None or key in chosen):
                    out.append(Pass(Op.R, ps.stage, ps.microbatch))
            if len(unit) == 2:
                starts.append(len(out))
            for ps in unit:
                moved.append(len(out))
                out.append(ps)
        rows.append(tuple(out))
        pairs.append(tuple(starts))
        if schedule.copies:  # a reload stays issued after the same pass, now at its new step
            lanes.append(tuple(c._replace(after=moved[c.after]) if c.kind == "L" and c.after >= 0 else c
                               for c in schedule.copies[d]))
    return replace(schedule, device_passes=tuple(rows), recompute_mode=mode,
                   copies=tuple(lanes) if schedule.copies else schedule.copies,
                   overlaps=tuple(pairs) if schedule.overlaps else schedule.overlaps)


def _pass_times(schedule: Schedule, costs: Costs) -> list[list[float]]:
    """Each device's pass times in its order (a ``BW`` takes ``b + w``)."""
    S, p = schedule.num_stages, schedule.num_devices
    f, b, w = costs.stage_times(S, p)
    rec = costs.recompute_times(S, p, schedule.recompute_mode)
    table = {Op.F: f, Op.B: b, Op.W: w, Op.R: rec}

    def time(ps: Pass) -> float:
        return b[ps.stage] + w[ps.stage] if ps.op is Op.BW else table[ps.op][ps.stage]

    return [[time(ps) for ps in row] for row in schedule.device_passes]


def with_offload(schedule: Schedule, fraction: float = 1.0, which: Iterable[tuple[int, int]] | None = None,
                 costs: Costs | None = None) -> Schedule:
    """``schedule`` with ``fraction`` of each chosen forward's activation offloaded after it and
    reloaded before its backward. ``which`` defaults to every forward with at least one pass
    between it and its backward (where a copy can hide); forwards that are recomputed are left
    alone. The reload is issued after the latest pass that leaves the passes before the
    backward at least the reload's time (``costs``; one pass ahead without costs)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"offload fraction must be a number in (0, 1], got {fraction!r}")
    chosen = None if which is None else set(which)
    recomputed = {(ps.stage, ps.microbatch) for row in schedule.device_passes for ps in row if ps.op is Op.R}
    times = _pass_times(schedule, costs) if costs is not None else None
    backs = _backward_steps(schedule)
    lanes = []
    for d, row in enumerate(schedule.device_passes):
        have = list(schedule.copies[d]) if schedule.copies else []
        done = {(c.stage, c.microbatch) for c in have}
        for i, ps in enumerate(row):
            key = (ps.stage, ps.microbatch)
            if ps.op is not Op.F or key in done or key in recomputed:
                continue
            j = backs[d][key]
            if chosen is None and j - i < 2 or chosen is not None and key not in chosen:
                continue
            copy_time = (costs.offload * fraction * _activation(schedule, ps.stage)) if costs is not None else 0.0
            after = _issue_step(i, j, times[d] if times else None, copy_time)
            have += [Copy("O", ps.stage, ps.microbatch, float(fraction)), Copy("L", ps.stage, ps.microbatch, after=after)]
        lanes.append(tuple(have))
    return replace(schedule, copies=tuple(lanes))


def _activation(schedule: Schedule, stage: int) -> float:
    """The even share ``p / S`` of ``a`` a stage's forward allocates (the default memory model)."""
    return schedule.num_devices / schedule.num_stages


def _issue_step(f_step: int, b_step: int, times: list[float] | None, copy_time: float) -> int:
    """The latest step in ``f_step .. b_step - 1`` after which the passes up to ``b_step`` take at
    least ``copy_time`` (the forward's own step when none does); without times, one pass ahead."""
    if times is None:
        return max(f_step, b_step - 2)
    covered = 0.0
    for step in range(b_step - 1, f_step, -1):
        if covered >= copy_time:
            return step
        covered += times[step]
    return f_step


def apply_levers(schedule: Schedule, recompute: str = "none", offload: object = "none",
                 costs: Costs | None = None) -> Schedule:
    """``schedule`` with ``recompute`` (``none``, ``selective``, ``full``) and ``offload``
    (``none`` or a fraction) applied to every forward."""
    if recompute != "none":
        schedule = with_recompute(schedule, recompute)
    if offload != "none":
        schedule = with_offload(schedule, float(offload), costs=costs or Costs())
    return schedule
