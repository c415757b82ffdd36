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
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ctrlmem.runtime.presets import PRESETS, ModelConfig, get_preset, layers_per_stage
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
