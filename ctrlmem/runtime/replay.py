"""Rank replay: one device's pass order in one process, with real kernels.

Runs the passes a schedule gives device ``d`` on that device's stages of the model (its real
layers, real sizes), with stand-in tensors for what would arrive from neighbours (random
activations for a stage's input, random output gradients for its backward). No process group, no
other ranks: this measures one device's pass costs and peak activation memory at paper scale on
one machine or one GPU (e.g. one device's share of the 9.6B model at the paper's microbatch
size), for any schedule. Memory accounting is the same as in real runs
(:mod:`ctrlmem.runtime.measure`): autograd saved tensors plus the deferred-W stash, and the
allocator peak; ``B`` runs a full autograd backward with deferred linear weights, ``W`` applies
them, as in :mod:`ctrlmem.runtime.adapter`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..ir import Op, Schedule
from .measure import AllocatorPeak, SavedTensorMeter, summarize, theory_peak_bytes
from .models import ModelConfig, build_stages, loss_fn

__all__ = ["ReplayResult", "replay_device", "probe_stages", "theory_per_device"]

log = logging.getLogger(__name__)


@dataclass
class ReplayResult:
    """What one replayed device measured."""

    schedule: str
    device: int
    stages: list[int]
    peak_saved_bytes: int
    peak_alloc_bytes: int
    theory_peak_bytes: float
    pass_times_s: dict[str, dict[str, dict[str, float]]]
    wall_s: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _stand_in_input(cfg: ModelConfig, stage: int, device, gen: torch.Generator) -> torch.Tensor:
    b, s, h = cfg.microbatch_size, cfg.seq_len, cfg.hidden
    if stage == 0:
        return torch.randint(0, cfg.vocab, (b, s), generator=gen).to(device)
    x = torch.randn((b, s, h), generator=gen).to(device=device, dtype=cfg.torch_dtype)
    return x.requires_grad_()


def probe_stages(cfg: ModelConfig, num_stages: int, stages: list[int], modules=None, device="cpu",
                 seed: int = 0) -> dict[int, tuple[int, int]]:
    """Per stage: bytes one microbatch's ``F`` stores, and how many of them wait for ``W``."""
    modules = modules or build_stages(cfg, num_stages, stages=stages, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for s in stages:
        mod = modules[s]
        meter = SavedTensorMeter().exclude(mod.parameters())
        mod.stash.meter, mod.stash.active = meter, True
        x = _stand_in_input(cfg, s, device, gen)
        with meter:
            y = mod(x)
            if s == num_stages - 1:
                y = loss_fn(y, torch.randint(0, cfg.vocab, (cfg.microbatch_size, cfg.seq_len), generator=gen).to(device))
        act = meter.current
        grad = None if s == num_stages - 1 else torch.randn(y.shape, generator=gen).to(device=device, dtype=y.dtype)
        torch.autograd.backward(y, grad)
        del y, x
        kept = meter.current
        mod.stash.take()()
        mod.stash.meter = None
        mod.zero_grad(set_to_none=True)
        out[s] = (act, kept)
    return out


def theory_per_device(schedule: Schedule, cfg: ModelConfig, device="cpu", seed: int = 0) -> list[float]:
    """The schedule's theoretical peak activation bytes on every device for ``cfg`` (each stage
    probed once; builds every stage, so use it for models that fit in memory)."""
    S = schedule.num_stages
    probe = probe_stages(cfg, S, list(range(S)), device=device, seed=seed)
    return theory_peak_bytes(schedule, [probe[s][0] for s in range(S)], [probe[s][1] for s in range(S)])


def replay_device(schedule: Schedule, device_index: int, cfg: ModelConfig, device: str | torch.device = "cpu",
                  seed: int = 0, measure_allocator: bool = True) -> ReplayResult:
    """Replay ``device_index``'s passes of ``schedule`` on ``cfg`` (see module doc)."""
    device = torch.device(device)
    S = schedule.num_stages
    mine = list(schedule.placement.stages_of(device_index))
    modules = build_stages(cfg, S, stages=mine, seed=seed, device=device)
    probe = probe_stages(cfg, S, mine, modules, device, seed)
    act = [0.0] * S
    kept = [0.0] * S
    for s, (a, k) in probe.items():
        act[s], kept[s] = a, k
    theory = theory_peak_bytes(schedule, act, kept)[device_index]
    params = [p for m in modules.values() for p in m.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    gen = torch.Generator().manual_seed(seed + 2)
    b, sl = cfg.microbatch_size, cfg.seq_len
    stand_ins = {s: _stand_in_input(cfg, s, device, gen) for s in mine}
    targets = torch.randint(0, cfg.vocab, (b, sl), generator=gen).to(device)
    meter = SavedTensorMeter().exclude(params)
    for m in modules.values():
        m.stash.meter, m.stash.active = meter, True
    live: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    pending_w: dict[tuple[int, int], object] = {}
    times: dict[tuple[str, int], list[float]] = {}
    cuda = device.type == "cuda"

    def run_pass(ps) -> None:
        key = (ps.stage, ps.microbatch)
        mod = modules[ps.stage]
        if ps.op is Op.F:
            x = stand_ins[ps.stage]
            if ps.stage != 0:
                x = x.detach().clone().requires_grad_()  # a fresh received activation per microbatch
            y = mod(x)
            if ps.stage == S - 1:
                y = loss_fn(y, targets)
            live[key] = (y, x)
        elif ps.op in (Op.B, Op.BW):
            y, x = live.pop(key)
            grad = None if ps.stage == S - 1 else torch.ones_like(y)
            torch.autograd.backward(y, grad)
            del y, x
            w = mod.stash.take()
            if ps.op is Op.BW:
                w()
            else:
                pending_w[key] = w
        else:
            pending_w.pop(key)()

    t0 = time.perf_counter()
    with AllocatorPeak(device) if measure_allocator else _Null() as alloc, meter:
        for ps in schedule.device_passes[device_index]:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run_pass(ps)
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                c0 = time.thread_time()
                run_pass(ps)
                dt = time.thread_time() - c0
            times.setdefault((ps.op.value, ps.stage), []).append(dt)
    wall = time.perf_counter() - t0
    for m in modules.values():
        m.stash.meter = None
    pass_times: dict[str, dict[str, dict[str, float]]] = {}
    for (op, s), xs in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pass_times.setdefault(str(s), {})[op] = summarize(xs)
    return ReplayResult(schedule.name, device_index, mine, meter.peak,
                        alloc.peak if measure_allocator else 0, theory, pass_times, wall)


class _Null:
    peak = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None
