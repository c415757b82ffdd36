"""Validation of schedules: structure, placement, dependencies and cross-device deadlock.

A valid schedule runs, for every stage ``s`` and microbatch ``k``, exactly one ``F`` and either
one ``BW`` or one ``B`` and one ``W``, each on the device that holds ``s``. The data
dependencies are those of docs/architecture.md:

* ``F(s, k)`` needs ``F(s-1, k)``;
* ``B(s, k)`` (or ``BW``) needs ``B(s+1, k)`` (or ``BW``), and the last stage's needs its own
  ``F`` (the loss turns the forward into the backward);
* ``W(s, k)`` needs ``B(s, k)``;
* with the memory levers (docs/theory.md §13): ``R(s, k)`` needs ``F(s, k)`` and must come before
  ``B(s, k)`` (or ``BW``) on the same device; an offload of ``(s, k)`` needs ``F(s, k)``, its
  reload the offload and the end of the compute pass it is issued after, which must come at or
  after ``F(s, k)`` and before ``B(s, k)``; ``B(s, k)`` then waits for the reload.

Each device runs its passes in the given order; :func:`execute` runs them as soon as possible
and detects deadlock, a cycle between device orders. :class:`ScheduleError` names the device,
its position (step), the pass and what it waits for, and prints the step-by-device grid with a
marker at the failing step, in the manner of torch's pipelining validator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ctrlmem.model.ir import Op, Pass, Schedule

__all__ = ["ScheduleError", "validate", "ScheduleIndex", "index_schedule", "execute", "format_grid"]



class ScheduleError(ValueError):
    """A schedule that cannot run. Carries the coordinates of the first problem.

    Attributes:
        device, position: where the problem is (``position`` is the step in that device's order).
        pass_: the pass at fault (or ``None``).
        waits_for: the pass it waits for, when it is a dependency problem.
        grid: the step-by-device grid with the marker.
    """

    def __init__(
        self,
        message: str,
        device: int | None = None,
        position: int | None = None,
        pass_: Pass | None = None,
        waits_for: Pass | None = None,
        grid: str = "",
    ):
        self.device = device
        self.position = position
        self.pass_ = pass_
        self.waits_for = waits_for
        self.grid = grid
        self.reason = message
        super().__init__(message + (f"\n\n{grid}" if grid else ""))


def format_grid(
    schedule: Schedule,
    device: int | None = None,
    position: int | None = None,
    window: int = 6,
) -> str:
    """The schedule as a step-by-device table (rows are steps, columns devices), marking the
    cell ``(device, position)`` with ``>>`` and its row with ``<-- ERROR HERE``. Long schedules
    show only ``window`` steps on either side of the marker."""
    rows = schedule.device_passes
    depth = max((len(r) for r in rows), default=0)
    if position is None:
        lo, hi = 0, min(depth, 2 * window + 1)
    else:
        lo, hi = max(0, position - window), min(depth, position + window + 1)
    cells = [[""] + [f"d{d}" for d in range(len(rows))]]
    for step in range(lo, hi):
        line = [f"step {step}"]
        for d, row in enumerate(rows):
            text = str(row[step]) if step < len(row) else ""
            if d == device and step == position:
                text = ">>" + text
            line.append(text)
        cells.append(line)
    widths = [max(len(r[c]) for r in cells) for c in range(len(cells[0]))]
    out = []
    if lo > 0:
        out.append(f"... ({lo} earlier steps)")
    for i, line in enumerate(cells):
        text = "  ".join(c.rjust(w) for c, w in zip(line, widths))
        if i > 0 and position is not None and lo + i - 1 == position:
            text += f"  <-- ERROR HERE (device {device})"
        out.append(text.rstrip())
    if hi < depth:
        out.append(f"... ({depth - hi} later steps)")
    return "\n".join(out)


@dataclass
class ScheduleIndex:
    """Flat integer view of a structurally valid schedule, shared by validation and simulation.

    A pass is identified by ``key = (kind * S + stage) * m + microbatch`` with kind 0 = F,
    1 = B or BW, 2 = W, and with the levers 3 = R, 4 = offload, 5 = reload (the arrays then
    grow to ``4·S·m`` or ``6·S·m``; without levers they hold ``3·S·m``). ``dep[key]`` is the key it
    needs (-1 for none), ``device[key]`` the device that runs it, ``where[key]`` its position on
    that device (for a copy: on its lane). ``lanes`` are the copy lanes (two per device with
    copies: device-to-host, host-to-device), ``lane_owner`` their devices, and ``extra_dep`` the
    keys a pass needs beyond ``dep`` (a ``B`` its reload, a reload its issuing pass), all on the
    same device.
    """

    num_stages: int
    num_microbatches: int
    device_keys: list[list[int]]
    device: list[int]
    where: list[int]
    dep: list[int]
    fused: bytearray  # per (stage * m + mb): 1 when the backward is a fused BW
    lanes: list[list[int]] = field(default_factory=list)
    lane_owner: list[int] = field(default_factory=list)
    extra_dep: dict[int, tuple[int, ...]] = field(default_factory=dict)
    fractions: dict[int, float] = field(default_factory=dict)  # offload key -> fraction copied
    partner: list[int] | None = None  # per key: the key of the pass it overlaps with, when it starts a pair

    @property
    def kinds(self) -> int:
        """Key kinds the arrays hold (3 without levers, 4 with ``R``, 6 with copies)."""
        return len(self.device) // (self.num_stages * self.num_microbatches)

    def pass_of(self, key: int) -> Pass:
        sm = self.num_stages * self.num_microbatches
        kind, rem = divmod(key, sm)
        stage, mb = divmod(rem, self.num_microbatches)
        if kind == 0:
            op = Op.F
        elif kind == 2:
            op = Op.W
        elif kind == 3:
            op = Op.R
        elif kind > 3:
            raise ValueError(f"key {key} is a {'reload' if kind == 5 else 'offload'} copy, not a pass; "
                             "use ScheduleIndex.describe")
        else:
            op = Op.BW if self.fused[rem] else Op.B
        return Pass(op, stage, mb)


def _describe(index: ScheduleIndex, key: int) -> str:
    """A pass's text, or ``offload 3O0`` / ``reload 3L0`` for a copy."""
    sm = index.num_stages * index.num_microbatches
    kind, rem = divmod(key, sm)
    if kind < 4:
        return str(index.pass_of(key))
    stage, mb = divmod(rem, index.num_microbatches)
    return f"{'reload' if kind == 5 else 'offload'} {stage}{'L' if kind == 5 else 'O'}{mb}"


ScheduleIndex.describe = _describe


def _fail(schedule: Schedule, message: str, device: int, position: int, pass_: Pass, waits_for=None):
    raise ScheduleError(
        message,
        device=device,
        position=position,
        pass_=pass_,
        waits_for=waits_for,
        grid=format_grid(schedule, device, position),
    )


def index_schedule(schedule: Schedule) -> ScheduleIndex:
    """Check the structure of ``schedule`` and return its :class:`ScheduleIndex`.

    Raises :class:`ScheduleError` for a pass on the wrong device, an out-of-range stage or
    microbatch, a duplicate, a missing pass, or a stage mixing ``BW`` with ``B``/``W``.
    """
    S, m = schedule.num_stages, schedule.num_microbatches
    if m < 1:
        raise ScheduleError(f"num_microbatches must be >= 1, got {m}")
    stage_device = schedule.placement.stage_device
    sm = S * m
    n = 3 * sm
    device = [-1] * n
    where = [-1] * n
    dep = [-1] * n
    fused = bytearray(sm)
    device_keys: list[list[int]] = []
    copies = schedule.model_copies
    per_s, per_m = S // copies, m // copies  # stages and microbatches of one model copy
    last = per_s - 1
    op_f, op_w, op_bw = Op.F, Op.W, Op.BW
    num_w = num_r = 0
    for d, row in enumerate(schedule.device_passes):
        keys = []
        for pos, ps in enumerate(row):
            s, k, op = ps.stage, ps.microbatch, ps.op
            if not 0 <= s < S:
                _fail(schedule, f"device {d}, step {pos}: pass {ps} names stage {s}, outside 0..{S - 1}", d, pos, ps)
            if not 0 <= k < m:
                _fail(schedule, f"device {d}, step {pos}: pass {ps} names microbatch {k}, outside 0..{m - 1}", d, pos, ps)
            if stage_device[s] != d:
                _fail(
                    schedule,
                    f"device {d}, step {pos}: pass {ps} runs stage {s}, which the placement "
                    f"({schedule.placement.kind}) puts on device {stage_device[s]}",
                    d, pos, ps,
                )
            r = s * m + k
            if copies != 1 and k // per_m != s // per_s:
                _fail_copy(schedule, d, pos, ps, per_s, per_m)
            if op is Op.R:
                if len(device) < 4 * sm:
                    _grow(sm, device, where, dep)
                key, need = 3 * sm + r, r
                num_r += 1
            elif op is op_f:
                key = r
                need = r - m if s % per_s else -1  # F(s-1), none at a copy's first stage
            elif op is op_w:
                key = 2 * sm + r
                need = sm + r
                num_w += 1
            else:
                key = sm + r
                need = key + m if s % per_s != last else r  # B(s+1) or, at a copy's loss, its own F
                if op is op_bw:
                    fused[r] = 1
            if device[key] >= 0:
                first = schedule.device_passes[device[key]][where[key]]
                _fail(
                    schedule,
                    f"device {d}, step {pos}: pass {ps} duplicates {first} at step {where[key]} "
                    f"(each stage and microbatch needs one F and one BW, or one B and one W, and at most one R)",
                    d, pos, ps,
                )
            device[key] = d
            where[key] = pos
            dep[key] = need
            keys.append(key)
        device_keys.append(keys)
    total = sum(len(keys) for keys in device_keys) - num_r
    # Without duplicates, the counts match exactly when nothing is missing and no stage mixes
    # BW with W; only then can the detailed scan be skipped.
    num_fused = sum(fused)
    mixed = num_fused and num_w and any(device[2 * sm + r] >= 0 for r in range(sm) if fused[r])
    slots = sm // copies  # the (stage, microbatch) pairs that run: each copy's own
    # pair partners sized for every key kind (R and copy keys included: the simulator looks them up)
    partner = _overlap_partners(schedule, device_keys, 6 * sm) if schedule.overlaps else None
    index = ScheduleIndex(S, m, device_keys, device, where, dep, fused, partner=partner)
    if num_r:
        _check_recomputes(schedule, index)
    if copies != 1 or mixed or total != 3 * slots - num_fused or num_w != slots - num_fused or -1 in device[: 2 * sm]:
        _check_complete(schedule, device, where, fused)
    if schedule.offloads:
        _index_copies(schedule, index)
    return index


def _grow(sm: int, *arrays: list[int]) -> None:
    """Extend the key arrays by one kind (``S·m`` keys) of -1."""
    for arr in arrays:
        arr.extend([-1] * sm)


def _check_recomputes(schedule: Schedule, index: ScheduleIndex) -> None:
    """Every ``R`` after its ``F`` and before its ``B``/``BW``, on the same device."""
    sm = index.num_stages * index.num_microbatches
    for d, keys in enumerate(index.device_keys):
        for key in keys:
            if key < 3 * sm:
                continue
            r, pos = key - 3 * sm, index.where[key]
            ps = schedule.device_passes[d][pos]
            back = Pass(Op.BW if index.fused[r] else Op.B, ps.stage, ps.microbatch)
            if index.device[r] < 0:
                _fail(schedule, f"device {d}, step {pos}: recompute {ps} has no forward "
                      f"{Pass(Op.F, ps.stage, ps.microbatch)} to recompute; add the F before it or drop the R",
                      d, pos, ps, Pass(Op.F, ps.stage, ps.microbatch))
            if index.where[r] > pos:
                _fail(schedule, f"device {d}, step {pos}: recompute {ps} comes before its forward "
                      f"{Pass(Op.F, ps.stage, ps.microbatch)} (step {index.where[r]}); an R recomputes a forward "
                      "that ran: move it after the F", d, pos, ps, Pass(Op.F, ps.stage, ps.microbatch))
            if index.device[sm + r] >= 0 and index.where[sm + r] < pos:
                _fail(schedule, f"device {d}, step {pos}: recompute {ps} comes after its backward {back} "
                      f"(step {index.where[sm + r]}), which needs the recomputed activation; move it before "
                      f"{back}", d, pos, ps, back)


def _index_copies(schedule: Schedule, index: ScheduleIndex) -> None:
    """Add the copy lanes to ``index`` (offloads in their forwards' order, reloads in issue order),
    refusing a copy without its pair, a recomputed forward that is also offloaded, a fraction
    outside (0, 1] and a reload issued before its forward or at/after its backward."""
    S, m = index.num_stages, index.num_microbatches
    sm = S * m
    if len(index.device) < 6 * sm:
        _grow(sm * (6 - len(index.device) // sm), index.device, index.where, index.dep)
    for d, row in enumerate(schedule.copies):
        offs = {}
        loads = {}
        for cp in row:
            _check_copy(schedule, index, d, cp, offs, loads)
        for r in offs.keys() ^ loads.keys():
            s, k = divmod(r, m)
            what = "offload without a reload" if r in offs else "reload without an offload"
            raise ScheduleError(f"device {d}: stage {s} microbatch {k} has an {what}; every offload needs one "
                                "reload before its B", device=d, pass_=Pass(Op.F, s, k))
        out = sorted(offs, key=lambda r: index.where[r])
        back = sorted(loads, key=lambda r: (loads[r].after, index.where[sm + r]))
        for rs, kind in ((out, 4), (back, 5)):
            keys = [kind * sm + r for r in rs]
            for pos, key in enumerate(keys):
                r = key - kind * sm
                index.device[key], index.where[key] = d, pos
                index.dep[key] = r if kind == 4 else 4 * sm + r
                if kind == 4:
                    index.fractions[key] = offs[r].fraction
                else:
                    after = loads[r].after
                    index.extra_dep[sm + r] = (key,)
                    if after >= 0:
                        index.extra_dep[key] = (index.device_keys[d][after],)
            index.lanes.append(keys)
            index.lane_owner.append(d)


def _check_copy(schedule: Schedule, index: ScheduleIndex, d: int, cp, offs: dict, loads: dict) -> None:
    m, sm = index.num_microbatches, index.num_stages * index.num_microbatches
    s, k = cp.stage, cp.microbatch
    if not (0 <= s < index.num_stages and 0 <= k < m) or schedule.placement.stage_device[s] != d:
        raise ScheduleError(f"device {d}: copy {cp} names stage {s} microbatch {k}, which is not on device {d} "
                            f"(stages {list(schedule.placement.stages_of(d))}, microbatches 0..{m - 1})", device=d)
    r = s * m + k
    table = offs if cp.kind == "O" else loads
    if r in table:
        raise ScheduleError(f"device {d}: copy {cp} is given twice", device=d)
    table[r] = cp
    f_pos, b_pos = index.where[r], index.where[sm + r]
    back = Pass(Op.BW if index.fused[r] else Op.B, s, k)
    if cp.kind == "O":
        if not 0 < cp.fraction <= 1:
            raise ScheduleError(f"device {d}: offload {cp} copies a fraction {cp.fraction!r}, outside (0, 1]",
                                device=d)
        if len(index.device) > 3 * sm and index.device[3 * sm + r] >= 0:
            pos = index.where[3 * sm + r]
            _fail(schedule, f"device {d}, step {pos}: {s}F{k} is both recomputed ({s}R{k}) and offloaded; "
                  "give each forward one lever", d, pos, Pass(Op.R, s, k))
    elif not f_pos <= cp.after < b_pos:
        where = "after its backward" if cp.after >= b_pos else "before its forward"
        _fail(schedule, f"device {d}, step {b_pos}: pass {back} needs reload {cp}, issued after step {cp.after}, "
              f"{where}; issue it after a step in {f_pos}..{b_pos - 1} (the F at step {f_pos})",
              d, b_pos, back, Pass(Op.F, s, k))


def _fail_copy(schedule: Schedule, d: int, pos: int, ps: Pass, per_s: int, per_m: int) -> None:
    c = ps.stage // per_s
    _fail(schedule, f"device {d}, step {pos}: pass {ps} runs microbatch {ps.microbatch} on stage {ps.stage} of model "
                    f"copy {c}, which runs microbatches {c * per_m}..{(c + 1) * per_m - 1} only", d, pos, ps)


def _overlap_partners(schedule: Schedule, device_keys: list[list[int]], n: int) -> list[int]:
    """Per key, the key of the second pass of the overlapped pair it starts (-1 elsewhere);
    :class:`ScheduleError` for a pair that is not one forward and one backward (``B`` or ``BW``)
    of two different microbatches (a microbatch's backward needs its own forward finished)."""
    partner = [-1] * n
    for d, starts in enumerate(schedule.overlaps):
        row = schedule.device_passes[d]
        for i in starts:
            kinds = {row[i].op, row[i + 1].op}
            if Op.F not in kinds or not kinds & {Op.B, Op.BW}:
                _fail(schedule, f"device {d}, step {i}: overlapped pair {row[i]}+{row[i + 1]} must be one forward and "
                                "one backward (B or BW)", d, i, row[i])
            if row[i].microbatch == row[i + 1].microbatch:
                _fail(schedule, f"device {d}, step {i}: overlapped pair {row[i]}+{row[i + 1]} runs one microbatch twice; its "
                                "backward needs its forward finished, so pair passes of different microbatches", d, i, row[i])
            partner[device_keys[d][i]] = device_keys[d][i + 1]
    return partner


def _check_complete(schedule: Schedule, device: list[int], where: list[int], fused: bytearray) -> None:
    S, m = schedule.num_stages, schedule.num_microbatches
    sm = S * m
    per_m = m // schedule.model_copies
    for s in range(S):
        first = schedule.copy_of_stage(s) * per_m
        for k in range(first, first + per_m):
            r = s * m + k
            f_key, b_key, w_key = r, sm + r, 2 * sm + r
            missing = None
            if device[f_key] < 0:
                missing = Pass(Op.F, s, k)
            elif device[b_key] < 0:
                missing = Pass(Op.B if device[w_key] >= 0 else Op.BW, s, k)
            elif fused[r] and device[w_key] >= 0:
                d, pos = device[w_key], where[w_key]
                _fail(
                    schedule,
                    f"device {d}, step {pos}: stage {s} microbatch {k} has a fused BW and also a W; "
                    "use either BW alone or B followed by W",
                    d, pos, schedule.device_passes[d][pos],
                )
            elif not fused[r] and device[w_key] < 0:
                missing = Pass(Op.W, s, k)
            if missing is not None:
                d = schedule.placement.stage_device[s]
                raise ScheduleError(
                    f"device {d}: pass {missing} (stage {s}, microbatch {k}) is missing; every stage "
                    "and microbatch needs one F and either one BW or one B and one W",
                    device=d, pass_=missing, grid=format_grid(schedule),
                )


def execute(
    schedule: Schedule,
    index: ScheduleIndex,
    durations: Sequence[float],
    comm: float,
) -> tuple[list[float], list[float]]:
    """Run every pass as soon as possible, keeping each device's order (the paper's squeeze).

    ``durations[key]`` is the time of each pass; ``comm`` is added on every dependency that
    crosses devices. An overlapped pair (``index.partner``) starts when the device is free and
    both inputs are ready, and both passes end after the sum of their durations. Returns
    ``(start, end)`` indexed by key. Raises :class:`ScheduleError` on deadlock, naming the blocked
    pass, what it waits for and where that pass sits.
    """
    dev = index.device
    dep = index.dep
    partner = index.partner
    n = len(dev)
    start = [-1.0] * n
    end = [-1.0] * n
    orders = index.device_keys + index.lanes  # the copy lanes run as orders of their own
    p = len(orders)
    owner = list(range(len(index.device_keys))) + index.lane_owner
    extra = index.extra_dep
    ptr = [0] * p
    free = [0.0] * p
    waiting: dict[int, list[int]] = {}
    queue = list(range(p - 1, -1, -1))
    while queue:
        d = queue.pop()
        od = owner[d]
        keys = orders[d]
        i = ptr[d]
        t_free = free[d]
        count = len(keys)
        while i < count:
            k = keys[i]
            t = t_free
            q = dep[k]
            if q >= 0:
                e = end[q]
                if e < 0.0:
                    waiting.setdefault(q, []).append(d)
                    break
                if dev[q] != od:
                    e += comm
                if e > t:
                    t = e
            if extra and k in extra:
                t = _extra_ready(extra[k], t, end, waiting, d)
                if t < 0.0:
                    break
            if partner is not None and partner[k] >= 0:
                t = _pair_ready(partner[k], t, d, dep, dev, end, comm, waiting)
                if t < 0.0:
                    break
                _run_pair(k, partner[k], t, durations, start, end, waiting, queue)
                i += 2
                t_free = end[k]
                continue
            start[k] = t
            t_free = t + durations[k]
            end[k] = t_free
            i += 1
            woken = waiting.pop(k, None)
            if woken:
                queue.extend(woken)
        ptr[d] = i
        free[d] = t_free
    blocked = [d for d in range(len(index.device_keys)) if ptr[d] < len(orders[d])]
    if blocked:
        _raise_deadlock(schedule, index, _blocked_positions(index, ptr, blocked, end), blocked)
    return start, end


def _extra_ready(needs: tuple[int, ...], t: float, end: list[float], waiting: dict, d: int) -> float:
    """The start time after the same-device keys ``needs`` have ended, or -1 (registered in
    ``waiting``) while one has not."""
    for q in needs:
        e = end[q]
        if e < 0.0:
            waiting.setdefault(q, []).append(d)
            return -1.0
        if e > t:
            t = e
    return t


def _blocked_positions(index: ScheduleIndex, ptr: list[int], blocked: list[int], end: list[float]) -> list[int]:
    """Where each device is stuck: its next position, or the pair's second pass when a pair waits
    for that one's input only."""
    if index.partner is None:
        return ptr
    out = list(ptr)
    for d in blocked:
        k = index.device_keys[d][ptr[d]]
        q = index.dep[k]
        if index.partner[k] >= 0 and (q < 0 or end[q] >= 0.0):
            out[d] += 1
    return out


def _pair_ready(k2: int, t: float, d: int, dep, dev, end, comm: float, waiting: dict) -> float:
    """The start of an overlapped pair whose first pass could start at ``t``: also after the
    second pass's input; -1 (and ``d`` waits for that input) when it has not run yet."""
    q = dep[k2]
    if q < 0:
        return t
    e = end[q]
    if e < 0.0:
        waiting.setdefault(q, []).append(d)
        return -1.0
    if dev[q] != dev[k2]:
        e += comm
    return e if e > t else t


def _run_pair(k: int, k2: int, t: float, durations, start, end, waiting: dict, queue: list) -> None:
    """Time the overlapped pair ``k``, ``k2`` from ``t`` (one unit); wake what waits for either."""
    start[k] = start[k2] = t
    end[k] = end[k2] = t + durations[k] + durations[k2]
    for key in (k, k2):
        woken = waiting.pop(key, None)
        if woken:
            queue.extend(woken)


def _raise_deadlock(schedule: Schedule, index: ScheduleIndex, ptr: list[int], blocked: list[int]):
    heads = {d: index.device_keys[d][ptr[d]] for d in blocked}
    # Prefer a same-device order error (the simplest fix), then the lowest device.
    primary = next((d for d in blocked if index.device[index.dep[heads[d]]] == d), blocked[0])
    key = heads[primary]
    need = index.dep[key]
    ps, wp = index.pass_of(key), index.pass_of(need)
    nd, npos = index.device[need], index.where[need]
    pos = ptr[primary]
    if nd == primary:
        msg = (
            f"device {primary}, step {pos}: pass {ps} waits for {wp}, which comes later on the same "
            f"device (step {npos}); move {wp} before {ps}"
        )
    else:
        chain = []
        seen = set()
        d = primary
        while d in heads and d not in seen:
            seen.add(d)
            h = heads[d]
            q = index.dep[h]
            chain.append(
                f"device {d} step {ptr[d]} {index.pass_of(h)} waits for {index.pass_of(q)} "
                f"(device {index.device[q]} step {index.where[q]})"
            )
            d = index.device[q]
        msg = (
            f"deadlock: device {primary}, step {pos}: pass {ps} waits for {wp} on device {nd} "
            f"(its step {npos}), which is never reached.\nWait chain: " + "; ".join(chain)
        )
    raise ScheduleError(
        msg, device=primary, position=pos, pass_=ps, waits_for=wp,
        grid=format_grid(schedule, primary, pos),
    )


def validate(schedule: Schedule) -> Schedule:
    """Check that ``schedule`` can run; return it unchanged, or raise :class:`ScheduleError`.

    Checks: passes sit on their stage's device; each (stage, microbatch) has one F and one BW,
    or one B and one W; each device's order respects the dependencies on that device; and the
    device orders together do not deadlock.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a ctrlmem Schedule (from cm.build or a file import), got "
                        f"{type(schedule).__name__} {schedule!r}"[:200])
    index = index_schedule(schedule)
    execute(schedule, index, [1.0] * len(index.device), 0.0)
    return schedule
