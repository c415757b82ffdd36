"""The per-rank entry point that ``torch.distributed.run`` starts (``python -m ctrlmem.runtime.worker CONFIG``).

One run, on every rank: build this rank's stages of the model, check one pipelined step against
a non-pipelined reference step (loss and every gradient), measure activation memory (autograd
saved tensors in that step, the allocator in the next), then time ``steps`` steps.

**Data × pipeline parallelism** (``dp`` > 1): the ``dp · p`` ranks form a 2-D device mesh
``(dp, pp)`` (global rank ``d · p + i`` is pipeline rank ``i`` of replica ``d``); each replica runs
the whole pipeline on its share of the batch (microbatches ``d·m … d·m + m − 1`` of the ``dp · m``
in the batch), and after every step each gradient is averaged over the replicas with an
``all_reduce`` on the ``dp`` group (as DDP does). The reference is the non-pipelined model on the
whole batch, so the check covers the data-parallel reduction too. Each rank
writes ``rank<R>.json`` into the output folder; rank 0 gathers all of them into
``result.json`` (:func:`ctrlmem.runtime.launch.assemble`). A rank that fails or stops making
progress writes ``rank<R>.error.json`` naming the pass it was in, then exits non-zero.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ctrlmem.util.fileio import atomic_write
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.runtime.adapter import P2PAudit, Pipeline, check_torch_version
from ctrlmem.runtime.measure import AllocatorPeak, SavedTensorMeter
from ctrlmem.runtime.offload import HostLedger, OffloadForward
from ctrlmem.runtime.models import FullModel, ModelConfig, build_stages, loss_fn, make_batch
from ctrlmem.runtime.launch import assemble

log = logging.getLogger("ctrlmem.runtime.worker")

_PERF_IS_MONOTONIC = time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation
"""``time.perf_counter`` reads the host's monotonic clock (Linux: ``CLOCK_MONOTONIC``, one clock for
every process of the host), so a step start read from it places ranks on one time line exactly."""


class RankWatchdog:
    """Which pass this rank is in, and a watchdog that ends the rank if it stops moving."""

    def __init__(self, rank: int, out: Path, hang_timeout: float) -> None:
        self.rank, self.out, self.hang_timeout = rank, out, hang_timeout
        self.phase = "start-up"
        self.job = ""
        self.label: str | None = None
        self.running = False
        self.last = time.monotonic()
        self.done = False
        self._lock = threading.Lock()

    def on_pass(self, label: str, running: bool) -> None:
        with self._lock:
            self.label, self.running, self.last = label, running, time.monotonic()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase, self.label, self.running, self.last = phase, None, False, time.monotonic()

    def where(self) -> str:
        if self.label is None:
            return f"{self.job}{self.phase} (before its first pass)"
        if self.running:
            return f"{self.job}{self.phase}, in pass {self.label}"
        return f"{self.job}{self.phase}, after pass {self.label} (waiting for communication)"

    def fail(self, reason: str, detail: str = "") -> None:
        record = {"rank": self.rank, "job": self.job.rstrip(": "), "phase": self.phase, "pass": self.label,
                  "in_pass": self.running, "time": time.time(), "where": self.where(),
                  "reason": reason, "detail": detail[-4000:]}
        try:  # atomically: a reader sees the whole record or none, never a 0-byte file
            atomic_write(self.out / f"rank{self.rank}.error.json", json.dumps(record, indent=2))
        except OSError as exc:  # a full disk: the launcher reports it from the free space it finds
            log.error("rank %d could not record its failure: %s", self.rank, exc)
        log.error("rank %d failed in %s: %s", self.rank, self.where(), reason)

    def start_watchdog(self) -> None:
        # A rank waiting for communication gives a rank stuck inside a pass a head start, so the
        # root cause reports first (torchrun stops the other ranks once one exits).
        grace = max(5.0, 0.5 * self.hang_timeout)

        def watch() -> None:
            while not self.done:
                time.sleep(0.5)
                limit = self.hang_timeout if self.running else self.hang_timeout + grace
                idle = time.monotonic() - self.last
                if not self.done and idle > limit:
                    self.fail(f"no progress for {idle:.0f} s (hang; limit {self.hang_timeout:g} s)")
                    os._exit(3)

        threading.Thread(target=watch, daemon=True, name="ctrlmem-watchdog").start()


def step_trace(records, step: int, t0: float, t0_clock: float, step_s: float) -> dict:
    """One timed step's passes on this rank as intervals in seconds from the step's start ``t0``
    (``time.perf_counter()`` just after the barrier that opens the step). ``start_clock`` is that
    moment on the host's monotonic clock, which every rank of one host shares: the launcher uses it
    to put the ranks of one host on one time line (:func:`ctrlmem.runtime.launch.measured_trace`)."""
    return {"step": step, "host": socket.gethostname(), "start_clock": t0_clock, "step_s": step_s,
            "passes": [{"op": r.op, "stage": r.stage, "microbatch": r.microbatch, "start_s": r.start - t0,
                        "end_s": r.start - t0 + r.wall_s} for r in records]}


def _probe_stage(mod, cfg: ModelConfig, is_first: bool, is_last: bool, device,
                 recompute: str | None = None) -> tuple[int, int, int]:
    """Bytes one microbatch's F of this stage stores, how many of them wait for W after B, and
    what a forward recomputed in ``recompute`` mode stores until its backward (the first
    otherwise)."""
    with mod.recomputing(None):
        act, kept = _probe_once(mod, cfg, is_first, is_last, device)
    if recompute is None:
        return act, kept, act
    with mod.recomputing(recompute):
        return act, kept, _probe_once(mod, cfg, is_first, is_last, device)[0]


def _probe_once(mod, cfg: ModelConfig, is_first: bool, is_last: bool, device,
                offload_bytes: float | None = None) -> tuple[int, ...]:
    """Bytes one microbatch's F of this stage stores, and how many of them wait for W after B;
    with ``offload_bytes``, the forward offloads that many (:class:`OffloadForward`) and the
    answer is ``(resident, resident kept for W, on the host, on the host kept for W)``."""
    meter = SavedTensorMeter().exclude(mod.parameters())
    ledger = HostLedger()
    offload = (OffloadForward(offload_bytes, ledger, meter, exclude=mod.parameters())
               if offload_bytes is not None else contextlib.nullcontext())
    mod.stash.meter, mod.stash.active = meter, True
    b, s, h = cfg.microbatch_size, cfg.seq_len, cfg.hidden
    g = torch.Generator().manual_seed(1)
    if is_first:
        x = torch.randint(0, cfg.vocab, (b, s), generator=g).to(device)
    else:
        x = torch.randn((b, s, h), generator=g).to(device=device, dtype=cfg.torch_dtype).requires_grad_()
    with meter:
        with offload:  # the stage's forward only: a run computes the loss outside it
            out = mod(x)
        if is_last:
            out = loss_fn(out, torch.randint(0, cfg.vocab, (b, s), generator=g).to(device))
    act, host = meter.current, ledger.current
    grad = None if is_last else torch.randn(out.shape, generator=g).to(device=device, dtype=out.dtype)
    torch.autograd.backward(out, grad)
    del out
    kept, host_kept = meter.current, ledger.current
    mod.stash.take()()
    mod.stash.meter = None
    mod.zero_grad(set_to_none=True)
    return (act, kept) if offload_bytes is None else (act, kept, host, host_kept)


def run(config: dict | list[dict]) -> None:
    """Run one job (a worker config) or several in a row on the same process group (same ``p``
    and backend): several jobs share one launch, which saves the start-up of every process."""
    jobs = config if isinstance(config, list) else [config]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    first = jobs[0]
    out = Path(first["out"])
    out.mkdir(parents=True, exist_ok=True)
    progress = RankWatchdog(rank, out, float(first["hang_timeout_s"]))
    progress.start_watchdog()
    audit = P2PAudit() if any(job.get("audit_p2p") for job in jobs) else None
    try:
        check_torch_version()
        if audit is not None:
            audit.__enter__()
        device = _init(first, rank, progress)
        for job in jobs:
            progress.out = Path(job["out"])
            progress.out.mkdir(parents=True, exist_ok=True)
            _run(job, rank, world, progress.out, progress, device, audit)
        dist.destroy_process_group()
    except BaseException as exc:
        progress.fail(f"{type(exc).__name__}: {exc}".splitlines()[0], traceback.format_exc())
        progress.done = True
        raise
    progress.done = True


def _init(config: dict, rank: int, progress: RankWatchdog) -> torch.device:
    threads = int(config.get("threads_per_rank", 1))
    torch.set_num_threads(threads)
    if config.get("pin_cores") and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[(int(os.environ.get("LOCAL_RANK", rank)) * threads + i) % len(cpus)]
                                 for i in range(threads)})
    backend = config["backend"]
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", local + 1))
        visible = torch.cuda.device_count()
        if local_world > visible:
            raise RuntimeError(
                f"backend nccl runs one rank per GPU, but this node starts {local_world} ranks and sees "
                f"{visible} GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                f"start at most {visible} ranks per node (torchrun --nproc-per-node, sbatch --gpus-per-node)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    progress.set_phase("init_process_group")
    dist.init_process_group(backend, timeout=timedelta(seconds=float(config["comm_timeout_s"])))
    return device


def _groups(dp: int, pp: int, device: torch.device):
    """``(pp_group, dp_group)`` of this rank on a ``(dp, pp)`` device mesh; ``(None, None)``
    (the world group, no reduction) when ``dp == 1``."""
    if dp == 1:
        return None, None
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415 - torch takes seconds to import; only real runs need it

    mesh = init_device_mesh(device.type, (dp, pp), mesh_dim_names=("dp", "pp"))
    return mesh.get_group("pp"), mesh.get_group("dp")


def _run(config: dict, rank: int, world: int, out: Path, progress: RankWatchdog, device: torch.device,
         audit: P2PAudit | None = None) -> None:
    schedule = Schedule.from_text(config["schedule_text"])
    dp = int(config.get("dp", 1))
    P = schedule.num_devices
    if P * dp != world:
        raise ValueError(f"schedule has {P} devices x dp={dp} = {P * dp} ranks but torchrun started {world}")
    pp_rank, dp_rank = rank % P, rank // P
    progress.job = f"{schedule.name} p={P} m={schedule.num_microbatches}{f' dp={dp}' if dp > 1 else ''}: "
    pp_group, dp_group = _groups(dp, P, device)
    cfg = ModelConfig(**config["model"])
    seed = int(config.get("seed", 0))
    S, m = schedule.num_stages, schedule.num_microbatches
    mine = list(schedule.placement.stages_of(pp_rank))
    modules = build_stages(cfg, S, stages=mine, seed=seed, device=device)

    progress.set_phase("probe")
    mode = schedule.recompute_mode if schedule.recomputes else None
    probe = {s: _probe_stage(modules[s], cfg, s == 0, s == S - 1, device, mode) for s in mine}

    # each forward gets its own levers (a forward is recomputed or offloaded, not both): the
    # forwards of this rank with an R run checkpointed (ctrlmem.runtime.recompute), the others
    # not; of an offloaded one (ctrlmem.runtime.offload), φ of what it stores goes to host memory
    # until its backward
    recomputed = {(ps.stage, ps.microbatch) for ps in schedule.device_passes[pp_rank] if ps.op is Op.R}
    offloads = {(c.stage, c.microbatch): c.fraction for c in (schedule.copies[pp_rank] if schedule.copies else ())
                if c.kind == "O"}
    resident = {s: probe[s][0] for s in mine}
    offload_probe = {(s, f): _probe_once(modules[s], cfg, s == 0, s == S - 1, device, f * resident[s])
                     for s, f in sorted({(st, f) for (st, _), f in offloads.items()})}
    ledger = HostLedger()
    active_meter: list = [None]  # the step-1 meter while it runs: kept tensors are counted by it

    def forward_context(s: int):
        params = list(modules[s].parameters())

        def context(mb: int):
            f = offloads.get((s, mb))
            if f is not None:
                return OffloadForward(f * resident[s], ledger, active_meter[0], exclude=params)
            return modules[s].recomputing(mode if (s, mb) in recomputed else None)
        return context

    forward_contexts = {s: forward_context(s) for s in mine} if recomputed or offloads else {}

    b, sl, h = cfg.microbatch_size, cfg.seq_len, cfg.hidden

    def io_shapes(s: int):
        x = (torch.zeros((b, sl), dtype=torch.long, device=device) if s == 0
             else torch.zeros((b, sl, h), dtype=cfg.torch_dtype, device=device, requires_grad=True))
        y = torch.zeros((b, sl, cfg.vocab if s == S - 1 else h), dtype=cfg.torch_dtype, device=device,
                        requires_grad=True)
        return x, y

    fault = tuple(config["fault"]) if config.get("fault") else None
    fidelity = bool(config.get("memory_fidelity", True))
    for mod in modules.values():
        mod.stash.active = fidelity  # without fidelity: plain autograd, torch's own split backward
    progress.set_phase("pipeline set-up")
    pipe = Pipeline.create(schedule, pp_rank, modules, loss_fn, io_shapes, device, group=pp_group,
                           dw_builders={s: modules[s].stash.take for s in mine} if fidelity else None,
                           release_sends=fidelity, forward_contexts=forward_contexts,
                           on_pass=progress.on_pass, fault=fault)
    all_tokens, all_targets = make_batch(cfg, m * dp, seed)  # the whole batch: dp replicas x m microbatches
    share = slice(dp_rank * m * cfg.microbatch_size, (dp_rank + 1) * m * cfg.microbatch_size)
    tokens, targets = all_tokens[share].to(device), all_targets[share].to(device)
    params = [p for s in mine for p in modules[s].parameters()]

    def reduce_grads() -> None:
        """Average every gradient over the data-parallel replicas (DDP's all-reduce, after the step)."""
        if dp_group is None:
            return
        works = [dist.all_reduce(p.grad, group=dp_group, async_op=True) for p in params]
        for w in works:
            w.wait()
        for p in params:
            p.grad.div_(dp)

    def train_step():
        losses = pipe.step(tokens, targets)
        reduce_grads()
        return losses

    def zero_grads() -> None:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    # Step 1: exactness against the reference, with autograd saved tensors counted.
    progress.set_phase("step 1 (gradient check, saved-tensor memory)")
    zero_grads()
    meter = SavedTensorMeter().exclude(params)
    for s in mine:
        modules[s].stash.meter = meter
    ledger.reset_peak()
    copied_before = ledger.total
    active_meter[0] = meter
    for s in mine:
        modules[s].recomputation.reset()
    with meter:
        losses = train_step()
    active_meter[0] = None
    regions = sum(modules[s].recomputation.regions for s in mine)
    recomputes = sum(modules[s].recomputation.recomputes for s in mine)
    host_peak, host_copied = ledger.peak, ledger.total - copied_before
    for s in mine:
        modules[s].stash.meter = None
    pipe_grads = {(s, n): p.grad.detach().clone() for s in mine for n, p in modules[s].named_parameters()}
    pipe_loss = float(torch.stack([loss.detach().float() for loss in losses]).mean()) if losses else None

    progress.set_phase("reference step")
    ref = FullModel(cfg, S, seed=seed).to(device)
    ref_loss = loss_fn(ref(all_tokens.to(device)), all_targets.to(device))
    ref_loss.backward()
    grad_diff, grad_scale = 0.0, 0.0
    for s in mine:
        for n, p in ref.stages[s].named_parameters():
            gr = p.grad.float()
            grad_scale = max(grad_scale, float(gr.abs().max()))
            grad_diff = max(grad_diff, float((pipe_grads[(s, n)].float() - gr).abs().max()))
    ref_loss_value = float(ref_loss)
    del ref, ref_loss, pipe_grads

    # Step 2: allocator peak (profiler on CPU perturbs timing, so it gets its own step).
    progress.set_phase("step 2 (allocator memory)")
    zero_grads()
    dist.barrier()
    for st in pipe.stages:
        st.peak_inflight_grad_bytes = 0
    with AllocatorPeak(device) as alloc:
        train_step()
    inflight = sum(st.peak_inflight_grad_bytes for st in pipe.stages)

    # Steps 3..: timing.
    step_times, records, trace = [], [], None
    for i in range(int(config["steps"])):
        progress.set_phase(f"timed step {i + 1}")
        zero_grads()
        dist.barrier()
        t0 = time.perf_counter()
        t0_clock = t0 if _PERF_IS_MONOTONIC else time.monotonic()
        train_step()
        dist.barrier()
        step_times.append(time.perf_counter() - t0)
        records.extend({"step": i, "op": r.op, "stage": r.stage, "microbatch": r.microbatch,
                        "cpu_s": r.cpu_s, "wall_s": r.wall_s} for r in pipe.records)
        trace = step_trace(pipe.records, i, t0, t0_clock, step_times[-1])  # the last timed step's

    mine_result = {
        "rank": rank,
        "pp_rank": pp_rank,
        "dp_rank": dp_rank,
        "stages": mine,
        "grad_max_abs_diff": grad_diff,
        "grad_scale": grad_scale,
        "loss": pipe_loss,
        "ref_loss": ref_loss_value,
        "peak_saved_bytes": meter.peak,
        "peak_alloc_bytes": alloc.peak,
        "peak_inflight_grad_bytes": inflight,
        "probe": {str(s): {"activation_bytes": a, "kept_for_w_bytes": k, "recomputed_bytes": r}
                  for s, (a, k, r) in probe.items()},
        "offload_probe": [{"stage": s, "fraction": f, "resident_bytes": v[0], "resident_kept_for_w_bytes": v[1],
                           "host_bytes": v[2], "host_kept_for_w_bytes": v[3]} for (s, f), v in offload_probe.items()],
        "recompute_regions": regions,
        "recomputes": recomputes,
        "peak_host_bytes": host_peak,
        "offloaded_bytes": host_copied,
        "step_times_s": step_times,
        "records": records,
        "trace": trace,
        "p2p_audit": audit.summary() if audit is not None else None,
    }
    atomic_write(out / f"rank{rank}.json", json.dumps(mine_result))
    progress.set_phase("gather")
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine_result)
    if rank == 0:

        result = assemble(config, schedule, gathered)
        atomic_write(out / "result.json", json.dumps(result, indent=2))
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ctrlmem.runtime.worker CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s rank%(process)d %(name)s: %(message)s")
    config = json.loads(Path(argv[0]).read_text())
    run(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
