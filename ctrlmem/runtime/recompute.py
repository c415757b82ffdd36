"""Activation recomputation in real runs: what ``ctrlmem run --recompute`` does (docs/theory.md §13).

A stage whose forwards the schedule recomputes (``R`` passes) runs its layers (``full``) or each
layer's attention core (``selective``) inside a *non-reentrant* ``torch.utils.checkpoint``
(``use_reentrant=False``): the forward keeps only the region's inputs, and the first time the
backward needs one of the region's saved tensors, torch runs the region's forward again and keeps
what it saves until the backward takes it. That is the schedule's ``R`` right before its ``B``
(or ``BW``).

**Split backward.** ctrlmem's runs (``memory_fidelity``, the default) run torch's ``I`` (our ``B``)
as one full autograd backward with the stage's linear layers in deferred mode
(:class:`ctrlmem.runtime.models.WeightGradStash`): the checkpoint recomputes once, inside ``B``,
the backward frees the recomputed tensors as it goes, and ``W`` applies the weight gradients from
the stashed (recomputed) layer inputs and output gradients, recomputing nothing. torch's own split
backward (``--torch-memory``) runs ``I`` as ``autograd.grad`` of the stage inputs and ``W`` as one
``autograd.grad`` per parameter group, each a graph task of its own, and a non-reentrant checkpoint
recomputes its region once per graph task that unpacks from it, keeping what that task does not
unpack until the graph is freed. :attr:`Recomputation.recomputes` counts what really happened, so a
result can say how many times each forward was recomputed (1 in ctrlmem's runs).

**Memory.** The checkpoint saves its inputs through the saved-tensor hooks in effect (the meter's:
:class:`ctrlmem.runtime.measure.SavedTensorMeter`), but saves the region's tensors through hooks of
its own, innermost, which autograd alone applies, so the meter never sees them: in the forward
there is nothing to see (the region keeps nothing), but in the backward the recomputed tensors are
resident. :class:`Recomputation` therefore gives the checkpoint a recompute context that observes
every tensor the recomputation saves (:class:`ctrlmem.runtime.adapter.ObservedSavedTensors`) and
counts it in the stage's active meter until it is freed
(:meth:`~ctrlmem.runtime.measure.SavedTensorMeter.count_until_freed`).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ctrlmem.runtime.adapter import ObservedSavedTensors

__all__ = ["Recomputation"]


class Recomputation:
    """The checkpointing of one stage (shared by its layers).

    Args:
        stash: the stage's :class:`~ctrlmem.runtime.models.WeightGradStash`, whose ``meter`` is
            the stage's active saved-tensor meter, or ``None`` (no measurement: the recompute
            context then only counts).

    ``regions`` counts the checkpointed regions the forwards ran, ``recomputes`` the times the
    backward recomputed one; both since the last :meth:`reset`.
    """

    def __init__(self, stash) -> None:
        self.stash = stash
        self.regions = 0
        self.recomputes = 0

    def reset(self) -> None:
        self.regions = self.recomputes = 0

    def __call__(self, fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        """``fn(*args)`` checkpointed when autograd records (plain otherwise)."""
        if not torch.is_grad_enabled():
            return fn(*args)
        self.regions += 1
        return checkpoint(fn, *args, use_reentrant=False, context_fn=self._contexts)

    def _contexts(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), _Recomputing(self)


class _Recomputing:
    """Entered by torch around each recomputation of a region (inside the checkpoint's own hooks)."""

    def __init__(self, owner: Recomputation) -> None:
        self.owner = owner
        self._hooks: ObservedSavedTensors | None = None

    def __enter__(self) -> "_Recomputing":
        self.owner.recomputes += 1
        meter = self.owner.stash.meter
        if meter is not None:
            self._hooks = ObservedSavedTensors(meter.count_until_freed)
            self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None
