"""The model side of the planner: a model's shape, how its layers are split into pipeline stages,
and the bytes each device holds (parameters, gradients, optimizer states, activation per
microbatch).

Everything here is arithmetic on the model's shape; the assumptions are the paper's (docs/theory.md
§4, §10) unless said otherwise, and :func:`memory_assumptions` states them in words.

* **Stages.** ``S`` stages (``p`` for one stage per device, ``2p`` for the V-shape placement,
  ``v·p`` looped) get the transformer layers by torchtitan's rule with the embedding and the LM
  head each counted as one layer (:func:`stage_layers`): for ``L + 2`` divisible by ``S`` that is
  the paper's ``k·S − 2`` rule (first and last stage one layer short, docs/theory.md §9.1).
* **Parameters.** ``12·h²`` per layer, ``V·h`` for the embedding on stage 0 and ``V·h`` for the
  (untied) LM head on stage ``S − 1``, all divided by ``tp``. Bytes per parameter: 2 for the bf16
  weights, 2 for the bf16 gradients, 12 for the fp32 master weights and Adam moments, divided by
  ``dp`` with a distributed optimizer (Megatron's ``--use-distributed-optimizer``; ZeRO-1).
* **Activation.** Per layer and token ``34·h + 5·heads·s`` bytes (the authors' runtime model,
  docs/theory.md §10), ``34·h`` with FlashAttention (no ``s × s`` scores), or a value measured by
  a rank replay; the LM head stage also keeps ``4·V + 4·h`` bytes per token (fp32 logits for the
  loss and the final norm: the H200 rank replay's last stage agrees within 1 %); all divided by
  ``tp`` (tensor + sequence parallelism). ``32·h`` of a layer's bytes wait for ``W``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ctrlmem.model import paper
from ctrlmem.planner import arch
from ctrlmem.planner import hf

__all__ = ["ModelSpec", "model_spec", "stage_layers", "runtime_stage_layers", "default_global_batch",
           "StageBytes", "stage_bytes", "layer_bytes", "BYTES_WEIGHT", "BYTES_GRAD", "BYTES_OPTIMIZER", "PRESET_NAMES"]

BYTES_WEIGHT = 2
"""bf16 weights, bytes per parameter."""
BYTES_GRAD = 2
"""bf16 gradients, bytes per parameter (the paper's model: fp16 weights and gradients, 4 B)."""
BYTES_OPTIMIZER = 12
"""fp32 master weights and the two Adam moments, bytes per parameter (sharded over dp with a
distributed optimizer)."""

PRESET_NAMES = {name.lower(): name for name, m in paper.MODELS.items() if m.source.startswith("Table 2")}
"""The paper's Table 2 models, by lower-case name (``"9.6b"`` -> ``"9.6B"``)."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder the planner can size: the paper's GPT model (``arch="gpt"``, the shape only) or a
    model read from a Hugging Face ``config.json`` (``arch="decoder"``, counted exactly,
    :mod:`ctrlmem.planner.arch`).

    Attributes:
        name: label (a paper preset's, e.g. ``"98.5B"``, the config's ``_name_or_path``, or the user's).
        num_layers: transformer layers ``L``.
        hidden: hidden size ``h``.
        heads: attention heads.
        vocab: vocabulary ``V`` (the paper's presets: :data:`ctrlmem.model.paper.ASSUMED_VOCAB`).
        seq_len: tokens per sequence ``s``.
        source: where the numbers come from.
        arch: ``"gpt"`` or ``"decoder"``.
        kv_heads, head_dim, ffn: key/value heads (grouped-query attention), head size and MLP
            width (0: ``heads``, ``hidden / heads``, ``4·hidden``).
        gated: SwiGLU MLP (3 matrices) rather than 2; tied: the LM head shares the embedding.
        qkv_bias, o_bias, mlp_bias, qk_norm: biases and per-head Q/K norms.
        norm_params: weights of one norm (``h`` for RMSNorm); dropout: GPT-style dropout masks.
        experts, top_k, expert_ffn, shared_ffn, shared_gate, router_bias: mixture of experts
            (routed experts, experts per token, one expert's width, all shared experts' width).
        moe_layers: per layer, whether it is MoE (empty: every layer, when ``experts``).
        mla: multi-head latent attention (q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim).
        family: the config's ``model_type``.
    """

    name: str
    num_layers: int
    hidden: int
    heads: int
    vocab: int = paper.ASSUMED_VOCAB
    seq_len: int = paper.ASSUMED_SEQ_LEN
    source: str = "given"
    arch: str = "gpt"
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    gated: bool = False
    tied: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norm_params: int = 0
    dropout: bool = False
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False
    router_bias: bool = False
    moe_layers: tuple = ()
    mla: tuple = ()
    family: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "moe_layers", tuple(bool(x) for x in self.moe_layers))
        object.__setattr__(self, "mla", tuple(int(x) for x in self.mla))
        for field_name in ("num_layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: {field_name} must be a positive integer, got {value!r}")
        for field_name in ("kv_heads", "head_dim", "ffn", "norm_params", "experts", "top_k", "expert_ffn",
                           "shared_ffn"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"model {self.name!r}: {field_name} must be an integer >= 0, got {value!r}")
        if self.arch not in ("gpt", "decoder"):
            raise ValueError(f"model {self.name!r}: arch must be 'gpt' or 'decoder', got {self.arch!r}")
        if not self.head_dim and not self.mla and self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                             f"pick a number of heads that divides the hidden size")
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.experts and not (1 <= self.top_k <= self.experts and self.expert_ffn >= 1):
            raise ValueError(f"model {self.name!r}: an MoE model needs 1 <= top_k <= experts and expert_ffn >= 1 "
                             f"(got top_k={self.top_k}, experts={self.experts}, expert_ffn={self.expert_ffn})")
        if self.moe_layers and len(self.moe_layers) != self.num_layers:
            raise ValueError(f"model {self.name!r}: moe_layers has {len(self.moe_layers)} entries for "
                             f"{self.num_layers} layers")

    # -- derived shape --------------------------------------------------------------------------
    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn_(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def norm_params_(self) -> int:
        return self.norm_params

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def preset(self) -> paper.ModelPreset:
        """The :class:`ctrlmem.model.paper.ModelPreset` the cost-model functions take."""
        return paper.ModelPreset(self.name, self.num_layers, self.heads, self.hidden, 0, None, self.source)

    def layer_shapes(self) -> list:
        """Every layer's :class:`ctrlmem.planner.arch.LayerShape`."""
        return arch.layer_shapes(self)

    @property
    def num_params(self) -> int:
        """All parameters (a tied embedding counted once)."""
        return arch.num_params(self)

    @property
    def num_active_params(self) -> int:
        """Parameters one token goes through (``top_k`` of the routed experts)."""
        return arch.num_active_params(self)

    def parameters(self) -> float:
        """All parameters: ``12·L·h² + 2·V·h`` for ``arch="gpt"`` (layers, embedding and an
        untied LM head), else :attr:`num_params`."""
        if self.arch == "gpt":
            return 12.0 * self.num_layers * self.hidden ** 2 + 2.0 * self.vocab * self.hidden
        return float(self.num_params)

    def flops_per_sample(self) -> float:
        """F + B + W FLOPs of one sequence (the MFU numerator; active parameters for MoE)."""
        if self.arch == "gpt":
            return paper.model_flops(self.preset, 1, self.seq_len, vocab=self.vocab)
        per_token = sum(sum(arch.layer_flops_per_token(self, sh)) for sh in self.layer_shapes())
        return self.seq_len * (per_token + 3 * 2.0 * self.hidden * self.vocab)

    def describe(self) -> str:
        base = (f"{self.name}: {self.num_layers} layers, h = {self.hidden}, {self.heads} heads")
        if self.arch == "gpt":
            return base + (f", vocabulary {self.vocab}, seq {self.seq_len}, "
                           f"{self.parameters() / 1e9:.1f}B parameters")
        att = (f"MLA (kv rank {self.mla[1]})" if self.mla else f"{self.kv_heads_} KV heads of {self.head_dim_}")
        moe = (f", {self.experts} experts of {self.expert_ffn} (top {self.top_k}"
               + (f", shared {self.shared_ffn}" if self.shared_ffn else "") + f") in "
               f"{sum(s.moe for s in self.layer_shapes())} layers" if self.experts else "")
        return (base + f", {att}, {'SwiGLU' if self.gated else 'MLP'} {self.ffn_}{moe}, vocabulary {self.vocab}"
                f" ({'tied' if self.tied else 'untied'}), seq {self.seq_len}, {self.num_params / 1e9:.2f}B parameters"
                + (f" ({self.num_active_params / 1e9:.2f}B active)" if self.experts else ""))


def _from_config(model: "str | dict", seq_len: int | None) -> ModelSpec:

    cfg = hf.read_config(model) if not isinstance(model, dict) else model
    fields = hf.fields_from_config(cfg, None if isinstance(model, dict) else None)
    where = f"Hugging Face config {model}" if not isinstance(model, dict) else "a Hugging Face config (dict)"
    seq = seq_len if seq_len is not None else hf.seq_len_default(cfg)
    return ModelSpec(**fields, seq_len=seq, source=where)


def _looks_like_path(text: str) -> bool:
    return text.endswith(".json") or "/" in text or text.startswith(".") or Path(text).is_file()


def model_spec(model: "str | dict | ModelSpec | os.PathLike | None" = None, *, layers: int | None = None,
               hidden: int | None = None, heads: int | None = None, vocab: int | None = None,
               seq_len: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a paper preset name (``"98.5b"``, any case), the path of a
    Hugging Face ``config.json`` (or its dict), a ModelSpec, or the shape (``layers``,
    ``hidden``, ``heads``; ``vocab`` and ``seq_len`` optional). Given fields override a
    preset's. ``ValueError`` names what is missing or unknown."""
    if isinstance(model, (dict, os.PathLike)) or (isinstance(model, str) and model.lower() not in PRESET_NAMES
                                                   and model.lower() not in ("", "custom") and _looks_like_path(model)):
        spec = _from_config(model if isinstance(model, dict) else str(model), seq_len)
        seq_len = None
    elif isinstance(model, ModelSpec):
        spec = model
    elif model is None or (isinstance(model, str) and model.lower() in ("", "custom")):
        missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise ValueError(f"a custom model needs {', '.join(missing)}; give them, or a preset "
                             f"({', '.join(PRESET_NAMES.values())}), or a Hugging Face config.json")
        return ModelSpec("custom", layers, hidden, heads, vocab if vocab is not None else paper.ASSUMED_VOCAB,
                         seq_len if seq_len is not None else paper.ASSUMED_SEQ_LEN, "given by the user")
    elif isinstance(model, str):
        key = model.lower()
        if key not in PRESET_NAMES:
            raise ValueError(f"unknown model {model!r}; presets: {', '.join(PRESET_NAMES.values())}, or the path of a "
                             f"Hugging Face config.json (or give layers, hidden and heads for another model)")
        p = paper.MODELS[PRESET_NAMES[key]]
        spec = ModelSpec(p.name, p.num_layers, p.hidden, p.num_heads, paper.ASSUMED_VOCAB, paper.ASSUMED_SEQ_LEN,
                         f"the paper's Table 2 (vocabulary {paper.ASSUMED_VOCAB} and seq {paper.ASSUMED_SEQ_LEN} "
                         "inferred, docs/theory.md §9.1)")
    else:
        raise TypeError(f"model must be a preset name, a config.json path or dict, or a ModelSpec, got "
                        f"{type(model).__name__} {model!r}")
    changes = {k: v for k, v in (("num_layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab),
                                 ("seq_len", seq_len)) if v is not None}
    if changes and spec.arch != "gpt" and set(changes) - {"seq_len"}:
        raise ValueError(f"{spec.name}: a config model's shape comes from its config.json; only seq_len may be "
                         "overridden (edit the file for another shape)")
    if "num_layers" in changes and spec.moe_layers:
        changes["moe_layers"] = ()
    return replace(spec, **changes) if changes else spec


def default_global_batch(spec: ModelSpec) -> tuple[int, str]:
    """The global batch (sequences) the planner assumes when none is given, for the paper's
    models: Table 3's for 98.5B (160 at seq 1024, 640 at seq 3072), and Table 4's microbatch
    × m = 4p (the middle of its grid) for the others. ``ValueError`` for other models."""
    seq = spec.seq_len
    if spec.name == "98.5B":
        batch = 640 if seq == 3072 else 160
        return batch, f"Table 3's global batch for 98.5B at seq {3072 if seq == 3072 else 1024}"
    setup = paper.TABLE4_SETUP.get(spec.name)
    if setup is not None:
        p, mb, _ = setup
        return mb * 4 * p, f"Table 4's microbatch {mb} × m = 4p = {4 * p} for {spec.name}"
    raise ValueError(f"no default global batch for model {spec.name!r}; give one (--global-batch N sequences)")


def stage_layers(num_layers: int, num_stages: int) -> list[int]:
    """Transformer layers per stage: torchtitan's split with the embedding and the LM head
    counted as one layer each (``L + 2`` units shared as evenly as possible, the first stages
    taking the remainder; stage 0 and stage ``S − 1`` give one unit to the embedding and the
    head). For ``L + 2 = k·S`` this is the paper's rule ``k − 1, k, …, k, k − 1``. ``ValueError``
    when there are more stages than units."""
    L, S = num_layers, num_stages
    if S < 1:
        raise ValueError(f"num_stages must be >= 1, got {S}")
    if S == 1:
        return [L]
    if S > L + 2:
        raise ValueError(f"{S} stages cannot share {L} layers plus the embedding and the head ({L + 2} units); "
                         f"use at most {L + 2} stages")
    base, extra = divmod(L + 2, S)
    units = [base + (1 if s < extra else 0) for s in range(S)]
    units[0] -= 1
    units[-1] -= 1
    return units


def runtime_stage_layers(num_layers: int, num_stages: int) -> list[int] | None:
    """The split ``ctrlmem run`` / ``ctrlmem replay`` use (:func:`ctrlmem.runtime.models.layers_per_stage`,
    restated here without torch): even when ``S`` divides ``L``, else ``k·S − 2``; ``None`` when
    neither applies (the runtime refuses that model)."""
    L, S = num_layers, num_stages
    if S >= 1 and L % S == 0:
        return [L // S] * S
    if S >= 2 and (L + 2) % S == 0:
        k = (L + 2) // S
        return [k - 1] + [k] * (S - 2) + [k - 1]
    return None


@dataclass(frozen=True)
class StageBytes:
    """Per stage of one placement: parameters (count per GPU: dense ones divided by ``tp``,
    routed experts' divided by ``ep``), activation bytes of one microbatch (per GPU, divided by
    ``tp``), and the fraction of a stage's activation kept until ``W``."""

    layers: tuple[int, ...]
    params: tuple[float, ...]
    activation: tuple[float, ...]
    w_kept: float
    expert_params: tuple[float, ...] = ()


def layer_bytes(spec: ModelSpec, layer_bytes_per_token: float, flash_attention: bool = True,
                recompute: str = "none") -> list[float]:
    """Activation bytes per token of every layer: ``layer_bytes_per_token`` for the paper's
    GPT model (``2h`` under full recomputation; at most ``34·h`` under selective), the
    architecture's own count (:func:`ctrlmem.planner.arch.activation_per_token`) otherwise."""
    if spec.arch == "gpt":
        x = layer_bytes_per_token
        if recompute == "full":
            x = 2.0 * spec.hidden
        elif recompute == "selective":
            x = min(x, 34.0 * spec.hidden)
        return [x] * spec.num_layers
    return [arch.activation_per_token(spec, sh, flash_attention, recompute) for sh in spec.layer_shapes()]


def stage_bytes(spec: ModelSpec, num_stages: int, microbatch_size: int, tp: int, layer_bytes_per_token: float,
                head_bytes_per_token: float | None = None, *, layers: "list[int] | None" = None, ep: int = 1,
                flash_attention: bool = True, recompute: str = "none") -> StageBytes:
    """Parameters (count, per GPU) and activation bytes of one microbatch (per GPU) of every
    stage, for ``layer_bytes_per_token`` activation bytes per layer and token (before tensor
    parallelism; a config model counts its own, :func:`layer_bytes`). ``head_bytes_per_token``
    (default ``4·V + 4·h``) is what the LM head stage keeps. ``layers``: the split (default
    :func:`stage_layers`); ``ep``: expert parallelism (routed experts per GPU ``1/ep``)."""
    layers = list(layers) if layers is not None else stage_layers(spec.num_layers, num_stages)
    h, v = spec.hidden, spec.vocab
    head = 4.0 * v + 4.0 * h if head_bytes_per_token is None else head_bytes_per_token
    tokens = microbatch_size * spec.seq_len
    S = num_stages
    shapes = spec.layer_shapes()
    per_layer = layer_bytes(spec, layer_bytes_per_token, flash_attention, recompute)
    emb, hd = arch.embedding_params(spec), arch.head_params(spec)
    params, experts, act = [], [], []
    start = 0
    for s, n in enumerate(layers):
        mine = range(start, start + n)
        start += n
        x = float(sum(shapes[i].dense for i in mine)) + (emb if s == 0 else 0) + (hd if s == S - 1 else 0)
        if S == 1 and spec.tied:
            x -= v * h
        params.append(x / tp)
        experts.append(sum(shapes[i].expert for i in mine) / ep)
        act.append(tokens * (sum(per_layer[i] for i in mine) + (head if s == S - 1 else 0.0)) / tp)
    need_w = sum(arch.w_inputs_per_token(spec, sh) for sh in shapes)
    total = sum(per_layer)
    w_kept = min(1.0, need_w / total) if total > 0 else 1.0
    if recompute == "full":
        w_kept = 1.0
    return StageBytes(tuple(layers), tuple(params), tuple(act), w_kept, tuple(experts))


def layer_activation_formula(spec: ModelSpec, flash_attention: bool) -> float:
    """Bytes per layer and token: ``34·h + 5·heads·s`` (docs/theory.md §10), ``34·h`` with
    FlashAttention."""
    return 34.0 * spec.hidden + (0.0 if flash_attention else 5.0 * spec.heads * spec.seq_len)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
