"""``cm.plan``: the fastest pipeline configuration that fits a cluster, in GB and seconds.

For a model, ``N`` GPUs of ``G`` GB, a global batch and a cost source, the planner enumerates
every ``DP × TP × PP = N`` factorization, every microbatch size that divides the batch, and every
schedule asked for (by default 1F1B, ZB-H1, V-Min, V-Half, V-ZB, and ``v-shape`` / ``zb`` at the
activation budget the remaining memory allows), and predicts for each configuration:

* **memory per GPU** on the device that needs most: parameters, gradients and optimizer states
  (:mod:`ctrlmem.planner.model`), the schedule's activation peak simulated with every stage's
  activation bytes, and the measured allocator margin (:class:`~ctrlmem.planner.sources.AllocatorMargin`);
* **time per step**: the schedule simulated exactly (``cm.simulate``) with per-stage pass costs
  (:mod:`ctrlmem.planner.sources`), plus the data-parallel gradient exchange, not overlapped;
* **throughput**: samples/s, tokens/s and MFU.

It returns a pandas DataFrame ranked by predicted samples/s; rows that do not fit are kept and
marked, and ``df.attrs`` holds the settings, every assumption in words, notes on the answer and
how long the search took.

**Few searches.** Cost-adapted schedules (``v-min`` … with ``costs``, ``v-shape`` / ``zb`` with a
budget) are searches. The planner (1) prunes a configuration whose memory cannot fit before
building its cost-adapted schedule: the schedule's unit-cost pattern has the same memory level,
so its simulated peak is the estimate (a row within :data:`ESTIMATE_TOLERANCE` of the GPU is
built anyway); (2) unless ``exhaustive``, skips a configuration whose no-bubble bound on
throughput is below the best the same schedule already reached (marked ``bounded``), trying the
most promising first; (3) caches every build by (schedule, p, m, costs, budget) for the process,
so a second plan (another GB, another batch) reuses them. Auto budgets are rounded down to whole
stage activations, the granularity of any schedule's peak, so nearby budgets share a build.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ctrlmem.model import paper
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.levers import with_offload, with_recompute
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.model.simulate import simulate
from ctrlmem.planner import arch
from ctrlmem.planner import split as split_mod
from ctrlmem.planner.model import (BYTES_GRAD, BYTES_OPTIMIZER, BYTES_WEIGHT, ModelSpec, StageBytes, default_global_batch,
                                   layer_bytes, model_spec, stage_bytes)
from ctrlmem.planner.sources import AllocatorMargin, CostSource, cost_source
from ctrlmem.planner.sources import cost_source as _cs
import numpy as np
from ctrlmem.util.checks import flag, integer, number, short_repr

__all__ = ["plan", "DEFAULT_SCHEDULES", "METHOD_LABELS", "ScheduleChoice", "parse_schedules", "Planner",
           "row_schedule", "row_memory", "cache_info", "clear_cache", "ESTIMATE_TOLERANCE", "COLUMNS", "insights"]

log = logging.getLogger(__name__)

DEFAULT_SCHEDULES = ("1f1b", "zb-h1", "v-min", "v-half", "v-zb", "v-shape", "zb")
"""What :func:`plan` compares by default: ``v-shape`` and ``zb`` without a budget take the one the
remaining memory allows."""

METHOD_LABELS = {"1f1b": "1F1B", "zb-h1": "ZB-H1", "zb-h2": "ZB-H2", "zb-v": "ZB-V", "v-min": "V-Min",
                 "v-half": "V-Half", "v-zb": "V-ZB", "1f1b-v": "1F1B-V", "gpipe": "GPipe",
                 "interleaved-1f1b": "Interleaved 1F1B", "v-shape": "V-shape", "zb": "ZB", "dualpipe-v": "DualPipeV",
                 "looped-bfs": "Looped BFS", "1f1b-r": "1F1B-R"}

ESTIMATE_TOLERANCE = 0.05
"""A cost-adapted schedule is built when its unit-cost pattern's memory is within this fraction
above the GPU's (the adapted schedule keeps the pattern's level in units of a stage, but stages of
unequal size can move its peak by a few per cent)."""

MAX_AUTO_LIMIT = 2.0
"""Largest budget (fraction of 1F1B's peak) an auto-budgeted ``v-shape`` / ``zb`` gets."""

RECOMPUTE_BUDGET_STEP = 8
"""With recomputation as ``R`` passes an auto budget is counted in ``1/RECOMPUTE_BUDGET_STEP`` of
the largest stage's activation (a peak is then no whole number of them: forwards in flight keep
a share), rounded down so that nearby budgets still share a build."""

COLUMNS = ["rank", "status", "fits", "schedule", "method", "placement", "dp", "tp", "pp", "ep", "recompute",
           "offload", "microbatch_size", "m", "dist_opt", "memory_limit", "layer_split", "samples_per_s", "tokens_per_s", "mfu", "step_s", "pipeline_s", "dp_sync_s",
           "bubble_rate", "a2a_s", "p2p_gb", "a2a_hidden_samples_per_s", "params_gb", "expert_params_gb",
           "grads_gb", "optimizer_gb", "activation_gb", "recompute_saved_gb", "offload_saved_gb", "lever_s", "recv_gb", "margin_gb", "reserve_gb", "total_gb", "gpu_memory_gb", "free_gb", "device", "memory_how", "upper_bound_samples_per_s", "reason"]
"""The DataFrame's columns: ``total_gb`` = params + grads + optimizer + activation + margin +
reserve (+ ``recv_gb``, torch's receive buffers) on ``device`` (the device that needs most;
``params_gb`` includes ``expert_params_gb``; ``activation_gb`` is with the row's levers
(``recompute``, ``offload``: the fraction of each forward's activation copied to host), and
``activation_gb + recompute_saved_gb + offload_saved_gb`` is the same schedule's activation
without them, ``lever_s`` the time they add to the pipeline; ``recv_gb`` is added only without a measured
allocator margin, which already holds them); ``fits`` is ``total_gb <= gpu_memory_gb``;
``status``: ``ok`` (simulated, fits), ``does not fit``, ``bounded`` (fits, not simulated: its
no-bubble bound is below its schedule's best), ``m < pp``, ``too many stages``."""


# ---- schedules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleChoice:
    """One schedule the planner compares: a registered ``name``, and for budgeted generators a
    fixed ``limit`` (fraction of 1F1B's peak) or ``None`` for the budget memory allows."""

    name: str
    limit: float | None = None

    @property
    def budgeted(self) -> bool:
        return SCHEDULES[self.name].memory_limit

    @property
    def auto(self) -> bool:
        return self.budgeted and self.limit is None

    @property
    def label(self) -> str:
        if self.limit is not None:
            return f"{self.name}@{self.limit:g}"
        return self.name

    @property
    def method(self) -> str:
        base = METHOD_LABELS.get(self.name, self.name)
        if self.name == "zb" and self.limit == 1.0:
            return "ZB-1P"
        if self.name == "zb" and self.limit == 2.0:
            return "ZB-2P"
        if self.limit is not None:
            return f"{base} @ {self.limit:g}"
        return f"{base} (memory-fit budget)" if self.auto else base


def parse_schedules(schedules: Iterable[str] | str) -> list[ScheduleChoice]:
    """``["1f1b", "zb@1.0", "v-shape"]`` (or one comma-separated string) -> choices; ``NAME@X``
    fixes a budgeted generator's memory limit, a bare budgeted name takes the budget memory allows.
    ``ValueError`` names a bad entry and the valid names."""
    items = [s.strip() for s in schedules.split(",")] if isinstance(schedules, str) else [str(s).strip()
                                                                                         for s in schedules]
    items = [s for s in items if s]
    if not items:
        raise ValueError("no schedule to plan; give at least one (e.g. 1f1b,v-half)")
    out = []
    for item in items:
        name, _, limit = item.partition("@")
        if name == "dualpipe":
            raise ValueError("dualpipe holds two copies of the model (twice the parameters, gradients and optimizer "
                             "states per GPU), which the planner's memory model does not count; plan dualpipe-v, "
                             "its one-copy V-shape form")
        if name not in SCHEDULES or name == "optimal":
            valid = ", ".join(n for n in SCHEDULES if n != "optimal")
            raise ValueError(f"unknown schedule {name!r} in the plan; valid names: {valid}")
        spec = SCHEDULES[name]
        if limit:
            if not spec.memory_limit:
                raise ValueError(f"{item!r}: {name} has a fixed memory footprint and takes no @LIMIT; budgeted: "
                                 + ", ".join(n for n, s in SCHEDULES.items() if s.memory_limit and n != "optimal"))
            if limit.lower() == "auto":
                out.append(ScheduleChoice(name))
                continue
            try:
                x = float(limit)
            except ValueError:
                raise ValueError(f"{item!r}: the limit after @ must be a number (fraction of 1F1B's peak) or "
                                 "'auto'") from None
            if not (x > 0 and math.isfinite(x)):
                raise ValueError(f"{item!r}: the limit must be a positive fraction of 1F1B's peak")
            out.append(ScheduleChoice(name, x))
        else:
            out.append(ScheduleChoice(name))
    return list(dict.fromkeys(out))


_PLACEMENTS: dict[str, tuple[str, int, bool]] = {}


def _shape_of(name: str) -> tuple[str, int, bool]:
    if name not in _PLACEMENTS:
        kw = {"memory_limit": 1.0} if SCHEDULES[name].memory_limit else {}
        s = build(name, 2, 4, **kw)
        _PLACEMENTS[name] = (s.placement.kind, s.placement.num_chunks, s.split_backward)
    return _PLACEMENTS[name]


def placement_of(name: str) -> tuple[str, int]:
    """(placement kind, stages per device) of a registered schedule, from a small build."""
    kind, v, _ = _shape_of(name)
    return kind, v


def split_backward(name: str) -> bool:
    """Whether a registered schedule runs ``B`` and ``W`` as separate passes."""
    return _shape_of(name)[2]


RECOMPUTE = ("none", "selective", "full")
"""The recomputation levers (Korthikanti et al. 2022): keep every activation; recompute the
attention core (drop its ``s × s`` tensors); recompute every layer from its input."""


# ---- the build cache ---------------------------------------------------------------------------

_BUILDS: "OrderedDict[tuple, Any]" = OrderedDict()
_SIMS: "OrderedDict[tuple, tuple]" = OrderedDict()
_MAX_BUILDS = 96
_MAX_SIMS = 20000
_STATS = {"builds": 0, "build_hits": 0, "build_s": 0.0}


def _build(name: str, p: int, m: int, costs: Costs | None, limit: float | None, recompute: str | None = None,
           levered_search: bool = False):
    """``cm.build`` through the process cache: one search per distinct (schedule, p, m, costs
    the generator sees, budget, recompute). Searches that take an objective rank by makespan: the
    planner's step time is the makespan (the optimizer step waits for every device).

    ``recompute`` (``"full"`` / ``"selective"``): every forward gets an ``R`` right before its
    ``B`` (:func:`ctrlmem.model.levers.with_recompute`, what ``ctrlmem run --recompute`` runs).
    The order is the plain build's (the same cached search, ``costs`` without the ``R``), except
    with ``levered_search``: a budgeted generator (``v-shape``, ``zb``) then chooses the order
    with every forward recomputed under the budget (``cm.build(..., memory_limit=L,
    recompute=mode)``, docs/theory.md §13 "A fixed lever under a budget"), ``costs`` carrying the
    ``R`` times and the kept share."""
    key = (name, p, m, costs if SCHEDULES[name].uses_costs else None, limit, recompute, levered_search)
    if key in _BUILDS:
        _BUILDS.move_to_end(key)
        _STATS["build_hits"] += 1
        if isinstance(_BUILDS[key], ValueError):  # a search that found nothing: not tried again
            raise _BUILDS[key]
        return _BUILDS[key], key
    kw = {"objective": "makespan"} if "objective" in SCHEDULES[name].params else {}
    if recompute and not levered_search:
        sched = with_recompute(_build(name, p, m, costs, limit)[0], recompute)
    else:
        t0 = time.perf_counter()
        lever = {"recompute": recompute} if recompute else {}
        try:
            sched = build(name, p, m, costs=costs if SCHEDULES[name].uses_costs else None, memory_limit=limit,
                          **lever, **kw)
        except ValueError as exc:
            if not levered_search:
                raise
            _BUILDS[key] = exc
            raise
        finally:
            _STATS["build_s"] += time.perf_counter() - t0
            _STATS["builds"] += 1
    _BUILDS[key] = sched
    while len(_BUILDS) > _MAX_BUILDS:
        _BUILDS.popitem(last=False)
    return sched, key


def _sim(name: str, p: int, m: int, costs: Costs | None, limit: float | None, sim_costs: Costs,
         memory: MemoryModel, offload: float = 0.0, recompute: str | None = None,
         levered_search: bool = False) -> tuple[float, tuple[float, ...], float, tuple]:
    """(makespan, peak per device, bubble rate, build key) of the cached build (:func:`_build`,
    with ``recompute``'s ``R`` passes) simulated with ``sim_costs`` and ``memory``, with
    ``offload`` of every forward's activation copied to host (:func:`_offloaded`); simulations
    are cached too."""
    bkey = (name, p, m, costs if SCHEDULES[name].uses_costs else None, limit, recompute, levered_search)
    skey = (bkey, sim_costs, memory, offload)
    if skey in _SIMS:  # the build (and its simulation) reused
        _SIMS.move_to_end(skey)
        _STATS["build_hits"] += 1
        return _SIMS[skey]
    sched, bkey = _build(name, p, m, costs, limit, recompute, levered_search)
    r = simulate(_offloaded(sched, offload, sim_costs, memory), sim_costs, memory)
    out = (r.makespan, tuple(r.peak_memory), r.bubble_rate, bkey)
    _SIMS[skey] = out
    while len(_SIMS) > _MAX_SIMS:
        _SIMS.popitem(last=False)
    return out


def _offloaded(sched, fraction: float, costs: Costs, memory: MemoryModel):
    """``sched`` with ``fraction`` of each forward's activation offloaded (``costs.offload``: ms
    per GB; ``memory``: GB per stage), the reloads issued to end before the backward when the
    largest stage's copy fits; unchanged for ``fraction`` 0."""
    if not fraction:
        return sched
    per_a = costs.offload * max(memory.activation) * sched.num_stages / sched.num_devices
    return with_offload(sched, fraction, costs=dataclasses.replace(costs, offload=per_a))


def cache_info() -> dict:
    """Builds done (searches) and reused in this process, and the seconds spent building."""
    return {"builds": _STATS["builds"], "hits": _STATS["build_hits"], "build_s": _STATS["build_s"],
            "cached_schedules": len(_BUILDS), "cached_simulations": len(_SIMS)}


def clear_cache() -> None:
    """Forget every cached build and simulation (tests; or to free memory)."""
    _BUILDS.clear()
    _SIMS.clear()
    _STATS.update(builds=0, build_hits=0, build_s=0.0)


# ---- the planner -------------------------------------------------------------------------------

def _gb(x: float) -> float:
    return x / 1e9


@dataclass
class _Layout:
    """One (placement, pp, tp, microbatch) of the model: per-stage costs and bytes."""

    S: int
    v: int
    kind: str
    sb: StageBytes
    costs: Costs              # ms, per stage
    memory: MemoryModel       # GB, per stage
    device_stages: tuple[tuple[int, ...], ...]
    start_ms: tuple[float, ...]   # earliest start of each device (the forward chain before it)
    work_ms: tuple[float, ...]    # one microbatch's F + B + W per device
    c_max_gb: float           # the largest stage activation of one microbatch
    a2a_ms: tuple[float, ...] = ()     # per device: one microbatch's all-to-all time (F + B)
    hop_bytes: float = 0.0             # bytes of one activation hop (per GPU)
    transient_gb: float = 0.0          # one layer rematerialised during B under recomputation
    rc: str = "none"                   # the recompute lever
    # with recomputation, for schedules with a split backward (their own R passes, not folded):
    r_costs: Costs | None = None       # ms: B without the recompute, R its own pass (Costs.recompute)
    r_memory: MemoryModel | None = None  # GB: the plain activation, what a forward keeps until its R
    plain_costs: Costs | None = None   # ms: the same stages without recomputation
    plain_max_gb: float = 0.0          # the largest stage's plain activation of one microbatch

    @property
    def recomputes(self) -> bool:
        return self.rc != "none"


@dataclass(frozen=True)
class _RowModel:
    """How one row is built and simulated (:meth:`Planner.row_model`)."""

    build_costs: Costs         # what a cost-adapted generator sees
    costs: Costs               # ms, simulated
    memory: MemoryModel        # GB, simulated
    extra_gb: float            # added to every simulated peak (the fold's rematerialised layer)
    recompute: str | None      # the mode of the schedule's R passes (None: none, or folded into B)
    levered_search: bool       # a budgeted search that orders with every forward recomputed
    unit_gb: float             # GB of one budget unit (the largest stage's activation the budget counts)


OVERLAPPED = ("dualpipe-v",)
"""Schedules whose F&B pairs overlap (DualPipeV): their pairs hide the MoE all-to-all."""


def overlap_fraction(lay: _Layout) -> float:
    """``Costs.fb_overlap`` of an overlapped F&B pair on ``lay`` (docs/plan.md): a pair's forward
    and backward each hide their all-to-all under the other's compute, at most as much as there is
    compute to hide it under. Per device, with ``w`` its stages' F + B ms and ``a`` their all-to-all
    ms (both included in ``w``), the pair takes ``(w − min(a, w − a)) / w`` of its two passes; the
    least gain over the devices is taken (one fraction for the whole schedule). 1.0 (no gain)
    without an all-to-all (a dense model, or EP 1)."""
    if not lay.a2a_ms or not any(lay.a2a_ms):
        return 1.0
    f, b = lay.costs.stage_times(lay.S, len(lay.device_stages))[:2]
    worst = 0.5
    for stages, a in zip(lay.device_stages, lay.a2a_ms):
        w = sum(f[s] + b[s] for s in stages)
        if w <= 0:
            continue
        worst = max(worst, (w - min(a, w - a)) / w)
    return min(1.0, worst)


def _device_stages(kind: str, p: int, v: int) -> tuple[tuple[int, ...], ...]:
    S = p * v
    if kind == "v-shape":
        return tuple((d, 2 * p - 1 - d) for d in range(p))
    if kind in ("sequential", "interleaved"):
        return tuple(tuple(s for s in range(S) if s % p == d) for d in range(p))
    raise ValueError(f"the planner handles sequential, looped and V-shape placements, not {kind!r}")


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to its square root."""
    small, large, d = [], [], 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


class Planner:
    """The search behind :func:`plan` (see the module doc); ``settings`` is the JSON of its inputs."""

    def __init__(self, *, model: ModelSpec, gpus: int, gpu_memory_gb: float, global_batch: int,
                 source: CostSource, schedules: Sequence[ScheduleChoice], microbatch_sizes: Sequence[int],
                 tp: Sequence[int], pp: Sequence[int] | None, min_pp: int, distributed_optimizer: bool | str,
                 flash_attention: bool, margin: AllocatorMargin, reserve_gb: float, dp_gbs: float,
                 gpus_per_node: int, batch_note: str = "", split: str = "even", ep: Sequence[int] | None = None,
                 recompute: Sequence[str] = ("none",), nvlink_gbs: float = 150.0, ib_gbs: float = 25.0,
                 offload: Sequence[float] = (0.0,), host_gbs: float | None = None) -> None:
        self.model, self.gpus, self.gpu_gb, self.batch = model, gpus, float(gpu_memory_gb), global_batch
        self.source, self.choices, self.mbs = source, list(schedules), sorted(set(microbatch_sizes))
        self.tps, self.pps, self.min_pp = sorted(set(tp)), (sorted(set(pp)) if pp else None), min_pp
        self.dist_opt = distributed_optimizer
        self.flash, self.margin, self.reserve_gb = flash_attention, margin, float(reserve_gb)
        self.dp_bw = float(dp_gbs) * 1e9
        self.gpus_per_node = gpus_per_node
        self.batch_note = batch_note
        self.split = split
        self.eps = sorted(set(ep)) if ep else None
        self.recompute = list(dict.fromkeys(recompute))
        self.offload = list(dict.fromkeys(float(x) for x in offload))
        self.host_gbs, self.host_how = (float(host_gbs), "given") if host_gbs else source.host_gbs()
        # a measured allocator margin already holds the receive buffers of the runs it was fitted on
        self.count_recv = margin.ratio == 1.0 and not margin.bytes_per_logit and not margin.bytes_per_embedding_param
        self.nvlink_bw, self.ib_bw = float(nvlink_gbs) * 1e9, float(ib_gbs) * 1e9
        self.layer_act = source.layer_activation(model, flash_attention)
        self._layouts: dict[tuple, _Layout] = {}
        self.skipped: list[str] = []
        self.peak = source.peak_flops()

    # -- configurations -------------------------------------------------------------------------
    def configs(self) -> list[tuple[int, int, int, int, bool]]:
        """(dp, tp, pp, microbatch, distributed optimizer) to plan, in a stable order."""
        out = []
        N, B = self.gpus, self.batch
        odd_tp = [t for t in self.tps if N % t]
        if odd_tp:
            self.skipped.append(f"TP {', '.join(map(str, odd_tp))} does not divide {N} GPUs")
        for tp in self.tps:
            if N % tp:
                continue
            rest = N // tp
            pps = [p for p in (self.pps or _divisors(rest)) if rest % p == 0 and p >= self.min_pp]
            if self.pps:
                bad = [p for p in self.pps if rest % p]
                if bad:
                    self.skipped.append(f"PP {', '.join(map(str, bad))} does not divide {rest} (= {N} GPUs / TP {tp})")
            for pp in pps:
                dp = rest // pp
                for mb in self.mbs:
                    if B % (dp * mb):
                        self.skipped.append(f"DP {dp} × microbatch {mb} does not divide the global batch {B}")
                        continue
                    opts = [True, False] if self.dist_opt == "both" else [bool(self.dist_opt)]
                    if dp == 1:
                        opts = [opts[0]]
                    for z in opts:
                        for ep in self.ep_choices(dp * tp):
                            for rc in self.recompute:
                                out += [(dp, tp, pp, mb, z, ep, rc, off) for off in self.offload]
        return out

    def ep_choices(self, group: int) -> list[int]:
        """Expert-parallel degrees for ``group`` = DP × TP ranks of a stage: those dividing both
        it and the experts (experts not split by TP: expert-tensor parallelism 1, Megatron's
        MoE parallel folding)."""
        E = self.model.experts
        if not E:
            return [1]
        cands = self.eps or [e for e in range(1, group + 1) if group % e == 0]
        ok = [e for e in cands if group % e == 0 and E % e == 0]
        bad = [e for e in cands if e not in ok]
        if bad:
            self.skipped.append(f"EP {', '.join(map(str, bad))} does not divide both {E} experts and DP × TP = {group}")
        return ok

    def layer_times(self, tp: int, mb: int, ep: int, rc: str) -> tuple[list[tuple[float, float, float]], list[float]]:
        """Per layer: (F, B, W) ms with recomputation and the all-to-all added, and the
        all-to-all ms alone (F + B)."""
        a2a = self.a2a_ms(tp, mb, ep)
        out, comm = [], []
        for (f, b, w), extra, sh in zip(self.source.layer_costs(self.model, mb, tp), self._recompute_s(tp, mb, rc),
                                        self.model.layer_shapes()):
            x = a2a if sh.moe else 0.0
            out.append(((f * 1e3 + x), (b + extra) * 1e3 + x, w * 1e3))
            comm.append(2 * x)
        return out, comm

    def recompute_ms(self, tp: int, mb: int, rc: str) -> list[float]:
        """Per layer: the ms recomputation adds to one microbatch's backward — the layer's
        forward (``full``), its attention core's share of it (``selective``), 0 (``none``). It is
        the ``R`` pass's time with a split backward and part of ``B`` with a fused one (the
        all-to-all of an MoE layer is not counted again)."""
        return [x * 1e3 for x in self._recompute_s(tp, mb, rc)]

    def _recompute_s(self, tp: int, mb: int, rc: str) -> list[float]:
        spec = self.model
        out = []
        for (f, _, _), sh in zip(self.source.layer_costs(spec, mb, tp), spec.layer_shapes()):
            if rc == "full":
                out.append(f)
            elif rc == "selective":
                ff, _, _ = arch.layer_flops_per_token(spec, sh)
                out.append(f * arch.attention_core_flops(spec) / ff)
            else:
                out.append(0.0)
        return out

    def a2a_ms(self, tp: int, mb: int, ep: int) -> float:
        """One MoE layer's all-to-all for one microbatch, one direction of the pass (dispatch
        + combine), ms: each GPU's ``mb·s/tp`` tokens (sequence parallel) sent to ``top_k``
        experts in bf16, ``(ep − 1)/ep`` of them leaving the GPU, at NVLink bandwidth when the
        EP group fits in a node, else the inter-node bandwidth."""
        spec = self.model
        if not spec.experts or ep == 1:
            return 0.0
        tokens = mb * spec.seq_len / tp
        bytes_one_way = tokens * spec.top_k * spec.hidden * 2.0 * (ep - 1) / ep
        bw = self.nvlink_bw if ep <= self.gpus_per_node else self.ib_bw
        return 2.0 * bytes_one_way / bw * 1e3

    def stage_split(self, kind: str, v: int, pp: int, times, ef: float, hf: float) -> list[int] | None:
        """Layers per stage: the balanced split (:mod:`ctrlmem.planner.split`) or ``None`` for the
        even rule."""
        S = v * pp
        if self.split != "balanced" or S > self.model.num_layers or S == 1:
            return None
        return split_mod.balanced_split([sum(t) for t in times], ef, hf, S, _device_stages(kind, pp, v))

    def layout(self, kind: str, v: int, pp: int, tp: int, mb: int, ep: int = 1, rc: str = "none") -> _Layout:
        key = (kind, v, pp, tp, mb, ep, rc)
        if key in self._layouts:
            return self._layouts[key]
        spec, src = self.model, self.source
        S = v * pp
        times, comm = self.layer_times(tp, mb, ep, rc)
        hf, hb, hw = src.head(spec, mb, tp)
        ef, eb, ew = src.embedding(spec, mb, tp)
        split = self.stage_split(kind, v, pp, times, (ef + eb + ew) * 1e3, (hf + hb + hw) * 1e3)
        sb = stage_bytes(spec, S, mb, tp, self.layer_act, layers=split, ep=ep, flash_attention=self.flash,
                         recompute=rc)
        fs, bs, ws, a2a_stage = [], [], [], []
        redo = self.recompute_ms(tp, mb, rc)
        plain_b = [t[1] for t in self.layer_times(tp, mb, ep, "none")[0]] if rc != "none" else []
        rs, bps = [], []  # per stage: its layers' recompute ms (an R pass's time), its B without it
        start_l = 0
        for s, n in enumerate(sb.layers):
            mine = range(start_l, start_l + n)
            start_l += n
            f, b, w = (sum(times[i][k] for i in mine) for k in range(3))
            bp = sum(plain_b[i] for i in mine) if plain_b else b
            if s == 0:
                f, b, w, bp = f + ef * 1e3, b + eb * 1e3, w + ew * 1e3, bp + eb * 1e3
            if s == S - 1:
                f, b, w, bp = f + hf * 1e3, b + hb * 1e3, w + hw * 1e3, bp + hb * 1e3
            fs.append(f), bs.append(b), ws.append(w)
            rs.append(sum(redo[i] for i in mine))
            bps.append(bp)
            a2a_stage.append(sum(comm[i] for i in mine))
        hop_ms = src.hop(spec, mb, tp) * 1e3
        costs = Costs(fs, bs, ws, comm=hop_ms)
        act_gb = [_gb(x) for x in sb.activation]
        release = 1.0 if (rc == "full") else max(0.0, 1.0 - sb.w_kept)
        memory = MemoryModel(activation=act_gb, release_at_b=release)
        rmodel: dict = {}
        if rc != "none":
            rmodel = self._r_model(spec, S, mb, tp, ep, sb, fs, bps, ws, rs, hop_ms)
        dev = _device_stages(kind, pp, v)
        device_of = {s: d for d, ss in enumerate(dev) for s in ss}
        arrive, t = [], 0.0
        for s in range(S):  # the forward chain of microbatch 0: the earliest each stage can start
            arrive.append(t)
            t += fs[s] + (hop_ms if s + 1 < S and device_of[s + 1] != device_of[s] else 0.0)
        start = tuple(min(arrive[s] for s in ss) for ss in dev)
        work = tuple(sum(fs[s] + bs[s] + ws[s] for s in ss) for ss in dev)
        transient = 0.0
        if rc != "none":  # one layer's full activation rematerialised during its B
            full = max(layer_bytes(spec, self.layer_act, self.flash, "none"))
            kept = min(layer_bytes(spec, self.layer_act, self.flash, rc))
            transient = _gb(mb * spec.seq_len * (full - kept) / tp)
        lay = _Layout(S, v, kind, sb, costs, memory, dev, start, work, max(act_gb),
                      tuple(sum(a2a_stage[s] for s in ss) for ss in dev),
                      2.0 * mb * spec.seq_len * spec.hidden / tp, transient, rc, **rmodel)
        self._layouts[key] = lay
        return lay

    def _r_model(self, spec: ModelSpec, S: int, mb: int, tp: int, ep: int, sb: StageBytes, fs, b_plain, ws, rs,
                 hop_ms: float) -> dict:
        """The recomputation of a split-backward schedule as its own ``R`` passes (docs/plan.md,
        "Recomputation as a dimension"). Per stage, with ``A`` the stage's activation of one
        microbatch without recomputation and ``K`` the bytes the lever keeps (the layers'
        inputs under ``full``, all but the attention scores under ``selective``; the LM head's
        logits are always kept), a recomputed forward holds ``K`` from its ``F`` to its ``R``,
        ``A`` from its ``R`` to the end of its ``B``, and ``w_kept·A`` (what ``W`` needs: the
        inputs of the weight matrices, recomputed) from there to its ``W``; its ``R`` takes the
        layers' recompute ms (:meth:`recompute_ms`) and its ``B`` what it takes without the lever.
        The layers per stage are the lever's (``sb``), so the plain bytes are counted on the
        same split."""
        plain = stage_bytes(spec, S, mb, tp, self.layer_act, layers=list(sb.layers), ep=ep,
                            flash_attention=self.flash, recompute="none")
        plain_gb = [_gb(x) for x in plain.activation]
        kept_gb = [min(_gb(x), a) for x, a in zip(sb.activation, plain_gb)]
        # the kept share a budgeted search with the lever counts for every stage: the largest (the
        # LM head's stage keeps its logits), so its memory bounds the simulated one (see auto_limit)
        kappa = max((k / a for k, a in zip(kept_gb, plain_gb) if a > 0), default=1.0)
        cost = max((r / f for r, f in zip(rs, fs) if f > 0), default=0.0)
        plain_costs = Costs(fs, b_plain, ws, comm=hop_ms)
        return {"r_costs": dataclasses.replace(plain_costs, recompute=tuple(rs), input_fraction=kappa,
                                               selective=(kappa, cost)),
                "r_memory": MemoryModel(activation=plain_gb, release_at_b=max(0.0, 1.0 - plain.w_kept),
                                        kept=kept_gb),
                "plain_costs": plain_costs, "plain_max_gb": max(plain_gb)}

    def row_model(self, lay: _Layout, choice: "ScheduleChoice") -> _RowModel:
        """How a row of ``lay`` and ``choice`` is built and simulated. Without recomputation, or
        with a fused backward (``BW``: 1F1B, interleaved 1F1B, 1F1B-V, GPipe), the lever is folded
        into the layout: ``B`` takes the recompute, the activation is what the lever keeps, and
        one layer's rematerialised activation is added to the peak. With a split backward the
        schedule gets its ``R`` passes (:meth:`_r_model`): ``W`` runs after ``B`` and needs the
        recomputed inputs of the weight matrices, which the fold would drop at ``B``."""
        if lay.recomputes and split_backward(choice.name):
            search = choice.auto  # the memory-fit budget: ordered with every forward recomputed
            return _RowModel(lay.r_costs if search else lay.plain_costs, lay.r_costs, lay.r_memory, 0.0, lay.rc,
                             search, lay.plain_max_gb)
        return _RowModel(lay.costs, lay.costs, lay.memory, lay.transient_gb, None, False, lay.c_max_gb)

    def states(self, lay: _Layout, dp: int, dist_opt: bool, tp: int = 1,
               ep: int = 1) -> list[tuple[float, float, float, float]]:
        """Per device: (params, grads, optimizer, of the params the routed experts') GB. Dense
        optimizer states are sharded over DP, the experts' over the expert-data-parallel
        ``DP·TP/EP`` ranks (with a distributed optimizer)."""
        out = []
        edp = dp * tp // ep
        for ss in lay.device_stages:
            n = sum(lay.sb.params[s] for s in ss)
            e = sum(lay.sb.expert_params[s] for s in ss) if lay.sb.expert_params else 0.0
            opt = n * BYTES_OPTIMIZER / (dp if dist_opt else 1) + e * BYTES_OPTIMIZER / (edp if dist_opt else 1)
            out.append((_gb((n + e) * BYTES_WEIGHT), _gb((n + e) * BYTES_GRAD), _gb(opt), _gb(e * BYTES_WEIGHT)))
        return out

    def recv_buffers(self, lay: _Layout, m: int) -> list[float]:
        """Per device: GB of the receive buffers torch's pipelining allocates up front, one per
        microbatch for each stage input from another device (activations) and each output
        gradient from another device (torch.distributed.pipelining.stage)."""
        dev = lay.device_stages
        device_of = {s: d for d, ss in enumerate(dev) for s in ss}
        out = []
        for d, ss in enumerate(dev):
            n = sum((s > 0 and device_of[s - 1] != d) + (s < lay.S - 1 and device_of[s + 1] != d) for s in ss)
            out.append(_gb(n * m * lay.hop_bytes))
        return out

    def p2p_gb(self, lay: _Layout, m: int) -> float:
        """GB the busiest device sends per step over pipeline hops (activations forward,
        gradients backward; the V-shape's two stages per device send twice)."""
        return max(self.recv_buffers(lay, m))

    def transient(self, lay: _Layout, mb: int, tp: int) -> list[float]:
        """Per device: the allocator margin's fixed terms (GB): logits on the LM head's device,
        the embedding's gradient on the embedding's device."""
        spec = self.model
        logits = mb * spec.seq_len * spec.vocab / tp
        emb = spec.vocab * spec.hidden / tp
        out = []
        for ss in lay.device_stages:
            x = 0.0
            if lay.S - 1 in ss:
                x += self.margin.bytes_per_logit * logits
            if 0 in ss:
                x += self.margin.bytes_per_embedding_param * emb
            out.append(_gb(x))
        return out

    def dp_sync_s(self, lay: _Layout, dp: int, tp: int = 1, ep: int = 1) -> float:
        """Ring all-reduce (or reduce-scatter + all-gather) of the bf16 gradients of the device
        holding most parameters, over ``dp`` replicas (routed experts' over ``DP·TP/EP``), not
        overlapped with the pipeline."""
        edp = dp * tp // ep
        worst = 0.0
        for ss in lay.device_stages:
            n = sum(lay.sb.params[s] for s in ss) * BYTES_GRAD
            e = (sum(lay.sb.expert_params[s] for s in ss) if lay.sb.expert_params else 0.0) * BYTES_GRAD
            t = (2.0 * (dp - 1) / dp * n if dp > 1 else 0.0) + (2.0 * (edp - 1) / edp * e if edp > 1 else 0.0)
            worst = max(worst, t)
        return worst / self.dp_bw

    def memory(self, lay, peaks_gb, states, transient, recv=None, extra_gb: float | None = None) -> tuple[int, dict]:
        """The device that needs most and its breakdown (GB); ``extra_gb`` (default the layout's
        rematerialised layer, :attr:`_RowModel.extra_gb`) is added to every activation peak."""
        best = None
        recv = recv or [0.0] * len(states)
        extra = lay.transient_gb if extra_gb is None else extra_gb
        for d, (pk, st, tr, rb) in enumerate(zip(peaks_gb, states, transient, recv)):
            pk = pk + extra
            margin = (self.margin.ratio - 1.0) * pk + tr
            total = st[0] + st[1] + st[2] + pk + margin + (rb if self.count_recv else 0.0) + self.reserve_gb
            if best is None or total > best[1]["total_gb"] + 1e-12:
                best = (d, {"params_gb": st[0], "expert_params_gb": st[3], "grads_gb": st[1], "optimizer_gb": st[2],
                            "activation_gb": pk, "recv_gb": rb, "margin_gb": margin, "reserve_gb": self.reserve_gb,
                            "total_gb": total})
        return best  # type: ignore[return-value]

    def sim_costs(self, lay: _Layout, offload: float, name: str | None = None, base: Costs | None = None) -> Costs:
        """The layout's pass costs (or ``base``: a row's, :meth:`row_model`), with the host copy's
        ms per GB when the row offloads, and for a schedule of overlapped F&B pairs
        (:data:`OVERLAPPED`) the pairs' time from the all-to-all they hide
        (:func:`overlap_fraction`)."""
        costs = lay.costs if base is None else base
        costs = dataclasses.replace(costs, offload=1e3 / self.host_gbs) if offload else costs
        if name in OVERLAPPED:
            fb = overlap_fraction(lay)
            if fb < 1.0:
                costs = dataclasses.replace(costs, fb_overlap=fb)
        return costs

    @staticmethod
    def least_units(lay: _Layout, rm: _RowModel) -> float:
        """The fewest budget units (:attr:`_RowModel.unit_gb`) a row of ``lay`` can need: one
        microbatch per device (``v`` stage activations) — or, with recomputation as ``R`` passes,
        in the budgeted search's model (every stage one unit, the largest kept share κ), ``1 +
        (v − 1)·κ``: while a device recomputes its last stage of a microbatch (whole), the
        microbatch's other stages on the device are in flight, keeping their share (their ``B``
        follows that stage's, and their ``R`` comes right before it), so no order fits less."""
        if not rm.recompute:
            return lay.v
        return 1.0 + (lay.v - 1) * float(lay.r_costs.kept_fraction(rm.recompute))

    def auto_limit(self, lay: _Layout, states, transient, recv=None, offload: float = 0.0,
                   model: _RowModel | None = None) -> tuple[float | None, str]:
        """The budget (fraction of 1F1B's peak) the remaining memory allows: whole stage
        activations of the largest stage, on the device with least room; ``None`` and why when
        not even one microbatch per device fits. With ``offload`` one microbatch per device is
        counted whole (its copy in flight) and the others at the ``1 − offload`` left on the GPU
        (the simulation then checks the schedule's real peak).

        **With recomputation.** On a fused-backward layout the recomputation is folded into the
        stage bytes, so the unit is the largest stage's *kept* activation and one rematerialised
        layer is held back. On a split-backward schedule (``model.recompute``) the unit is the
        largest stage's activation *without* the lever — what a forward holds from its ``R`` to its
        ``B``, and the ``a`` of the budgeted search's model — and the search orders with every
        forward recomputed under the budget (:meth:`row_model`: ``cm.build(..., memory_limit=L,
        recompute=mode)``), where each forward in flight takes only its kept share: the same
        GPU memory then holds about ``1/κ`` as many microbatches in flight as without the lever
        (κ the kept share), and the search's looser orders and ``W``-after-``B`` patterns
        compete for it. Counting the budget in kept activations instead, as the fold does, would
        undercount: the forward being recomputed holds its whole activation, and what ``W``
        waits for is recomputed, whole. The search's model bounds the simulated peak (every stage
        counted as the largest, κ the largest kept share over the stages, everything held until
        ``W``), so the order it returns fits the budget in GB too. A peak is then no whole number
        of units, so the budget is counted in :data:`RECOMPUTE_BUDGET_STEP` ths of one; the least is
        :meth:`least_units` (``1 + (v − 1)·κ``); below one microbatch per device (``v`` units)
        only some orders fit, which only the build tells, so such rows are always built (never
        ``bounded``; a search that finds none is cached as such)."""
        model = model or self.row_model(lay, ScheduleChoice("1f1b"))
        room = min(self.gpu_gb - self.reserve_gb - st[0] - st[1] - st[2] - tr for st, tr in zip(states, transient))
        room -= model.extra_gb + (max(recv or [0.0]) if self.count_recv else 0.0)
        unit = self.margin.ratio * model.unit_gb
        step = RECOMPUTE_BUDGET_STEP if model.recompute else 1
        k = math.floor(max(0.0, room) / unit * step + 1e-9) / step if model.unit_gb > 0 else 0
        if offload and k >= lay.v:
            rest = (room - lay.v * unit) / (unit * (1.0 - offload)) if offload < 1 else math.inf
            k = lay.v + math.floor(min(rest, MAX_AUTO_LIMIT * lay.S) + 1e-9)
        k = min(k, int(MAX_AUTO_LIMIT * lay.S))
        least = self.least_units(lay, model)
        if k < least:
            return None, (f"the remaining {room:.1f} GB holds {k:g} stage activation(s) of {model.unit_gb:.2f} GB "
                          f"(× {self.margin.ratio:.3f} allocator margin), "
                          + (f"less than the {least:.3g} a recomputing order needs (one stage whole, the others of "
                             "its microbatch on the device keeping their share)" if model.recompute else
                             "fewer than one microbatch per device"))
        what = "the largest stage's activations without recomputation" if model.recompute else \
            "the largest stage's activations"
        return k / lay.S, f"{k:g} of {what} ({room:.1f} GB left)"

    # -- the search -----------------------------------------------------------------------------
    def run(self, exhaustive: bool = False, progress: bool = True, top: int = 1) -> list[dict]:
        t0 = time.perf_counter()
        rows: list[dict] = []
        pending: list[tuple[float, int, dict, dict]] = []  # (bound samples/s, order, row, work)
        configs = self.configs()
        # one bar over both phases: every row's memory check, then every simulation
        bar = _progress(len(configs) * len(self.choices), progress)
        try:
            self._search(configs, rows, pending, bar, exhaustive, top)
        finally:
            bar.close()
        self.seconds = time.perf_counter() - t0
        return rows

    def _search(self, configs, rows: list[dict], pending: list, bar, exhaustive: bool, top: int) -> None:
        for ci, (dp, tp, pp, mb, z, ep, rc, off) in enumerate(configs):
            m = self.batch // (dp * mb)
            for oi, ch in enumerate(self.choices):
                bar.update(1)
                kind, v = placement_of(ch.name)
                if rc != "none" and off and split_backward(ch.name):
                    self.skipped.append(f"offload {off:g} with {rc} recomputation on {ch.name}: its forwards get R "
                                        "passes, and a forward is recomputed or offloaded, not both (docs/theory.md "
                                        "§13); planned with the fused-backward schedules (1f1b, interleaved-1f1b, "
                                        "1f1b-v, gpipe), whose recomputation is folded into B")
                    continue
                row = {"schedule": ch.label, "method": ch.method + ("" if rc == "none" else f" + {rc} recompute")
                       + (f" + offload {off:g}" if off else ""),
                       "placement": kind, "dp": dp, "tp": tp, "pp": pp, "ep": ep, "recompute": rc, "offload": off,
                       "microbatch_size": mb, "m": m, "dist_opt": bool(z), "memory_limit": ch.limit,
                       "gpu_memory_gb": self.gpu_gb, "reason": "", "_order": (oi, ci)}
                rows.append(row)
                if v * pp > self.model.num_layers + 2:
                    row.update(status="too many stages", fits=False,
                               reason=f"{v * pp} stages for {self.model.num_layers} layers + embedding + head")
                    continue
                lay = self.layout(kind, v, pp, tp, mb, ep, rc)
                rm = self.row_model(lay, ch)
                row["layer_split"] = split_mod.split_text(lay.sb.layers)
                states = self.states(lay, dp, z, tp, ep)
                trans = self.transient(lay, mb, tp)
                recv = self.recv_buffers(lay, m)
                sync = self.dp_sync_s(lay, dp, tp, ep)
                row["p2p_gb"] = max(recv)
                row["a2a_s"] = m * max(lay.a2a_ms) / 1e3 if lay.a2a_ms else 0.0
                limit = ch.limit
                how = "simulated"
                if ch.auto:
                    limit, why = self.auto_limit(lay, states, trans, recv, off, rm)
                    row["memory_limit"] = limit
                    if limit is None:
                        # the least it could need: one microbatch in flight per device (budget 1/p), or
                        # with R passes the stage being recomputed
                        d, mem = self.memory(lay, [self.least_units(lay, rm) * rm.unit_gb] * pp, states, trans, recv,
                                             rm.extra_gb)
                        row.update(mem, device=d, status="does not fit", fits=False, reason=why,
                                   memory_how="the smallest budget (" + ("a recomputing order's least" if rm.recompute else
                                                                         "one microbatch per device") + ")")
                        continue
                    row["reason"] = f"budget {limit:.4g} × 1F1B's peak: {why}"
                if m < pp:
                    row.update(status="m < pp", fits=False,
                               reason=f"{m} microbatches for {pp} pipeline stages: the pipeline never fills "
                                      "(ctrlmem's schedules and `ctrlmem run` need m ≥ p)")
                    continue
                if ch.name in OVERLAPPED and m < 2 * pp:
                    row.update(status="m < 2pp", fits=False,
                               reason=f"{m} microbatches for {pp} devices: {ch.name} needs m ≥ 2·pp (as torch's "
                                      "ScheduleDualPipeV)")
                    continue
                uses_costs = SCHEDULES[ch.name].uses_costs
                exact = not uses_costs or ch.auto
                if not exact:
                    # memory estimate from the unit-cost pattern (same memory level, no search)
                    _, peaks, _, _ = _sim(ch.name, pp, m, None, limit, Costs(), rm.memory, off, rm.recompute)
                    d, mem = self.memory(lay, peaks, states, trans, recv, rm.extra_gb)
                    how = "estimated (unit-cost pattern)"
                    if mem["total_gb"] > self.gpu_gb * (1 + ESTIMATE_TOLERANCE):
                        row.update(mem, device=d, status="does not fit", fits=False, memory_how=how,
                                   reason=_over(mem, self.gpu_gb) + "; estimated from the schedule's unit-cost "
                                          "pattern (same memory level), its cost-adapted form not built")
                        continue
                elif not ch.auto:
                    _, peaks, _, _ = _sim(ch.name, pp, m, rm.build_costs, limit,
                                          self.sim_costs(lay, off, ch.name, rm.costs), rm.memory, off, rm.recompute)
                    d, mem = self.memory(lay, peaks, states, trans, recv, rm.extra_gb)
                    if mem["total_gb"] > self.gpu_gb + 1e-9:
                        row.update(mem, device=d, status="does not fit", fits=False, memory_how=how,
                                   reason=_over(mem, self.gpu_gb))
                        continue
                bound_ms = max(s + w * m for s, w in zip(lay.start_ms, lay.work_ms))
                ub = self.batch / (bound_ms / 1e3 + sync)
                row["upper_bound_samples_per_s"] = ub
                # below one microbatch per device only the build says whether any order fits
                unsure = bool(rm.levered_search and limit is not None and limit * lay.S < lay.v - 1e-9)
                pending.append((ub, len(pending), row, {"choice": ch, "lay": lay, "states": states, "trans": trans,
                                                        "sync": sync, "limit": limit, "recv": recv, "off": off,
                                                        "model": rm, "unsure": unsure}))
        pending.sort(key=lambda x: (-x[0], x[1]))
        found: dict[str, list[float]] = {}  # per schedule: the best `top` samples/s simulated so far
        bar.add(len(pending))
        for ub, _, row, w in pending:
            ch = w["choice"]
            mine = found.get(ch.label, [])
            if not exhaustive and len(mine) >= top and ub < mine[top - 1] * (1 - 1e-12):
                nth = "best" if top == 1 else f"{top}th best"
                row.update(status="bounded", fits=True, memory_how=row.get("memory_how", "–"),
                           reason=(f"not simulated: at most {ub:.4g} samples/s (no-bubble bound), below the "
                                   f"{mine[top - 1]:.4g} of {ch.label}'s {nth} configuration")
                           + (f"; {row['reason']}" if row["reason"] else ""))
                self._fill_bounded_memory(row, w)
                if w["unsure"]:  # not built: whether an order fits this budget is not known
                    row.update(fits=False, reason="fit not known: below one microbatch per device an order with every "
                                                  "forward recomputed fits only sometimes, and the search was not run "
                                                  "(" + row["reason"] + ")")
                bar.update(1)
                continue
            self._evaluate(row, w)
            if row["fits"]:
                found[ch.label] = sorted(mine + [row["samples_per_s"]], reverse=True)[:top]
            bar.update(1)

    def _fill_bounded_memory(self, row: dict, w: dict) -> None:
        ch, lay, rm = w["choice"], w["lay"], w["model"]
        pp, m = row["pp"], row["m"]
        if ch.auto:  # not built: its activation is at most the budget it was given
            budget = w["limit"] * lay.S * rm.unit_gb
            d, mem = self.memory(lay, [budget] * pp, w["states"], w["trans"], w["recv"], rm.extra_gb)
            row.update(mem, device=d, memory_how="at most its budget (not built)")
            return
        if not SCHEDULES[ch.name].uses_costs:
            _, peaks, _, _ = _sim(ch.name, pp, m, rm.build_costs, w["limit"],
                                  self.sim_costs(lay, w["off"], ch.name, rm.costs), rm.memory, w["off"], rm.recompute)
            how = "simulated"
        else:
            _, peaks, _, _ = _sim(ch.name, pp, m, None, w["limit"], Costs(), rm.memory, w["off"], rm.recompute)
            how = "estimated (unit-cost pattern)"
        d, mem = self.memory(lay, peaks, w["states"], w["trans"], w["recv"], rm.extra_gb)
        row.update(mem, device=d, memory_how=how)
        row["fits"] = mem["total_gb"] <= self.gpu_gb + 1e-9
        if not row["fits"]:
            row.update(status="does not fit", reason=_over(mem, self.gpu_gb) + "; " + row["reason"])

    def lever_effects(self, row: dict, w: dict, d: int, span_ms: float, act_gb: float) -> dict:
        """What the row's levers save on device ``d`` (GB) and the pipeline time they add (s). The
        same order is simulated with the recomputation and without the offload (the offload's
        saving is the difference to the row), then without either — its ``R`` passes removed,
        the same stages' bytes and pass costs without recomputation — for the recomputation's
        saving and the time both add."""
        ch, lay, rm = w["choice"], w["lay"], w["model"]
        pp, m, rc, off = row["pp"], row["m"], row["recompute"], w["off"]
        if rc == "none" and not off:
            return {"recompute_saved_gb": 0.0, "offload_saved_gb": 0.0, "lever_s": 0.0}
        _, kept, _, _ = _sim(ch.name, pp, m, rm.build_costs, w["limit"], self.sim_costs(lay, 0.0, ch.name, rm.costs),
                             rm.memory, 0.0, rm.recompute, rm.levered_search)
        with_rc = kept[d] + rm.extra_gb
        if rc == "none":
            span0, full, _, _ = _sim(ch.name, pp, m, rm.build_costs, w["limit"],
                                     self.sim_costs(lay, 0.0, ch.name, rm.costs), rm.memory)
        else:  # the very order, without its R passes (none with a fused backward: the fold has none)
            sched, _ = _build(ch.name, pp, m, rm.build_costs, w["limit"], rm.recompute, rm.levered_search)
            r0 = simulate(sched.compute_only(), self.sim_costs(lay, 0.0, ch.name, lay.plain_costs), lay.r_memory)
            span0, full = r0.makespan, r0.peak_memory
        return {"offload_saved_gb": with_rc - act_gb, "recompute_saved_gb": full[d] - with_rc,
                "lever_s": (span_ms - span0) / 1e3}

    def _evaluate(self, row: dict, w: dict) -> None:
        ch, lay, rm = w["choice"], w["lay"], w["model"]
        pp, m = row["pp"], row["m"]
        try:
            span_ms, peaks, bubble, _ = _sim(ch.name, pp, m, rm.build_costs, w["limit"],
                                             self.sim_costs(lay, w["off"], ch.name, rm.costs), rm.memory, w["off"],
                                             rm.recompute, rm.levered_search)
        except ValueError as exc:  # a budgeted search with every forward recomputed that fits no order
            if not rm.levered_search:
                raise
            d, mem = self.memory(lay, [self.least_units(lay, rm) * rm.unit_gb] * pp, w["states"], w["trans"],
                                 w["recv"], rm.extra_gb)
            row.update(mem, device=d, status="does not fit", fits=False,
                       memory_how="the smallest budget (a recomputing order's least)",
                       reason=f"no order fits the budget with every forward recomputed ({exc}); {row['reason']}")
            return
        d, mem = self.memory(lay, peaks, w["states"], w["trans"], w["recv"], rm.extra_gb)
        mem.update(self.lever_effects(row, w, d, span_ms, mem["activation_gb"]))
        step = span_ms / 1e3 + w["sync"]
        row.update(mem, device=d, memory_how="simulated", pipeline_s=span_ms / 1e3, dp_sync_s=w["sync"], step_s=step,
                   bubble_rate=bubble, samples_per_s=self.batch / step,
                   tokens_per_s=self.batch * self.model.seq_len / step)
        row["mfu"] = (self.batch * self.model.flops_per_sample() / (step * self.gpus * self.peak)
                      if self.peak else math.nan)
        if row.get("a2a_s"):  # the all-to-all hidden behind the other microbatch's compute (F&B overlap)
            row["a2a_hidden_samples_per_s"] = self.batch / max(step - row["a2a_s"], 1e-12)
        fits = mem["total_gb"] <= self.gpu_gb + 1e-9
        row["fits"] = fits
        row["status"] = "ok" if fits else "does not fit"
        if not fits:
            row["reason"] = _over(mem, self.gpu_gb) + (f"; {row['reason']}" if row["reason"] else "")

    # -- words ----------------------------------------------------------------------------------
    def _moe_assumptions(self) -> list[str]:
        spec = self.model
        if not spec.experts:
            return []
        return [f"mixture of experts: {spec.experts} routed experts, top {spec.top_k}; expert parallelism EP divides "
                "DP × TP (experts not split by TP: Megatron's MoE parallel folding, expert-tensor parallelism 1); a "
                "GPU holds 1/EP of the routed experts, their optimizer states sharded over DP·TP/EP ranks; each MoE "
                "layer's all-to-all (dispatch and combine, forward and backward) sends mb·s/tp tokens × top_k × h "
                f"bf16 values, (EP − 1)/EP of them off the GPU, at {self.nvlink_bw / 1e9:g} GB/s within a node of "
                f"{self.gpus_per_node} GPUs, {self.ib_bw / 1e9:g} GB/s across nodes, added to F and B (not "
                "overlapped); a2a_hidden_samples_per_s is the same step with the all-to-all hidden entirely, "
                "the most a DualPipe-style overlap of one microbatch's F with another's B can give"]

    def assumptions(self) -> list[str]:
        spec, src = self.model, self.source
        z = {True: "a distributed optimizer (optimizer states sharded over DP, Megatron's "
                   "--use-distributed-optimizer / ZeRO-1)", False: "no distributed optimizer (every DP replica holds "
                                                                   "all optimizer states)",
             "both": "with and without a distributed optimizer (both rows)"}[self.dist_opt]
        out = [
            f"model: {spec.describe()} ({spec.source})",
            f"cluster: {self.gpus} GPUs of {self.gpu_gb:g} GB, tensor parallelism within a node of "
            f"{self.gpus_per_node} GPUs; global batch {self.batch} sequences" + (f" ({self.batch_note})"
                                                                               if self.batch_note else ""),
            *src.assumptions(spec),
            f"one pipeline hop: 2·mb·s·h/tp bytes at {src.p2p_bytes_per_s / 1e9:g} GB/s"
            if not hasattr(src, "hop_s") else "one pipeline hop: the given latency",
            f"data parallelism: the bf16 gradients of the fullest device exchanged by a ring (2·(dp − 1)/dp of them) "
            f"at {self.dp_bw / 1e9:g} GB/s after the pipeline, not overlapped; the optimizer step, data loading and "
            "kernel launch gaps are not modelled (predicted MFU is an upper estimate; ratios compare)",
            ("stages: the balanced split — the layers per stage (each >= 1) that minimise the busiest device's "
             "F + B + W time, the embedding's on stage 0 and the LM head's on the last (V-shape: stages r and "
             "2p − 1 − r share a device), column layer_split (E = embedding, H = head)" if self.split == "balanced"
             else "stages: torchtitan's split of the layers with the embedding and the LM head counting one layer each "
             "(the paper's k·S − 2 rule when it divides)"),
            (f"memory per GPU: bf16 weights (2 B/param) and gradients (2 B/param), fp32 master weights and Adam "
             f"moments (12 B/param) with {z}; embedding and LM head untied, V·h each" if spec.arch == "gpt" else
             f"memory per GPU: bf16 weights (2 B/param) and gradients (2 B/param), fp32 master weights and Adam "
             f"moments (12 B/param) with {z}; the parameters counted from the config ({spec.num_params:,} in all"
             + (f", {spec.num_active_params:,} active" if spec.experts else "") + "), the embedding on the first "
             "stage, the final norm and LM head on the last (a tied head is a copy there); dense parameters divided "
             "by TP"),
            *self._moe_assumptions(),
            "receive buffers: torch's pipelining allocates one per microbatch up front for every stage input and "
            "output gradient that crosses devices (2·mb·s·h/tp bytes each), column recv_gb; "
            + ("added to the total (no measured allocator margin)" if self.count_recv else
               "inside the measured allocator margin (the replayed runs had them), so not added again"),
            ("recomputation (Korthikanti et al. 2022): full keeps each layer's input (2h bytes per token) and "
             "recomputes the layers' forward, selective drops the attention core's s × s tensors and recomputes the "
             "attention core (the LM head's logits are kept either way); with a fused backward (1F1B, interleaved "
             "1F1B, 1F1B-V, GPipe) the recompute is added to B, the activation is what the lever keeps and one layer "
             "rematerialised during B is counted with it; with a split backward every forward gets an R pass right "
             "before its B (what ctrlmem run --recompute runs): it keeps its share until the R, holds its whole "
             "activation from the R to the end of its B and what W needs (the recomputed inputs of the weight "
             "matrices) until its W, and the R takes the recompute's time; v-shape / zb at the memory-fit budget "
             "then order with every forward recomputed; levers "
             f"planned: {', '.join(self.recompute)}" if self.recompute != ["none"] else
             "no recomputation (every activation kept; recompute='none,full' adds the lever)"),
            (f"activation offload: a fraction of every forward's activation (with recomputation, of what it keeps) "
             f"copied to host memory on the GPU's device-to-host lane once the forward ends and reloaded on the "
             f"host-to-device lane to end before its backward (docs/theory.md §13), each copy at {self.host_gbs:g} "
             f"GB/s ({self.host_how}); a late reload delays its backward, and memory counts what is resident while "
             f"a copy is in flight; levers planned: {', '.join(f'{x:g}' for x in self.offload if x)}; "
             "activation_gb + recompute_saved_gb + offload_saved_gb is the activation without the levers, lever_s "
             "the time they add" if any(self.offload) else
             "no activation offload (offload='none,0.5,1' adds the lever)"),
            src.activation_note(spec, self.flash) + "; the LM head stage also keeps 4·V + 4·h bytes per token "
            "(fp32 logits for the loss, final norm); tensor parallelism divides activations by tp (sequence "
            "parallelism); " + ("32·h bytes per layer and token wait for W" if spec.arch == "gpt" else
                                "the inputs of a layer's weight matrices wait for W"),
            "activation peak: the schedule's own order simulated with every stage's bytes (peak on each device)",
            self.margin.describe(),
            f"reserve {self.reserve_gb:g} GB per GPU for the CUDA context, NCCL buffers and fragmentation"
            + (" (none: raise it with reserve_gb / --reserve-gb)" if not self.reserve_gb else ""),
            f"v-shape / zb without a limit: the budget the memory left after states and margins allows, in whole "
            f"stage activations, up to {MAX_AUTO_LIMIT:g} × 1F1B's peak",
        ]
        if self.peak:
            out.append(f"MFU: model FLOPs (F + B + W with attention and the LM head) over {self.peak / 1e12:g} "
                       f"TFLOP/s per GPU ({src.gpu} dense bf16 peak)")
        return out


def _over(mem: dict, gpu_gb: float) -> str:
    return (f"needs {mem['total_gb']:.1f} GB > {gpu_gb:g} GB (params {mem['params_gb']:.1f} + grads "
            f"{mem['grads_gb']:.1f} + optimizer {mem['optimizer_gb']:.1f} + activation {mem['activation_gb']:.1f} + "
            f"margin {mem['margin_gb']:.1f}" + (f" + reserve {mem['reserve_gb']:.1f}" if mem["reserve_gb"] else "")
            + ")")


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def add(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar(_NoBar):
    """A tqdm bar (``delay=1``: drawn only once the search has taken more than a second) whose
    total can grow (the simulations are known after the memory checks)."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm  # noqa: PLC0415 - optional dependency: the core installs with numpy only

        class _Quiet(tqdm):  # no monitor thread: the bar is only ever drawn from the planner's thread
            monitor_interval = 0

        self.bar = _Quiet(total=total, delay=1.0, desc="plan", unit="step", leave=False)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def add(self, n: int) -> None:
        self.bar.total += n  # shown at the next update (a refresh would draw it before the delay)

    def close(self) -> None:
        self.bar.close()


def _progress(total: int, enabled: bool):
    """A progress bar that appears only when the search takes more than a second."""
    if not enabled or total == 0:
        return _NoBar()
    return _Bar(total)


# ---- the public function -----------------------------------------------------------------------

MAX_GPUS = 1_000_000
"""Largest cluster planned (``gpus``): more GPUs than any machine has; the divisor search of a
larger number would take minutes."""

MAX_GPU_MEMORY_GB = 1e6
"""Largest ``gpu_memory_gb`` accepted (a PB per GPU: far beyond any GPU, so nothing changes)."""


def _positive_int(name: str, value: object, maximum: int | None = None) -> int:
    """A positive integer (numpy integers too, never a bool): :func:`ctrlmem.util.checks.integer`
    with the ``ValueError`` the planner has always raised."""
    try:
        return integer(name, value, 1, maximum)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _int_list(name: str, values, maximum: int | None = None) -> list[int]:
    if values is None:
        return []
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, str):
        try:
            values = [int(x) for x in values.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{name} must be comma-separated positive integers, got {short_repr(values)}") from None
    if not isinstance(values, Iterable) or isinstance(values, (bytes, dict)):
        raise ValueError(f"{name} must be a list of positive integers, got {type(values).__name__} {short_repr(values)}")
    out = [_positive_int(name, v, maximum) for v in values]
    if not out:
        raise ValueError(f"{name} is empty; give at least one value")
    return out


def plan(model: "str | ModelSpec | None" = "98.5b", gpus: int = 40, gpu_memory_gb: float = 80.0,
         global_batch: int | None = None, *, costs: Any = "a100", seq_len: int | None = None,
         layers: int | None = None, hidden: int | None = None, heads: int | None = None, vocab: int | None = None,
         schedules: Iterable[str] | str = DEFAULT_SCHEDULES, microbatch_sizes: Sequence[int] | None = None,
         tp: Sequence[int] | None = None, pp: Sequence[int] | None = None, min_pp: int = 2,
         distributed_optimizer: bool | str = True, flash_attention: bool = True,
         allocator: "AllocatorMargin | str | None" = "replay", reserve_gb: float = 0.0, dp_gbs: float = 25.0,
         p2p_gbs: float | None = None, gpus_per_node: int = 8, exhaustive: bool = False, top: int = 1,
         progress: bool = True, layer_split: str = "auto", ep: Sequence[int] | None = None,
         recompute: "Sequence[str] | str" = "auto", nvlink_gbs: float = 150.0, ib_gbs: float = 25.0,
         offload: "Sequence[float | str] | str | float" = "none", host_gbs: float | None = None):
    """Rank every configuration of ``model`` on ``gpus`` GPUs of ``gpu_memory_gb`` GB by predicted
    throughput (see the module doc); returns a pandas DataFrame (:data:`COLUMNS`, best first;
    ``df.attrs``: ``settings``, ``assumptions``, ``notes``, ``skipped``, ``seconds``, ``builds``).

    Args:
        model: a paper preset (``"9.6b"``, ``"21b"``, ``"38.5b"``, ``"98.5b"``), a
            :class:`~ctrlmem.planner.ModelSpec`, or ``None`` / ``"custom"`` with ``layers``,
            ``hidden``, ``heads`` (``vocab``, ``seq_len`` optional; they also override a preset's).
        gpus, gpu_memory_gb: the cluster.
        global_batch: sequences per step (default: the paper's for its presets).
        costs: ``"a100"`` (the paper's A100 cost model), ``"h200"`` (the shipped H200 rank
            replay), a ``ctrlmem replay`` file, ``"F,B,W[,HOP]"`` per-layer seconds, or a CostSource.
        schedules: names; ``NAME@X`` fixes a budgeted generator's limit (``"zb@1.0"`` is ZB-1P).
        microbatch_sizes, tp, pp: candidates (default: the cost source's microbatch sizes; TP 1,
            2, 4, 8 within a node; every PP ≥ ``min_pp`` that divides).
        distributed_optimizer: ``True``, ``False`` or ``"both"``.
        flash_attention: activation 34·h bytes per layer and token instead of 34·h + 5·heads·s
            (A100 and per-layer sources; a replay measures its own).
        allocator: ``"replay"`` (measured on the shipped H200 replay), a replay file path, an
            :class:`~ctrlmem.planner.AllocatorMargin`, or ``None`` for none.
        reserve_gb: memory per GPU set aside for the CUDA context, NCCL buffers, fragmentation.
        dp_gbs, p2p_gbs: data-parallel and pipeline-hop bandwidth, GB/s.
        exhaustive: simulate every configuration that fits (else skip those whose no-bubble
            bound cannot beat their schedule's ``top``-th best; they are marked ``bounded``).
        top: how many configurations per schedule are guaranteed simulated and ranked exactly
            (the best ``top`` of each schedule; default 1).
        progress: show a progress bar when the search takes more than a second.
        layer_split: ``"balanced"`` (search the layers per stage that balance the busiest
            device, embedding and LM head included), ``"even"`` (torchtitan's rule) or ``"auto"``
            (balanced for a config model, even for the paper's presets, as the paper ran them).
        ep: expert-parallel candidates for an MoE model (default: every degree dividing the
            experts and DP × TP).
        recompute: levers among ``"none"``, ``"selective"``, ``"full"`` (a list or comma-separated);
            ``"auto"``: none and full for a config model (selective too without FlashAttention),
            none for the paper's presets.
        nvlink_gbs, ib_gbs: per-GPU bandwidth of the MoE all-to-all within a node of
            ``gpus_per_node`` and across nodes, GB/s.
        offload: activation-offload levers: fractions in (0, 1] of every forward's activation
            copied to host after it and reloaded before its backward, and ``"none"`` (a list or
            comma-separated; default ``"none"``).
        host_gbs: the host link's GB/s per direction the copies take (default: the GPU kind's,
            :data:`~ctrlmem.planner.sources.HOST_LINK_GBS`).
    """
    import pandas as pd  # noqa: PLC0415 - pandas takes ~0.4 s to import; only tables need it

    spec = model_spec(model, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len)
    gpus = _positive_int("gpus", gpus, MAX_GPUS)
    try:
        gpu_memory_gb = number("gpu_memory_gb", gpu_memory_gb, positive=True, maximum=MAX_GPU_MEMORY_GB, what="GB")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    exhaustive, flash_attention, progress = (flag(k, v) for k, v in (
        ("exhaustive", exhaustive), ("flash_attention", flash_attention), ("progress", progress)))
    if not isinstance(schedules, (str, Iterable)) or isinstance(schedules, (bytes, dict)):
        raise ValueError(f"schedules must be names (a list, or one comma-separated text), got "
                         f"{type(schedules).__name__} {short_repr(schedules)}")
    note = ""
    if global_batch is None:
        global_batch, note = default_global_batch(spec)
    global_batch = _positive_int("global_batch", global_batch)
    source = cost_source(costs, p2p_gbs=p2p_gbs)
    choices = parse_schedules(schedules)
    mbs = _int_list("microbatch_sizes", microbatch_sizes, global_batch) if microbatch_sizes is not None else \
        list(source.microbatch_sizes(spec))
    gpus_per_node = _positive_int("gpus_per_node", gpus_per_node, MAX_GPUS)
    tps = _int_list("tp", tp, gpus) if tp is not None else [t for t in (1, 2, 4, 8) if t <= gpus_per_node]
    bad = [t for t in tps if not source.tp_allowed(t)]
    if bad:
        raise ValueError(f"tp {bad}: this cost source prices TP {sorted(paper.FIG12_SINGLE_PASS_MFU)} only "
                         "(Fig. 12's efficiency)")
    bad = [t for t in tps if spec.heads % t or spec.hidden % t or spec.kv_heads_ % t]
    if bad and tp is not None:
        raise ValueError(f"tp {bad} does not divide the {spec.heads} heads / hidden {spec.hidden} of {spec.name}")
    wide = [t for t in tps if t > gpus_per_node]
    if wide and tp is not None:
        raise ValueError(f"tp {wide} is more than the {gpus_per_node} GPUs of a node; tensor parallelism stays "
                         "within a node (raise gpus_per_node / --gpus-per-node if yours has more)")
    skipped = [f"TP {t} does not divide the {spec.heads} heads" for t in bad]
    tps = [t for t in tps if t not in bad]
    if not tps:
        raise ValueError(f"no tensor-parallel degree in 1, 2, 4, 8 divides the {spec.heads} heads of {spec.name}; give "
                         "tp explicitly")
    pps = _int_list("pp", pp, gpus) if pp is not None else None
    split, eps, levers = _dimensions(spec, layer_split, ep, recompute, flash_attention)
    offloads = offload_levers(offload)
    if host_gbs is not None and (isinstance(host_gbs, bool) or not isinstance(host_gbs, (int, float))
                                 or not math.isfinite(host_gbs) or host_gbs <= 0):
        raise ValueError(f"host_gbs must be a positive number of GB/s, got {host_gbs!r}")
    for name, x in (("nvlink_gbs", nvlink_gbs), ("ib_gbs", ib_gbs)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"{name} must be a positive number of GB/s, got {x!r}")
    min_pp = _positive_int("min_pp", min_pp)
    if distributed_optimizer not in (True, False, "both"):
        raise ValueError(f"distributed_optimizer must be True, False or 'both', got {distributed_optimizer!r}")
    try:
        reserve_gb = number("reserve_gb", reserve_gb, minimum=0.0, maximum=MAX_GPU_MEMORY_GB, what="GB")
        dp_gbs = number("dp_gbs", dp_gbs, positive=True, maximum=1e9, what="GB/s")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if allocator is None:
        margin = AllocatorMargin()
    elif isinstance(allocator, AllocatorMargin):
        margin = allocator
    elif allocator == "replay":
        margin = AllocatorMargin.from_replay()
    else:
        margin = AllocatorMargin.from_replay(allocator)
    planner = Planner(model=spec, gpus=gpus, gpu_memory_gb=gpu_memory_gb, global_batch=global_batch, source=source,
                      schedules=choices, microbatch_sizes=mbs, tp=tps, pp=pps, min_pp=min_pp,
                      distributed_optimizer=distributed_optimizer, flash_attention=bool(flash_attention),
                      margin=margin, reserve_gb=reserve_gb, dp_gbs=dp_gbs, gpus_per_node=gpus_per_node,
                      batch_note=note, split=split, ep=eps, recompute=levers, nvlink_gbs=nvlink_gbs, ib_gbs=ib_gbs,
                      offload=offloads, host_gbs=host_gbs)
    planner.skipped += skipped
    before = cache_info()
    top = _positive_int("top", top)
    rows = planner.run(exhaustive=exhaustive, progress=progress, top=top)
    if not rows:
        why = "; ".join(sorted(set(planner.skipped))[:3]) or "no DP × TP × PP factorization"
        raise ValueError(f"no configuration to plan for {gpus} GPUs and a global batch of {global_batch}: {why}; "
                         "change --microbatch-sizes / --tp / --pp / --global-batch")
    after = cache_info()
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = math.nan
    df = _rank(df)
    settings = {
        "model": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(spec).items()},
        "gpus": gpus, "gpu_memory_gb": float(gpu_memory_gb), "global_batch": global_batch,
        "costs": source.spec(), "costs_description": source.describe(), "gpu": source.gpu,
        "schedules": [c.label for c in choices], "microbatch_sizes": mbs, "tp": tps, "pp": pps, "min_pp": min_pp,
        "distributed_optimizer": distributed_optimizer, "flash_attention": bool(flash_attention),
        "allocator": margin.spec(), "reserve_gb": float(reserve_gb), "dp_gbs": float(dp_gbs),
        "p2p_gbs": source.p2p_bytes_per_s / 1e9, "gpus_per_node": gpus_per_node, "exhaustive": exhaustive,
        "top": top, "layer_split": split, "ep": eps, "recompute": levers, "nvlink_gbs": float(nvlink_gbs),
        "ib_gbs": float(ib_gbs), "offload": offloads, "host_gbs": planner.host_gbs,
        "model_params": spec.num_params, "model_active_params": spec.num_active_params,
    }
    df.attrs.update({
        "settings": settings,
        "assumptions": planner.assumptions(),
        "skipped": sorted(set(planner.skipped)),
        "seconds": planner.seconds,
        "builds": after["builds"] - before["builds"],
        "build_hits": after["hits"] - before["hits"],
        "build_s": after["build_s"] - before["build_s"],
    })
    df.attrs["notes"] = insights(df)
    log.info("plan: %d rows, %d fit, %.2f s, %d builds (%d reused)", len(df), int(df["fits"].fillna(False).sum()),
             planner.seconds, df.attrs["builds"], df.attrs["build_hits"])
    return df


def _dimensions(spec: ModelSpec, layer_split, ep, recompute, flash: bool):
    """(split, EP candidates, recompute levers) from :func:`plan`'s arguments."""
    if layer_split not in ("auto", "balanced", "even"):
        raise ValueError(f"layer_split must be 'auto', 'balanced' or 'even', got {layer_split!r}")
    split = ("balanced" if spec.arch != "gpt" else "even") if layer_split == "auto" else layer_split
    eps = _int_list("ep", ep) if ep is not None else None
    if eps and not spec.experts and eps != [1]:
        raise ValueError(f"ep {eps}: {spec.name} has no experts; expert parallelism applies to MoE models only")
    if isinstance(recompute, str) and recompute != "auto":
        recompute = [x.strip() for x in recompute.split(",") if x.strip()]
    if recompute == "auto":
        levers = ["none"] if spec.arch == "gpt" else ["none", "full"] + ([] if flash else ["selective"])
    else:
        levers = [str(x) for x in recompute]
        bad = [x for x in levers if x not in RECOMPUTE]
        if bad or not levers:
            raise ValueError(f"recompute {bad or levers!r}: choose among {', '.join(RECOMPUTE)} (or 'auto')")
    return split, eps, list(dict.fromkeys(levers))


def offload_levers(value) -> list[float]:
    """``offload=`` of :func:`plan` as fractions (0.0 for ``none``): ``"none,0.5,1"``, a list, or
    one value; a ``ValueError`` naming the bad entry otherwise."""
    items = [x.strip() for x in value.split(",")] if isinstance(value, str) else (
        list(value) if isinstance(value, (list, tuple)) else [value])
    out = []
    for x in items:
        if x in ("none", None, 0, 0.0, "0"):
            out.append(0.0)
            continue
        try:
            f = float(x) if not isinstance(x, bool) else math.nan
        except (TypeError, ValueError):
            f = math.nan
        if not 0 < f <= 1:
            raise ValueError(f"offload {x!r}: give none or a fraction in (0, 1] of each forward's activation "
                             "(e.g. none,0.5,1)")
        out.append(f)
    if not out:
        raise ValueError("offload is empty; give none or fractions in (0, 1] (e.g. none,0.5,1)")
    return list(dict.fromkeys(out))


def _rank(df):

    status_order = {"ok": 0, "bounded": 1, "does not fit": 2, "m < pp": 3, "too many stages": 4}
    df = df.copy()
    df["_s"] = df["status"].map(status_order).fillna(9)
    df["_sp"] = -df["samples_per_s"].fillna(-1.0)
    df["_ub"] = -df["upper_bound_samples_per_s"].fillna(-1.0)
    df["_tot"] = df["total_gb"].fillna(np.inf)
    df = df.sort_values(["_s", "_sp", "_ub", "_tot", "_order"], kind="mergesort").reset_index(drop=True)
    ok = df["status"] == "ok"
    df["rank"] = np.where(ok, np.cumsum(ok), np.nan)
    df["fits"] = df["fits"].astype(bool)
    return df.drop(columns=["_s", "_sp", "_ub", "_tot", "_order"])[COLUMNS]


def _row_text(r) -> str:
    return (f"{r['method']} at DP {r['dp']}, TP {r['tp']}, PP {r['pp']}, microbatch {r['microbatch_size']}"
            + (f" (m = {r['m']})" if "m" in r else ""))


def insights(df) -> list[str]:
    """What the ranking says, in words: the winner, the best 1F1B row, and whether a V schedule's
    memory saving buys a larger microbatch (or why not)."""
    notes: list[str] = []
    ok = df[df["status"] == "ok"]
    if ok.empty:
        need = df["total_gb"].min()
        notes.append(f"nothing fits: the smallest configuration needs {need:.1f} GB per GPU" if need == need
                     else "nothing fits")
        return notes
    win = ok.iloc[0]
    notes.append(f"fastest: {_row_text(win)}, {win['samples_per_s']:.3g} samples/s"
                 + (f", MFU {100 * win['mfu']:.1f} %" if win["mfu"] == win["mfu"] else "")
                 + f", {win['total_gb']:.1f} of {win['gpu_memory_gb']:g} GB")
    one = ok[ok["schedule"] == "1f1b"]
    if not one.empty:
        b = one.iloc[0]
        notes.append(f"best 1F1B: {_row_text(b)}, {b['samples_per_s']:.3g} samples/s; the winner is "
                     f"{win['samples_per_s'] / b['samples_per_s']:.3f}× faster")
    vrows = ok[ok["placement"] == "v-shape"]
    if vrows.empty:
        return notes
    v = vrows.iloc[0]
    same = df[(df["schedule"] == "1f1b") & (df["dp"] == v["dp"]) & (df["tp"] == v["tp"]) & (df["pp"] == v["pp"])
              & (df["dist_opt"] == v["dist_opt"]) & (df["ep"] == v["ep"]) & (df["recompute"] == v["recompute"])]
    at = same[same["microbatch_size"] == v["microbatch_size"]]
    fit_mb = same[same["fits"]]["microbatch_size"]
    lead = "first" if v.name == win.name else f"best V row ({_row_text(v)}, {v['samples_per_s']:.3g} samples/s)"
    if not at.empty and not bool(at.iloc[0]["fits"]):
        largest = int(fit_mb.max()) if not fit_mb.empty else None
        notes.append(f"the V schedule ranks {lead}: its memory saving buys microbatch {v['microbatch_size']} at DP "
                     f"{v['dp']}, TP {v['tp']}, PP {v['pp']}, where 1F1B needs {at.iloc[0]['total_gb']:.1f} GB > "
                     f"{v['gpu_memory_gb']:g} GB"
                     + (f" (1F1B fits microbatch {largest} at most there)" if largest else
                        " (1F1B fits no microbatch there)"))
    elif not at.empty:
        o = at.iloc[0]
        more = (f"; it holds more activation than 1F1B there ({v['activation_gb']:.1f} against {o['activation_gb']:.1f} "
                f"GB, a budget of {v['memory_limit']:.3g} × 1F1B's peak), so the spare memory buys it a smaller bubble, "
                "not a larger microbatch" if v["activation_gb"] > o["activation_gb"] + 1e-9 and isinstance(
                    v["memory_limit"], (int, float)) and v["memory_limit"] == v["memory_limit"] else "")
        if o["status"] == "ok":
            notes.append(f"V ranks {lead}; its memory saving buys no larger microbatch here: 1F1B fits the same "
                         f"configuration too ({o['total_gb']:.1f} of {v['gpu_memory_gb']:g} GB), so memory is not "
                         f"binding and the V schedule {'wins by its smaller bubble' if v.name == win.name else 'is not ahead'}"
                         f" (bubble {v['bubble_rate']:.3f} against 1F1B's {o['bubble_rate']:.3f}){more}")
        else:
            notes.append(f"V ranks {lead}; 1F1B fits the same configuration too ({o['total_gb']:.1f} GB), so memory is "
                         f"not binding there{more}")
    return notes


def row_schedule(df, index: int = 0):
    """The :class:`ctrlmem.Schedule` of row ``index`` of a plan (its cost-adapted build, from the
    cache or built again; with its ``R`` passes where the row recomputes with a split backward),
    and the per-stage ``Costs`` (ms) it was simulated with. Its memory model in GB is
    :func:`row_memory`'s."""
    sched, costs, _ = _row_parts(df, index)
    return sched, costs


def row_memory(df, index: int = 0) -> tuple[MemoryModel, float]:
    """The memory model (GB per stage) row ``index`` was simulated with, and the GB added to every
    simulated peak (one rematerialised layer where the recomputation is folded into ``B``):
    ``cm.simulate(*row_schedule(df, i), row_memory(df, i)[0])`` gives the row's activation peaks
    before that addition."""
    _, _, rm = _row_parts(df, index)
    return rm.memory, rm.extra_gb


def _row_parts(df, index: int):

    s = df.attrs["settings"]
    row = df.iloc[index]
    if row["status"] in ("m < pp", "too many stages"):
        raise ValueError(f"row {index} ({row['schedule']}, {row['status']}) has no schedule")
    spec = ModelSpec(**{k: v for k, v in s["model"].items()})
    source = _cs(s["costs"])
    margin = AllocatorMargin(**s["allocator"])
    planner = Planner(model=spec, gpus=s["gpus"], gpu_memory_gb=s["gpu_memory_gb"], global_batch=s["global_batch"],
                      source=source, schedules=parse_schedules(s["schedules"]), microbatch_sizes=s["microbatch_sizes"],
                      tp=s["tp"], pp=s["pp"], min_pp=s["min_pp"], distributed_optimizer=s["distributed_optimizer"],
                      flash_attention=s["flash_attention"], margin=margin, reserve_gb=s["reserve_gb"],
                      dp_gbs=s["dp_gbs"], gpus_per_node=s["gpus_per_node"], split=s.get("layer_split", "even"),
                      ep=s.get("ep"), recompute=s.get("recompute", ["none"]), nvlink_gbs=s.get("nvlink_gbs", 150.0),
                      ib_gbs=s.get("ib_gbs", 25.0), host_gbs=s.get("host_gbs"))
    name = str(row["schedule"]).partition("@")[0]
    kind, v = placement_of(name)
    ep = int(row["ep"]) if "ep" in row and row["ep"] == row["ep"] else 1
    rc = str(row["recompute"]) if "recompute" in row and isinstance(row["recompute"], str) else "none"
    lay = planner.layout(kind, v, int(row["pp"]), int(row["tp"]), int(row["microbatch_size"]), ep, rc)
    limit = row["memory_limit"]
    limit = None if limit is None or (isinstance(limit, float) and math.isnan(limit)) else float(limit)
    choice = ScheduleChoice(name, None if str(row["schedule"]) == name else limit)
    rm = planner.row_model(lay, choice)
    sched, _ = _build(name, int(row["pp"]), int(row["m"]), rm.build_costs, limit, rm.recompute, rm.levered_search)
    off = float(row["offload"]) if "offload" in row and row["offload"] == row["offload"] else 0.0
    costs = planner.sim_costs(lay, off, name, rm.costs)
    return _offloaded(sched, off, costs, rm.memory), costs, rm
