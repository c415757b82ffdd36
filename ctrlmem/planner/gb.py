"""Memory in GB where a budget is asked: ``--memory-gb`` beside ``--memory-limit``, and the GB
axis of the explorer's memory panel.

A schedule's memory is counted in ``a``, one microbatch's activation over one full device-stage
(docs/architecture.md), and a budget is a fraction of 1F1B's peak ``p·a``. For a model,
microbatch size and tensor parallelism, ``a`` in bytes is the activation of the largest of the
``p`` stages of one-stage-per-device pipelining (:func:`bytes_per_a`, the activation model of
:mod:`ctrlmem.planner.model`: ``34·h`` bytes per layer and token with FlashAttention, the LM head's
``4·V + 4·h`` on the last stage, divided by ``tp``), so ``G`` GB is ``G / (p·a)`` of 1F1B's peak.
Taking the largest stage keeps a schedule built for that fraction within ``G`` on every stage of
even size; the GB a schedule really needs, stage by stage, is :func:`simulated_gb`.
"""

from __future__ import annotations

import math

from ctrlmem.model.costs import MemoryModel
from ctrlmem.planner.model import ModelSpec, layer_activation_formula, model_spec, stage_bytes
from ctrlmem.model import paper
from ctrlmem.model.simulate import simulate

__all__ = ["bytes_per_a", "memory_limit_from_gb", "default_microbatch", "memory_model_gb", "simulated_gb"]


def default_microbatch(spec: ModelSpec) -> int:
    """The paper's pure-PP microbatch of a preset (Table 4: 4 / 2 / 1), else 1."""

    preset = paper.MODELS.get(spec.name)
    return preset.microbatch_size if preset is not None and preset.microbatch_size else 1


def bytes_per_a(model: "str | ModelSpec", num_devices: int, microbatch_size: int | None = None, tp: int = 1,
                flash_attention: bool = True) -> float:
    """Bytes of ``a`` (see the module doc) for ``model`` split into ``num_devices`` stages."""
    spec = model_spec(model)
    mb = microbatch_size or default_microbatch(spec)
    sb = stage_bytes(spec, num_devices, mb, tp, layer_activation_formula(spec, flash_attention))
    return max(sb.activation)


def memory_limit_from_gb(gb: float, model: "str | ModelSpec", num_devices: int, microbatch_size: int | None = None,
                         tp: int = 1, flash_attention: bool = True) -> tuple[float, str]:
    """``(memory_limit, explanation)``: ``gb`` GB of activation per device as a fraction of
    1F1B's peak for ``model`` at ``num_devices`` devices. ``ValueError`` for a bad ``gb``."""
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0:
        raise ValueError(f"--memory-gb must be a positive number of GB, got {gb!r}")
    spec = model_spec(model)
    mb = microbatch_size or default_microbatch(spec)
    a = bytes_per_a(spec, num_devices, mb, tp, flash_attention)
    limit = gb * 1e9 / (num_devices * a)
    text = (f"--memory-gb {gb:g} = {limit:.4g} of 1F1B's peak ({spec.name}, p = {num_devices}, microbatch {mb}, "
            f"seq {spec.seq_len}, TP {tp}: a = {a / 1e9:.3g} GB, the largest stage's activation of one microbatch; "
            f"1F1B holds p·a = {num_devices * a / 1e9:.3g} GB)")
    return limit, text


def memory_model_gb(model: "str | ModelSpec", num_stages: int, microbatch_size: int | None = None, tp: int = 1,
                    flash_attention: bool = True) -> MemoryModel:
    """A :class:`ctrlmem.MemoryModel` whose units are GB: each of ``num_stages`` stages' own
    activation of one microbatch (unequal stages, the LM head included)."""
    spec = model_spec(model)
    mb = microbatch_size or default_microbatch(spec)
    sb = stage_bytes(spec, num_stages, mb, tp, layer_activation_formula(spec, flash_attention))
    return MemoryModel(activation=[x / 1e9 for x in sb.activation], release_at_b=max(0.0, 1.0 - sb.w_kept))


def simulated_gb(schedule, model: "str | ModelSpec", microbatch_size: int | None = None, tp: int = 1,
                 flash_attention: bool = True) -> list[float]:
    """Peak activation GB of every device of ``schedule`` for ``model`` (theory: no allocator margin)."""

    mem = memory_model_gb(model, schedule.num_stages, microbatch_size, tp, flash_attention)
    return list(simulate(schedule, None, mem).peak_memory)
