"""The model presets of real runs and their split into stages, without torch.

:class:`ModelConfig` (a GPT-style decoder's sizes), :data:`PRESETS` (the paper's Table 2 models and
small CPU ones), :func:`get_preset` and :func:`layers_per_stage` are what ``ctrlmem run`` checks a
run against before it launches anything; keeping them free of torch spares the launcher (and
``--emit-sbatch``) the seconds of importing it. :mod:`.models`, which builds the model itself,
re-exports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ModelConfig", "PRESETS", "get_preset", "layers_per_stage"]

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}
"""Accepted dtype names and the ``torch`` attribute each stands for."""


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
        import torch  # noqa: PLC0415 - torch takes seconds to import; only real runs need it

        return getattr(torch, _DTYPES[self.dtype])

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
