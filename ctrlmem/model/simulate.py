"""Exact, order-preserving, as-soon-as-possible simulation of a schedule (docs/architecture.md).

Each pass starts when its device is free and its input has arrived: ``comm`` is added to every
dependency that crosses devices. Devices keep their order, which is the paper's *squeeze*
(docs/theory.md §2). Memory in units of ``a`` comes from the same timeline: an ``F`` allocates its
stage's activation at its start; ``B`` releases ``MemoryModel.release_at_b`` of it at its end,
``W`` the rest at its end, ``BW`` all of it. At equal times releases come before allocations.

With the memory levers (docs/theory.md §13) a recomputed forward allocates only
``Costs.kept_fraction`` of its activation, its ``R`` the rest at its start; an offloaded share
leaves device memory when its copy to the host ends and comes back when its reload starts, so
memory counts what is resident while a copy is in flight. Copies run on two lanes per device
(device-to-host, host-to-device) beside compute; a ``B`` waits for its reload.

Definitions (docs/theory.md §5): a device's *span* runs from the start of its first pass to the end
of its last; its *work* is the sum of its pass times; its *bubble* is span − work. The bubble
rate is ``1 − max_work / max_span``; with equal costs per device this is the paper's
``1 − m·(F+B+W) / longest span``. ``makespan`` is the global end time (all devices start at 0).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.model.validate import ScheduleIndex, execute, index_schedule

__all__ = ["simulate", "SimResult", "TimedPass", "Transfer"]


class TimedPass(NamedTuple):
    device: int
    op: Op
    stage: int
    microbatch: int
    start: float
    end: float


class Transfer(NamedTuple):
    """One cross-device dependency of a timeline: ``sender``'s output goes to ``receiver``'s device
    (sent at ``sender.end``, arriving ``comm`` later)."""

    sender: TimedPass
    receiver: TimedPass


def _clean(x: float) -> float:
    """Round away float noise (sums of thirds and halves) so exact results compare exactly."""
    return round(x, 9) + 0.0


@dataclass
class SimResult:
    """Timeline and statistics of one simulated schedule.

    Attributes:
        schedule, costs, memory: the inputs.
        makespan: end of the last pass (global clock, all devices start at 0).
        device_spans: per device, end of its last pass − start of its first.
        device_work: per device, the sum of its pass times.
        device_bubbles: per device, span − work.
        bubble_rate: ``1 − max(device_work) / max(device_spans)``.
        peak_memory: per device, the peak activation memory in units of ``a``.
        passes: every pass with its device and start/end times (device-major, in order).
        copies: every activation copy (``op`` is ``"O"`` or ``"L"``) with its times.
    """

    schedule: Schedule
    costs: Costs
    memory: MemoryModel
    makespan: float
    device_spans: list[float]
    device_work: list[float]
    device_bubbles: list[float]
    bubble_rate: float
    peak_memory: list[float]
    _index: ScheduleIndex = field(repr=False)
    _start: list[float] = field(repr=False)
    _end: list[float] = field(repr=False)
    _events: list[list[tuple[float, float]]] = field(repr=False)

    @cached_property
    def copies(self) -> list[TimedPass]:
        idx, start, end = self._index, self._start, self._end
        sm = idx.num_stages * idx.num_microbatches
        out = []
        for d, keys in zip(idx.lane_owner, idx.lanes):
            for key in keys:
                kind, r = divmod(key, sm)
                stage, mb = divmod(r, idx.num_microbatches)
                out.append(TimedPass(d, "O" if kind == 4 else "L", stage, mb, start[key], end[key]))
        return out

    @cached_property
    def passes(self) -> list[TimedPass]:
        idx, start, end = self._index, self._start, self._end
        out = []
        for d, keys in enumerate(idx.device_keys):
            for key in keys:
                ps = idx.pass_of(key)
                out.append(TimedPass(d, ps.op, ps.stage, ps.microbatch, start[key], end[key]))
        return out

    def forward_windows(self) -> list[tuple[int, int, int, float, float]]:
        """Every forward as ``(device, stage, microbatch, end of its F, start of its B or BW)``
        (the window a memory lever acts in), stage-major; faster than reading :attr:`passes`."""
        idx, start, end = self._index, self._start, self._end
        m, sm = idx.num_microbatches, idx.num_stages * idx.num_microbatches
        device = idx.device
        return [(device[k], k // m, k % m, end[k], start[sm + k]) for k in range(sm)]

    def transfers(self) -> list[Transfer]:
        """Every dependency that crosses devices (an activation forward, a gradient backward), in
        the receivers' device-major order."""
        idx, start, end = self._index, self._start, self._end
        out = []
        for d, keys in enumerate(idx.device_keys):
            for key in keys:
                q = idx.dep[key]
                if q >= 0 and idx.device[q] != d:
                    a, b = idx.pass_of(q), idx.pass_of(key)
                    out.append(Transfer(TimedPass(idx.device[q], a.op, a.stage, a.microbatch, start[q], end[q]),
                                        TimedPass(d, b.op, b.stage, b.microbatch, start[key], end[key])))
        return out

    def timing(self, device: int, position: int) -> tuple[float, float]:
        """(start, end) of the pass at ``position`` in ``device``'s order."""
        key = self._index.device_keys[device][position]
        return self._start[key], self._end[key]

    def memory_curve(self, device: int) -> tuple[list[float], list[float]]:
        """Step curve of ``device``'s activation memory: ``values[i]`` holds from ``times[i]``
        until ``times[i+1]``. Starts at ``(0, 0)``."""
        times, values = [0.0], [0.0]
        level = 0.0
        for t, delta in self._events[device]:
            level += delta
            if t == times[-1]:
                values[-1] = _clean(level)
            else:
                times.append(t)
                values.append(_clean(level))
        return times, values

    @property
    def memory_curves(self) -> list[tuple[list[float], list[float]]]:
        return [self.memory_curve(d) for d in range(self.schedule.num_devices)]

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)

    def to_dict(self, include_passes: bool = True) -> dict:
        """JSON-ready dict; its keys are the SimResult fields (docs/architecture.md)."""
        out = {
            "schedule": self.schedule.name,
            "num_devices": self.schedule.num_devices,
            "num_microbatches": self.schedule.num_microbatches,
            "num_stages": self.schedule.num_stages,
            "placement": self.schedule.placement.kind,
            "costs": self.costs.to_dict(),
            "release_at_b": self.memory.release_at_b,
            **({"kept": self.memory.kept} if self.memory.kept is not None else {}),
            "makespan": self.makespan,
            "device_spans": self.device_spans,
            "device_work": self.device_work,
            "device_bubbles": self.device_bubbles,
            "bubble_rate": self.bubble_rate,
            "peak_memory": self.peak_memory,
        }
        if include_passes and self._index.lanes:
            out["copies"] = [{"device": c.device, "op": c.op, "stage": c.stage, "microbatch": c.microbatch,
                              "start": c.start, "end": c.end} for c in self.copies]
        if include_passes:
            out["passes"] = [
                {"device": tp.device, "op": tp.op.value, "stage": tp.stage, "microbatch": tp.microbatch,
                 "start": tp.start, "end": tp.end}
                for tp in self.passes
            ]
        return out


def pass_durations(index: ScheduleIndex, f, b, w) -> list[float]:
    """Each pass's time, indexed by the key of ``index`` (:class:`ctrlmem.model.validate.ScheduleIndex`),
    from per-stage times ``f``, ``b``, ``w`` (a fused ``BW`` takes ``b + w``)."""
    S, m = index.num_stages, index.num_microbatches
    sm = S * m
    fused = index.fused
    durations = [0.0] * (3 * sm)
    for st in range(S):
        base = st * m
        durations[base : base + m] = [f[st]] * m
        if any(fused[base : base + m]):
            durations[sm + base : sm + base + m] = [b[st] + w[st] if fused[base + k] else b[st] for k in range(m)]
        else:
            durations[sm + base : sm + base + m] = [b[st]] * m
        durations[2 * sm + base : 2 * sm + base + m] = [w[st]] * m
    return durations


def _scale_overlapped(index: ScheduleIndex, durations: list[float], fb_overlap: float) -> None:
    """An overlapped pair's two passes take ``fb_overlap`` of their times (their sum is the unit's
    time, so each device's work stays the sum of its durations)."""
    if index.partner is None or fb_overlap == 1.0:
        return
    for k, k2 in enumerate(index.partner):
        if k2 >= 0:
            durations[k] *= fb_overlap
            durations[k2] *= fb_overlap


def simulate(
    schedule: Schedule,
    costs: Costs | None = None,
    memory: MemoryModel | None = None,
) -> SimResult:
    """Simulate ``schedule`` under ``costs`` (default: F = B = W = 1, comm 0) and ``memory``.

    ``costs`` may also be given as ``"F,B,W[,COMM]"`` text or an ``(F, B, W[, COMM])`` tuple
    (:meth:`Costs.coerce`); other types raise ``TypeError`` naming the argument.

    Raises :class:`ctrlmem.ScheduleError` if the schedule is malformed or deadlocks.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a ctrlmem Schedule (from cm.build or a file import), got "
                        f"{type(schedule).__name__} {schedule!r}"[:200])
    costs = Costs.coerce(costs, "costs")
    memory = MemoryModel.coerce(memory, "memory")
    S, p = schedule.num_stages, schedule.num_devices
    # a model copy's layers are split over S / copies stages (two copies: each stage is 1/p of the model)
    f, b, w = costs.stage_times(S, p * schedule.model_copies)
    act = memory.stage_activation(S, p * schedule.model_copies)
    index = _index_of(schedule)
    durations = pass_durations(index, f, b, w)
    keep = _kept(schedule, index, costs, act, memory.stage_kept(S, p * schedule.model_copies)) \
        if index.kinds > 3 else None
    if keep is not None:
        _lever_durations(schedule, index, costs, durations, keep)
    _scale_overlapped(index, durations, costs.fb_overlap)
    plan = _plan_of(index)
    if plan is not None:
        start, end = _run_plan(plan, len(index.device), durations, float(costs.comm))
    else:  # copy lanes, a lever's extra dependencies, overlapped pairs, or a deadlock to report
        start, end = execute(schedule, index, durations, float(costs.comm))

    rb = memory.release_at_b
    spans, work, peaks, events = [], [], [], []
    makespan = 0.0
    static = _memory_deltas(index, act, rb)
    for d, keys in enumerate(index.device_keys):
        if not keys:
            spans.append(0.0), work.append(0.0), peaks.append(0.0), events.append([])
            continue
        # a device runs its passes in order, each after the previous one ended (an overlapped
        # pair's two passes share their start and end): its first pass starts first, its last ends last
        first = start[keys[0]]
        last = end[keys[-1]]
        makespan = max(makespan, last)
        spans.append(_clean(last - first))
        work.append(_clean(math.fsum(map(durations.__getitem__, keys))))
        at_start, at_end = static[d]
        ev: list[tuple[float, float]] = [(start[k], a) for k, a in at_start]
        ev += [(end[k], a) for k, a in at_end]
        if keep is not None:
            ev += _lever_events(index, keys, keep, act, start, end)
        ev.sort()  # at equal times the negative deltas (releases) sort first
        level = peak = 0.0
        for _, delta in ev:
            level += delta
            if level > peak:
                peak = level
        peaks.append(_clean(peak))
        events.append(ev)
    if keep is not None:  # a device's span and its makespan end with its copies too
        for lane in index.lanes:
            if lane:
                makespan = max(makespan, max(end[k] for k in lane))
    max_span = max(spans)
    # work <= span on every device, so the rate is >= 0; clamp the float noise of huge sums
    bubble_rate = max(0.0, _clean(1.0 - max(work) / max_span)) if max_span > 0 else 0.0
    return SimResult(
        schedule=schedule,
        costs=costs,
        memory=memory,
        makespan=_clean(makespan),
        device_spans=spans,
        device_work=work,
        device_bubbles=[_clean(s - w_) for s, w_ in zip(spans, work)],
        bubble_rate=bubble_rate,
        peak_memory=peaks,
        _index=index,
        _start=start,
        _end=end,
        _events=events,
    )


_PLANS: "OrderedDict[int, tuple[ScheduleIndex, tuple | None]]" = OrderedDict()


def _plan_of(index: ScheduleIndex) -> tuple | None:
    """The order :func:`~ctrlmem.model.validate.execute` times the passes in, with what each one
    waits for: ``(keys, previous, dep, crosses)`` (per pass: its key, the key before it on its
    device or -1, the key it needs or -1, and whether that one runs on another device). Which
    pass ``execute`` can time next depends on the orders only, never on the costs, so a schedule
    simulated again under new costs (every cost edit of the explorer) is timed by one loop over
    this list (:func:`_run_plan`), with the very same additions and comparisons: 3 times faster.
    ``None`` when ``execute`` itself is needed: copy lanes, extra dependencies (the levers),
    overlapped pairs, or a deadlock (reported by ``execute``). The last few are kept."""
    key = id(index)
    with _INDEXES_LOCK:
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is index:
            _PLANS.move_to_end(key)
            return hit[1]
    plan = None
    if index.partner is None and not index.extra_dep and not index.lanes:
        plan = _structural_order(index)
    with _INDEXES_LOCK:
        _PLANS[key] = (index, plan)
        while len(_PLANS) > _DELTAS_KEPT:
            _PLANS.popitem(last=False)
    return plan


def _structural_order(index: ScheduleIndex) -> tuple | None:
    """``execute``'s loop without the clock: the order it reaches the passes in (a device runs
    on until a pass waits for one not reached yet; that device resumes when it is), or None on
    a deadlock."""
    dev, dep, orders = index.device, index.dep, index.device_keys
    done = bytearray(len(dev))
    ptr = [0] * len(orders)
    waiting: dict[int, list[int]] = {}
    queue = list(range(len(orders) - 1, -1, -1))
    out_keys, out_prev, out_dep, out_cross = [], [], [], []
    while queue:
        d = queue.pop()
        keys = orders[d]
        i = ptr[d]
        while i < len(keys):
            k = keys[i]
            q = dep[k]
            if q >= 0 and not done[q]:
                waiting.setdefault(q, []).append(d)
                break
            out_keys.append(k)
            out_prev.append(keys[i - 1] if i else -1)
            out_dep.append(q)
            out_cross.append(q >= 0 and dev[q] != d)
            done[k] = 1
            i += 1
            woken = waiting.pop(k, None)
            if woken:
                queue.extend(woken)
        ptr[d] = i
    if any(ptr[d] < len(keys) for d, keys in enumerate(orders)):
        return None
    return out_keys, out_prev, out_dep, out_cross


def _run_plan(plan: tuple, n: int, durations: list[float], comm: float) -> tuple[list[float], list[float]]:
    """Start and end of every pass, by :func:`_plan_of`'s order: a pass starts when the one
    before it on its device has ended and its input has arrived (``comm`` later across devices),
    as in ``execute``."""
    start = [-1.0] * n
    end = [-1.0] * n
    for k, before, q, cross in zip(*plan):
        t = end[before] if before >= 0 else 0.0
        if q >= 0:
            e = end[q]
            if cross:
                e += comm
            if e > t:
                t = e
        start[k] = t
        end[k] = t + durations[k]
    return start, end


_DELTAS: "OrderedDict[tuple, tuple[ScheduleIndex, list]]" = OrderedDict()
_DELTAS_KEPT = 8


def _memory_deltas(index: ScheduleIndex, act: list[float], rb: float) -> list:
    """Per device, the memory each of its passes moves: ``(at_start, at_end)``, lists of ``(key,
    delta)`` (an ``F`` allocates its stage's activation at its start; a ``B`` releases the share
    ``rb`` at its end, a fused ``BW`` all of it, a ``W`` the rest; the levers' passes are
    :func:`_lever_events`'). They depend on the orders and the memory model only, so a schedule
    simulated again under new costs (every cost edit of the explorer) reuses them; the last few
    are kept."""
    key = (id(index), rb, tuple(act))
    with _INDEXES_LOCK:
        hit = _DELTAS.get(key)
        if hit is not None and hit[0] is index:
            _DELTAS.move_to_end(key)
            return hit[1]
    sm, m, fused = index.num_stages * index.num_microbatches, index.num_microbatches, index.fused
    out = []
    for keys in index.device_keys:
        at_start, at_end = [], []
        for k in keys:
            kind, r = divmod(k, sm)
            a = act[r // m]
            if kind == 0:
                at_start.append((k, a))
            elif kind == 1:
                if fused[r]:
                    at_end.append((k, -a))
                elif rb:
                    at_end.append((k, -a * rb))
            elif kind == 2:
                at_end.append((k, -a * (1.0 - rb)))
        out.append((at_start, at_end))
    with _INDEXES_LOCK:
        _DELTAS[key] = (index, out)
        while len(_DELTAS) > _DELTAS_KEPT:
            _DELTAS.popitem(last=False)
    return out


_INDEXES: "OrderedDict[int, tuple[weakref.ref, ScheduleIndex]]" = OrderedDict()
_INDEXES_KEPT = 32
_INDEXES_LOCK = threading.RLock()  # re-entrant: a schedule freed by a collection inside the lock runs forget


def _index_of(schedule: Schedule) -> ScheduleIndex:
    """``index_schedule(schedule)``, kept for the last :data:`_INDEXES_KEPT` schedules alive: the
    index depends on the orders only (a schedule is immutable), so simulating the same schedule
    under new costs — every cost edit of the explorer, every point of a cost sweep — skips it (34 ms
    of the 100 ms of a simulation at p = 32, m = 256). The index is only read after it is built."""
    key = id(schedule)
    with _INDEXES_LOCK:
        hit = _INDEXES.get(key)
        if hit is not None and hit[0]() is schedule:
            _INDEXES.move_to_end(key)
            return hit[1]
    index = index_schedule(schedule)

    def forget(_ref, key=key):
        with _INDEXES_LOCK:
            entry = _INDEXES.get(key)
            if entry is not None and entry[0] is _ref:
                del _INDEXES[key]

    with _INDEXES_LOCK:
        _INDEXES[key] = (weakref.ref(schedule, forget), index)
        while len(_INDEXES) > _INDEXES_KEPT:
            _INDEXES.popitem(last=False)
    return index


def _kept(schedule: Schedule, index: ScheduleIndex, costs: Costs, act: list[float],
          kept: list[float] | None = None) -> list[float]:
    """Per ``stage * m + mb``, the activation a forward keeps resident after it (for a recomputed
    one the stage's ``MemoryModel.kept``, or ``a`` times ``Costs.kept_fraction``)."""
    S, m = index.num_stages, index.num_microbatches
    sm = S * m
    frac = costs.kept_fraction(schedule.recompute_mode)
    keep = [act[r // m] for r in range(sm)]
    for r in range(sm):
        if index.device[3 * sm + r] >= 0:
            keep[r] = kept[r // m] if kept is not None else keep[r] * frac
    return keep


def _lever_durations(schedule: Schedule, index: ScheduleIndex, costs: Costs, durations: list[float],
                     keep: list[float]) -> None:
    """Extend ``durations`` with the ``R`` passes' times and the copies' (``Costs.offload`` per
    ``a`` copied)."""
    S, m, p = index.num_stages, index.num_microbatches, schedule.num_devices
    sm = S * m
    rec = costs.recompute_times(S, p, schedule.recompute_mode)
    durations.extend(rec[st] for st in range(S) for _ in range(m))
    if index.kinds > 4:
        copy = [0.0] * sm
        for key, frac in index.fractions.items():
            copy[key - 4 * sm] = float(costs.offload) * frac * keep[key - 4 * sm]
        durations.extend(copy)
        durations.extend(copy)


def _lever_events(index: ScheduleIndex, keys: list[int], keep: list[float], act: list[float],
                  start: list[float], end: list[float]) -> list[tuple[float, float]]:
    """One device's memory deltas from its levers: a recomputed forward gives back what it does
    not keep at its start and its ``R`` takes it at its start; an offloaded share leaves at its
    copy's end and returns at its reload's start."""
    S, m = index.num_stages, index.num_microbatches
    sm = S * m
    ev: list[tuple[float, float]] = []
    for key in keys:
        if key >= 3 * sm:  # an R
            r = key - 3 * sm
            rest = act[r // m] - keep[r]
            ev += ((start[r], -rest), (start[key], rest))
    if not index.lanes:
        return ev
    d = index.device[keys[0]] if keys else -1
    for owner, lane in zip(index.lane_owner, index.lanes):
        if owner != d:
            continue
        for key in lane:
            kind, r = divmod(key, sm)
            share = index.fractions[4 * sm + r] * keep[r]
            ev.append((end[key], -share) if kind == 4 else (start[key], share))
    return ev
