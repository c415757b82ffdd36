"""Parameters, FLOPs and activation bytes of one decoder layer, from its shape.

Two architectures (``spec.arch``):

* ``"gpt"`` — the paper's model (docs/theory.md §9–10): ``12·h²`` parameters per layer, biases and
  norms ignored; per token ``F = 24h² + 4sh``, ``B = 24h² + 8sh``, ``W = 24h²`` FLOPs; activation
  ``34·h + 5·heads·s`` bytes (Korthikanti et al. 2022), ``34·h`` with FlashAttention.
* ``"decoder"`` — a model read from a Hugging Face ``config.json`` (:mod:`ctrlmem.planner.hf`),
  counted exactly: attention with ``kv_heads`` key/value heads of ``head_dim`` (grouped-query
  attention) or MLA's low-rank projections, a gated (SwiGLU, 3 matrices) or plain (2 matrices)
  MLP, optional biases, the norms' weights, and mixture-of-experts layers (router, ``experts``
  experts of ``expert_ffn``, ``top_k`` per token, shared experts of ``shared_ffn`` in all, an
  optional shared-expert gate). Its FLOPs are ``2·P`` per token and matrix parameter ``P``
  (active experts only) for ``F`` and ``W`` and ``2·P`` for ``B``'s input gradients, plus the
  attention core (``4·s·q`` for ``F`` and ``8·s·q`` for ``B``, ``q`` = heads × head_dim), the
  paper's counting. Its activation bytes per token are the tensors autograd keeps in bf16
  (see :func:`activation_per_token`).

A spec is anything with the attributes of :class:`ctrlmem.planner.model.ModelSpec`; this module
imports nothing of the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LayerShape", "layer_shapes", "embedding_params", "head_params", "num_params", "num_active_params",
           "activation_per_token", "layer_flops_per_token", "attention_core_flops"]


@dataclass(frozen=True)
class LayerShape:
    """One kind of layer: ``dense`` parameters (held by every TP group, divided by ``tp``),
    ``expert`` parameters (all routed experts; divided by expert parallelism), ``active``
    matrix parameters a token goes through (FLOPs), and whether it is an MoE layer."""

    kind: str
    dense: int
    expert: int
    active_matrix: int
    moe: bool


def _attention(spec) -> tuple[int, int]:
    """(parameters, of which matrix parameters) of one attention block."""
    h = spec.hidden
    if spec.mla:
        q_rank, kv_rank, nope, rope, vdim = spec.mla
        qk = nope + rope
        H = spec.heads
        if q_rank:
            q = h * q_rank + q_rank + q_rank * H * qk  # down, its norm, up
            qm = h * q_rank + q_rank * H * qk
        else:
            q = qm = h * H * qk
        kv_down = h * (kv_rank + rope)
        kv_up = kv_rank * H * (nope + vdim)
        o = H * vdim * h
        mat = qm + kv_down + kv_up + o
        return q + kv_down + kv_rank + kv_up + o, mat  # + the kv_a norm
    qd = spec.heads * spec.head_dim_
    kvd = spec.kv_heads_ * spec.head_dim_
    mat = h * qd + 2 * h * kvd + qd * h
    bias = (qd + 2 * kvd if spec.qkv_bias else 0) + (h if spec.o_bias else 0)
    norms = 2 * spec.head_dim_ if spec.qk_norm else 0
    return mat + bias + norms, mat


def _mlp(spec, ffn: int) -> int:
    h = spec.hidden
    mats = 3 if spec.gated else 2
    bias = ((2 * ffn if spec.gated else ffn) + h) if spec.mlp_bias else 0
    return mats * h * ffn + bias


def _norm(spec) -> int:
    return spec.norm_params_


def layer_shapes(spec) -> list[LayerShape]:
    """The shape of every layer, in order (``num_layers`` entries)."""
    if spec.arch == "gpt":
        x = 12 * spec.hidden ** 2
        return [LayerShape("dense", x, 0, x, False)] * spec.num_layers
    attn, attn_mat = _attention(spec)
    norms = 2 * _norm(spec)
    ffn = spec.ffn_
    dense = LayerShape("dense", attn + norms + _mlp(spec, ffn), 0, attn_mat + (3 if spec.gated else 2) * spec.hidden * ffn,
                       False)
    if not spec.experts:
        return [dense] * spec.num_layers
    h, E, k = spec.hidden, spec.experts, spec.top_k
    one = _mlp(spec, spec.expert_ffn)
    router = h * E + (E if spec.router_bias else 0)
    shared = _mlp(spec, spec.shared_ffn) if spec.shared_ffn else 0
    gate = h if spec.shared_gate else 0
    mats = 3 if spec.gated else 2
    active = attn_mat + router + gate + mats * h * (k * spec.expert_ffn + spec.shared_ffn)
    moe = LayerShape("moe", attn + norms + router + shared + gate, E * one, active, True)
    flags = spec.moe_layers if spec.moe_layers else (True,) * spec.num_layers
    return [moe if f else dense for f in flags]


def embedding_params(spec) -> int:
    return spec.vocab * spec.hidden


def head_params(spec) -> int:
    """The LM head's weights, and the final norm's (a tied head shares the embedding's weights,
    counted once in :func:`num_params`; a pipeline's last stage holds a copy)."""
    return spec.vocab * spec.hidden + (_norm(spec) if spec.arch != "gpt" else 0)


def num_params(spec) -> int:
    layers = sum(s.dense + s.expert for s in layer_shapes(spec))
    head = head_params(spec) - (spec.vocab * spec.hidden if spec.tied else 0)
    return layers + embedding_params(spec) + head


def num_active_params(spec) -> int:
    """Parameters one token goes through: every dense parameter and ``top_k`` of the experts."""
    total = 0
    for s in layer_shapes(spec):
        total += s.dense + (s.expert * spec.top_k // spec.experts if s.moe else 0)
    head = head_params(spec) - (spec.vocab * spec.hidden if spec.tied else 0)
    return total + embedding_params(spec) + head


def _q_dim(spec) -> int:
    if spec.mla:
        _, _, nope, rope, vdim = spec.mla
        return spec.heads * (nope + rope + vdim) // 2  # QK^T over nope + rope, AV over vdim
    return spec.heads * spec.head_dim_


def attention_core_flops(spec) -> float:
    """FLOPs per token of the attention core's forward (``QKᵀ`` and ``AV``): ``4·s·q``."""
    if spec.arch == "gpt":
        return 4.0 * spec.seq_len * spec.hidden
    return 4.0 * spec.seq_len * _q_dim(spec)


def layer_flops_per_token(spec, shape: LayerShape) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of one layer of ``shape`` and one token."""
    core = attention_core_flops(spec)
    mat = 2.0 * shape.active_matrix
    return mat + core, mat + 2.0 * core, mat


def activation_per_token(spec, shape: LayerShape, flash_attention: bool, recompute: str = "none") -> float:
    """Bytes one layer keeps per token for its backward (bf16; before tensor parallelism).

    ``"gpt"``: ``34·h + 5·heads·s`` (``34·h`` with FlashAttention). ``"decoder"``: the two norms'
    inputs (``2·2h``), the QKV input (``2h``), Q, K, V (``2(q + 2kv)``), the attention output
    (``2q``, the output projection's input; FlashAttention adds its fp32 log-sum-exp,
    ``4·heads``), without FlashAttention the softmax output (``2·heads·s``), the MLP input
    (``2h``) and its intermediates: ``8·f`` gated (gate and up outputs, the SiLU output, their
    product) or ``4·f`` plain (the GELU's input and output). An MoE layer keeps the router
    input and its fp32 scores (``2h + 4E``) and, per routed copy, the expert's input and
    intermediates (``top_k · (2h + 8·f_e)``) and the shared experts' (``8·f_s``). With
    ``dropout`` (GPT-style training) the two 1-byte masks (``2h``) and, without FlashAttention,
    the attention dropout's mask and output (``3·heads·s``): for a GPT shape this is Korthikanti
    et al.'s ``34·h + 5·heads·s`` exactly (docs/plan.md, the cross-check table).

    ``recompute``: ``"full"`` keeps the layer's input only (``2h``, Korthikanti et al.'s full
    recomputation); ``"selective"`` drops the attention core's ``s × s`` tensors (their
    selective recomputation; nothing more with FlashAttention)."""
    h = spec.hidden
    if recompute == "full":
        return 2.0 * h
    keep_scores = not flash_attention and recompute != "selective"
    if spec.arch == "gpt":
        return 34.0 * h + (5.0 * spec.heads * spec.seq_len if keep_scores else 0.0)
    if spec.mla:
        _, kv_rank, nope, rope, vdim = spec.mla
        H = spec.heads
        q, kv = H * (nope + rope), kv_rank + rope + H * (nope + vdim) // 2
        out = H * vdim
    else:
        q = spec.heads * spec.head_dim_
        kv = spec.kv_heads_ * spec.head_dim_
        out = q
    attn = 2 * h + 2 * (q + 2 * kv) + 2 * out + (4 * spec.heads if flash_attention else 0)
    attn += 2.0 * spec.heads * spec.seq_len if keep_scores else 0.0
    inter = 8 if spec.gated else 4
    if shape.moe:
        mlp = 2 * h + 4 * spec.experts + spec.top_k * (2 * h + inter * spec.expert_ffn) + inter * spec.shared_ffn
    else:
        mlp = 2 * h + inter * spec.ffn_
    drop = (2 * h + (3.0 * spec.heads * spec.seq_len if keep_scores else 0.0)) if spec.dropout else 0.0
    return float(4 * h + attn + mlp + drop)


def w_inputs_per_token(spec, shape: LayerShape) -> float:
    """Bytes per token of a layer's activation that its ``W`` pass still needs after ``B``: the
    inputs of its weight matrices (``32·h`` for ``"gpt"``, the paper's runtime model)."""
    h = spec.hidden
    if spec.arch == "gpt":
        return 32.0 * h
    q = spec.heads * (spec.mla[4] if spec.mla else spec.head_dim_)
    attn = 2 * h + 2 * q
    if shape.moe:
        mlp = 2 * h + spec.top_k * (2 * h + 2 * spec.expert_ffn) + 2 * spec.shared_ffn
    else:
        mlp = 2 * h + 2 * spec.ffn_
    return float(attn + mlp)
