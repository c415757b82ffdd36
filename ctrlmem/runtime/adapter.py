"""Run a ctrlmem :class:`~ctrlmem.Schedule` on ``torch.distributed.pipelining``.

**Supported torch: 2.11, 2.12 and 2.13** (:data:`SUPPORTED_TORCH`; :func:`check_torch_version`
refuses others, because the private runtime used here changes between releases; both live in
:mod:`.versions`, which the launcher imports without torch).

This is the only module of ctrlmem that touches private torch API: the pipelining runtime's
(``_PipelineScheduleRuntime``, ``_Action``, ``_prepare_schedule_with_comms``, ``_validate_schedule``,
``stage_index_to_group_rank``, a stage's receive slots and its neighbour warm-up), the profiler's
raw memory events (:func:`cpu_allocation_deltas`), the point-to-point audit (:class:`P2PAudit`) and
autograd's stack of saved-tensor hooks (:class:`ObservedSavedTensors`).

**Shapes up front, no self-send.** Every stage is built with its input and output shapes
(``input_args`` / ``output_args``), so torch runs no shape-inference exchange (torch 2.12 and 2.13
vote "static" and skip it; torch 2.11 never starts it). torch 2.11 instead opens every stage's
neighbour links with a dummy send to the next stage's rank and a receive from the previous one,
*including* when that rank is the stage's own (the V-shape turn, e.g. stages 1 and 2 on rank 1 at
p = 2), which gloo rejects ("Pair is not connected"). :class:`TrackedStage` drops those
self-addressed warm-up operations; :class:`Pipeline` runs the same filtered warm-up itself on every
version, so the path is exercised (and audited by the tests) on every supported torch.

**Letters.** ctrlmem's passes follow the paper: ``F`` forward, ``B`` input backward, ``W`` weight
backward, ``BW`` fused backward. Torch's letters differ: its ``I`` (BACKWARD_INPUT) is our ``B``,
its ``B`` (FULL_BACKWARD) is our ``BW``; ``F`` and ``W`` agree. :func:`to_torch_actions` is the
one place that translates.

**Placement.** Torch infers which rank runs each stage from the actions; :class:`Pipeline` checks
that its inference equals the schedule's placement and raises otherwise. A rank's stages are
handed to torch in ascending stage order (other orders break the warm-up handshake).

**Memory fidelity.** Out of the box torch's ``I`` keeps the whole autograd graph until ``W``,
stashes intermediate gradients as well, and keeps every sent tensor until the step ends, so
split-backward schedules hold more than their theory. Here, without patching torch:

* every stage gets a ``dw_builder`` (:meth:`WeightGradStash.take
  <ctrlmem.runtime.models.WeightGradStash.take>`): torch then runs a *full* autograd backward at
  ``I`` with the stage's linear layers in deferred mode, which frees the graph and keeps only each
  linear layer's ``(input, grad_output)`` for ``W``, as the paper's runtime does;
* :class:`TrackedStage` issues its own sends and drops each send's tensor as soon as the send has
  completed, instead of at the end of the step, and after ``B`` forgets the activation and the
  gradient a same-rank neighbour stage handed over (the V-shape turn), which torch keeps in its
  receive slots until the next step.

:class:`TrackedStage` also times every pass (thread CPU time on CPU, CUDA events on GPU) and
remembers the pass it is in, so a failure can name it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.stage import _RecvInfo
from torch.distributed.pipelining.schedules import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    _Action,
    _PipelineScheduleRuntime,
    _validate_schedule,
)

from ctrlmem.model.ir import Op, Pass, Schedule
from ctrlmem.runtime.versions import ALLOW_ENV, SUPPORTED_TORCH, UnsupportedTorch, check_torch_version

__all__ = ["SUPPORTED_TORCH", "ALLOW_ENV", "UnsupportedTorch", "check_torch_version", "to_torch_actions", "torch_stage_to_rank",
           "torch_inferred_placement", "cpu_allocation_deltas", "ObservedSavedTensors", "P2PAudit", "PassRecord",
           "TrackedStage", "Pipeline"]

log = logging.getLogger(__name__)

_TO_TORCH = {Op.F: FORWARD, Op.B: BACKWARD_INPUT, Op.W: BACKWARD_WEIGHT, Op.BW: FULL_BACKWARD}


def to_torch_actions(schedule: Schedule) -> dict[int, list[_Action]]:
    """Torch's compute-only actions per rank (our ``B`` → torch ``I``, our ``BW`` → torch ``B``).
    ``R`` passes have no torch action: a stage wrapped in ``torch.utils.checkpoint`` recomputes
    inside its backward, where ctrlmem places the ``R`` (docs/theory.md §13)."""
    return {
        rank: [_Action(ps.stage, _TO_TORCH[ps.op], ps.microbatch) for ps in row]
        for rank, row in enumerate(schedule.compute_only().device_passes)
    }


def torch_stage_to_rank(runtime: _PipelineScheduleRuntime) -> dict[int, int]:
    """The stage → rank mapping torch inferred from the actions it was given."""
    return dict(runtime.stage_index_to_group_rank)


def torch_inferred_placement(schedule: Schedule) -> dict[int, int]:
    """Stage → rank as torch's own schedule validator infers it from :func:`to_torch_actions`
    (no process group needed); raises torch's error if torch rejects the action lists."""
    return dict(_validate_schedule(to_torch_actions(schedule), schedule.num_devices,
                                   schedule.num_stages, schedule.num_microbatches))


def cpu_allocation_deltas(prof) -> list[tuple[int, int]]:
    """``(time_ns, bytes)`` of every CPU allocation (+) and free (−) a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in time order. The public
    ``prof.events()`` folds them into per-operator totals, which hides peaks inside an operator,
    so this reads the profiler's raw (private) event list."""
    events = prof.profiler.kineto_results.events()
    return sorted((e.start_ns(), e.nbytes()) for e in events
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)


class ObservedSavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that show every tensor autograd saves to ``observe`` and then hand what
    ``observe`` returns to the hooks that were in effect when this context was entered.

    Autograd applies only the innermost pair of ``saved_tensors_hooks``, so hooks pushed inside
    another pair normally replace it. This pair keeps the one below working: it reads the pair in
    effect at entry from autograd's hook stack (private: ``torch._C._autograd``) and calls its pack
    and unpack itself (or keeps the tensor when there is none). ``observe(t)`` must return ``t``
    or a tensor aliasing it (``t.detach()``).

    ctrlmem enters it as the recompute context of a non-reentrant ``torch.utils.checkpoint``
    (:mod:`ctrlmem.runtime.recompute`), where the pair below is the checkpoint's own, which stores
    each recomputed tensor until the backward unpacks it: the observer sees what the recomputation
    keeps without changing it.
    """

    def __init__(self, observe: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._observe = observe
        self._below: tuple[Callable, Callable] | None = None
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "ObservedSavedTensors":
        self._below = torch._C._autograd._top_saved_tensors_default_hooks(True)
        super().__enter__()
        return self

    def _pack(self, t: torch.Tensor):
        t = self._observe(t)
        return self._below[0](t) if self._below is not None else t

    def _unpack(self, obj):
        return self._below[1](obj) if self._below is not None else obj


class P2PAudit:
    """Counts every point-to-point operation this process issues (test and check tool).

    While active it wraps ``torch.distributed``'s ``send`` / ``recv`` / ``isend`` / ``irecv``
    (the functions every batched or single P2P operation of the pipelining runtime ends in) and
    ``send_object_list`` / ``recv_object_list`` (torch's metadata / shape-inference exchange), and
    records each operation's peer. :attr:`self_ops` lists operations addressed to this process
    itself (what gloo rejects with "Pair is not connected"); :attr:`object_exchanges` counts
    metadata exchanges (0 when every stage's shapes are given up front).
    """

    _P2P = ("send", "recv", "isend", "irecv")
    _OBJ = ("send_object_list", "recv_object_list")

    def __init__(self) -> None:
        self.ops = 0
        self.self_ops: list[str] = []
        self.object_exchanges = 0
        self._saved: list[tuple[object, str, object]] = []
        self._lock = threading.Lock()

    def summary(self) -> dict:
        return {"p2p_ops": self.ops, "self_ops": len(self.self_ops), "self_op_examples": self.self_ops[:5],
                "object_exchanges": self.object_exchanges}

    def _wrap_p2p(self, name: str, fn):
        sending = name in ("send", "isend")

        def wrapped(tensor, *args, **kwargs):
            peer = args[0] if args else kwargs.get("dst" if sending else "src")
            group = args[1] if len(args) > 1 else kwargs.get("group")
            group_peer = kwargs.get("group_dst" if sending else "group_src")
            if peer is None and group_peer is not None:
                peer = dist.get_global_rank(group, group_peer) if group is not None else group_peer
            with self._lock:
                self.ops += 1
                if peer is not None and peer == dist.get_rank():
                    self.self_ops.append(f"{name} to own rank {peer}")
            return fn(tensor, *args, **kwargs)

        wrapped.__wrapped__ = fn
        return wrapped

    def _wrap_obj(self, fn):
        def wrapped(*args, **kwargs):
            with self._lock:
                self.object_exchanges += 1
            return fn(*args, **kwargs)

        wrapped.__wrapped__ = fn
        return wrapped

    def __enter__(self) -> "P2PAudit":
        for name in self._P2P + self._OBJ:
            original = getattr(c10d, name)
            new = self._wrap_p2p(name, original) if name in self._P2P else self._wrap_obj(original)
            for module in (c10d, dist):  # both names: P2POp checks its op against c10d's globals
                self._saved.append((module, name, getattr(module, name)))
                setattr(module, name, new)
        return self

    def __exit__(self, *exc) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved = []


def _p2p_group_peer(op: dist.P2POp, group) -> int:
    group_peer = getattr(op, "group_peer", None)
    if group_peer is None:
        group_peer = dist.get_group_rank(group, op.peer) if group is not None else op.peer
    return group_peer


@dataclass
class PassRecord:
    """One executed pass: which, and how long (``cpu_s`` thread CPU time, ``wall_s`` wall)."""

    op: str
    stage: int
    microbatch: int
    cpu_s: float
    wall_s: float
    start: float


@dataclass
class _Fault:
    """Test-only fault injection: ``mode`` is ``"crash"`` or ``"hang"`` at pass ``pass_`` on ``rank``."""

    rank: int
    pass_: str
    mode: str


class TrackedStage(PipelineStage):
    """A ``PipelineStage`` that times its passes, names the current one, and frees sent buffers.

    ``on_pass(label, running)`` is called when a pass starts (``running=True``) and when it ends
    (progress / watchdog: a rank can say whether it hung inside a pass or between passes); ``fault`` makes
    the rank crash or hang at one pass (failure-handling tests).
    """

    def __init__(self, *args, on_pass: Callable[[str, bool], None] | None = None,
                 fault: _Fault | None = None, release_sends: bool = True,
                 forward_context: Callable[[int], contextlib.AbstractContextManager] | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._forward_context = forward_context
        self.records: list[PassRecord] = []
        self._on_pass = on_pass
        self._fault = fault
        self._inflight_sends: list[tuple[dist.Work, int]] = []
        self.inflight_grad_bytes = 0
        self.peak_inflight_grad_bytes = 0  # gradients waiting in sends for their receiver (measurement)
        self._release_sends = release_sends
        self.cuda = self.device.type == "cuda"

    # -- timing ---------------------------------------------------------------------------
    def _timed(self, op: Op, mb: int, fn: Callable[[], object]) -> object:
        label = str(Pass(op, self.stage_index, mb))
        self._reap_sends()
        if self._on_pass is not None:
            self._on_pass(label, True)
        if self._fault is not None and self._fault.pass_ == label:
            if self._fault.mode == "hang":
                log.warning("fault injection: pass %s hangs", label)
                while True:
                    time.sleep(1.0)
            raise RuntimeError(f"fault injection: pass {label} crashed")
        wall0 = time.perf_counter()
        if self.cuda:
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_ev.record()
            out = fn()
            end_ev.record()
            end_ev.synchronize()
            cpu = start_ev.elapsed_time(end_ev) / 1e3
        else:
            cpu0 = time.thread_time()
            out = fn()
            cpu = time.thread_time() - cpu0
        self.records.append(PassRecord(op.value, self.stage_index, mb, cpu, time.perf_counter() - wall0, wall0))
        if self._on_pass is not None:
            self._on_pass(label, False)
        return out

    def add_to_last(self, op: Op, mb: int, cpu_s: float, wall_s: float) -> None:
        """Add time spent outside the stage (the loss) to its latest ``op`` pass of ``mb``."""
        for rec in reversed(self.records):
            if rec.op == op.value and rec.microbatch == mb:
                rec.cpu_s += cpu_s
                rec.wall_s += wall_s
                return

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        def run():
            ctx = self._forward_context(fwd_chunk_id) if self._forward_context is not None else contextlib.nullcontext()
            with ctx:  # e.g. the saved-tensor hooks of an offloaded forward (ctrlmem.runtime.offload)
                return super(TrackedStage, self).forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        return self._timed(Op.F, fwd_chunk_id, run)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        op = Op.BW if full_backward else Op.B
        out = self._timed(op, bwd_chunk_id, lambda: super(TrackedStage, self).backward_one_chunk(
            bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward))
        if self._release_sends and self.dw_builder is not None:
            self._drop_local_buffers(bwd_chunk_id)
        return out

    def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
        """torch's neighbour warm-up without the operations addressed to this rank itself (a
        neighbour stage on the same rank, the V-shape turn), which torch 2.11 issues and gloo
        rejects. Same-rank neighbours exchange tensors in memory, never through P2P."""
        ops = super()._get_init_p2p_neighbors_ops()
        return [op for op in ops if _p2p_group_peer(op, self.group) != self.group_rank]

    def _drop_local_buffers(self, mb: int) -> None:
        """After B of ``mb``: forget the activation and the gradient handed over by a same-rank
        neighbour stage (V-shape turn). Torch keeps them in its receive slots until the next step;
        the next forward / backward hands over new ones, and nothing after B reads them (W uses
        the deferred-weight stash)."""
        placement = self.stage_index_to_group_rank
        if not self.is_first and placement.get(self.stage_index - 1) == self.group_rank:
            for info in self.args_recv_info[mb]:
                # torch 2.12+ marks model inputs with is_root_arg; 2.11 uses another class for them
                if isinstance(info, _RecvInfo) and not getattr(info, "is_root_arg", False):
                    info.buffer = self._placeholder()
        if not self.is_last and placement.get(self.stage_index + 1) == self.group_rank:
            for info in self.grad_recv_info[mb]:
                info.buffer = self._placeholder()

    def _placeholder(self) -> torch.Tensor:
        # an empty tensor, not None: torch 2.11 clears `buffer.grad` on every slot between steps
        return torch.empty(0, device=self.device)

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        return self._timed(Op.W, bwd_chunk_id, lambda: super(TrackedStage, self).backward_weight_one_chunk(
            bwd_chunk_id, last_backward=last_backward))

    # -- sends: issue them here, drop each tensor as soon as its send completes -----------
    def _issue(self, ops: list[dist.P2POp], grads: bool) -> list[dist.P2POp]:
        if not self._release_sends:
            return ops  # torch's default: it keeps every send until the end of the step
        for op in ops:
            # a sent gradient lives only in its send (torch popped it); an activation also lives
            # in torch's forward cache until B, so only gradients count as extra bytes in flight
            nbytes = op.tensor.untyped_storage().nbytes() if grads else 0
            self._inflight_sends.append((op.op(op.tensor, op.peer, op.group, op.tag), nbytes))
            self.inflight_grad_bytes += nbytes
        self.peak_inflight_grad_bytes = max(self.peak_inflight_grad_bytes, self.inflight_grad_bytes)
        return []

    def _reap_sends(self) -> None:
        if self._inflight_sends:
            keep = []
            for work, nbytes in self._inflight_sends:
                if work.is_completed():
                    self.inflight_grad_bytes -= nbytes
                else:
                    keep.append((work, nbytes))
            self._inflight_sends = keep

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._issue(super().get_fwd_send_ops(fwd_chunk_id), grads=False)

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._issue(super().get_bwd_send_ops(bwd_chunk_id), grads=True)

    def finish_sends(self) -> None:
        for work, _ in self._inflight_sends:
            work.wait()
        self._inflight_sends = []
        self.inflight_grad_bytes = 0


def _warm_up_neighbours(stages: list[TrackedStage]) -> None:
    """Open every cross-rank neighbour link (a dummy tensor each way), skipping same-rank
    neighbours: the filtered form of torch 2.11's warm-up, run on every torch version so the
    path is the same everywhere. Every rank of the pipeline calls it (from :meth:`Pipeline.create`)."""
    ops = [op for st in stages for op in st._get_init_p2p_neighbors_ops()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


@dataclass
class Pipeline:
    """One rank's share of a schedule, ready to ``step``.

    Build with :meth:`create`; ``stages`` are this rank's :class:`TrackedStage` in ascending
    stage order.
    """

    schedule: Schedule
    rank: int
    runtime: _PipelineScheduleRuntime
    stages: list[TrackedStage]
    loss_records: list[tuple[int, float, float]] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        schedule: Schedule,
        rank: int,
        modules: dict[int, torch.nn.Module],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        io_shapes: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        dw_builders: dict[int, Callable[[], Callable[[], None]]] | None = None,
        on_pass: Callable[[str, bool], None] | None = None,
        fault: tuple[int, str, str] | None = None,
        release_sends: bool = True,
        forward_contexts: dict[int, Callable[[int], contextlib.AbstractContextManager]] | None = None,
    ) -> "Pipeline":
        """``modules[s]`` for every stage ``s`` this rank holds; ``io_shapes(s)`` gives example
        ``(input, output)`` tensors of stage ``s`` for one microbatch; ``dw_builders[s]`` (optional)
        turns torch's ``I`` into a full backward whose weight part runs at ``W``; without it (and
        with ``release_sends=False``) torch's own behaviour is kept, for comparison.
        ``forward_contexts[s]`` (optional) gives, for a microbatch, the context its forward of
        stage ``s`` runs in (an offloaded forward's saved-tensor hooks)."""
        mine = schedule.placement.stages_of(rank)
        if sorted(modules) != list(mine):
            raise ValueError(f"rank {rank} holds stages {list(mine)} but got modules for {sorted(modules)}")
        flt = _Fault(*fault) if fault is not None and fault[0] == rank else None
        pipeline: Pipeline | None = None
        stages = []
        for s in mine:  # ascending: torch's warm-up handshake needs it
            example_in, example_out = io_shapes(s)
            stages.append(TrackedStage(
                modules[s], s, schedule.num_stages, device,
                input_args=example_in, output_args=example_out, group=group,
                dw_builder=(dw_builders or {}).get(s), on_pass=on_pass, fault=flt,
                release_sends=release_sends, forward_context=(forward_contexts or {}).get(s),
            ))
        last = stages[-1] if stages[-1].is_last else None

        def timed_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            loss = loss_fn(output, target)
            if pipeline is not None and last is not None and last.records:
                last.add_to_last(Op.F, last.records[-1].microbatch,
                                 time.thread_time() - cpu0, time.perf_counter() - wall0)
            return loss

        runtime = _PipelineScheduleRuntime(stages, schedule.num_microbatches, loss_fn=timed_loss, scale_grads=True)
        runtime._prepare_schedule_with_comms(to_torch_actions(schedule))
        inferred = torch_stage_to_rank(runtime)
        expected = {s: schedule.placement.device_of(s) for s in range(schedule.num_stages)}
        if inferred != expected:
            diff = {s: (expected[s], inferred.get(s)) for s in expected if inferred.get(s) != expected[s]}
            raise RuntimeError(
                f"torch placed stages differently from the schedule ({schedule.placement.kind}): "
                f"stage: (ours, torch's) = {diff}"
            )
        _warm_up_neighbours(stages)
        pipeline = cls(schedule, rank, runtime, stages)
        return pipeline

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> list[torch.Tensor]:
        """One training step over ``m`` microbatches; returns the losses (last stage only)."""
        for st in self.stages:
            st.records.clear()
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.stages[0].is_first else ()
        has_last = self.stages[-1].is_last
        self.runtime.step(*args, target=targets if has_last else None,
                          losses=losses if has_last else None, return_outputs=False)
        for st in self.stages:
            st.finish_sends()
        return losses

    @property
    def records(self) -> list[PassRecord]:
        """This step's passes on this rank, in execution order."""
        return sorted((r for st in self.stages for r in st.records), key=lambda r: r.start)
