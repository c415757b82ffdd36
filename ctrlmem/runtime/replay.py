"""Rank replay: one device's pass order in one process, with real kernels.

Runs the passes a schedule gives device ``d`` on that device's stages of the model (its real
layers, real sizes), with stand-in tensors for what would arrive from neighbours (random
activations for a stage's input, random output gradients for its backward). No process group, no
other ranks: this measures one device's pass costs and peak activation memory at paper scale on
one machine or one GPU (e.g. one device's share of the 9.6B model at the paper's microbatch
size), for any schedule. Memory accounting is the same as in real runs
(:mod:`ctrlmem.runtime.measure`): autograd saved tensors plus the deferred-W stash, and the
allocator peak; ``B`` runs a full autograd backward with deferred linear weights, ``W`` applies
them, as in :mod:`ctrlmem.runtime.adapter`. Weights are created directly on the target device
(``build_stages(init="device")``).

:func:`run_replay` is ``ctrlmem replay``: several schedules and devices of one model, written
to ``DIR/replay.json`` (``what``, ``date``, ``gpu``, ``torch``, ``models`` and one row per
replayed device: ``model``, ``p``, ``m``, ``schedule``, ``device``, ``stages``,
``peak_saved_bytes``, ``peak_alloc_bytes``, ``theory_peak_bytes``, ``pass_times_s``
(per stage, per pass kind: median / min / max / spread / iqr / n in seconds), ``wall_s``,
``elapsed_s``, ``tag``). Rerunning into the same folder merges: a row with the same model, p,
m, microbatch size, schedule, device and tag is replaced, the others are kept.
"""

from __future__ import annotations

import json
import os
import logging
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ctrlmem.util.fileio import atomic_write, make_output_folder
from ctrlmem.model.ir import Op, Schedule
from ctrlmem.runtime.measure import AllocatorPeak, SavedTensorMeter, sample_stats, theory_peak_bytes
from ctrlmem.runtime.models import ModelConfig, build_stages, loss_fn
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.runtime.models import get_preset, layers_per_stage

__all__ = ["ReplayResult", "replay_device", "probe_stages", "theory_per_device", "run_replay", "REPLAY_FILE"]

REPLAY_FILE = "replay.json"

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
                  seed: int = 0, measure_allocator: bool = True, init: str = "device") -> ReplayResult:
    """Replay ``device_index``'s passes of ``schedule`` on ``cfg`` (see module doc); ``init`` as
    in :func:`~ctrlmem.runtime.models.build_stages` (default: weights made on ``device``)."""
    device = torch.device(device)
    S = schedule.num_stages
    if not 0 <= device_index < schedule.num_devices:
        raise ValueError(f"device_index must be in 0..{schedule.num_devices - 1}, got {device_index}")
    mine = list(schedule.placement.stages_of(device_index))
    modules = build_stages(cfg, S, stages=mine, seed=seed, device=device, init=init)
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
        pass_times.setdefault(str(s), {})[op] = sample_stats(xs)
    return ReplayResult(schedule.name, device_index, mine, meter.peak,
                        alloc.peak if measure_allocator else 0, theory, pass_times, wall)


class _Null:
    peak = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _parse_list(name: str, text: str | list, cast=str) -> list:
    items = text if isinstance(text, list) else [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{name} is empty; give a comma-separated list")
    try:
        return [cast(x) for x in items]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a comma-separated list of {cast.__name__}, got {text!r}") from None


def _hardware(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.total_memory // 2**20} MiB)"
    return f"none: CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run_replay(model: str, p: int, m: int, schedules, devices, device: str = "cuda", out: str | os.PathLike = ".",
               num_layers: int | None = None, microbatch_size: int | None = None, dtype: str | None = None,
               tag: str = "", seed: int = 0, progress=None) -> dict:
    """Replay ``devices`` of every schedule in ``schedules`` for ``model`` at ``p`` devices and
    ``m`` microbatches on ``device``; merge the rows into ``out/replay.json`` (see module doc)
    and return the whole file's content. ``ValueError`` names a bad argument and its fix."""

    schedules = _parse_list("schedules", schedules)
    devices = _parse_list("devices", devices, int)
    unknown = [n for n in schedules if n not in SCHEDULES]
    if unknown:
        raise ValueError(f"unknown schedule(s) {unknown}; valid: {', '.join(SCHEDULES)}")
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be a positive integer, got {p!r}")
    bad = [d for d in devices if not 0 <= d < p]
    if bad:
        raise ValueError(f"devices {bad} are outside the pipeline (0..{p - 1}); pick devices below p={p}")
    if m < p:
        raise ValueError(f"m={m} is too small for p={p}; use m >= p (e.g. -m {2 * p})")
    overrides = {k: v for k, v in (("num_layers", num_layers), ("microbatch_size", microbatch_size),
                                    ("dtype", dtype)) if v is not None}
    cfg = get_preset(model, **overrides)
    built = {}
    for name in schedules:
        sched = build(name, p, m)
        try:
            layers_per_stage(cfg.num_layers, sched.num_stages)
        except ValueError as exc:
            raise ValueError(f"model {model!r} on {name} ({sched.num_stages} stages): {exc}; "
                             f"change it with --layers") from None
        built[name] = sched
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for but torch sees no GPU; use --device cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)
    out = Path(out)
    make_output_folder(out)  # git-ignored when this call creates it
    path = out / REPLAY_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    rows = list(data.get("rows", []))
    kind = "CUDA events" if dev.type == "cuda" else "thread CPU time"
    data.update({
        "what": (f"Rank replay (ctrlmem replay, ctrlmem.runtime.replay.replay_device): one pipeline device's "
                 f"passes in one process on {dev.type} with its real stage shapes, weights created on the "
                 f"device at torch's default init. Per replayed device: peak autograd-saved bytes, allocator "
                 f"peak, the schedule's theory peak, and per-stage pass times ({kind})."),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "gpu": _hardware(dev),
        "torch": torch.__version__,
        "device": dev.type,
        "pass_time_kind": kind,
    })
    models = dict(data.get("models", {}))
    models[cfg.name] = (f"p={p}, {cfg.num_layers} layers, h={cfg.hidden}, mb {cfg.microbatch_size}"
                        + (f", {cfg.dtype}" if cfg.dtype != "bfloat16" else ""))
    data["models"] = models
    def key(x):
        return (x.get("model"), x.get("p"), x.get("m"), x.get("microbatch_size", cfg.microbatch_size),
                x.get("schedule"), x.get("device"), x.get("tag", ""))

    for sched in built.values():
        for d in devices:
            t0 = time.perf_counter()
            r = replay_device(sched, d, cfg, device=dev, seed=seed)
            row = {"model": cfg.name, "p": p, "m": m, "microbatch_size": cfg.microbatch_size, **r.to_dict(),
                   "elapsed_s": time.perf_counter() - t0, "tag": tag}
            rows = [x for x in rows if key(x) != key(row)] + [row]
            data["rows"] = rows
            atomic_write(path, json.dumps(data, indent=1))  # every finished row is on disk before the next starts
            if progress is not None:
                progress(row)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return data
