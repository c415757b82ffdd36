"""Where the planner's pass times, activation bytes and allocator margin come from.

Three cost sources, each pricing one transformer layer's ``F``, ``B`` and ``W`` for one
microbatch on one GPU, the LM head on the last stage, the embedding on the first, and one
pipeline hop; each says what it assumed (:meth:`CostSource.assumptions`):

* :class:`A100Costs` — the A100 cost model of :mod:`ctrlmem.model.paper` (FLOPs at 65 % of the A100's
  peak, Fig. 12's efficiency for tensor parallelism).
* :class:`ReplayCosts` — the pass times a ``ctrlmem replay`` measured (the shipped H200 file by
  default): per-layer ``F``, ``B``, ``W`` of the replayed interior stages at each replayed
  microbatch size, the LM head and the embedding as the last / first stage's time minus its
  layers', and the activation bytes per layer and token from 1F1B's peak on an interior device.
* :class:`LayerCosts` — explicit per-layer ``F``, ``B``, ``W`` per sequence and a hop latency.

:class:`AllocatorMargin` is the measured allocator margin over the schedule's activation theory
(read from a rank-replay file; the shipped H200 one by default).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrlmem.model import paper
from ctrlmem.planner import arch
from ctrlmem.util.checks import short_repr
from ctrlmem.planner.model import ModelSpec, layer_activation_formula, runtime_stage_layers, stage_layers
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.model.replayfile import default_replay_path, gpu_label, load_replay

__all__ = ["CostSource", "A100Costs", "ReplayCosts", "LayerCosts", "AllocatorMargin", "cost_source",
           "GPU_PEAK_FLOPS", "HOST_LINK_GBS", "DEFAULT_HOST_GBS", "REPLAY_VOCAB", "DEFAULT_P2P_BYTES_PER_S"]

GPU_PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}
HOST_LINK_GBS = {"A100": 25.0, "H100": 50.0, "H200": 50.0}
"""Device-to-host bandwidth per GPU and direction, GB/s, that an activation offload copies at:
what a pinned ``cudaMemcpyAsync`` sustains on the GPU's PCIe link (A100: PCIe 4.0 x16, 32 GB/s
peak; H100/H200: PCIe 5.0 x16, 64 GB/s peak), about 80 % of peak; ``scripts/gpu-check.sh``
measures it on a lent GPU, ``--host-gbs`` sets it."""
DEFAULT_HOST_GBS = 25.0
"""The host-link bandwidth for a GPU not in :data:`HOST_LINK_GBS` (PCIe 4.0 x16 sustained)."""
"""Dense bf16 tensor-core peak per GPU, FLOP/s (NVIDIA's data sheets; A100 as in
:data:`ctrlmem.model.paper.A100_PEAK_FLOPS`): the MFU denominator."""

REPLAY_VOCAB = 50304
"""Vocabulary of the models ``ctrlmem replay`` runs (``ctrlmem.runtime.models.PRESETS``; a test
checks it), used to turn the replay's LM-head bytes into bytes per logit."""

DEFAULT_P2P_BYTES_PER_S = paper.ASSUMED_P2P_BYTES_PER_S
"""Pipeline hop bandwidth (25 GB/s, RDMA; the A100 cost model's assumption)."""


def _flops_kinds(h: int, s: int) -> tuple[float, float, float]:
    return paper.layer_flops(h, s)


def _layer_flops(spec: ModelSpec) -> tuple[float, float, float]:
    """(F, B, W) FLOPs per token of the model's most common layer."""
    if spec.arch == "gpt":
        return _flops_kinds(spec.hidden, spec.seq_len)
    shapes = spec.layer_shapes()
    kinds = {sh.kind: sh for sh in shapes}
    common = max(kinds, key=lambda k: sum(sh.kind == k for sh in shapes))
    return arch.layer_flops_per_token(spec, kinds[common])


def _head_ratio(spec: ModelSpec) -> tuple[float, float, float]:
    """LM head FLOPs over one layer's, per pass kind (``2·h·V`` each for F, B, W)."""
    head = 2.0 * spec.hidden * spec.vocab
    return tuple(head / x for x in _layer_flops(spec))  # type: ignore[return-value]


class CostSource:
    """Prices passes of one model (see the module doc). Times in seconds, per GPU, for one
    microbatch of ``mb`` sequences under tensor parallelism ``tp``."""

    label = "costs"
    gpu = "GPU"

    def layer(self, spec: ModelSpec, mb: int, tp: int) -> tuple[float, float, float]:
        raise NotImplementedError

    def layer_costs(self, spec: ModelSpec, mb: int, tp: int) -> list[tuple[float, float, float]]:
        """(F, B, W) seconds of every layer: :meth:`layer` for the paper's GPT model; for a config
        model :meth:`layer` is its most common layer kind and the others scale by their FLOPs."""
        base = self.layer(spec, mb, tp)
        if spec.arch == "gpt":
            return [base] * spec.num_layers
        shapes = spec.layer_shapes()
        flops = {sh.kind: arch.layer_flops_per_token(spec, sh) for sh in shapes}
        common = max(flops, key=lambda k: sum(sh.kind == k for sh in shapes))
        ref = flops[common]
        scaled = {k: tuple(x * f / r for x, f, r in zip(base, v, ref)) for k, v in flops.items()}
        return [scaled[sh.kind] for sh in shapes]

    def head(self, spec: ModelSpec, mb: int, tp: int) -> tuple[float, float, float]:
        """The LM head (and loss) on the last stage, on top of its layers."""
        f, b, w = self.layer(spec, mb, tp)
        rf, rb, rw = _head_ratio(spec)
        return f * rf, b * rb, w * rw

    def embedding(self, spec: ModelSpec, mb: int, tp: int) -> tuple[float, float, float]:
        """The embedding on the first stage, on top of its layers (0 unless measured)."""
        return 0.0, 0.0, 0.0

    def hop(self, spec: ModelSpec, mb: int, tp: int) -> float:
        """One pipeline hop: ``2·mb·s·h / tp`` bf16 bytes at the P2P bandwidth."""
        return 2.0 * mb * spec.seq_len * spec.hidden / tp / self.p2p_bytes_per_s

    p2p_bytes_per_s: float = DEFAULT_P2P_BYTES_PER_S

    def layer_activation(self, spec: ModelSpec, flash_attention: bool) -> float:
        """Activation bytes per layer and token (before tensor parallelism)."""
        return layer_activation_formula(spec, flash_attention)

    def activation_note(self, spec: ModelSpec, flash_attention: bool) -> str:
        if spec.arch != "gpt":
            per = [arch.activation_per_token(spec, sh, flash_attention) for sh in spec.layer_shapes()]
            return (f"activation per layer and token counted from the config ({min(per) / spec.hidden:.1f}·h to "
                    f"{max(per) / spec.hidden:.1f}·h bytes: norms, QKV, attention output, MLP intermediates"
                    + (", routed copies" if spec.experts else "") + "; ctrlmem.planner.arch)"
                    + ("" if flash_attention else " with the s × s softmax output"))
        return ("activation per layer and token 34·h + 5·heads·s bytes (docs/theory.md §10)" if not flash_attention
                else "activation per layer and token 34·h bytes (FlashAttention: no s × s scores; docs/theory.md §10)")

    def tp_allowed(self, tp: int) -> bool:
        return tp in paper.FIG12_SINGLE_PASS_MFU

    def microbatch_sizes(self, spec: ModelSpec) -> tuple[int, ...]:
        return (1, 2, 4, 8)

    def peak_flops(self) -> float | None:
        """The GPU's dense bf16 peak (:data:`GPU_PEAK_FLOPS`, matched in its name), or ``None``."""
        for name, flops in GPU_PEAK_FLOPS.items():
            if re.search(rf"\b{name}\b", self.gpu):
                return flops
        return None

    def host_gbs(self) -> tuple[float, str]:
        """(GB/s, where it comes from) of the GPU's host link (:data:`HOST_LINK_GBS`, matched in
        its name; :data:`DEFAULT_HOST_GBS` otherwise)."""
        for name, gbs in HOST_LINK_GBS.items():
            if re.search(rf"\b{name}\b", self.gpu):
                return gbs, f"{name}'s PCIe link, sustained"
        return DEFAULT_HOST_GBS, f"PCIe 4.0 x16 sustained (no figure for {self.gpu})"

    def describe(self) -> str:
        return self.label

    def assumptions(self, spec: ModelSpec) -> list[str]:
        return []

    def spec(self) -> dict:
        """What :func:`cost_source` needs to make this source again (JSON)."""
        raise NotImplementedError


def _tp_factor(tp: int) -> float:
    """Time of a pass under tensor parallelism ``tp`` over its time on one GPU: ``1/tp`` at
    Fig. 12(a)'s single-pass MFU ratio."""
    if tp not in paper.FIG12_SINGLE_PASS_MFU:
        raise ValueError(f"tp must be one of {sorted(paper.FIG12_SINGLE_PASS_MFU)} (Fig. 12 gives the efficiency of "
                         f"those only), got {tp}")
    return paper.FIG12_SINGLE_PASS_MFU[1] / paper.FIG12_SINGLE_PASS_MFU[tp] / tp


@dataclass
class A100Costs(CostSource):
    """The A100 cost model of :mod:`ctrlmem.model.paper` (:func:`ctrlmem.model.paper.pass_times`)."""

    p2p_bytes_per_s: float = DEFAULT_P2P_BYTES_PER_S
    label = "A100 cost model"
    gpu = "A100"

    def layer(self, spec, mb, tp):
        eff = paper.tp_efficiency(tp)
        if spec.arch != "gpt":
            rate = paper.A100_PEAK_FLOPS * eff * tp
            return tuple(mb * spec.seq_len * x / rate for x in _layer_flops(spec))
        f, b, w = paper.pass_times(spec.preset, 1, mb, spec.seq_len, eff, vocab=spec.vocab)
        return f / tp, b / tp, w / tp

    def head(self, spec, mb, tp):
        eff = paper.tp_efficiency(tp)
        if spec.arch != "gpt":
            x = mb * spec.seq_len * 2.0 * spec.hidden * spec.vocab / (paper.A100_PEAK_FLOPS * eff * tp)
            return x, x, x
        f, b, w = paper.pass_times(spec.preset, 0, mb, spec.seq_len, eff, vocab=spec.vocab, head_share=1.0)
        return f / tp, b / tp, w / tp

    def describe(self):
        return (f"A100 cost model (ctrlmem.model.paper: FLOPs at {paper.DEFAULT_EFFICIENCY:.0%} of the A100's "
                f"{paper.A100_PEAK_FLOPS / 1e12:.0f} TFLOP/s)")

    def assumptions(self, spec):
        if spec.arch != "gpt":
            f, b, w = _layer_flops(spec)
            return [f"pass times: FLOPs counted from the config ({spec.name}'s most common layer: F {f / 1e9:.3g}, B "
                    f"{b / 1e9:.3g}, W {w / 1e9:.3g} GFLOP per token — 2 per matrix parameter a token goes through, "
                    "the attention core 4·s·q for F and 8·s·q for B; other layer kinds by their own count), the LM "
                    f"head 2hV each, at {paper.DEFAULT_EFFICIENCY:.0%} of the A100's "
                    f"{paper.A100_PEAK_FLOPS / 1e12:.0f} TFLOP/s; tensor parallelism at Fig. 12(a)'s single-pass MFU "
                    "ratio; linear in the microbatch size"]
        return [
            f"pass times: the A100 cost model of ctrlmem.model.paper — per layer and token F = 24h² + 4sh, B = 24h² + 8sh, "
            f"W = 24h² FLOPs, the LM head 2hV each, at {paper.DEFAULT_EFFICIENCY:.0%} of the A100's "
            f"{paper.A100_PEAK_FLOPS / 1e12:.0f} TFLOP/s (Table 5's FBW MFU); tensor parallelism divides a pass by tp "
            f"at Fig. 12(a)'s single-pass MFU ratio (TP 2/4/8: "
            + ", ".join(f"{paper.tp_efficiency(t) / paper.DEFAULT_EFFICIENCY:.3f}" for t in (2, 4, 8))
            + " of TP 1's efficiency); pass time is linear in the microbatch size (no small-microbatch penalty)",
        ]

    def spec(self):
        return {"kind": "a100", "p2p_bytes_per_s": self.p2p_bytes_per_s}


@dataclass
class LayerCosts(CostSource):
    """Explicit per-layer pass times: ``f``, ``b``, ``w`` seconds per layer per sequence on one
    GPU at TP 1, and ``hop`` seconds per pipeline hop. Times scale linearly with the microbatch
    size; the LM head is priced at its FLOP ratio to a layer; ``peak_tflops`` (per GPU) gives MFU."""

    f: float = 0.0
    b: float = 0.0
    w: float = 0.0
    hop_s: float = 0.0
    peak_tflops: float | None = None
    label = "given per-layer costs"
    gpu = "GPU"

    def __post_init__(self) -> None:
        for name in ("f", "b", "w", "hop_s"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise ValueError(f"per-layer costs: {name} must be a number >= 0 (seconds), got {x!r}")
        if self.f + self.b + self.w <= 0:
            raise ValueError("per-layer costs: f + b + w must be > 0 (seconds per layer per sequence)")
        if self.peak_tflops is not None and not (isinstance(self.peak_tflops, (int, float)) and self.peak_tflops > 0):
            raise ValueError(f"peak_tflops must be a positive number, got {self.peak_tflops!r}")

    def layer(self, spec, mb, tp):
        k = mb * _tp_factor(tp)
        return self.f * k, self.b * k, self.w * k

    def hop(self, spec, mb, tp):
        return self.hop_s

    def peak_flops(self):
        return self.peak_tflops * 1e12 if self.peak_tflops else None

    def describe(self):
        return (f"given per-layer costs (F, B, W = {self.f:g}, {self.b:g}, {self.w:g} s per layer and sequence, "
                f"hop {self.hop_s:g} s)")

    def assumptions(self, spec):
        return [f"pass times: the given per-layer F, B, W ({self.f:g}, {self.b:g}, {self.w:g} s per sequence at TP 1), "
                "linear in the microbatch size; the LM head at its FLOP ratio to a layer; tensor parallelism at "
                "Fig. 12(a)'s single-pass MFU ratio; one pipeline hop takes the given "
                f"{self.hop_s:g} s"
                + ("" if self.peak_tflops else "; no GPU peak given, so no MFU (peak_tflops / --peak-tflops)")]

    def spec(self):
        return {"kind": "layers", "f": self.f, "b": self.b, "w": self.w, "hop_s": self.hop_s,
                "peak_tflops": self.peak_tflops}


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _parse(pattern: str, text: str, default=None):
    m = re.search(pattern, text or "")
    return type(default)(m.group(1)) if m and default is not None else (m.group(1) if m else default)


def _chunks(schedule: str) -> int:
    """Stages per device of a registered schedule (from a small build)."""

    if schedule not in SCHEDULES:
        raise ValueError(f"replay row names schedule {schedule!r}, which is not registered here")
    spec = SCHEDULES[schedule]
    kw = {"memory_limit": 1.0} if spec.memory_limit else {}
    return build(schedule, 2, 4, **kw).placement.num_chunks


@dataclass
class _Measured:
    """One model's measurements from a replay file."""

    layer: dict[int, tuple[float, float, float]]      # microbatch -> per-layer F, B, W (s)
    head: dict[int, tuple[float, float, float]]       # microbatch -> LM head F, B, W (s)
    embedding: dict[int, tuple[float, float, float]]  # microbatch -> embedding F, B, W (s)
    act_per_layer_token: float | None                 # bytes
    seq_len: int
    hidden: int | None
    rows: int


@dataclass
class ReplayCosts(CostSource):
    """Pass times and activation bytes measured by a rank replay (``ctrlmem replay``; ``path``
    ``None``: the shipped H200 file). Only the models the file replayed can be planned."""

    path: str | None = None
    p2p_bytes_per_s: float = DEFAULT_P2P_BYTES_PER_S
    data: dict = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:

        path = Path(self.path) if self.path is not None else default_replay_path()
        self.data = load_replay(path)
        self.file = path.name if self.path is None else str(path)
        self.gpu = gpu_label(self.data)
        self.label = f"{self.gpu} rank replay"

    # -- reading the file ---------------------------------------------------------------------
    def models(self) -> list[str]:
        return sorted({str(r["model"]) for r in self.data["rows"]})

    def measured(self, spec: ModelSpec) -> _Measured:
        key = spec.name.lower()
        if key in self._cache:
            return self._cache[key]
        rows = [r for r in self.data["rows"] if str(r["model"]).lower() == key]
        if not rows:
            raise ValueError(f"replay file {self.file} has no rows for model {spec.name!r} (it replayed "
                             f"{', '.join(self.models())}); replay it (`ctrlmem replay --model ...`) or plan with "
                             f"the A100 cost model (--costs-from a100)")
        desc = str(self.data.get("models", {}).get(rows[0]["model"], ""))
        layers_total = _parse(r"(\d+) layers", desc, spec.num_layers)
        hidden = _parse(r"h=(\d+)", desc, 0) or None
        if hidden is not None and hidden != spec.hidden:
            raise ValueError(f"replay file {self.file} replayed {rows[0]['model']} with h = {hidden}, but the model "
                             f"planned has h = {spec.hidden}; replay this shape or use another cost source")
        default_mb = _parse(r"mb (\d+)", desc, 1)
        seq = _parse(r"seq (\d+)", str(self.data.get("what", "")), paper.ASSUMED_SEQ_LEN)
        per_layer: dict[int, dict[str, list[float]]] = {}
        ends: dict[str, dict[int, list[tuple[str, float, float, float, bool]]]] = {"head": {}, "embedding": {}}
        act: list[float] = []
        for row in rows:
            p, m = int(row["p"]), int(row["m"])
            S = _chunks(row["schedule"]) * p
            layers = runtime_stage_layers(layers_total, S) or stage_layers(layers_total, S)
            mb = int(row.get("microbatch_size") or default_mb)
            slot = per_layer.setdefault(mb, {"F": [], "B": [], "W": [], "BW": []})
            for stage, passes in row["pass_times_s"].items():
                s = int(stage)
                med = {k: float(v["median"]) for k, v in passes.items()}
                if 0 < s < S - 1 and layers[s] > 0:
                    for k in ("F", "B", "W", "BW"):
                        if k in med:
                            slot[k].append(med[k] / layers[s])
                elif s in (0, S - 1):
                    which = "head" if s == S - 1 else "embedding"
                    item = (row["schedule"], med.get("F", 0.0), med.get("B", med.get("BW", 0.0)),
                            med.get("W", 0.0), "BW" in med, layers[s])
                    ends[which].setdefault(mb, []).append(item)
            if row["schedule"] == "1f1b" and m >= p:
                d = int(row["device"])
                if all(0 < s < S - 1 for s in row["stages"]):
                    inflight = min(p - d, m)  # 1F1B holds p - d microbatches on device d (m >= p)
                    n = sum(layers[s] for s in row["stages"])
                    if n:
                        act.append(float(row["peak_saved_bytes"]) / (inflight * n * mb * seq))
        layer: dict[int, tuple[float, float, float]] = {}
        for mb, slot in per_layer.items():
            if not slot["F"]:
                continue
            f = _median(slot["F"])
            if slot["B"] and slot["W"]:
                b, w = _median(slot["B"]), _median(slot["W"])
            elif slot["BW"]:
                bw = _median(slot["BW"])
                _, fb, fw = _flops_kinds(spec.hidden, seq)
                b, w = bw * fb / (fb + fw), bw * fw / (fb + fw)
            else:
                continue
            layer[mb] = (f, b, w)
        if not layer:
            raise ValueError(f"replay file {self.file} has no interior-stage pass times for {spec.name!r}; replay "
                             "devices 1 … p − 2 too")
        out: dict[str, dict[int, tuple[float, float, float]]] = {"head": {}, "embedding": {}}
        for which, by_mb in ends.items():
            for mb, items in by_mb.items():
                if mb not in layer:
                    continue
                lf, lb, lw = layer[mb]
                split = [x for x in items if not x[4]]
                use = split or items
                fs, bs, ws = [], [], []
                for _, f, b, w, fused, n in use:
                    fs.append(max(0.0, f - n * lf))
                    if fused:
                        both = max(0.0, b - n * (lb + lw))
                        bs.append(both / 2)
                        ws.append(both / 2)
                    else:
                        bs.append(max(0.0, b - n * lb))
                        ws.append(max(0.0, w - n * lw))
                out[which][mb] = (_median(fs), _median(bs), _median(ws))
        meas = _Measured(layer, out["head"], out["embedding"], _median(act) if act else None, seq, hidden, len(rows))
        self._cache[key] = meas
        return meas

    # -- pricing -----------------------------------------------------------------------------
    def _at(self, table: dict[int, tuple[float, float, float]], mb: int) -> tuple[tuple[float, float, float], int]:
        """The measurement at ``mb``, or the nearest measured microbatch scaled linearly."""
        if mb in table:
            return table[mb], mb
        near = min(table, key=lambda x: (abs(math.log(x / mb)), -x))
        k = mb / near
        return tuple(x * k for x in table[near]), near  # type: ignore[return-value]

    def _seq_factor(self, spec: ModelSpec, meas: _Measured) -> tuple[float, float, float]:
        if spec.seq_len == meas.seq_len:
            return 1.0, 1.0, 1.0
        new, old = _flops_kinds(spec.hidden, spec.seq_len), _flops_kinds(spec.hidden, meas.seq_len)
        r = spec.seq_len / meas.seq_len
        return tuple(r * a / b for a, b in zip(new, old))  # type: ignore[return-value]

    def layer(self, spec, mb, tp):
        meas = self.measured(spec)
        (f, b, w), _ = self._at(meas.layer, mb)
        k = _tp_factor(tp)
        sf = self._seq_factor(spec, meas)
        return f * k * sf[0], b * k * sf[1], w * k * sf[2]

    def head(self, spec, mb, tp):
        meas = self.measured(spec)
        if not meas.head:
            return super().head(spec, mb, tp)
        (f, b, w), _ = self._at(meas.head, mb)
        k = _tp_factor(tp) * spec.seq_len / meas.seq_len
        return f * k, b * k, w * k

    def embedding(self, spec, mb, tp):
        meas = self.measured(spec)
        if not meas.embedding:
            return 0.0, 0.0, 0.0
        (f, b, w), _ = self._at(meas.embedding, mb)
        k = _tp_factor(tp) * spec.seq_len / meas.seq_len
        return f * k, b * k, w * k

    def layer_activation(self, spec, flash_attention):
        meas = self.measured(spec)
        return meas.act_per_layer_token if meas.act_per_layer_token else layer_activation_formula(spec, True)

    def activation_note(self, spec, flash_attention):
        meas = self.measured(spec)
        if meas.act_per_layer_token:
            return (f"activation per layer and token {meas.act_per_layer_token:.0f} bytes = "
                    f"{meas.act_per_layer_token / spec.hidden:.2f}·h, measured: 1F1B's autograd-saved peak on the "
                    f"replayed interior devices over its p − d microbatches in flight ({self.file})")
        return "activation per layer and token 34·h bytes (the replay has no interior 1F1B row to measure it)"

    def microbatch_sizes(self, spec):
        return tuple(sorted(self.measured(spec).layer))

    def describe(self):
        return f"pass times measured on {self.gpu} by rank replay ({self.file})"

    def assumptions(self, spec):
        meas = self.measured(spec)
        mbs = ", ".join(str(x) for x in sorted(meas.layer))
        parts = [
            f"pass times: medians measured on {self.gpu} by rank replay ({self.file}, {self.data.get('torch', '')}, "
            f"{self.data.get('pass_time_kind', 'CUDA events')}): per-layer F, B, W of the replayed interior stages "
            f"of {spec.name} at microbatch {mbs} (a stage of n layers costs n times a layer); other microbatch sizes "
            "scale the nearest measured one linearly",
            ("the LM head and the embedding: the last / first stage's measured time minus its layers'"
             if meas.head else "the LM head at its FLOP ratio to a measured layer (the replay did not run the last "
                               "stage); the embedding costs nothing"),
            "tensor parallelism (not measured by the replay): a pass divided by tp at Fig. 12(a)'s single-pass MFU "
            "ratio (A100 readings)",
        ]
        if spec.seq_len != meas.seq_len:
            parts.append(f"sequence length {spec.seq_len} (replayed at {meas.seq_len}): layer times scaled by the "
                         "FLOP ratio per sequence")
        return parts

    def spec(self):
        return {"kind": "replay", "path": self.path, "p2p_bytes_per_s": self.p2p_bytes_per_s}


@dataclass(frozen=True)
class AllocatorMargin:
    """Peak allocated bytes on a GPU from the schedule's activation theory: ``ratio`` × the
    activation, plus ``bytes_per_logit`` × the logits of one microbatch on the device holding the
    LM head, plus ``bytes_per_embedding_param`` × the embedding's parameters on the device
    holding the embedding. ``source`` says where the numbers were measured."""

    ratio: float = 1.0
    bytes_per_logit: float = 0.0
    bytes_per_embedding_param: float = 0.0
    source: str = "none (the schedule's activation theory as it is)"

    def describe(self) -> str:
        if self.ratio == 1.0 and not self.bytes_per_logit and not self.bytes_per_embedding_param:
            return "no allocator margin (activation = the schedule's theory)"
        return (f"allocator margin measured on {self.source}: {self.ratio:.3f} × the schedule's activation, "
                f"+ {self.bytes_per_logit:.1f} bytes per logit of one microbatch on the device holding the LM head, "
                f"+ {self.bytes_per_embedding_param:.2f} bytes per embedding parameter on the device holding the "
                "embedding")

    @classmethod
    def from_replay(cls, path: str | Path | None = None) -> "AllocatorMargin":
        """Fit the three terms on a replay file, each as the largest over its rows: the ratio of
        allocator peak to theory on devices holding neither the embedding nor the head; then the
        bytes per logit left over on devices holding the head but not the embedding; then the
        bytes per embedding parameter left over on devices holding the embedding."""

        p = Path(path) if path is not None else default_replay_path()
        data = load_replay(p, need=("peak_alloc_bytes",))
        inner, head, emb = [], [], []
        for row in data["rows"]:
            S = _chunks(row["schedule"]) * int(row["p"])
            desc = str(data.get("models", {}).get(row["model"], ""))
            mb = int(row.get("microbatch_size") or _parse(r"mb (\d+)", desc, 1))
            seq = _parse(r"seq (\d+)", str(data.get("what", "")), paper.ASSUMED_SEQ_LEN)
            h = _parse(r"h=(\d+)", desc, 0)
            stages = set(row["stages"])
            theory, alloc = float(row["theory_peak_bytes"]), float(row["peak_alloc_bytes"])
            has_head, has_emb = S - 1 in stages, 0 in stages
            if theory <= 0:
                continue
            if not has_head and not has_emb:
                inner.append(alloc / theory)
            else:
                (head if not has_emb else emb).append((alloc, theory, mb * seq * REPLAY_VOCAB, REPLAY_VOCAB * h,
                                                       has_head))
        if not inner:
            raise ValueError(f"replay file {p}: no device without the embedding or the head, so no allocator ratio")
        ratio = max(inner)
        per_logit = max([max(0.0, (a - ratio * t) / n) for a, t, n, _, _ in head] or [0.0])
        per_param = max([max(0.0, (a - ratio * t - (per_logit * n if hh else 0.0)) / e) for a, t, n, e, hh in emb
                         if e] or [0.0])
        where = f"{gpu_label(data)} by rank replay ({p.name if path is None else p}, {len(data['rows'])} devices)"
        return cls(ratio, per_logit, per_param, where)

    def spec(self) -> dict:
        return {"ratio": self.ratio, "bytes_per_logit": self.bytes_per_logit,
                "bytes_per_embedding_param": self.bytes_per_embedding_param, "source": self.source}


def cost_source(value: Any = "a100", *, p2p_gbs: float | None = None) -> CostSource:
    """A :class:`CostSource` from ``"a100"``, ``"h200"`` (the shipped replay), a replay file's
    path, ``"F,B,W[,HOP]"`` per-layer seconds, a ``{"kind": ...}`` spec (:meth:`CostSource.spec`)
    or a CostSource. ``p2p_gbs`` sets the hop bandwidth (GB/s) of the A100 / replay sources."""
    bw = DEFAULT_P2P_BYTES_PER_S if p2p_gbs is None else float(p2p_gbs) * 1e9
    if p2p_gbs is not None and not (math.isfinite(bw) and bw > 0):
        raise ValueError(f"p2p_gbs must be a positive number of GB/s, got {p2p_gbs!r}")
    if isinstance(value, CostSource):
        return value
    if isinstance(value, dict):
        kind = value.get("kind")
        if kind == "a100":
            return A100Costs(value.get("p2p_bytes_per_s", bw))
        if kind == "replay":
            return ReplayCosts(value.get("path"), value.get("p2p_bytes_per_s", bw))
        if kind == "layers":
            missing = [k for k in ("f", "b", "w") if k not in value]
            if missing:
                raise ValueError(f"costs {{'kind': 'layers'}} lacks {', '.join(missing)}: give f, b, w (seconds per "
                                 "layer and sequence) and optionally hop_s, peak_tflops")
            return LayerCosts(value["f"], value["b"], value["w"], value.get("hop_s", 0.0), value.get("peak_tflops"))
        raise ValueError(f"unknown cost source spec {short_repr(value)}: 'kind' must be a100, replay or layers")
    if isinstance(value, (tuple, list)) and len(value) in (3, 4):
        return LayerCosts(*[float(x) for x in value])
    if not isinstance(value, str):
        raise TypeError(f"costs must be 'a100', 'h200', a replay file, 'F,B,W[,HOP]' or a CostSource, got "
                        f"{type(value).__name__} {value!r}")
    text = value.strip()
    if text.lower() in ("a100", "paper"):
        return A100Costs(bw)
    if text.lower() in ("h200", "replay"):
        return ReplayCosts(None, bw)
    if text.count(",") in (2, 3) and not Path(text).exists():
        try:
            nums = [float(x) for x in text.split(",")]
        except ValueError:
            raise ValueError(f"costs {text!r}: per-layer costs are F,B,W[,HOP] numbers (seconds per layer and "
                             "sequence; HOP seconds per pipeline hop)") from None
        return LayerCosts(*nums)
    if os.path.lexists(text):  # a FIFO, a folder, a device: the replay reader says what it is
        return ReplayCosts(text, bw)
    raise ValueError(f"costs {text!r}: not 'a100', 'h200', a replay file (no such file) or F,B,W[,HOP] numbers")

