"""Pass costs and the activation-memory model (docs/architecture.md).

* :class:`Costs` gives the time of one pass over **one full device-stage** (all the layers a
  device holds) and the latency ``comm`` of one cross-device hop. A chunk pass of a schedule with
  ``v`` stages per device costs ``f / v`` (layers split evenly). Per-stage lists give each virtual
  stage's own time instead (unequal stages: embedding, LM head, padding layers). ``BW`` costs
  ``b + w``.
* :class:`MemoryModel` gives the activation each stage's ``F`` allocates, in units of ``a`` (one
  microbatch's activation over one full device-stage; 1F1B's peak is ``p·a``), and the fraction
  released at ``B``; the rest is released at ``W`` (or all of it at ``BW``).
* The memory levers (docs/theory.md §13): a recomputed forward keeps ``Costs.input_fraction`` of
  its activation until its ``R`` (``Costs.recompute`` long, the forward by default); selective
  recomputation keeps ``Costs.selective[0]`` and recomputes for ``Costs.selective[1]`` of the
  forward; an offload copy takes ``Costs.offload`` per ``a`` copied, each direction.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Sequence, Union

__all__ = ["Costs", "MemoryModel", "MAX_COST"]

Number = Union[int, float]
PerStage = Union[Number, Sequence[Number]]

MAX_COST = 1e15
"""Largest pass time or latency accepted: sums over millions of passes stay finite and exact to
well below one unit. Rescale the time unit (ms instead of ns) for larger values."""


def _is_number(value: object) -> bool:
    """A real number (``int``, ``float``, numpy scalars: ``numbers.Real``), never a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_value(name: str, value: Number, allow_zero: bool = True) -> float:
    if not _is_number(value):
        what = "a bool" if isinstance(value, bool) else f"a {type(value).__name__}"
        raise TypeError(f"{name} must be a number, got {what} ({value!r})")
    x = float(value)
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if x < 0 or (x == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    if x > MAX_COST:
        raise ValueError(f"{name}={value!r} is larger than {MAX_COST:g} (ctrlmem.model.costs.MAX_COST); sums of many "
                         f"passes would overflow or lose precision; express the times in a larger unit")
    return x


def _check_fraction(name: str, value: Number) -> float:
    x = _check_value(name, value)
    if not 0 < x <= 1:
        raise ValueError(f"{name} is the time of an overlapped pair as a fraction of F + B, in (0, 1], got {value!r}; "
                         "1.0 is no gain (a pair that runs slower overlapped should not overlap)")
    return x


def _normalise(name: str, value: PerStage, allow_zero: bool = True) -> float | tuple[float, ...]:
    if _is_number(value):
        return _check_value(name, value, allow_zero)
    if isinstance(value, (str, bytes, bool, Mapping)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a number or a list of per-stage numbers, got "
                        f"{type(value).__name__} {value!r}" + ("; parse text with Costs.parse('F,B,W,COMM')"
                                                              if isinstance(value, str) else ""))
    items = list(value)
    if not items:
        raise ValueError(f"{name} is an empty list; give a number or one value per stage")
    return tuple(_check_value(f"{name}[{i}]", x, allow_zero) for i, x in enumerate(items))


def _total(value: float | tuple[float, ...]) -> float:
    return math.fsum(value) if isinstance(value, tuple) else value


def _per_stage(name: str, value: float | tuple[float, ...], num_stages: int, share: float) -> list[float]:
    if isinstance(value, tuple):
        if len(value) != num_stages:
            raise ValueError(
                f"{name} has {len(value)} per-stage values but the schedule has {num_stages} stages; "
                f"give one value per stage or a single number"
            )
        return list(value)
    return [value * share] * num_stages


@dataclass(frozen=True)
class Costs:
    """Pass times and communication latency.

    Args:
        f: forward time of one full device-stage, or one value per virtual stage.
        b: input-backward time (same convention).
        w: weight-backward time (same convention).
        comm: latency of one cross-device send (a single number).

    Keyword-only, the memory levers (docs/theory.md §13):

        recompute: time of an ``R`` pass (same convention as ``f``), in either recompute mode;
            ``None``, the default, is the forward's time for full recomputation and
            ``selective[1]`` of it for selective (a given time is the ``R``'s as it is: the
            planner gives each stage's recomputed layers, which leave its embedding and LM head
            out).
        offload: time to copy one ``a`` of activation between device and host, one direction
            (a copy of ``x·a`` takes ``x·offload``).
        input_fraction: the share of a forward's activation a fully recomputed forward keeps
            until its ``R``: the stage's input, ``2sbh`` of the ``sbh(34 + 5·heads·s/h)`` bytes a
            GPT layer saves (Korthikanti et al. 2022). The default ``2/34`` drops attention's
            ``s x s`` term, as the paper's ``34·s·b·h`` model does (and as a layer with a fused
            attention kernel saves); :meth:`gpt_levers` gives the exact value for known sizes.
        selective: ``(keep, cost)`` of selective recomputation: the share kept (all but
            attention's ``s x s`` part) and the recompute's time as a fraction of the forward.
            The default is Korthikanti et al.'s GPT-3 175B layer (h = 12288, 96 heads, s = 2048):
            ``34 / (34 + 5·96·2048/12288)`` kept, ``s / (6h + s)`` of the forward recomputed;
            :meth:`selective_pair` computes it for another model (:meth:`gpt_levers`: both
            fields).
        fb_overlap: (keyword-only) the time of an overlapped forward + backward pair
            (:attr:`ctrlmem.Schedule.overlaps`, DualPipe's F&B) as a fraction of ``F + B``, in
            (0, 1]; 1.0 (the default) is no gain. Measure it as DualPipe's authors do: time one
            forward alone, one backward alone, and the two run together (two CUDA streams, or one
            stream with the all-to-all of one hidden under the other's compute); the ratio is
            ``t(F&B) / (t(F) + t(B))`` (docs/theory.md, DualPipe).
    """

    f: PerStage = 1.0
    b: PerStage = 1.0
    w: PerStage = 1.0
    comm: Number = 0.0
    recompute: PerStage | None = field(default=None, kw_only=True)
    offload: Number = field(default=0.0, kw_only=True)
    input_fraction: Number = field(default=2 / 34, kw_only=True)
    selective: tuple[float, float] = field(default=(34 / 114, 2048 / 75776), kw_only=True)
    fb_overlap: Number = field(default=1.0, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("f", "b", "w"):
            object.__setattr__(self, name, _normalise(name, getattr(self, name)))
        object.__setattr__(self, "comm", _check_value("comm", self.comm))
        self._check_levers()
        object.__setattr__(self, "fb_overlap", _check_fraction("fb_overlap", self.fb_overlap))
        if _total(self.f) + _total(self.b) + _total(self.w) == 0:
            raise ValueError("f + b + w must be > 0 (on at least one stage): a schedule with free passes has no "
                             "bubble rate")

    def _check_levers(self) -> None:
        if self.recompute is not None:
            object.__setattr__(self, "recompute", _normalise("recompute", self.recompute))
        object.__setattr__(self, "offload", _check_value("offload", self.offload))
        keep = _check_value("input_fraction", self.input_fraction)
        if keep > 1:
            raise ValueError(f"input_fraction is a fraction in [0, 1], got {self.input_fraction!r}")
        object.__setattr__(self, "input_fraction", keep)
        pair = self.selective
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"selective must be a (keep, cost) pair of fractions, got {pair!r}")
        keep_s, cost_s = (_check_value(f"selective[{i}]", x) for i, x in enumerate(pair))
        if keep_s > 1:
            raise ValueError(f"selective[0] (the share kept) is a fraction in [0, 1], got {pair[0]!r}")
        object.__setattr__(self, "selective", (keep_s, cost_s))

    @staticmethod
    def selective_pair(hidden: int, heads: int, seq_len: int) -> tuple[float, float]:
        """``(keep, cost)`` of selective recomputation for a GPT layer (Korthikanti et al. 2022):
        the layer saves ``sbh(34 + 5·heads·s/h)`` bytes, selective recomputation drops the
        ``5·heads·s²b`` of attention's scores; the attention core is ``4bs²h`` of the
        forward's ``24bsh² + 4bs²h`` FLOPs."""
        scores = 5 * heads * seq_len / hidden
        return 34 / (34 + scores), seq_len / (6 * hidden + seq_len)

    @staticmethod
    def gpt_levers(hidden: int, heads: int, seq_len: int, flash_attention: bool = False) -> dict[str, object]:
        """``input_fraction`` and ``selective`` of a GPT layer of hidden size ``hidden``, ``heads``
        attention heads and sequence ``seq_len`` (Korthikanti et al. 2022), to pass to
        ``Costs(..., **Costs.gpt_levers(h, heads, s))``: the layer saves ``sbh(34 + 5·heads·s/h)``
        bytes, full recomputation keeps its input ``2sbh``, so ``input_fraction = 2 / (34 +
        5·heads·s/h)``; selective keeps all but the scores (:meth:`selective_pair`). With a
        fused attention kernel (``flash_attention``) the layer saves ``34sbh``, no scores:
        ``2/34`` and selective keeps everything and recomputes nothing."""
        for name, value in (("hidden", hidden), ("heads", heads), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if flash_attention:
            return {"input_fraction": 2 / 34, "selective": (1.0, 0.0)}
        return {"input_fraction": 2 / (34 + 5 * heads * seq_len / hidden),
                "selective": Costs.selective_pair(hidden, heads, seq_len)}

    def recompute_times(self, num_stages: int, num_devices: int, mode: str = "full") -> list[float]:
        """Per-stage time of an ``R`` pass: ``recompute`` when given (either mode), else the
        forward for ``full`` and ``selective[1]`` of the forward for ``selective``."""
        if self.recompute is not None:
            return _per_stage("recompute", self.recompute, num_stages, num_devices / num_stages)
        f = _per_stage("f", self.f, num_stages, num_devices / num_stages)
        if mode == "selective":
            return [x * self.selective[1] for x in f]
        return f

    def kept_fraction(self, mode: str = "full") -> float:
        """The share of a recomputed forward's activation kept until its ``R``."""
        return self.selective[0] if mode == "selective" else self.input_fraction

    @classmethod
    def coerce(cls, value: object, name: str = "costs") -> "Costs":
        """``value`` as a :class:`Costs`: ``None`` (the default costs), a ``Costs``, the text
        ``"F,B,W[,COMM]"``, a sequence ``(F, B, W[, COMM])`` or a mapping ``{"f": .., "b": ..}``
        (:meth:`to_dict`'s form). Anything else is a ``TypeError`` naming ``name``."""
        if value is None:
            return cls()
        if isinstance(value, Costs):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, Mapping):
            unknown = sorted(set(map(str, value)) - set(_KEYS))
            if unknown:
                raise TypeError(f"{name}: unknown key(s) {unknown}; a costs mapping takes {', '.join(_KEYS)}")
            return cls(**value)
        if isinstance(value, (list, tuple)) and not isinstance(value, bool):
            if len(value) not in (3, 4):
                raise ValueError(f"{name} as a sequence must be (F, B, W) or (F, B, W, COMM), got {len(value)} "
                                 f"values: {value!r}")
            return cls(*value)
        raise TypeError(f"{name} must be a ctrlmem.Costs, 'F,B,W[,COMM]' text or an (F, B, W[, COMM]) tuple, got "
                        f"{type(value).__name__} {value!r}")

    @classmethod
    def parse(cls, text: str) -> "Costs":
        """``"F,B,W"`` or ``"F,B,W,COMM"``, e.g. ``"1,1,1,0"`` (command-line form)."""
        if not isinstance(text, str):
            raise TypeError(f"costs text must be a str like '1,1,1,0', got {type(text).__name__} {text!r}")
        parts = [x.strip() for x in str(text).split(",")]
        if len(parts) not in (3, 4):
            raise ValueError(f"costs must be F,B,W or F,B,W,COMM (e.g. 1,1,1,0), got {text!r}")
        names = ("f", "b", "w", "comm")
        values = {}
        for name, raw in zip(names, parts):
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"costs: {name} must be a number, got {raw!r} in {text!r}") from None
        return cls(**values)

    def stage_times(self, num_stages: int, num_devices: int) -> tuple[list[float], list[float], list[float]]:
        """Per-stage ``(f, b, w)`` times for a schedule with ``num_stages`` stages."""
        share = num_devices / num_stages
        return (
            _per_stage("f", self.f, num_stages, share),
            _per_stage("b", self.b, num_stages, share),
            _per_stage("w", self.w, num_stages, share),
        )

    def to_dict(self) -> dict:
        """``f, b, w, comm``, and each lever field that is not at its default."""
        out = {"f": self.f, "b": self.b, "w": self.w, "comm": self.comm}
        for key, default in _LEVER_DEFAULTS.items():
            if getattr(self, key) != default:
                out[key] = getattr(self, key)
        return out


_LEVER_DEFAULTS = {"recompute": None, "offload": 0.0, "input_fraction": 2 / 34,
                   "selective": (34 / 114, 2048 / 75776), "fb_overlap": 1.0}
_KEYS = ("f", "b", "w", "comm", *_LEVER_DEFAULTS)


@dataclass(frozen=True)
class MemoryModel:
    """Activation memory per pass, in units of ``a``.

    Args:
        activation: activation one ``F`` allocates, per virtual stage, in ``a``. ``None`` (the
            default) gives every stage its even share ``p / S`` (``1`` for one stage per device,
            ``1/2`` for V-shape chunks). A single number applies to all stages.
        release_at_b: fraction of a stage's activation released when its ``B`` ends (the rest at
            ``W``). ``0`` is the paper's scheduling model; the transformer model of docs/theory.md §10
            frees about ``1 - 32h / (34h + 5·heads·s)`` at ``B``.
        kept: (keyword-only) what a recomputed forward keeps until its ``R``, per virtual stage,
            in the units of ``activation`` (a single number applies to all stages), at most the
            stage's activation. ``None``, the default, is ``Costs.kept_fraction`` of it. Where a
            stage keeps a share of its own (the planner's LM-head stage keeps its logits, which no
            recomputation drops), give the bytes here; the simulator (:func:`ctrlmem.simulate`)
            reads it, the budgeted searches and solvers take ``Costs.kept_fraction``.
    """

    activation: PerStage | None = None
    release_at_b: float = 0.0
    kept: PerStage | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.activation is not None:
            object.__setattr__(self, "activation", _normalise("activation", self.activation))
        r = _check_value("release_at_b", self.release_at_b)
        if self.activation is not None and _total(self.activation) == 0:
            raise ValueError("activation is zero on every stage; give positive activations (or None for even shares)")
        if r > 1:
            raise ValueError(f"release_at_b is a fraction in [0, 1], got {self.release_at_b!r}")
        object.__setattr__(self, "release_at_b", r)
        if self.kept is not None:
            object.__setattr__(self, "kept", _normalise("kept", self.kept))

    @classmethod
    def coerce(cls, value: object, name: str = "memory") -> "MemoryModel":
        """``None`` (the default model) or a :class:`MemoryModel`; anything else is a ``TypeError``."""
        if value is None:
            return cls()
        if isinstance(value, MemoryModel):
            return value
        raise TypeError(f"{name} must be a ctrlmem.MemoryModel (or None), got {type(value).__name__} {value!r}")

    @classmethod
    def transformer(cls, hidden: int, heads: int, seq_len: int) -> "MemoryModel":
        """The paper's per-layer model: 34·h + 5·heads·s bytes per token stored, 32·h of it
        kept until W (docs/theory.md §10, the authors' runtime)."""
        total = 34 * hidden + 5 * heads * seq_len
        return cls(release_at_b=1 - 32 * hidden / total)

    def stage_activation(self, num_stages: int, num_devices: int) -> list[float]:
        if self.activation is None:
            return [num_devices / num_stages] * num_stages
        return _per_stage("activation", self.activation, num_stages, 1.0)

    def stage_kept(self, num_stages: int, num_devices: int) -> list[float] | None:
        """Per stage, what a recomputed forward keeps until its ``R`` (:attr:`kept`, capped at
        the stage's activation), or ``None`` when ``Costs.kept_fraction`` decides."""
        if self.kept is None:
            return None
        act = self.stage_activation(num_stages, num_devices)
        return [min(k, a) for k, a in zip(_per_stage("kept", self.kept, num_stages, 1.0), act)]
