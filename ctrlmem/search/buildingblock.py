"""Building blocks and the pipeline steps built on them (docs/theory.md §2–§3, §6).

A **building block** is the passes of one microbatch, each with an integer start time (a *slot*)
and a length in slots, on a placement. Repeating it every ``interval`` slots (the paper's *T*)
for ``m`` microbatches gives a pipeline; the paper then *squeezes* it (every pass as early as
possible, keeping each device's order) and *reorders* the warm-up and cool-down without raising
peak memory. Each step here is a function of its own, returning a :class:`Timeline` (slot-timed
passes) that :meth:`Timeline.to_schedule` turns into a :class:`~ctrlmem.model.ir.Schedule`:

    block = v_min_block(4)
    t0 = block.repeat(8)          # Fig. 1 "repeat": copies of the block, W placed in the block
    t1 = place_w(t0.without_w())  # W put greedily into free slots (docs/theory.md §10 step 3)
    t2 = reorder(t1)              # warm-up / cool-down reorder under the peak (§1.2, App. C)
    t3 = squeeze(place_w(t2.without_w()))  # order-preserving as-soon-as-possible (§1.2)
    schedule = t3.to_schedule()

:func:`build_from_block` runs these steps (with the further reorder rounds described in
:func:`pipeline_steps`); :func:`pipeline_steps` returns every intermediate timeline so a
notebook can show them one after another (the paper's Fig. 1, 3, 11, 18). For large ``m``,
:func:`build_from_block` runs the steps on a shorter pipeline and lengthens its periodic stable
phase (:func:`extend_stable`); the tests check this gives the same orders as the direct run.
The steps themselves are compiled kernels (:mod:`ctrlmem.search.steps`) that the search's families also
run directly on arrays; the functions here wrap them for :class:`Timeline` objects.

Symbols (docs/theory.md §1–6): the slot is the paper's unit pass τ (one F, B or W over one V-shape
chunk); ``interval`` is *T*; :meth:`BuildingBlock.lifespans` is *l* per stage (start of its F to
the end of the pass that releases its activation: W, or the fused BW); :meth:`BuildingBlock.
memory_bound` is Eq. 1, ``Σ_s ⌈l_s / T⌉ · m_s`` per device, in units of ``a`` (a V-shape chunk
holds ``a/2``). A block is valid only if it repeats without *collision*: the passes of a device
occupy distinct residues modulo ``T`` (docs/theory.md §2); :meth:`BuildingBlock.collisions` lists
the clashes.

The block constructors cover the V-shape family (:func:`v_min_block`, :func:`v_half_block`,
:func:`v_zb_block`, :func:`v_shape_block`, :func:`v_1f1b_block`) and the paper's gallery
(:func:`one_f_one_b_block`, :func:`eager_1f1b_block`, :func:`zb_h1_block`,
:func:`zb_h2_block`, :func:`gpipe_block`, :func:`interleaved_block`). Their slot units: V-shape
blocks use the chunk pass (F = B = W = 1 slot, BW = 2, T = 6); one-stage-per-device blocks use
the same τ, so a full-stage F is 2 slots and a fused BW 4 (docs/theory.md §1), T = 6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ctrlmem.search import steps
from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.search.encoding import CandidateSet, extend, from_schedules
from ctrlmem.model.validate import execute, index_schedule

__all__ = [
    "SlotPass",
    "Collision",
    "BuildingBlock",
    "Timeline",
    "place_w",
    "squeeze",
    "reorder",
    "build_from_block",
    "extend_stable",
    "pipeline_steps",
    "greedy_block",
    "v_min_block",
    "v_half_block",
    "v_zb_block",
    "v_shape_block",
    "v_cost_block",
    "slot_lengths",
    "v_1f1b_block",
    "one_f_one_b_block",
    "eager_1f1b_block",
    "zb_h1_block",
    "zb_h2_block",
    "gpipe_block",
    "interleaved_block",
    "GALLERY",
]


_KIND = {Op.F: 0, Op.B: 1, Op.BW: 1, Op.W: 2}


class SlotPass(NamedTuple):
    """A pass with an integer start slot and a length in slots."""

    start: int
    length: int
    op: Op
    stage: int
    microbatch: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def pass_(self) -> Pass:
        return Pass(self.op, self.stage, self.microbatch)


class Collision(NamedTuple):
    """Two passes of a block that overlap on ``device`` once the block repeats every ``T``."""

    device: int
    first: SlotPass
    second: SlotPass
    residue: int


# --------------------------------------------------------------------------------------------
# Timeline


@dataclass(frozen=True)
class Timeline:
    """Slot-timed passes per device: the output of every pipeline step.

    Attributes:
        name: label carried into :meth:`to_schedule`.
        placement: which device holds each stage.
        num_microbatches: ``m``.
        rows: ``rows[d]`` is device ``d``'s passes sorted by start slot (no two overlap).
    """

    name: str
    placement: Placement
    num_microbatches: int
    rows: tuple[tuple[SlotPass, ...], ...]

    @property
    def num_devices(self) -> int:
        return self.placement.num_devices

    @property
    def end(self) -> int:
        return max((row[-1].end for row in self.rows if row), default=0)

    @property
    def has_w(self) -> bool:
        return any(sp.op is Op.W for row in self.rows for sp in row)

    def without_w(self) -> "Timeline":
        """The same timeline with every ``W`` removed (to be placed again by :func:`place_w`)."""
        rows = tuple(tuple(sp for sp in row if sp.op is not Op.W) for row in self.rows)
        return Timeline(self.name, self.placement, self.num_microbatches, rows)

    def to_schedule(self, name: str | None = None, params: dict | None = None) -> Schedule:
        """The device orders of this timeline as a :class:`~ctrlmem.model.ir.Schedule`."""
        orders = [[sp.pass_ for sp in row] for row in self.rows]
        return Schedule.from_orders(name or self.name, self.placement, self.num_microbatches, orders, params)

    def peak_memory(self) -> list[float]:
        """Peak activation per device, in units of ``a`` (F allocates its stage's share at its
        start; W or BW releases it at its end; releases first at equal times)."""
        act = self.placement.num_devices / self.placement.num_stages
        peaks = []
        for row in self.rows:
            ev = []
            for sp in row:
                if sp.op is Op.F:
                    ev.append((sp.start, 1))
                elif sp.op in (Op.W, Op.BW):
                    ev.append((sp.end, -1))
            ev.sort()
            level = peak = 0
            for _, delta in ev:
                level += delta
                peak = max(peak, level)
            peaks.append(peak * act)
        return peaks

    def device_bubbles(self) -> list[int]:
        """Per device, idle slots between its first and its last pass."""
        return [
            (row[-1].end - row[0].start) - sum(sp.length for sp in row) if row else 0
            for row in self.rows
        ]

    def to_text(self) -> str:
        """One line per device, one character column per slot: ``F``/``B``/``W``/``X`` (BW)
        for the lowest stage a device holds, lower case for its other stages, ``.`` idle."""
        letters = {Op.F: "F", Op.B: "B", Op.W: "W", Op.BW: "X"}
        end = self.end
        lines = []
        for d, row in enumerate(self.rows):
            cells = ["."] * end
            low = self.placement.stages_of(d)[0]
            for sp in row:
                ch = letters[sp.op]
                if sp.stage != low:
                    ch = ch.lower()
                for t in range(sp.start, sp.end):
                    cells[t] = ch
            lines.append(f"d{d}: " + "".join(cells))
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Building block


@dataclass(frozen=True)
class BuildingBlock:
    """The passes of one microbatch (microbatch 0) with their slots, and the repeat interval.

    Attributes:
        name: label (``"v-min"``, ``"1f1b"``, ...).
        placement: which device holds each stage.
        interval: *T*, the slot shift between consecutive microbatches' copies.
        passes: one ``F`` per stage and either one ``BW`` or one ``B`` and one ``W`` per stage,
            all with microbatch 0.
        offsets: the design parameters the block was built from (for display), e.g.
            ``{"delta0": 1, "delta1": 1}``.
    """

    name: str
    placement: Placement
    interval: int
    passes: tuple[SlotPass, ...]
    offsets: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"interval T must be >= 1 slot, got {self.interval}")
        S = self.placement.num_stages
        seen: dict[tuple[int, int], SlotPass] = {}
        for sp in self.passes:
            if sp.microbatch != 0 or not 0 <= sp.stage < S or sp.length < 1 or sp.start < 0:
                raise ValueError(f"block {self.name}: bad pass {sp} (microbatch 0, stage in 0..{S - 1}, length >= 1)")
            key = (_KIND[sp.op], sp.stage)
            if key in seen:
                raise ValueError(f"block {self.name}: {sp} duplicates {seen[key]}")
            seen[key] = sp
        for s in range(S):
            if (0, s) not in seen or (1, s) not in seen:
                raise ValueError(f"block {self.name}: stage {s} needs an F and a B (or BW)")
            split = seen[(1, s)].op is Op.B
            if split != ((2, s) in seen):
                raise ValueError(f"block {self.name}: stage {s} needs W exactly when its backward is split")
        # dependencies inside the block
        for s in range(S):
            f, b = seen[(0, s)], seen[(1, s)]
            if s > 0 and f.start < seen[(0, s - 1)].end:
                raise ValueError(f"block {self.name}: {f} starts before F of stage {s - 1} ends")
            up = seen[(1, s + 1)] if s < S - 1 else seen[(0, s)]
            if b.start < up.end:
                raise ValueError(f"block {self.name}: {b} starts before {up} ends")
            if (2, s) in seen and seen[(2, s)].start < b.end:
                raise ValueError(f"block {self.name}: W of stage {s} starts before its B ends")
        object.__setattr__(self, "passes", tuple(sorted(self.passes)))

    # -- views ---------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.placement.num_devices

    def device_passes(self, device: int) -> list[SlotPass]:
        """The block's passes on ``device``, by start slot."""
        stages = set(self.placement.stages_of(device))
        return [sp for sp in self.passes if sp.stage in stages]

    def work(self, device: int) -> int:
        """Slots of computation ``device`` does per microbatch (the efficient ``T``)."""
        return sum(sp.length for sp in self.device_passes(device))

    @property
    def span(self) -> int:
        """Slots from the first pass of the block to the end of its last."""
        return max(sp.end for sp in self.passes) - min(sp.start for sp in self.passes)

    # -- properties of the paper ---------------------------------------------------------------
    def collisions(self) -> list[Collision]:
        """Pairs of a device's passes whose slots coincide modulo ``T`` (docs/theory.md §2): the
        block cannot repeat every ``T`` without those passes overlapping."""
        T = self.interval
        out = []
        for d in range(self.num_devices):
            owner: dict[int, SlotPass] = {}
            for sp in self.device_passes(d):
                for t in range(sp.start, sp.end):
                    r = t % T
                    if r in owner and owner[r] is not sp:
                        out.append(Collision(d, owner[r], sp, r))
                        break
                    owner[r] = sp
        return out

    def check(self) -> "BuildingBlock":
        """Return the block, or raise ``ValueError`` naming the first collision."""
        clashes = self.collisions()
        if clashes:
            c = clashes[0]
            raise ValueError(
                f"block {self.name} collides when repeated every T={self.interval}: on device "
                f"{c.device}, {c.first.pass_} (slot {c.first.start}) and {c.second.pass_} (slot "
                f"{c.second.start}) both use residue {c.residue}; shift one of them or raise T"
            )
        return self

    def lifespans(self) -> dict[int, int]:
        """Lifespan of each stage in slots: from the start of its F to the end of the pass that
        releases its activation (W, or the fused BW) (docs/theory.md §3)."""
        f = {sp.stage: sp.start for sp in self.passes if sp.op is Op.F}
        rel = {sp.stage: sp.end for sp in self.passes if sp.op in (Op.W, Op.BW)}
        return {s: rel[s] - f[s] for s in sorted(f)}

    def memory_bound(self) -> list[float]:
        """Eq. 1 per device, in units of ``a``: ``Σ_{s on device} ⌈l_s / T⌉ · m_s`` with
        ``m_s = p / S`` (docs/theory.md §3)."""
        life = self.lifespans()
        act = self.num_devices / self.placement.num_stages
        return [
            sum(math.ceil(life[s] / self.interval) for s in self.placement.stages_of(d)) * act
            for d in range(self.num_devices)
        ]

    # -- steps ---------------------------------------------------------------------------------
    def repeat(self, num_microbatches: int) -> Timeline:
        """The block repeated every ``T`` for ``num_microbatches`` microbatches (no squeeze).

        Raises ``ValueError`` if the block collides (see :meth:`check`)."""
        if num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
        self.check()
        return _timeline_of(self.name, self.placement, num_microbatches,
                            steps.repeat(block_rows(self), self.interval, num_microbatches))

    def to_text(self) -> str:
        """The block drawn as one line per device (see :meth:`Timeline.to_text`)."""
        return Timeline(self.name, self.placement, 1, tuple(tuple(self.device_passes(d)) for d in range(self.num_devices))).to_text()


# --------------------------------------------------------------------------------------------
# Steps on timelines


def place_w(timeline: Timeline) -> Timeline:
    """Put every ``W`` into the first free slots after its ``B`` (docs/theory.md §10, ``put_w``).

    Existing ``W`` passes are removed first. Each device keeps one first-in-first-out queue of
    pending ``W`` per stage; a free gap takes pending ``W`` (higher stage first, as the authors'
    code does for V-shape chunks) while they fit; the rest follow the device's last pass. A ``W``
    lasts as long as the first ``W`` or ``B`` of its stage in the timeline. Placing ``W`` as early
    as possible never raises memory over any other placement of the same ``F``/``B`` times.
    (Compiled: :func:`ctrlmem.search.steps.place_w_rows`.)
    """
    P = timeline.placement
    rows = steps.place_w_rows(_rows_of(timeline), _stages_desc(P), P.num_stages, timeline.num_microbatches)
    return _timeline_of(timeline.name, P, timeline.num_microbatches, rows)


def squeeze(timeline: Timeline) -> Timeline:
    """Run every pass as early as possible, keeping each device's order (docs/theory.md §2).

    Pass lengths stay the block's slot lengths; use :func:`ctrlmem.simulate` on
    :meth:`Timeline.to_schedule` to squeeze with real costs. Raises
    :class:`ctrlmem.ScheduleError` if the device orders deadlock. (Compiled:
    :func:`ctrlmem.search.steps.squeeze_rows`.)
    """
    P, m = timeline.placement, timeline.num_microbatches
    rows = steps.squeeze_rows(_rows_of(timeline), P.num_stages, m)
    if rows is None:
        s = timeline.to_schedule()
        execute(s, index_schedule(s), [1.0] * (3 * P.num_stages * m), 0.0)  # raises, naming the deadlock
        raise AssertionError("squeeze: stuck without a deadlock")  # pragma: no cover
    return _timeline_of(timeline.name, P, m, rows)


def reorder(
    timeline: Timeline,
    warmup: bool | None = None,
    cooldown: bool = True,
    memory_cap: int | None = None,
    stable: bool = False,
) -> Timeline:
    """Move warm-up and cool-down passes earlier without raising the peak (docs/theory.md §2,
    App. C Fig. 11; the greedy the authors describe for ``zbv_greedy.reorder``, §6 step 4).

    Passes are visited in slot order. The *warm-up* is everything before the first backward of
    stage 0; the *cool-down* everything after both that backward and the forward of stage 0's
    last microbatch; the stable phase between stays where it is unless ``stable=True``. A
    pass of a phase that may move goes to the earliest free slot at or after the end of its
    inputs (and of the same pass of the previous microbatch) for which its device's live
    activations stay within ``memory_cap`` (default: the timeline's own peak over all devices,
    counted in live stage activations).

    With ``W`` passes in the timeline they count as anonymous releases (the ``j``-th ``W`` of a
    device follows its ``j``-th ``B``) and move like the others; re-place them with
    :func:`place_w` afterwards. Without ``W`` passes, memory is counted as if pending ``W`` filled
    every idle slot (the model of :func:`place_w`; one-slot W only). ``warmup`` defaults to
    moving the warm-up only when the timeline has ``W`` passes (or fuses its backward), as the
    authors do. (Compiled: :func:`ctrlmem.search.steps.reorder_rows`.)
    """
    P, m = timeline.placement, timeline.num_microbatches
    rows = steps.reorder_rows(_rows_of(timeline), P.num_stages, m, warmup, cooldown, memory_cap, stable)
    return _timeline_of(timeline.name, P, m, rows)


# -- Timeline <-> the kernels' arrays ----------------------------------------------------------

_OPCODE = {Op.F: steps.OP_F, Op.B: steps.OP_B, Op.W: steps.OP_W, Op.BW: steps.OP_BW}
_OP_OF = (Op.F, Op.B, Op.W, Op.BW)


def _rows_of(timeline: Timeline) -> steps.Rows:
    rows = timeline.rows
    out = steps.Rows(len(rows), max((len(r) for r in rows), default=0))
    for d, row in enumerate(rows):
        out.n[d] = len(row)
        if row:
            a = np.array([(sp.start, sp.length, _OPCODE[sp.op], sp.stage, sp.microbatch) for sp in row], dtype=np.int64)
            out.st[d, : len(row)], out.ln[d, : len(row)], out.op[d, : len(row)] = a[:, 0], a[:, 1], a[:, 2]
            out.sg[d, : len(row)], out.mb[d, : len(row)] = a[:, 3], a[:, 4]
    return out


def _timeline_of(name: str, placement: Placement, m: int, rows: steps.Rows) -> Timeline:
    out = []
    new = tuple.__new__
    for d in range(len(rows.n)):
        k = int(rows.n[d])
        cols = zip(rows.st[d, :k].tolist(), rows.ln[d, :k].tolist(), rows.op[d, :k].tolist(),
                   rows.sg[d, :k].tolist(), rows.mb[d, :k].tolist())
        out.append(tuple(new(SlotPass, (a, b, _OP_OF[c], e, f)) for a, b, c, e, f in cols))
    return Timeline(name, placement, m, tuple(out))


def block_rows(block: "BuildingBlock") -> steps.Rows:
    """The block's passes per device (sorted by start) as arrays."""
    per = [block.device_passes(d) for d in range(block.num_devices)]
    out = steps.Rows(block.num_devices, max(len(x) for x in per))
    for d, row in enumerate(per):
        out.n[d] = len(row)
        for j, sp in enumerate(row):
            out.st[d, j], out.ln[d, j], out.op[d, j] = sp.start, sp.length, _OPCODE[sp.op]
            out.sg[d, j], out.mb[d, j] = sp.stage, sp.microbatch
    return out


def _stages_desc(placement: Placement) -> np.ndarray:
    return np.array([sorted(placement.stages_of(d), reverse=True) for d in range(placement.num_devices)],
                    dtype=np.int64)


def pipeline_steps(block: BuildingBlock, num_microbatches: int, reorder_phases: bool = True) -> dict[str, Timeline]:
    """Every intermediate timeline of :func:`build_from_block`, in order, for display.

    ``repeat``: the block tiled every T with its own W slots. ``place_w``: W re-placed greedily
    (split-backward blocks only). ``reorder``: warm-up and cool-down moved under the peak. For
    split blocks with one-slot W (the V-shape blocks) this is three rounds, each followed by
    :func:`place_w`: (1) warm-up and cool-down with W as explicit passes (the authors' first
    round, docs/theory.md §10 step 4); then, on the squeezed timeline, (2) warm-up and cool-down again
    with W filling idle slots (in place of the authors' cool-down-only second round) and (3)
    the stable phase with explicit W. Rounds 2 and 3 close the last τ where the authors' two
    rounds stay above the bound of docs/theory.md §6 (V-Min when 3 | p, V-Half for odd p ≥ 9,
    V-ZB at m = 2p) and give the exact values of docs/theory.md §7 exactly for p = 2..32 and m ≥ 2p.
    ``squeeze``: the final timeline. Every round keeps the peak at or below the repeated
    block's (the default cap of :func:`reorder`). (The steps run as the compiled kernels of
    :mod:`ctrlmem.search.steps`.)
    """
    block.check()
    P, m = block.placement, num_microbatches
    if m < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {m}")
    last, got = steps.pipeline(block_rows(block), block.interval, m, P.num_stages, _stages_desc(P),
                               reorder_phases, keep_steps=True)
    out = {name: _timeline_of(block.name, P, m, rows) for name, rows in got.items()}
    if last is None:  # a deadlock: let squeeze name it
        squeeze(out[list(out)[-1]])
    return out


def block_keys(block: BuildingBlock, num_microbatches: int, reorder_phases: bool = True) -> np.ndarray | None:
    """The final order of :func:`pipeline_steps` as pass keys (``int64[p, L]``, see
    :mod:`ctrlmem.search.encoding`), without making timelines; ``None`` on a deadlock."""
    block.check()
    P = block.placement
    out, _ = steps.pipeline(block_rows(block), block.interval, num_microbatches, P.num_stages,
                            _stages_desc(P), reorder_phases)
    return None if out is None else steps.to_keys(out, P.num_stages, num_microbatches)


def block_set(block: BuildingBlock, num_microbatches: int, label: str, reorder_phases: bool = True,
              direct: bool = False) -> CandidateSet | None:
    """The block's pipeline as a one-candidate :class:`~ctrlmem.search.encoding.CandidateSet`
    for ``num_microbatches``: run on a short pipeline and lengthened when ``m`` is large (see
    :func:`build_from_block`); ``None`` when the short pipeline has no periodic stable phase
    (or deadlocks)."""
    m = num_microbatches
    short = short_pipeline(block, m)
    run = m if (direct or short >= m) else short
    keys = block_keys(block, run, reorder_phases)
    if keys is None:
        return None
    fused = any(sp.op is Op.BW for sp in block.passes)
    cs = CandidateSet(block.placement, run, fused, keys[None], (label,))
    if run == m:
        return cs
    cs = extend(cs, m)
    return cs if len(cs) else None


def build_from_block(
    block: BuildingBlock,
    num_microbatches: int,
    name: str | None = None,
    params: dict | None = None,
    reorder_phases: bool = True,
    direct: bool = False,
    direct_fallback: bool = True,
) -> Schedule:
    """Repeat ``block`` for ``num_microbatches``, place W, reorder the warm-up and cool-down
    without raising the peak, squeeze, and return the schedule (docs/theory.md §2, §6).

    For many microbatches the steps run on a shorter pipeline (enough copies of the block for
    warm-up, a stable phase and cool-down) and the stable phase is then lengthened: the
    stable phase is periodic, one period being one microbatch more, so each device's order
    gains the missing periods in its middle (:func:`extend_stable`). ``direct=True`` runs the
    steps on all ``num_microbatches`` instead (slower; the tests check both agree); it is also
    the fallback when the short pipeline has no exactly periodic stable phase to lengthen
    (``direct_fallback=False``: raise ``ValueError`` instead).
    """
    m = num_microbatches
    label = name or block.name
    cs = block_set(block, m, label, reorder_phases, direct)
    if cs is None:
        if direct or short_pipeline(block, m) >= m:
            pipeline_steps(block, m, reorder_phases)  # raises, naming the deadlock
        if not direct_fallback:
            raise ValueError(f"block {block.name}: the short pipeline has no periodic stable phase to lengthen")
        cs = block_set(block, m, label, reorder_phases, direct=True)
        if cs is None:  # pragma: no cover - the direct run deadlocked: pipeline_steps raises
            pipeline_steps(block, m, reorder_phases)
    return cs.schedule(0, label, params)


def short_pipeline(block: BuildingBlock, m: int) -> int:
    """Microbatches enough for warm-up, a stable phase of a few periods, and cool-down."""
    return math.ceil(block.span / block.interval) + block.num_devices // 2 + 6


def extend_stable(schedule: Schedule, num_microbatches: int) -> Schedule:
    """Lengthen the periodic stable phase of ``schedule`` to ``num_microbatches``.

    On each device, find the window of one period nearest the middle of its order that
    repeats in the next period with every microbatch one higher (same ops and stages); insert
    the missing periods after it and raise the microbatch of every later pass accordingly
    (:func:`ctrlmem.search.encoding.extend`). Raises ``ValueError`` if a device has no such
    window (the schedule has no stable phase).
    """
    extra = num_microbatches - schedule.num_microbatches
    if extra < 0:
        raise ValueError("extend_stable only lengthens a schedule")
    if extra == 0:
        return schedule
    fused = any(ps.op is Op.BW for row in schedule.device_passes for ps in row)
    got = extend(from_schedules([(schedule.name, schedule)], fused=fused), num_microbatches)
    if not len(got):
        raise ValueError(f"a device of {schedule.name} has no periodic stable phase to extend")
    return got.schedule(0, schedule.name, dict(schedule.params))


# --------------------------------------------------------------------------------------------
# Block constructors


def _v_block(name: str, p: int, f0, f1, b1, b0, offsets: dict) -> BuildingBlock:
    """A V-shape block from the start slots of F chunk 0, F chunk 1, B chunk 1, B chunk 0 on
    each device (unit-slot passes, T = 6), with each W in the first free slot after its B."""
    S = 2 * p
    passes = []
    for i in range(p):
        passes += [
            SlotPass(f0[i], 1, Op.F, i, 0),
            SlotPass(f1[i], 1, Op.F, S - 1 - i, 0),
            SlotPass(b1[i], 1, Op.B, S - 1 - i, 0),
            SlotPass(b0[i], 1, Op.B, i, 0),
        ]
    block = _fill_block_w(name, Placement.v_shape(p), 6, passes, offsets)
    return block


def _fill_block_w(name, placement, T, passes, offsets, w_length: int | None = None) -> BuildingBlock:
    """Add each stage's W at the first slot after its B whose residues are free on its device
    (the authors' ``fill_w_in_building_block``); raises if the device has no room in T."""
    passes = list(passes)
    used: dict[int, set[int]] = {d: set() for d in range(placement.num_devices)}
    for sp in passes:
        d = placement.device_of(sp.stage)
        used[d].update(t % T for t in range(sp.start, sp.end))
    for sp in sorted([sp for sp in passes if sp.op is Op.B], key=lambda x: (x.end, x.stage)):
        d = placement.device_of(sp.stage)
        ln = w_length or sp.length
        t = _first_free(used[d], sp.end, ln, T)
        if t is None:
            raise ValueError(f"block {name}: device {d} has no free slot for W of stage {sp.stage} in T={T}")
        used[d].update(u % T for u in range(t, t + ln))
        passes.append(SlotPass(t, ln, Op.W, sp.stage, 0))
    return BuildingBlock(name, placement, T, tuple(passes), tuple(sorted(offsets.items())))


def _need_p(p: int, least: int, what: str) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < least:
        raise ValueError(
            f"{what} needs at least {least} devices (num_devices >= {least}), got {p!r}; with a "
            "single device there is no pipeline: use '1f1b' or 'gpipe' with num_devices=1"
        )


def v_min_block(p: int) -> BuildingBlock:
    """V-Min block (docs/theory.md §7, Table 8; the authors' ``stable_pattern_v_min``).

    Device ``i``: F chunk 0 at ``i``, F chunk 1 at ``2p−1−i``, B chunk 1 at ``2p+g+i``, B chunk 0
    at ``4p+g−1−i`` with ``g = 2`` when ``3 | p`` (else the block collides), offsets all 1.
    """
    _need_p(p, 2, "V-Min")
    g = 2 if p % 3 == 0 else 0
    r = range(p)
    return _v_block(
        "v-min", p,
        [i for i in r], [2 * p - 1 - i for i in r], [2 * p + g + i for i in r], [4 * p + g - 1 - i for i in r],
        {"delta0": 1, "delta1": 1, "loss_gap": 1 + g},
    )


def v_half_block(p: int, variant: str = "code") -> BuildingBlock:
    """V-Half block (docs/theory.md §7, Table 9; δ0 = 2, δ1 = 1).

    ``variant="code"`` (default) uses the authors' ``stable_pattern_v_half``: F chunk 0 at
    ``2i``, F chunk 1 at ``3p−2−i``, B chunk 1 at ``3p+g−1+2i``, B chunk 0 at ``6p+g−2−i``,
    ``g = 3`` for even p: F turn gap 1, B turn gap 2. ``variant="paper"`` mirrors the turns
    (F turn 2, B turn 1) as Table 9 prints them. Both are collision-free with the same peak;
    the default is the code's because it is the variant whose bubbles the exact values of docs/theory.md §7 records.
    """
    _need_p(p, 2, "V-Half")
    g = 3 if p % 2 == 0 else 0
    r = range(p)
    if variant == "code":
        f0 = [2 * i for i in r]
        f1 = [3 * p - 2 - i for i in r]
        b1 = [3 * p + g - 1 + 2 * i for i in r]
        b0 = [6 * p + g - 2 - i for i in r]
    elif variant == "paper":
        f0 = [2 * i for i in r]
        f1 = [3 * p - 1 - i for i in r]  # F turn gap 2
        b1 = [3 * p + g + 2 * i for i in r]
        b0 = [5 * p + g - 2 + 1 + (p - 1 - i) for i in r]  # B turn gap 1
    else:
        raise ValueError(f"v_half_block variant must be 'code' or 'paper', got {variant!r}")
    return _v_block("v-half", p, f0, f1, b1, b0, {"delta0": 2, "delta1": 1, "variant": variant})


def v_zb_block(p: int) -> BuildingBlock:
    """V-ZB block (docs/theory.md §7; δ0 = 4, δ1 = 2, turn gaps 1; Fig. 3(d) 4d−3 / 2d−1 / ...)."""
    _need_p(p, 2, "V-ZB")
    r = range(p)
    f0 = [4 * i for i in r]
    f1 = [4 * (p - 1) + 1 + 2 * (p - 1 - i) for i in r]
    b1 = [f1[0] + 1 + 4 * i for i in r]
    b0 = [b1[p - 1] + 1 + 2 * (p - 1 - i) for i in r]
    return _v_block("v-zb", p, f0, f1, b1, b0, {"delta0": 4, "delta1": 2})


def _first_free(used: set[int], earliest: int, length: int, T: int) -> int | None:
    """The first start slot from ``earliest`` whose ``length`` slots are all free modulo the
    interval ``T`` on a device whose taken residues are ``used``; ``None`` if none within ``T``."""
    for t in range(earliest, earliest + T + 1):
        if all((u % T) not in used for u in range(t, t + length)):
            return t
    return None


def _slot_placer(name: str, placement: Placement, T: int, passes: list[SlotPass]):
    """``put(op, stage, earliest, length)``: place a pass of ``length`` slots on its stage's device at
    the first slot from ``earliest`` whose slots are all free modulo the interval ``T``, append it
    to ``passes`` and return it (``ValueError`` when the device has no room within ``T``)."""
    used: dict[int, set[int]] = {d: set() for d in range(placement.num_devices)}

    def put(op: Op, stage: int, earliest: int, ln: int) -> SlotPass:
        d = placement.device_of(stage)
        t = _first_free(used[d], earliest, ln, T)
        if t is None:
            raise ValueError(f"block {name}: device {d} has no room for {op}{stage} within T={T}")
        used[d].update(u % T for u in range(t, t + ln))
        sp = SlotPass(t, ln, op, stage, 0)
        passes.append(sp)
        return sp

    return put


def greedy_block(
    name: str,
    placement: Placement,
    interval: int,
    f_len: int,
    b_len: int,
    w_len: int | None,
    min_offset: Callable[[Op, int, int], int] | None = None,
    offsets: dict | None = None,
) -> BuildingBlock:
    """A block laid out pass by pass along one microbatch's chain, each pass at the earliest
    slot that is at least ``min_offset(op, from_stage, to_stage)`` after the previous pass of the
    chain starts (and not before it ends), and whose residues modulo ``interval`` are still free
    on its device; so the block never collides.

    The chain is ``F`` over stages ``0..S−1``, then the backward over ``S−1..0``; ``w_len=None``
    fuses the backward (``BW`` of ``b_len`` slots), otherwise each ``W`` goes to the first free
    slot after its ``B``.
    """
    S, T = placement.num_stages, interval
    passes: list[SlotPass] = []
    put = _slot_placer(name, placement, T, passes)

    back = Op.BW if w_len is None else Op.B
    prev = None
    for s in range(S):
        earliest = 0 if prev is None else max(prev.end, prev.start + (min_offset(Op.F, s - 1, s) if min_offset else 0))
        prev = put(Op.F, s, earliest, f_len)
    for s in range(S - 1, -1, -1):
        gap = min_offset(back, s + 1, s) if min_offset else 0
        prev = put(back, s, max(prev.end, prev.start + gap), b_len)
    block_passes = tuple(passes)
    if w_len is None:
        return BuildingBlock(name, placement, T, block_passes, tuple(sorted((offsets or {}).items())))
    return _fill_block_w(name, placement, T, block_passes, offsets or {}, w_length=w_len)


def v_shape_block(p: int, delta0: Sequence[int], delta1: Sequence[int], name: str = "v-shape") -> BuildingBlock:
    """A V-shape block with per-link offsets (docs/theory.md §4, §6 adaptive family).

    ``delta0[i]`` is the start-to-start offset from device ``i`` to ``i+1`` on the chunk-0
    forward and the chunk-1 backward (δ_F^0 = δ_B^1); ``delta1[i]`` the offset from device
    ``i+1`` to ``i`` on the chunk-1 forward and the chunk-0 backward (δ_F^1 = δ_B^0). Turn-around
    offsets are 1 slot plus whatever the collision check needs: each pass goes to the earliest
    collision-free slot (see :func:`greedy_block`). Unit-slot passes, T = 6.
    """
    _need_p(p, 2, "a V-shape block")
    if len(delta0) != p - 1 or len(delta1) != p - 1:
        raise ValueError(f"delta0 and delta1 need p-1={p - 1} values each, got {len(delta0)} and {len(delta1)}")
    S = 2 * p

    def off(op: Op, a: int, b: int) -> int:
        if op is Op.F:
            if b < p:  # chunk 0 forward, device a -> a+1
                return delta0[a]
            if a == p - 1:  # turn
                return 1
            return delta1[S - 1 - b]  # chunk 1 forward, device (S-1-a) -> (S-1-b) = i+1 -> i
        # backward, from stage a to stage b = a-1
        if b >= p:  # chunk 1 backward: device S-1-a -> S-1-b (i -> i+1)
            return delta0[S - 1 - a]
        if a == p:  # turn on device p-1
            return 1
        return delta1[b]  # chunk 0 backward: device a -> b = a-1 (i+1 -> i)

    return greedy_block(
        name, Placement.v_shape(p), 6, 1, 1, 1, off,
        {"delta0": tuple(delta0), "delta1": tuple(delta1)},
    )


def slot_lengths(f: float, b: float, w: float, comm: float = 0.0, resolution: int = 1) -> tuple[int, int, int, int]:
    """Chunk pass times ``f``, ``b``, ``w`` and hop latency ``comm`` as whole slots: the
    shortest of the three passes is ``resolution`` slots, the others in proportion (rounded, at
    least 1 slot; ``comm`` may round to 0)."""
    if resolution < 1:
        raise ValueError(f"resolution must be >= 1 slot, got {resolution}")
    unit = min(x for x in (f, b, w) if x > 0) / resolution if max(f, b, w) > 0 else 1.0
    fl, bl, wl = (max(1, round(x / unit)) for x in (f, b, w))
    return fl, bl, wl, max(0, round(comm / unit))


def v_cost_block(
    p: int,
    lengths: tuple[int, int, int, int],
    gap0: Sequence[int],
    gap1: Sequence[int],
    slack: int = 0,
    name: str = "v-shape",
) -> BuildingBlock:
    """A V-shape block for unequal pass times (the paper §2.3, App. A: offsets adapt to F/B/W).

    ``lengths = (F, B, W, comm)`` in slots (see :func:`slot_lengths`); the interval is a
    device's work per microbatch plus ``slack``, ``T = 2(F + B + W) + slack``, so a block that
    repeats without collision has at most ``slack`` idle slots per interval in its stable phase
    under those times. Along each device link a pass starts at least its predecessor's length
    plus ``comm`` plus a gap after it: ``gap0[i]`` on the link ``i → i+1`` (chunk-0 forward,
    chunk-1 backward: δ0 of the paper), ``gap1[i]`` on ``i+1 → i`` (chunk-1 forward, chunk-0
    backward: δ1). Larger gaps lengthen the lifespans (more memory) and leave room to avoid
    collisions. The passes are laid out along the microbatch's chain, each at the earliest slot
    whose residues modulo ``T`` are free on its device, and each ``W`` is reserved at the first
    free slot after its ``B`` as soon as the ``B`` is placed. Raises ``ValueError`` when a device
    runs out of room in ``T`` (raise ``slack``).
    """
    _need_p(p, 2, "a V-shape block")
    if len(gap0) != p - 1 or len(gap1) != p - 1:
        raise ValueError(f"gap0 and gap1 need p-1={p - 1} values each, got {len(gap0)} and {len(gap1)}")
    fl, bl, wl, cl = lengths
    S = 2 * p
    T = 2 * (fl + bl + wl) + slack
    placement = Placement.v_shape(p)
    passes: list[SlotPass] = []
    put = _slot_placer(name, placement, T, passes)

    prev = put(Op.F, 0, 0, fl)
    for s in range(1, S):
        if s < p:
            gap = fl + cl + gap0[s - 1]
        elif s == p:
            gap = fl  # turn on the last device
        else:
            gap = fl + cl + gap1[S - 1 - s]
        prev = put(Op.F, s, max(prev.end, prev.start + gap), fl)
    for s in range(S - 1, -1, -1):
        if s == S - 1:
            gap = fl  # the loss, on device 0
        elif s >= p:
            gap = bl + cl + gap0[S - 2 - s]
        elif s == p - 1:
            gap = bl  # turn on the last device
        else:
            gap = bl + cl + gap1[s]
        prev = put(Op.B, s, max(prev.end, prev.start + gap), bl)
        put(Op.W, s, prev.end, wl)
    return BuildingBlock(name, placement, T, tuple(passes),
                         (("gap0", tuple(gap0)), ("gap1", tuple(gap1)), ("lengths", tuple(lengths)), ("slack", slack)))


def v_1f1b_block(p: int) -> BuildingBlock:
    """1F1B-V block (the paper's App. I, Fig. 16(a)): V-shape placement, fused backward.

    Chunk passes: F 1 slot, BW 2 slots, T = 6. Chunk-0 forwards one slot apart down the
    devices, chunk-1 forwards back up; one slot for the loss (four when ``3 | p``); then the
    fused backwards two slots apart, chunk 1 down the devices and chunk 0 back up, with three
    slots skipped after every third device (counting from ``(3 − (p+2) mod 3) mod 3``), which
    keeps the six slots of every device on distinct residues modulo 6 (the authors' layout).
    """
    _need_p(p, 2, "1F1B-V")
    S = 2 * p
    f0, f1, b1, b0 = [0] * p, [0] * p, [0] * p, [0] * p
    t = -1
    for i in range(p):
        t += 1
        f0[i] = t
    for i in range(p):
        t += 1
        f1[p - 1 - i] = t
    t += 1 + (3 if p % 3 == 0 else 0)
    skip = (3 - (p + 2) % 3) % 3
    for slots, devices in ((b1, range(p)), (b0, range(p - 1, -1, -1))):
        for i in devices:
            slots[i] = t
            t += 2
            skip += 1
            if skip == 3:
                skip = 0
                t += 3
    passes = []
    for i in range(p):
        passes += [SlotPass(f0[i], 1, Op.F, i, 0), SlotPass(f1[i], 1, Op.F, S - 1 - i, 0),
                   SlotPass(b1[i], 2, Op.BW, S - 1 - i, 0), SlotPass(b0[i], 2, Op.BW, i, 0)]
    return BuildingBlock("1f1b-v", Placement.v_shape(p), 6, tuple(passes), (("fused", True),)).check()


def one_f_one_b_block(p: int) -> BuildingBlock:
    """1F1B block (docs/theory.md §2, Fig. 1(a), Fig. 3(a)): F of 2 slots down the devices, fused
    BW of 4 slots back up, T = 6; lifespan of stage ``i`` is ``6(p−i)``, Eq. 1 gives ``p·a``."""
    _need_p(p, 1, "1F1B")
    passes = []
    for i in range(p):
        passes.append(SlotPass(2 * i, 2, Op.F, i, 0))
        passes.append(SlotPass(2 * p + 4 * (p - 1 - i), 4, Op.BW, i, 0))
    return BuildingBlock("1f1b", Placement.sequential(p), 6, tuple(passes))


def eager_1f1b_block(p: int) -> BuildingBlock:
    """Eager 1F1B block (the paper's Fig. 1(b), Fig. 18(b)): as 1F1B, but the backward chain
    starts one interval later, so every device holds one more microbatch (forwards run ahead
    of the backwards, which lets the forward sends overlap compute). Peak ``(p+1)·a``.

    The digest does not give the exact offsets of Fig. 1(b); this is our reading, stated here.
    """
    _need_p(p, 1, "Eager 1F1B")
    passes = []
    for i in range(p):
        passes.append(SlotPass(2 * i, 2, Op.F, i, 0))
        passes.append(SlotPass(2 * p + 6 + 4 * (p - 1 - i), 4, Op.BW, i, 0))
    return BuildingBlock("eager-1f1b", Placement.sequential(p), 6, tuple(passes))


def zb_h1_block(p: int) -> BuildingBlock:
    """ZB-H1 block (docs/theory.md §8, Fig. 18(c)): 1F1B's forwards (2 slots), the input backward
    B (2 slots) chained with offset 2, and each W (2 slots) in the first collision-free slot
    after its B; T = 6."""
    _need_p(p, 1, "ZB-H1")
    return greedy_block("zb-h1", Placement.sequential(p), 6, 2, 2, 2)


def zb_h2_block(p: int) -> BuildingBlock:
    """ZB-H2 block (docs/theory.md §8, Fig. 18(d)): as ZB-H1 but the backward chain starts
    ``6(p−1)`` slots later at the loss, so the warm-up holds about twice as many forwards
    (``2p−1`` on device 0) and W fills what would be the bubble; T = 6."""
    _need_p(p, 1, "ZB-H2")
    delay = 6 * (p - 1)

    # the loss edge is F(S-1) -> B(S-1); greedy_block asks min_offset(B, S, S-1) for it
    return greedy_block(
        "zb-h2", Placement.sequential(p), 6, 2, 2, 2,
        lambda op, a, b: delay + 2 if (op is Op.B and a == p) else 0,
    )


def gpipe_block(p: int, num_microbatches: int) -> BuildingBlock:
    """GPipe block (the paper's Fig. 18(e)): F of 2 slots down the devices; the fused backward of
    microbatch 0 waits until the last microbatch's forward has left the last device, so the
    block depends on ``m``. Repeated every T = 6 and squeezed it gives GPipe's order."""
    _need_p(p, 1, "GPipe")
    m = num_microbatches
    return greedy_block(
        "gpipe", Placement.sequential(p), 6, 2, 4, None,
        lambda op, a, b: 6 * (m - 1) + 2 if (op is Op.BW and a == p) else 0,
        {"num_microbatches": m},
    )


def interleaved_block(p: int, num_chunks: int = 2) -> BuildingBlock:
    """Interleaved 1F1B with a uniform repeat interval (the paper's App. G, Fig. 15(b), 18(i)):
    looped placement, ``v = 2`` chunks (chunk F 1 slot, BW 2 slots, T = 6), laid out with
    :func:`greedy_block`, each pass at the earliest collision-free slot; the second chunk's
    forwards are delayed by the fewest slots that leave room for every BW."""
    _need_p(p, 1, "Interleaved 1F1B")
    if num_chunks != 2:
        raise ValueError(f"interleaved_block supports num_chunks=2 (1-slot chunk passes), got {num_chunks}")
    last_error = None
    for delay in range(0, 12):
        try:
            return greedy_block(
                "interleaved-1f1b", Placement.interleaved(p, 2), 6, 1, 2, None,
                lambda op, a, b: 1 + delay if (op is Op.F and b == p) else 0,
                {"num_chunks": 2, "chunk_delay": delay},
            )
        except ValueError as exc:  # fragmented residues: delay the second chunk's forwards
            last_error = exc
    raise ValueError(f"no collision-free uniform-interval interleaved block for p={p}: {last_error}")


#: The paper's gallery and the V blocks by name, each a function of ``p`` (GPipe also of ``m``).
GALLERY: dict[str, Callable[..., BuildingBlock]] = {
    "1f1b": one_f_one_b_block,
    "eager-1f1b": eager_1f1b_block,
    "zb-h1": zb_h1_block,
    "zb-h2": zb_h2_block,
    "gpipe": gpipe_block,
    "interleaved-1f1b": interleaved_block,
    "v-min": v_min_block,
    "v-half": v_half_block,
    "v-zb": v_zb_block,
    "1f1b-v": v_1f1b_block,
}
