"""Read a Hugging Face ``config.json`` into the fields of a planner model
(:func:`ctrlmem.planner.model.model_spec` makes the :class:`~ctrlmem.planner.model.ModelSpec`).

The user gives the file (nothing is downloaded). Families read (``model_type``):

* dense: ``llama`` (Llama 2/3, and most Llama-style configs), ``mistral``, ``qwen2``, ``qwen3``;
* mixture of experts: ``mixtral``, ``qwen2_moe`` (shared expert with its gate), ``qwen3_moe``,
  ``deepseek_v2`` / ``deepseek_v3`` (multi-head latent attention, shared experts, the first
  ``first_k_dense_replace`` layers dense).

Every family has RMSNorm, a gated (SwiGLU) MLP and rotary positions (no position-embedding
weights). Bad input — a file too large to be a config, not JSON, not an object, an unknown
family, a missing or non-positive field, sizes that do not divide — raises ``ValueError`` with
one line naming the field and the fix.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["MAX_CONFIG_BYTES", "FAMILIES", "read_config", "fields_from_config", "DEFAULT_SEQ_LEN"]

MAX_CONFIG_BYTES = 1 << 20
"""A ``config.json`` is a few KB; anything above 1 MiB is refused before it is read."""

DEFAULT_SEQ_LEN = 4096
"""Sequence length the planner assumes for a config model when none is given."""

_LIMITS = {"hidden_size": 1 << 20, "num_hidden_layers": 4096, "num_attention_heads": 1 << 14,
           "vocab_size": 1 << 27, "intermediate_size": 1 << 24}

FAMILIES = {
    "llama": "dense", "mistral": "dense", "qwen2": "dense", "qwen3": "dense",
    "mixtral": "moe", "qwen2_moe": "moe", "qwen3_moe": "moe", "deepseek_v2": "moe", "deepseek_v3": "moe",
}
"""``model_type`` values read, and whether they are dense or mixture-of-experts."""


def read_config(path: "str | os.PathLike") -> dict:
    """The JSON object in ``path`` (size-checked first). ``ValueError`` names the problem."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ValueError(f"model config {str(p)!r} is not a regular file; give the path of a Hugging Face config.json")
    if not p.is_file():
        raise ValueError(f"model config {str(p)!r}: no such file; give the path of a Hugging Face config.json "
                         "(or a preset: 9.6b, 21b, 38.5b, 98.5b)")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"model config {str(p)!r} is {size} bytes, more than a config.json's {MAX_CONFIG_BYTES} "
                         "at most; give the model's config.json, not its weights or an index")
    try:
        with open(p, "rb") as fh:
            data = json.loads(fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except RecursionError:
        raise ValueError(f"model config {str(p)!r} nests deeper than any config; give a Hugging Face "
                         "config.json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"model config {str(p)!r} is not JSON ({first}); give a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise ValueError(f"model config {str(p)!r} holds a JSON {type(data).__name__}, not an object; give a Hugging "
                         "Face config.json")
    return data


def _where(cfg: dict) -> str:
    return str(cfg.get("_name_or_path") or cfg.get("model_type") or "config")


def _int(cfg: dict, key: str, default: Any = None, *, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"model config ({_where(cfg)}): field {key!r} is missing; a {cfg.get('model_type')} "
                         "config.json has it — give the complete file")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"model config ({_where(cfg)}): {key} must be an integer >= {minimum}, got {value!r}")
    limit = _LIMITS.get(key)
    if limit is not None and value > limit:
        raise ValueError(f"model config ({_where(cfg)}): {key} = {value} is larger than any model's ({limit} at "
                         "most); check the file")
    return value


def _flag(cfg: dict, key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"model config ({_where(cfg)}): {key} must be true or false, got {value!r}")
    return value


def _moe_layers(cfg: dict, L: int, family: str) -> tuple[bool, ...]:
    """Which layers are mixture-of-experts."""
    if family in ("deepseek_v2", "deepseek_v3"):
        first = _int(cfg, "first_k_dense_replace", 0, minimum=0)
        freq = _int(cfg, "moe_layer_freq", 1)
        return tuple(i >= first and i % freq == 0 for i in range(L))
    if family in ("qwen2_moe", "qwen3_moe"):
        step = _int(cfg, "decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise ValueError(f"model config ({_where(cfg)}): mlp_only_layers must be a list of layer indices")
        return tuple(i not in only and (i + 1) % step == 0 for i in range(L))
    return (True,) * L


def fields_from_config(cfg: dict, name: str | None = None) -> dict:
    """The :class:`~ctrlmem.planner.model.ModelSpec` fields of a config (a dict)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"model config must be a JSON object (dict), got {type(cfg).__name__}")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"model config ({_where(cfg)}): model_type {family!r} is not read here; read: "
                         f"{', '.join(FAMILIES)} (or give --layers/--hidden/--heads for a GPT-style model)")
    h = _int(cfg, "hidden_size")
    L = _int(cfg, "num_hidden_layers")
    H = _int(cfg, "num_attention_heads")
    V = _int(cfg, "vocab_size")
    f = dict(name=name or str(cfg.get("_name_or_path") or family), arch="decoder", num_layers=L, hidden=h,
             heads=H, vocab=V, gated=True, norm_params=h, family=family,
             tied=_flag(cfg, "tie_word_embeddings", False))
    if family in ("deepseek_v2", "deepseek_v3"):
        q_rank = cfg.get("q_lora_rank")
        q_rank = 0 if q_rank is None else _int(cfg, "q_lora_rank")
        f["mla"] = (q_rank, _int(cfg, "kv_lora_rank"), _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim"),
                    _int(cfg, "v_head_dim"))
        f["kv_heads"] = H
    else:
        kv = _int(cfg, "num_key_value_heads", H)
        if H % kv:
            raise ValueError(f"model config ({_where(cfg)}): num_attention_heads {H} is not a multiple of "
                             f"num_key_value_heads {kv}")
        hd = cfg.get("head_dim")
        if hd is None:
            if h % H:
                raise ValueError(f"model config ({_where(cfg)}): hidden_size {h} is not divisible by "
                                 f"num_attention_heads {H} and no head_dim is given")
            hd = h // H
        else:
            hd = _int(cfg, "head_dim")
        f.update(kv_heads=kv, head_dim=hd)
        bias = _flag(cfg, "attention_bias", False)
        f["qkv_bias"] = family in ("qwen2", "qwen2_moe") or bias
        f["o_bias"] = bias and family not in ("qwen2", "qwen2_moe")
        f["qk_norm"] = family in ("qwen3", "qwen3_moe")
        f["mlp_bias"] = _flag(cfg, "mlp_bias", False)
    if FAMILIES[family] == "dense":
        f["ffn"] = _int(cfg, "intermediate_size")
        return f
    if family == "mixtral":
        E, k, fe = _int(cfg, "num_local_experts"), _int(cfg, "num_experts_per_tok"), _int(cfg, "intermediate_size")
        f.update(ffn=fe, experts=E, top_k=k, expert_ffn=fe)
    elif family in ("qwen2_moe", "qwen3_moe"):
        E, k = _int(cfg, "num_experts"), _int(cfg, "num_experts_per_tok")
        shared = _int(cfg, "shared_expert_intermediate_size", 0, minimum=0) if family == "qwen2_moe" else 0
        f.update(ffn=_int(cfg, "intermediate_size"), experts=E, top_k=k, expert_ffn=_int(cfg, "moe_intermediate_size"),
                 shared_ffn=shared, shared_gate=shared > 0)
    else:
        E, k = _int(cfg, "n_routed_experts"), _int(cfg, "num_experts_per_tok")
        fe = _int(cfg, "moe_intermediate_size")
        f.update(ffn=_int(cfg, "intermediate_size"), experts=E, top_k=k, expert_ffn=fe,
                 shared_ffn=_int(cfg, "n_shared_experts", 0, minimum=0) * fe,
                 router_bias=family == "deepseek_v3")
    if k > E:
        raise ValueError(f"model config ({_where(cfg)}): {k} experts per token but only {E} experts")
    f["moe_layers"] = _moe_layers(cfg, L, family)
    return f


def seq_len_default(cfg: dict) -> int:
    """``DEFAULT_SEQ_LEN``, or the model's context if shorter."""
    ctx = cfg.get("max_position_embeddings")
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0 and math.isfinite(ctx):
        return min(ctx, DEFAULT_SEQ_LEN)
    return DEFAULT_SEQ_LEN
