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
from dataclasses import dataclass, replace

from ctrlmem.model import paper

__all__ = ["ModelSpec", "model_spec", "stage_layers", "runtime_stage_layers", "default_global_batch",
           "StageBytes", "stage_bytes", "BYTES_WEIGHT", "BYTES_GRAD", "BYTES_OPTIMIZER", "PRESET_NAMES"]

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
    """A GPT-style decoder the planner can size.

    Attributes:
        name: label (a paper preset's, e.g. ``"98.5B"``, or the user's).
        num_layers: transformer layers ``L``.
        hidden: hidden size ``h``.
        heads: attention heads.
        vocab: vocabulary ``V`` (the paper's presets: :data:`ctrlmem.model.paper.ASSUMED_VOCAB`).
        seq_len: tokens per sequence ``s``.
        source: where the numbers come from.
    """

    name: str
    num_layers: int
    hidden: int
    heads: int
    vocab: int = paper.ASSUMED_VOCAB
    seq_len: int = paper.ASSUMED_SEQ_LEN
    source: str = "given"

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: {field_name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                             f"pick a number of heads that divides the hidden size")

    @property
    def preset(self) -> paper.ModelPreset:
        """The :class:`ctrlmem.model.paper.ModelPreset` the cost-model functions take."""
        return paper.ModelPreset(self.name, self.num_layers, self.heads, self.hidden, 0, None, self.source)

    def parameters(self) -> float:
        """All parameters: ``12·L·h² + 2·V·h`` (layers, embedding and an untied LM head)."""
        return 12.0 * self.num_layers * self.hidden ** 2 + 2.0 * self.vocab * self.hidden

    def flops_per_sample(self) -> float:
        """F + B + W FLOPs of one sequence (the MFU numerator, :func:`ctrlmem.model.paper.model_flops`)."""
        return paper.model_flops(self.preset, 1, self.seq_len, vocab=self.vocab)

    def describe(self) -> str:
        return (f"{self.name}: {self.num_layers} layers, h = {self.hidden}, {self.heads} heads, vocabulary "
                f"{self.vocab}, seq {self.seq_len}, {self.parameters() / 1e9:.1f}B parameters")


def model_spec(model: "str | ModelSpec | None" = None, *, layers: int | None = None, hidden: int | None = None,
               heads: int | None = None, vocab: int | None = None, seq_len: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a paper preset name (``"98.5b"``, any case), a ModelSpec, or the
    shape (``layers``, ``hidden``, ``heads``; ``vocab`` and ``seq_len`` optional). Given fields
    override a preset's. ``ValueError`` names what is missing or unknown."""
    if isinstance(model, ModelSpec):
        spec = model
    elif model is None or (isinstance(model, str) and model.lower() in ("", "custom")):
        missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise ValueError(f"a custom model needs {', '.join(missing)}; give them, or a preset "
                             f"({', '.join(PRESET_NAMES.values())})")
        return ModelSpec("custom", layers, hidden, heads, vocab if vocab is not None else paper.ASSUMED_VOCAB,
                         seq_len if seq_len is not None else paper.ASSUMED_SEQ_LEN, "given by the user")
    elif isinstance(model, str):
        key = model.lower()
        if key not in PRESET_NAMES:
            raise ValueError(f"unknown model {model!r}; presets: {', '.join(PRESET_NAMES.values())} "
                             f"(or give layers, hidden and heads for another model)")
        p = paper.MODELS[PRESET_NAMES[key]]
        spec = ModelSpec(p.name, p.num_layers, p.hidden, p.num_heads, paper.ASSUMED_VOCAB, paper.ASSUMED_SEQ_LEN,
                         f"the paper's Table 2 (vocabulary {paper.ASSUMED_VOCAB} and seq {paper.ASSUMED_SEQ_LEN} "
                         "inferred, docs/theory.md §9.1)")
    else:
        raise TypeError(f"model must be a preset name or a ModelSpec, got {type(model).__name__} {model!r}")
    changes = {k: v for k, v in (("num_layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab),
                                 ("seq_len", seq_len)) if v is not None}
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
    """Per stage of one placement: parameters and activation bytes of one microbatch (per GPU,
    i.e. already divided by ``tp``), and the fraction of a stage's activation kept until ``W``."""

    layers: tuple[int, ...]
    params: tuple[float, ...]
    activation: tuple[float, ...]
    w_kept: float


def stage_bytes(spec: ModelSpec, num_stages: int, microbatch_size: int, tp: int, layer_bytes_per_token: float,
                head_bytes_per_token: float | None = None) -> StageBytes:
    """Parameters (count, per GPU) and activation bytes of one microbatch (per GPU) of every
    stage, for ``layer_bytes_per_token`` activation bytes per layer and token (before tensor
    parallelism). ``head_bytes_per_token`` (default ``4·V + 4·h``) is what the LM head stage keeps."""
    layers = stage_layers(spec.num_layers, num_stages)
    h, v = spec.hidden, spec.vocab
    head = 4.0 * v + 4.0 * h if head_bytes_per_token is None else head_bytes_per_token
    tokens = microbatch_size * spec.seq_len
    S = num_stages
    params = []
    act = []
    for s, n in enumerate(layers):
        x = 12.0 * n * h * h
        if s == 0:
            x += v * h
        if s == S - 1:
            x += v * h
        params.append(x / tp)
        act.append(tokens * (n * layer_bytes_per_token + (head if s == S - 1 else 0.0)) / tp)
    w_kept = min(1.0, 32.0 * h / layer_bytes_per_token) if layer_bytes_per_token > 0 else 1.0
    return StageBytes(tuple(layers), tuple(params), tuple(act), w_kept)


def layer_activation_formula(spec: ModelSpec, flash_attention: bool) -> float:
    """Bytes per layer and token: ``34·h + 5·heads·s`` (docs/theory.md §10), ``34·h`` with
    FlashAttention."""
    return 34.0 * spec.hidden + (0.0 if flash_attention else 5.0 * spec.heads * spec.seq_len)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
