"""Activation offload on a real device, for ``scripts/gpu-check.sh`` (docs/theory.md §13).

* :func:`copy_bandwidth` measures the host link a copy of activations takes: device-to-host into
  pinned host memory and back, GB/s (CUDA events); on a CPU the same copies are host memcpys,
  labelled so (there is no host link to measure).
* :func:`offloaded_step` runs one training step of a model preset over ``m`` microbatches in
  V-Min's order of one device's first forwards (every forward before the first backward, the
  worst case for activation memory) twice: keeping the saved tensors on the device, and with
  every saved activation (the parameters stay) packed into host memory by
  :class:`ctrlmem.runtime.offload.OffloadForward` (``saved_tensors_hooks``, no budget) and
  reloaded at its backward. It reports the saved bytes that went to the host, the peak device
  memory of both (CUDA only), both step times, and whether the gradients are identical.
* :func:`predicted_v_min` turns the measured bandwidth and pass time into the copy cost of the
  schedule model and simulates V-Min with and without offload at that cost.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any

import torch

from ctrlmem.model.costs import Costs
from ctrlmem.model.simulate import simulate
from ctrlmem.runtime.models import FullModel, get_preset, loss_fn
from ctrlmem.runtime.offload import HostLedger, OffloadForward
from ctrlmem.schedules import build

__all__ = ["copy_bandwidth", "offloaded_step", "predicted_v_min"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def copy_bandwidth(device: str = "cuda", mib: int = 256, repeats: int = 5) -> dict[str, Any]:
    """Median GB/s of ``repeats`` copies of ``mib`` MiB device → host (pinned) and host → device."""
    if mib < 1 or repeats < 1:
        raise ValueError(f"mib and repeats must be >= 1, got {mib}, {repeats}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=dev)
    host = torch.empty(src.shape, dtype=torch.uint8, pin_memory=cuda)
    d2h = [_timed(lambda: host.copy_(src, non_blocking=cuda), dev) for _ in range(repeats)]
    h2d = [_timed(lambda: src.copy_(host, non_blocking=cuda), dev) for _ in range(repeats)]
    nbytes = src.numel()
    return {"device": str(dev), "mib": mib, "repeats": repeats,
            "d2h_gbs": nbytes / statistics.median(d2h) / 1e9, "h2d_gbs": nbytes / statistics.median(h2d) / 1e9,
            "how": "measured: pinned host memory, CUDA" if cuda else "measured: host memcpy (a CPU has no host link)"}


def _step(model: FullModel, batches, offload: bool, device: torch.device) -> tuple[float, int, int, list]:
    """(seconds, saved bytes sent to host, peak device bytes, gradients) of one step: every
    forward, then every backward in reverse order (the V-Min order's worst case on one device)."""
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ledger = HostLedger() if offload else None
    params = list(model.parameters())
    t0 = time.perf_counter()
    losses = []
    for tokens, targets in batches:
        hooks = OffloadForward(math.inf, ledger, exclude=params) if ledger is not None else contextlib.nullcontext()
        with hooks:
            losses.append(loss_fn(model(tokens), targets))
    for loss in reversed(losses):
        loss.backward()
    _sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return seconds, ledger.total if ledger else 0, peak, grads


def offloaded_step(model: str = "small", device: str = "cuda", microbatches: int = 4, seed: int = 0) -> dict[str, Any]:
    """One step with and without offloading every saved tensor (see the module doc)."""
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    dev = torch.device(device)
    cfg = get_preset(model)
    net = FullModel(cfg, 1, seed=seed).to(dev)
    gen = torch.Generator().manual_seed(seed)
    shape = (cfg.microbatch_size, cfg.seq_len)
    batches = [(torch.randint(cfg.vocab, shape, generator=gen).to(dev), torch.randint(cfg.vocab, shape, generator=gen)
                .to(dev)) for _ in range(microbatches)]
    _step(net, batches, False, dev)  # warm-up (kernels, allocator)
    t_keep, _, peak_keep, g_keep = _step(net, batches, False, dev)
    t_off, moved, peak_off, g_off = _step(net, batches, True, dev)
    exact = all(torch.equal(a, b) for a, b in zip(g_keep, g_off))
    return {"model": model, "device": str(dev), "microbatches": microbatches, "offloaded_bytes": moved,
            "step_s": t_keep, "offloaded_step_s": t_off, "peak_device_bytes": peak_keep,
            "offloaded_peak_device_bytes": peak_off, "grads_identical": exact,
            "forward_s": _forward_time(net, batches[0], dev)}


def _forward_time(net: FullModel, batch, device: torch.device, repeats: int = 3) -> float:
    """Median seconds of one microbatch's forward (no graph kept)."""
    with torch.no_grad():
        return statistics.median(_timed(lambda: net(batch[0]), device) for _ in range(repeats))


def predicted_v_min(step: dict[str, Any], bandwidth: dict[str, Any], p: int = 4, m: int = 8) -> dict[str, Any]:
    """V-Min at ``p``, ``m`` simulated with F = B = W and the copy of one stage activation at the
    measured ratio of its copy time to its forward (``step``'s bytes per microbatch over the
    device-to-host bandwidth, against ``step``'s forward time), with and without offload."""
    per_mb = step["offloaded_bytes"] / step["microbatches"]
    copy_s = per_mb / (bandwidth["d2h_gbs"] * 1e9)
    ratio = copy_s / step["forward_s"] if step["forward_s"] > 0 else float("inf")
    costs = Costs(1, 1, 1, offload=ratio)
    plain = simulate(build("v-min", p, m), costs)
    off = simulate(build("v-min", p, m, costs=costs, offload=1.0), costs)
    return {"p": p, "m": m, "copy_over_forward": ratio, "makespan": plain.makespan, "peak": plain.max_peak_memory,
            "offloaded_makespan": off.makespan, "offloaded_peak": off.max_peak_memory,
            "how": "predicted: the schedule model with the measured copy-to-forward ratio"}
