"""Measuring activation memory and pass costs honestly (docs/architecture.md).

* :class:`SavedTensorMeter` counts what autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``): deduplicated by storage, parameters skipped,
  each tensor packed as ``t.detach()`` (no reference cycle) and released when autograd drops
  the packed object. Tensors held for a deferred ``W`` register with the same meter, so a
  tensor both saved and stashed is counted once, and so do the tensors a non-reentrant
  checkpoint recomputes in the backward (:meth:`SavedTensorMeter.count_until_freed`, called by
  :mod:`ctrlmem.runtime.recompute`), which the checkpoint's own saved-tensor hooks hide from the
  meter's. ``peak`` is the high-water mark in bytes.
* :class:`AllocatorPeak` reads the allocator: ``torch.cuda.max_memory_allocated`` on GPU, the
  profiler's memory events (``profile_memory=True``) on CPU; bytes above the level at entry.
* :func:`theory_peak_bytes` replays a device's pass order with per-stage activation bytes: the
  peak the schedule promises for this model (F allocates the stage's activation, B frees the
  part ``W`` does not need, W or BW frees the rest).
* :func:`costs_from_records` turns measured passes into a per-stage :class:`ctrlmem.Costs`.
"""

from __future__ import annotations

import statistics
import weakref
from collections import defaultdict
from typing import Iterable, Mapping, Sequence

import torch

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.runtime.adapter import cpu_allocation_deltas
from ctrlmem.util.userfile import read_json

__all__ = ["SavedTensorMeter", "AllocatorPeak", "theory_peak_bytes", "theory_host_peak_bytes", "costs_from_records", "costs_from_result",
           "sample_stats"]


class _Packed:
    __slots__ = ("tensor", "meter", "key", "__weakref__")

    def __init__(self, tensor: torch.Tensor, meter: "SavedTensorMeter", key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release_key(self.key)


def not_activation(t: torch.Tensor, excluded: set[int]) -> bool:
    """Whether a tensor autograd saves is a parameter (or a view of one: its storage is in
    ``excluded``) or a meta tensor, not an activation to count or move."""
    return isinstance(t, torch.nn.Parameter) or t.device.type == "meta" or t.untyped_storage().data_ptr() in excluded


class SavedTensorMeter:
    """Bytes of activation held for backward, deduplicated by storage (see module doc)."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self._refs: dict[int, int] = defaultdict(int)
        self._size: dict[int, int] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._excluded: set[int] = set()

    def exclude(self, tensors: Iterable[torch.Tensor]) -> "SavedTensorMeter":
        """Never count these tensors' storages (the parameters, and views of them such as
        ``weight.t()`` that autograd saves for a matmul)."""
        self._excluded.update(t.untyped_storage().data_ptr() for t in tensors)
        return self

    def reset_peak(self) -> None:
        self.peak = self.current

    def _acquire(self, t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if self._refs[key] == 0:
            self._size[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        self._refs[key] += 1
        return key

    def _release_key(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.current -= self._size.pop(key)
            del self._refs[key]

    def hold(self, t: torch.Tensor) -> int:
        """Count ``t`` as held (a deferred-W stash); returns a key for :meth:`drop`."""
        return self._acquire(t)

    def drop(self, key: int) -> None:
        self._release_key(key)

    def count_until_freed(self, t: torch.Tensor) -> torch.Tensor:
        """Count ``t`` (an activation; parameters and views of them are skipped) for as long as
        the tensor returned lives: ``t.detach()``, released when the last reference to it goes.
        For tensors kept by someone else than autograd's saved-tensor hooks (a non-reentrant
        checkpoint keeps what it recomputes in its own table until the backward unpacks it)."""
        if not_activation(t, self._excluded):
            return t
        alias = t.detach()
        weakref.finalize(alias, self._release_key, self._acquire(alias))
        return alias

    def _pack(self, t: torch.Tensor):
        if not_activation(t, self._excluded):
            return t
        d = t.detach()
        return _Packed(d, self, self._acquire(d))

    @staticmethod
    def _unpack(obj):
        return obj.tensor if isinstance(obj, _Packed) else obj

    def __enter__(self) -> "SavedTensorMeter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)
        self._hooks = None


class AllocatorPeak:
    """Peak allocator bytes above the level at entry (CUDA stats on GPU, profiler on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._prof = None
        self._base = 0

    def __enter__(self) -> "AllocatorPeak":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - torch takes seconds to import; only real runs need it

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return
        self._prof.__exit__(*exc)

        deltas = cpu_allocation_deltas(self._prof)
        level = peak = 0
        for _, nbytes in deltas:
            level += nbytes
            peak = max(peak, level)
        self.peak = peak


def theory_peak_bytes(
    schedule: Schedule,
    stage_activation: Sequence[float],
    stage_kept_for_w: Sequence[float],
    stage_recomputed: Sequence[float] | None = None,
    offloaded: Mapping[tuple[int, int], tuple[float, float, float]] | None = None,
) -> list[float]:
    """Per device, the schedule's peak activation bytes for a model whose stage ``s`` stores
    ``stage_activation[s]`` bytes per microbatch at ``F``, of which ``stage_kept_for_w[s]`` wait
    for ``W`` after ``B``. A forward that has an ``R`` stores ``stage_recomputed[s]`` until it (by
    default :meth:`ctrlmem.Costs.kept_fraction` of its activation), the ``R`` the rest. A forward
    ``(stage, microbatch)`` in ``offloaded`` = ``(resident, resident kept for W, reloaded)`` keeps
    ``resident`` bytes on the device from its ``F`` (what is left once its offload's share went to
    the host, as a real run's offload does it: :mod:`ctrlmem.runtime.offload`); at its ``B`` (or
    ``BW``) the ``reloaded`` bytes come back to the device first, so the backward sees its whole
    activation, and ``resident kept for W`` bytes stay there after ``B`` until ``W``.
    Memory depends only on each device's own order, not on timing (copy lanes are not modelled
    here; the simulator models them)."""
    if stage_recomputed is None:
        frac = Costs().kept_fraction(schedule.recompute_mode)
        stage_recomputed = [a * frac for a in stage_activation]
    recomputed = {(ps.stage, ps.microbatch) for row in schedule.device_passes for ps in row if ps.op is Op.R}
    offloaded = offloaded or {}

    def sizes(s: int, mb: int) -> tuple[float, float, float, float]:
        """(bytes the F stores, more bytes the R stores, bytes reloaded before its backward,
        bytes kept for W after B)."""
        a, keep = stage_activation[s], stage_kept_for_w[s]
        r = a - stage_recomputed[s] if (s, mb) in recomputed else 0.0
        if (s, mb) in offloaded:  # what stays on the device of what the F stores
            resident, keep, back = offloaded[(s, mb)]
            return resident, r, back, keep
        return a - r, r, 0.0, keep

    peaks = []
    for row in schedule.device_passes:
        level = peak = 0.0
        for ps in row:
            f, r, back, keep = sizes(ps.stage, ps.microbatch)
            if ps.op is Op.F:
                level += f
                peak = max(peak, level)
            elif ps.op is Op.R:
                level += r
                peak = max(peak, level)
            elif ps.op is Op.W:
                level -= keep
            else:  # B or BW: the reload first, then what the backward frees
                level += back
                peak = max(peak, level)
                level -= f + r + back - (keep if ps.op is Op.B else 0.0)
        peaks.append(peak)
    return peaks


def theory_host_peak_bytes(schedule: Schedule, offloaded: Mapping[tuple[int, int], tuple[float, float]]) -> list[float]:
    """Per device, the peak bytes of activation on the host when each forward ``(stage,
    microbatch)`` in ``offloaded`` puts ``(host bytes, of them kept for W after B)`` there at its
    ``F`` until autograd drops them (at ``B`` the part ``W`` does not need, at ``W`` / ``BW`` the
    rest), as :mod:`ctrlmem.runtime.offload` does in a real run: :func:`theory_peak_bytes` of a
    model that keeps nothing else."""
    none = [0.0] * schedule.num_stages
    return theory_peak_bytes(schedule, none, none, none,
                             {key: (host, keep, 0.0) for key, (host, keep) in offloaded.items()})


def _median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else 0.0


def stage_pass_times(records: Iterable[dict], num_stages: int) -> dict[str, list[float]]:
    """Median thread-CPU time of each pass kind per stage; ``BW`` is split into ``B``+``W`` when
    both are also measured, else counted as ``B`` with ``W`` = 0 for that stage."""
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in records:
        by[(r["op"], r["stage"])].append(r["cpu_s"])
    out: dict[str, list[float]] = {"f": [], "b": [], "w": [], "bw": []}
    for s in range(num_stages):
        f = _median(by[("F", s)])
        b, w, bw = _median(by[("B", s)]), _median(by[("W", s)]), _median(by[("BW", s)])
        if not by[("B", s)] and bw:
            b, w = bw, 0.0
        out["f"].append(f)
        out["b"].append(b)
        out["w"].append(w)
        out["bw"].append(bw)
    return out


def costs_from_records(records: Iterable[dict], num_stages: int, comm: float = 0.0) -> Costs:
    """A per-stage :class:`ctrlmem.Costs` from measured pass records (median per stage and kind).

    For a schedule with fused backward only (``BW``), ``b`` carries the whole backward and
    ``w`` is 0, so the simulator's ``BW = b + w`` is the measured one.
    """
    t = stage_pass_times(records, num_stages)
    return Costs(f=t["f"], b=t["b"], w=t["w"], comm=comm)


def sample_stats(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, the relative spread ``(max − min) / median`` and the relative
    interquartile range ``(q3 − q1) / median`` (robust to a few outliers) of a sample."""
    if not values:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "spread": 0.0, "iqr": 0.0, "n": 0}
    med = statistics.median(values)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
    else:
        q1, q3 = min(values), max(values)
    return {"median": med, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / med if med else 0.0,
            "iqr": (q3 - q1) / med if med else 0.0, "n": len(values)}


def costs_from_result(result: dict | str) -> Costs:
    """The measured per-stage :class:`ctrlmem.Costs` of a ``result.json`` (a dict or a path), for
    ``cm.build(..., costs=...)`` and ``cm.simulate``."""
    if isinstance(result, str) or hasattr(result, "__fspath__"):

        result = read_json(result, "result file", fix="give the result.json `ctrlmem run` wrote")
    c = result.get("measured_costs") if isinstance(result, dict) else None
    if not isinstance(c, dict) or any(k not in c for k in ("f", "b", "w", "comm")):
        raise ValueError("this result has no measured costs (f, b, w, comm): run with --steps 1 or more")
    return Costs(f=c["f"], b=c["b"], w=c["w"], comm=c["comm"])
