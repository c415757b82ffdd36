"""The search's compact candidates: device orders as integer arrays.

A :class:`CandidateSet` holds ``K`` schedules of one kind (placement, ``m``, fused or split
backward) as one ``int64`` array ``keys[K, p, L]``: ``keys[c, d, i]`` is the ``i``-th pass of
device ``d`` in candidate ``c``, written as the key of :class:`ctrlmem.model.validate.ScheduleIndex`,

    ``key = (kind · S + stage) · m + microbatch``,  kind 0 = F, 1 = B (or a fused BW), 2 = W,

so that a pass's input is found by arithmetic (:func:`tables`). Every device of a candidate runs
the same number ``L`` of passes (``3m·v`` split, ``2m·v`` fused, ``v`` stages per device).
What does not depend on the costs is computed once per set: each candidate's peak activation
(a device's memory follows its order, whatever the times). ``Schedule`` objects are made only
for what a search returns (:meth:`CandidateSet.schedule`).

Families build candidates for a few microbatches and lengthen their periodic stable phase
(:func:`extend`), which is exact for the orders they produce (their steady state repeats with
period one microbatch) and keeps the cost of a family independent of ``m``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.search.kernels import ints, kernel

__all__ = ["CandidateSet", "tables", "Tables", "extend", "from_orders", "concat", "passes_per_device", "problem"]

_new_pass = tuple.__new__
#: The one integer encoding of the pass kinds in the search's arrays (the block steps' rows use all
#: four; a candidate's keys fold a fused backward into its input backward's kind).
OP_F, OP_B, OP_W, OP_BW = 0, 1, 2, 3
_KIND_OF = {Op.F: OP_F, Op.B: OP_B, Op.BW: OP_B, Op.W: OP_W}  # Pass is a NamedTuple: build it without its Python-level __new__
_SERIAL = count()


def passes_per_device(placement: Placement, m: int, fused: bool) -> int:
    return (2 if fused else 3) * m * placement.num_chunks


@dataclass(frozen=True)
class Tables:
    """Cost-independent arrays for one (placement, m, fused), indexed by key.

    ``dep[key]``: the key of the pass's input (-1: none); ``cross[key]``: 1 when that input
    is on another device (the hop latency applies); ``kind[key]``, ``stage[key]``;
    ``delta[key]``: the activation (in ``a``) the pass allocates (+, an F) or releases (−, a W
    or a fused BW)."""

    placement: Placement
    m: int
    fused: bool
    dep: np.ndarray
    cross: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    delta: np.ndarray


@lru_cache(maxsize=64)
def tables(placement: Placement, m: int, fused: bool) -> Tables:
    """The :class:`Tables` of a placement and ``m`` (cached)."""
    S = placement.num_stages
    sm = S * m
    key = np.arange(3 * sm, dtype=np.int64)
    kind, r = np.divmod(key, sm)
    stage = r // m
    dep = np.where(
        kind == 0,
        np.where(stage > 0, key - m, -1),
        np.where(kind == 1, np.where(stage < S - 1, key + m, r), key - sm),
    )
    sd = np.asarray(placement.stage_device, dtype=np.int64)
    dep_stage = np.where(dep >= 0, (dep % sm) // m, 0)
    cross = ((dep >= 0) & (sd[dep_stage] != sd[stage])).astype(np.int64)
    act = placement.num_devices / S  # the default MemoryModel: even shares
    delta = np.zeros(3 * sm)
    delta[kind == 0] = act
    delta[kind == (1 if fused else 2)] = -act
    return Tables(placement, m, fused, ints(dep), ints(cross), ints(kind), ints(stage), delta)


@dataclass(frozen=True, eq=False)
class CandidateSet:
    """``K`` candidate schedules of one kind, as arrays (see the module docstring).

    Attributes:
        placement, m, fused: what every candidate is.
        keys: ``int64[K, p, L]`` pass keys in each device's order.
        labels: how each candidate was built (shown as the schedule's ``block`` parameter).
        peak: ``float64[K]``, each candidate's peak activation over devices, in ``a``.
        uid: identity for the timing cache (sets are immutable).
    """

    placement: Placement
    m: int
    fused: bool
    keys: np.ndarray
    labels: tuple[str, ...]
    peak: np.ndarray = field(default=None)  # type: ignore[assignment]
    uid: int = field(default_factory=lambda: next(_SERIAL))

    def __post_init__(self) -> None:
        k = self.keys
        if k.ndim != 3 or k.shape[0] != len(self.labels) or k.shape[1] != self.placement.num_devices:
            raise ValueError(f"keys must be [K={len(self.labels)}, p={self.placement.num_devices}, L], got {k.shape}")
        if k.shape[0] and k.shape[2] != passes_per_device(self.placement, self.m, self.fused):
            raise ValueError(f"each device needs {passes_per_device(self.placement, self.m, self.fused)} passes, "
                             f"got {k.shape[2]}")
        if self.peak is None:
            object.__setattr__(self, "peak", peaks(self.keys, tables(self.placement, self.m, self.fused).delta))

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_devices(self) -> int:
        return self.placement.num_devices

    def subset(self, index: Sequence[int] | np.ndarray) -> "CandidateSet":
        idx = np.asarray(index, dtype=np.int64)
        return CandidateSet(self.placement, self.m, self.fused, self.keys[idx],
                            tuple(self.labels[i] for i in idx), self.peak[idx])

    def orders(self, c: int) -> list[list[Pass]]:
        """Candidate ``c``'s device orders as :class:`~ctrlmem.model.ir.Pass` lists."""
        S, m = self.placement.num_stages, self.m
        sm = S * m
        ops = (Op.F, Op.BW if self.fused else Op.B, Op.W)
        out = []
        for row in self.keys[c].tolist():
            out.append([_new_pass(Pass, (ops[k // sm], (k % sm) // m, k % m)) for k in row])
        return out

    def schedule(self, c: int, name: str, params: dict | None = None) -> Schedule:
        """Candidate ``c`` as a :class:`~ctrlmem.model.ir.Schedule` (not validated here)."""
        orders = self.orders(c)
        return Schedule(name, self.placement.num_devices, self.m, self.placement,
                        tuple(tuple(o) for o in orders), tuple(sorted((params or {}).items())))


def problem(cs: CandidateSet, c: int) -> str | None:
    """Why candidate ``c`` is not a complete schedule (``None`` if it is): every pass once, each
    on its stage's device, and either one fused backward or a B and a W per stage and
    microbatch. (Deadlock is what timing finds: an infinite span.)"""
    t = tables(cs.placement, cs.m, cs.fused)
    keys = cs.keys[c]
    n = len(t.dep)
    if keys.min() < 0 or keys.max() >= n:
        return "a pass key outside the schedule's range"
    counts = np.bincount(keys.ravel(), minlength=n)
    want = np.ones(n, dtype=np.int64)
    if cs.fused:
        want[t.kind == 2] = 0
    bad = np.nonzero(counts != want)[0]
    if len(bad):
        k = int(bad[0])
        return f"pass key {k} appears {int(counts[k])} times (expected {int(want[k])})"
    sd = np.asarray(cs.placement.stage_device, dtype=np.int64)
    on = np.repeat(np.arange(keys.shape[0]), keys.shape[1]).reshape(keys.shape)
    wrong = sd[t.stage[keys]] != on
    if wrong.any():
        d, i = map(int, np.argwhere(wrong)[0])
        return f"device {d}, step {i} runs a stage the placement puts elsewhere"
    return None


def peaks(keys: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Each candidate's peak activation over its devices (``a``), from ``delta`` per key."""
    if keys.shape[0] == 0:
        return np.zeros(0)
    level = np.cumsum(delta[keys], axis=2)
    top = level.max(axis=(1, 2))
    return np.maximum(np.round(top, 9), 0.0) + 0.0


def from_orders(placement: Placement, m: int, fused: bool,
                items: Iterable[tuple[str, Sequence[Sequence[Pass]]]]) -> CandidateSet:
    """A set from ``(label, device orders)`` pairs (orders of :class:`Pass`, each device's
    passes complete for ``m`` microbatches)."""
    S = placement.num_stages
    labels, rows = [], []
    for label, orders in items:
        labels.append(label)
        rows.append([[((_KIND_OF[ps.op] * S + ps.stage) * m + ps.microbatch) for ps in o] for o in orders])
    L = passes_per_device(placement, m, fused)
    keys = np.asarray(rows, dtype=np.int64).reshape(len(labels), placement.num_devices, L) if rows else \
        np.zeros((0, placement.num_devices, L), dtype=np.int64)
    return CandidateSet(placement, m, fused, keys, tuple(labels))


def from_schedules(items: Iterable[tuple[str, Schedule]], fused: bool = False) -> CandidateSet:
    """A set from ``(label, Schedule)`` pairs of one placement and ``m``."""
    items = list(items)
    if not items:
        raise ValueError("from_schedules needs at least one schedule")
    s0 = items[0][1]
    return from_orders(s0.placement, s0.num_microbatches, fused, ((lab, s.device_passes) for lab, s in items))


def concat(sets: Sequence[CandidateSet]) -> CandidateSet:
    """One set holding every candidate of ``sets`` (same placement, m, fused)."""
    sets = [s for s in sets if len(s)]
    if len(sets) == 1:
        return sets[0]
    if not sets:
        raise ValueError("concat needs a non-empty set")
    s0 = sets[0]
    return CandidateSet(s0.placement, s0.m, s0.fused, np.concatenate([s.keys for s in sets]),
                        tuple(lab for s in sets for lab in s.labels), np.concatenate([s.peak for s in sets]))


def dedupe(cs: CandidateSet) -> CandidateSet:
    """The set without repeated orders (the first label of each kept)."""
    if len(cs) < 2:
        return cs
    seen: set[bytes] = set()
    keep = []
    for i in range(len(cs)):
        sig = cs.keys[i].tobytes()
        if sig not in seen:
            seen.add(sig)
            keep.append(i)
    return cs if len(keep) == len(cs) else cs.subset(keep)


# ---------------------------------------------------------------------------------------------
# lengthening the stable phase


@kernel
def _extend_kernel(keys0, m0, m, per_mb, out, ok):  # pragma: no cover - compiled; py_func tested
    """Lengthen each candidate's stable phase from ``m0`` to ``m`` microbatches: on each device
    the window of ``per_mb`` passes nearest the middle of its order that repeats right after it
    with every microbatch one higher (and holds each (kind, stage) once) gets the missing
    periods inserted after it; later passes' microbatches rise by ``m − m0``. ``ok[c]`` is 0
    when some device of candidate ``c`` has no such window."""
    K, p, L0 = keys0.shape
    extra = m - m0
    for c in range(K):
        ok[c] = 1
        for d in range(p):
            row = keys0[c, d]
            mid = L0 // 2
            best = -1
            for off in range(L0):
                for side in range(2):
                    i = mid - off if side == 0 else mid + off
                    if i < 0 or i + 2 * per_mb > L0:
                        continue
                    good = True
                    for j in range(per_mb):
                        a = row[i + j]
                        b = row[i + per_mb + j]
                        if a // m0 != b // m0 or b % m0 != a % m0 + 1:
                            good = False
                            break
                    if good:
                        for j in range(per_mb):
                            for j2 in range(j + 1, per_mb):
                                if row[i + j] // m0 == row[i + j2] // m0:
                                    good = False
                                    break
                            if not good:
                                break
                    if good:
                        best = i
                        break
                if best >= 0:
                    break
            if best < 0:
                ok[c] = 0
                break
            cut = best + per_mb
            n = 0
            for i in range(cut):
                k = row[i]
                out[c, d, n] = (k // m0) * m + k % m0
                n += 1
            for j in range(1, extra + 1):
                for i in range(best, cut):
                    k = row[i]
                    out[c, d, n] = (k // m0) * m + k % m0 + j
                    n += 1
            for i in range(cut, L0):
                k = row[i]
                out[c, d, n] = (k // m0) * m + k % m0 + extra
                n += 1


def extend(cs: CandidateSet, m: int) -> CandidateSet:
    """``cs`` lengthened to ``m`` microbatches (:func:`_extend_kernel`); candidates without a
    periodic stable phase are left out."""
    if m == cs.m:
        return cs
    if m < cs.m:
        raise ValueError(f"extend only lengthens: {cs.m} -> {m}")
    K, p, L0 = cs.keys.shape
    per_mb = L0 // cs.m
    out = np.empty((K, p, per_mb * m), dtype=np.int64)
    ok = np.zeros(K, dtype=np.int64)
    _extend_kernel(cs.keys, cs.m, m, per_mb, out, ok)
    if ok.all():  # (the usual case: no copy)
        return CandidateSet(cs.placement, m, cs.fused, out, cs.labels, cs.peak)
    keep = np.nonzero(ok)[0]
    return CandidateSet(cs.placement, m, cs.fused, out[keep], tuple(cs.labels[i] for i in keep), cs.peak[keep])
