"""Activation offload in real runs: what ``ctrlmem run --offload`` does (docs/theory.md §13).

A forward that the schedule offloads (a copy ``O`` of stage ``s``, microbatch ``mb``, fraction
``φ``) runs inside :class:`OffloadForward`, a ``torch.autograd.graph.saved_tensors_hooks``
context: the tensors autograd saves for its backward go to host memory (pinned on CUDA) until
``φ`` of the stage's activation bytes are there, the rest stays on the device; each offloaded
tensor comes back to the forward's device when autograd unpacks it in the backward (the
reload), and its host copy is freed when autograd drops it. The parameters are never moved.

When a :class:`ctrlmem.runtime.measure.SavedTensorMeter` is active (the first step of a run),
the tensors kept on the device go through it, so the meter counts exactly what stays resident,
and a :class:`HostLedger` counts the bytes on the host.

What a CPU run shows and what it does not: host and "device" are the same memory there, so the
copy is a memcpy between two CPU buffers; the run shows that the hook path computes the same
gradients, and the meter shows the resident activation falling by the offloaded bytes as the
schedule model says. It does not show a host link's bandwidth, a copy hidden behind compute, or
the allocator's peak falling (the host copy is a CPU allocation too): those need a GPU
(``scripts/gpu-check.sh``, :mod:`ctrlmem.runtime.hostcopy`).
"""

from __future__ import annotations

from typing import Iterable

import torch

from ctrlmem.runtime.measure import not_activation

__all__ = ["HostLedger", "OffloadForward"]


class HostLedger:
    """Bytes of activation held in host memory (offloaded, not yet dropped by autograd)."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.total = 0  # bytes copied to the host over the ledger's life

    def add(self, nbytes: int) -> None:
        self.current += nbytes
        self.total += nbytes
        self.peak = max(self.peak, self.current)

    def release(self, nbytes: int) -> None:
        self.current -= nbytes

    def reset_peak(self) -> None:
        self.peak = self.current


class _OnHost:
    __slots__ = ("host", "device", "ledger", "nbytes", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, ledger: HostLedger, nbytes: int) -> None:
        self.host, self.device, self.ledger, self.nbytes = host, device, ledger, nbytes
        ledger.add(nbytes)

    def __del__(self) -> None:
        self.ledger.release(self.nbytes)


class OffloadForward(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors of one forward to host memory, up to ``budget_bytes`` (see the module doc).

    Args:
        budget_bytes: bytes to offload (``φ`` times the stage's activation bytes per microbatch);
            tensors are taken in the order autograd saves them, while the budget is not reached.
        ledger: counts the bytes on the host.
        meter: the active :class:`~ctrlmem.runtime.measure.SavedTensorMeter`, or ``None``: the
            tensors kept on the device go through it (this context replaces its hooks while the
            forward runs).
        exclude: tensors never moved (the parameters, and views of them that autograd saves).
    """

    def __init__(self, budget_bytes: float, ledger: HostLedger, meter=None,
                 exclude: Iterable[torch.Tensor] = ()) -> None:
        self.budget = float(budget_bytes)
        self.ledger = ledger
        self.meter = meter
        self.offloaded = 0
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        # key -> (the device tensor, its host copy); the device tensor is held until the forward
        # ends so that its memory cannot be reused by a later tensor of the same forward, whose
        # key would then match and get this host copy (wrong gradients)
        self._seen: dict[tuple, tuple[torch.Tensor, _OnHost]] = {}
        super().__init__(self._pack, self._unpack)

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        # autograd keeps this object (its unpack hook) with every tensor the forward saved: the
        # de-duplication table goes now, so each host copy is freed when autograd drops it
        self._seen.clear()

    def _keep(self, t: torch.Tensor):
        return self.meter._pack(t) if self.meter is not None else t

    def _pack(self, t: torch.Tensor):
        if not_activation(t, self._excluded):
            return self._keep(t)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in self._seen:  # the same tensor saved twice (by two operations): one host copy
            return self._seen[key][1]
        if self.offloaded >= self.budget:
            return self._keep(t)
        nbytes = t.numel() * t.element_size()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        host.copy_(t.detach())
        self.offloaded += nbytes
        packed = _OnHost(host, t.device, self.ledger, nbytes)
        self._seen[key] = (t, packed)
        return packed

    def _unpack(self, obj):
        if isinstance(obj, _OnHost):
            return obj.host.to(obj.device, non_blocking=obj.host.is_pinned())
        return self.meter._unpack(obj) if self.meter is not None else obj
