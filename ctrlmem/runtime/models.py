"""Model zoo for real execution: a GPT-style decoder, its presets, and its split into stages.

The model is the one the paper trains (docs/theory.md §9.1, Table 2): token and position embedding,
``num_layers`` pre-LN transformer blocks (causal self-attention and a 4h GELU MLP, each with a
residual), a final LayerNorm, an LM head and the cross-entropy loss. :func:`split_stages` cuts it
into the ``S`` virtual stages of a schedule: the embedding goes on stage 0, the final norm and
head on stage ``S-1`` (the loss is applied there by the runtime). When ``num_layers`` is
``k·S − 2`` the first and the last stage get one layer fewer, as the paper's
``--allow-padding-num-layers`` does, to balance the embedding and the head.

Every linear layer is a :class:`DeferrableLinear`: when its stage's :class:`WeightGradStash`
is active, its backward computes only the input gradient and stashes ``(input, grad_output)``;
:meth:`WeightGradStash.take` turns the stash into the weight-gradient pass (the paper's ``W``).
This is what lets a ``B`` pass free a layer's autograd graph while keeping exactly what ``W``
needs (the paper's 32·h of 34·h + 5·heads·s bytes per token).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ctrlmem.runtime.recompute import Recomputation

__all__ = [
    "ModelConfig",
    "PRESETS",
    "get_preset",
    "layers_per_stage",
    "WeightGradStash",
    "DeferrableLinear",
    "StageModule",
    "build_stages",
    "FullModel",
    "make_batch",
    "loss_fn",
]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-style decoder.

    Attributes:
        name: preset name (for reports).
        num_layers: transformer blocks in the whole model.
        hidden: hidden size ``h``.
        num_heads: attention heads; must divide ``hidden``.
        seq_len: tokens per sequence ``s``.
        vocab: vocabulary size.
        microbatch_size: sequences per microbatch ``b``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    seq_len: int
    vocab: int
    microbatch_size: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden", "num_heads", "seq_len", "vocab", "microbatch_size"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < (0 if field_name == "num_layers" else 1):
                raise ValueError(f"model {self.name!r}: {field_name} must be a positive integer, got {value!r}")
        if self.hidden % self.num_heads:
            raise ValueError(
                f"model {self.name!r}: hidden={self.hidden} is not divisible by num_heads={self.num_heads}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"model {self.name!r}: dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def tokens_per_microbatch(self) -> int:
        return self.microbatch_size * self.seq_len

    def num_parameters(self) -> int:
        h, v, s = self.hidden, self.vocab, self.seq_len
        block = 12 * h * h + 13 * h
        return v * h + s * h + self.num_layers * block + 2 * h + h * v + v

    def to_dict(self) -> dict:
        return asdict(self)


# The paper's Table 2 models (docs/theory.md §9.1) with its pure-PP microbatch sizes (4 / 2 / 1; 1 for
# 98.5B, not reported); seq 1024 and a GPT-2-sized vocabulary are inferred, not recovered.
# The small presets run on a laptop CPU.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", num_layers=8, hidden=64, num_heads=4, seq_len=64, vocab=256, microbatch_size=2),
    "small": ModelConfig("small", num_layers=8, hidden=256, num_heads=8, seq_len=128, vocab=1024, microbatch_size=2),
    "medium": ModelConfig("medium", num_layers=16, hidden=512, num_heads=8, seq_len=256, vocab=4096, microbatch_size=2),
    "9.6b": ModelConfig("9.6b", num_layers=30, hidden=5120, num_heads=40, seq_len=1024, vocab=50304,
                        microbatch_size=4, dtype="bfloat16"),
    "21b": ModelConfig("21b", num_layers=46, hidden=6144, num_heads=48, seq_len=1024, vocab=50304,
                       microbatch_size=2, dtype="bfloat16"),
    "38.5b": ModelConfig("38.5b", num_layers=62, hidden=7168, num_heads=64, seq_len=1024, vocab=50304,
                         microbatch_size=1, dtype="bfloat16"),
    "98.5b": ModelConfig("98.5b", num_layers=78, hidden=10240, num_heads=80, seq_len=1024, vocab=50304,
                         microbatch_size=1, dtype="bfloat16"),
}


def get_preset(name: str, **overrides: object) -> ModelConfig:
    """The preset ``name`` with optional field overrides (``num_layers=4``, ``dtype="float32"``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


def layers_per_stage(num_layers: int, num_stages: int) -> list[int]:
    """Transformer blocks on each of ``num_stages`` stages.

    Even split when ``num_stages`` divides ``num_layers``; when ``num_layers = k·S − 2`` (the
    paper's padding) the first and last stages get ``k − 1`` and the others ``k``. Anything else
    raises ``ValueError`` with the layer counts that would work.
    """
    L, S = num_layers, num_stages
    if S < 1:
        raise ValueError(f"num_stages must be >= 1, got {S}")
    if L % S == 0:
        return [L // S] * S
    if S >= 2 and (L + 2) % S == 0 and (L + 2) // S >= 1:
        k = (L + 2) // S
        return [k - 1] + [k] * (S - 2) + [k - 1]
    lo = (L // S) * S
    raise ValueError(
        f"{L} layers cannot be split among {S} stages: use a multiple of {S} (e.g. {lo or S} or {lo + S}) "
        f"or k·{S} − 2 (e.g. {lo + S - 2}) for the paper's padding"
    )


class WeightGradStash:
    """Deferred weight gradients of one stage (the paper's ``W`` pass).

    While :attr:`active`, every :class:`DeferrableLinear` backward of the stage computes only the
    input gradient and appends ``(layer, input, grad_output)`` here. :meth:`take` removes what the
    last backward stashed and returns the function that applies those weight gradients.
    ``meter`` (optional, a :class:`ctrlmem.runtime.measure.SavedTensorMeter`) is told which
    tensors the stash holds, so they count as activation memory until ``W``.
    """

    def __init__(self) -> None:
        self.active = False
        self.meter = None
        self._pending: list[tuple["DeferrableLinear", torch.Tensor, torch.Tensor, list[int]]] = []

    def push(self, layer: "DeferrableLinear", x: torch.Tensor, grad_out: torch.Tensor) -> None:
        keys = [self.meter.hold(x), self.meter.hold(grad_out)] if self.meter is not None else []
        self._pending.append((layer, x, grad_out, keys))

    def take(self) -> Callable[[], None]:
        """The weight-gradient pass for everything stashed since the last ``take``."""
        items, self._pending = self._pending, []
        meter = self.meter

        def run_w() -> None:
            nonlocal items
            with torch.no_grad():
                for layer, x, g, _ in items:
                    x2 = x.reshape(-1, x.shape[-1])
                    g2 = g.reshape(-1, g.shape[-1])
                    _accumulate(layer.weight, g2.t().mm(x2))
                    if layer.bias is not None:
                        _accumulate(layer.bias, g2.sum(0))
            if meter is not None:
                for *_, keys in items:
                    for key in keys:
                        meter.drop(key)
            items = []

        return run_w


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad.to(param.dtype)
    else:
        param.grad.add_(grad)


class _DeferredLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        layer = ctx.layer
        grad_in = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
        layer.stash.push(layer, x.detach(), grad_out.detach())
        return grad_in, None, None, None


class DeferrableLinear(nn.Linear):
    """``nn.Linear`` whose weight gradient can be deferred to a later ``W`` pass (see module doc)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.stash: WeightGradStash | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stash is not None and self.stash.active and torch.is_grad_enabled():
            return _DeferredLinearFn.apply(x, self.weight, self.bias, self)
        return F.linear(x, self.weight, self.bias)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)); x + mlp(ln2(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.num_heads = cfg.num_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = DeferrableLinear(h, 3 * h)
        self.proj = DeferrableLinear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = DeferrableLinear(h, 4 * h)
        self.out = DeferrableLinear(4 * h, h)

    recompute_attention: Recomputation | None = None
    """Selective recomputation: keep everything but the attention core's internals, which the
    backward recomputes (the stage's checkpoint around it; docs/theory.md §13)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        shape = (b, s, self.num_heads, h // self.num_heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        if self.recompute_attention is not None:
            a = self.recompute_attention(_causal_attention, q, k, v)
        else:
            a = _causal_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class StageModule(nn.Module):
    """One virtual stage: optional embedding, some blocks, optional final norm and head.

    Stage 0 takes token ids ``(b, s)`` (int64); the others take hidden states ``(b, s, h)``;
    the last stage returns logits ``(b, s, vocab)``.
    """

    def __init__(self, cfg: ModelConfig, stage: int, num_stages: int, layer_ids: list[int]) -> None:
        super().__init__()
        self.stage, self.num_stages, self.layer_ids = stage, num_stages, list(layer_ids)
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        if self.is_first:
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in layer_ids)
        if self.is_last:
            self.norm = nn.LayerNorm(cfg.hidden)
            self.head = DeferrableLinear(cfg.hidden, cfg.vocab, bias=False)
        self.stash = WeightGradStash()
        self.recompute: str | None = None
        self.recomputation = Recomputation(self.stash)
        for mod in self.modules():
            if isinstance(mod, DeferrableLinear):
                mod.stash = self.stash

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(pos)
        if self.recompute == "full" and self.blocks:
            x = self.recomputation(self._blocks, x)
        else:
            x = self._blocks(x)
        if self.is_last:
            x = self.head(self.norm(x))
        return x


    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def set_recompute(self, mode: str | None) -> None:
        """Recompute in the backward (docs/theory.md §13): ``"full"`` wraps the stage's layers in
        a non-reentrant ``torch.utils.checkpoint`` (the forward keeps their input only),
        ``"selective"`` each layer's attention core, ``None`` neither. The checkpoint's saved
        inputs and the tensors it recomputes count in the stage's meter (``stash.meter``), and
        :attr:`recomputation` counts the regions and their recomputations
        (:mod:`ctrlmem.runtime.recompute`)."""
        if mode not in (None, "full", "selective"):
            raise ValueError(f"recompute mode must be None, 'full' or 'selective', got {mode!r}")
        self.recompute = mode
        for block in self.blocks:
            block.recompute_attention = self.recomputation if mode == "selective" else None

    @contextlib.contextmanager
    def recomputing(self, mode: str | None) -> Iterator[None]:
        """:meth:`set_recompute` ``mode`` for the forwards run inside, the previous mode after
        (a run recomputes the forwards its schedule has an ``R`` of, each on its own)."""
        before = self.recompute
        self.set_recompute(mode)
        try:
            yield
        finally:
            self.set_recompute(before)


def _init_weights(module: nn.Module, generator: torch.Generator, num_layers: int) -> None:
    std = 0.02
    for name, prm in module.named_parameters():
        with torch.no_grad():
            if name.endswith("bias"):
                prm.zero_()
            elif prm.dim() == 1:  # LayerNorm weight
                prm.fill_(1.0)
            else:
                scale = std / math.sqrt(2 * max(num_layers, 1)) if name.endswith(("proj.weight", "out.weight")) else std
                prm.copy_(torch.randn(prm.shape, generator=generator) * scale)


INITS = ("seeded", "device")


def build_stages(
    cfg: ModelConfig,
    num_stages: int,
    stages: list[int] | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    init: str = "seeded",
) -> dict[int, StageModule]:
    """Build the stages ``stages`` (default: all) of the model cut into ``num_stages`` stages.

    ``init="seeded"``: weights depend only on ``(cfg, seed)`` and the global layer index, not on
    the split, so a stage built on any rank equals the same layers of :class:`FullModel` with the
    same seed (drawn on the CPU, then moved). ``init="device"``: the stage is laid out on the
    ``meta`` device, allocated directly on ``device`` in ``cfg``'s dtype (``to_empty``) and
    initialised there by each layer's ``reset_parameters`` (torch's default init; not seeded by
    ``seed``). Values do not change pass times or activation memory, and a paper-scale stage
    then takes well under a second on a GPU instead of seconds per layer on the CPU.
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    counts = layers_per_stage(cfg.num_layers, num_stages)
    starts = [sum(counts[:s]) for s in range(num_stages)]
    wanted = range(num_stages) if stages is None else stages
    out: dict[int, StageModule] = {}
    for s in wanted:
        ids = list(range(starts[s], starts[s] + counts[s]))
        if init == "device":
            with torch.device("meta"):
                mod = StageModule(cfg, s, num_stages, ids).to(dtype=cfg.torch_dtype)
            mod = mod.to_empty(device=device)
            with torch.no_grad():
                for sub in mod.modules():
                    if sub is not mod and hasattr(sub, "reset_parameters"):
                        sub.reset_parameters()
            out[s] = mod
            continue
        mod = StageModule(cfg, s, num_stages, ids)
        _init_stage(mod, cfg, seed)
        out[s] = mod.to(device=device, dtype=cfg.torch_dtype)
    return out


def _init_stage(mod: StageModule, cfg: ModelConfig, seed: int) -> None:
    # One generator per component, seeded from (seed, component), so weights do not depend on the split.
    def gen(tag: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed * 1_000_003 + tag)

    if mod.is_first:
        _init_weights(nn.ModuleDict({"tok": mod.tok, "pos": mod.pos}), gen(0), cfg.num_layers)
    for layer_id, block in zip(mod.layer_ids, mod.blocks):
        _init_weights(block, gen(1 + layer_id), cfg.num_layers)
    if mod.is_last:
        _init_weights(nn.ModuleDict({"norm": mod.norm, "head": mod.head}), gen(10_000_000), cfg.num_layers)


class FullModel(nn.Module):
    """The whole model as one module (the non-pipelined reference): all stages in a row."""

    def __init__(self, cfg: ModelConfig, num_stages: int, seed: int = 0) -> None:
        super().__init__()
        built = build_stages(cfg, num_stages, seed=seed)
        self.stages = nn.ModuleList(built[s] for s in range(num_stages))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens
        for stage in self.stages:
            x = stage(x)
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all tokens of a microbatch (computed in fp32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(cfg: ModelConfig, num_microbatches: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, ``(m·b, s)`` each, identical on every rank."""
    g = torch.Generator().manual_seed(seed + 7919)
    n = num_microbatches * cfg.microbatch_size
    data = torch.randint(0, cfg.vocab, (n, cfg.seq_len + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
