"""The schedule data model: passes, placements, schedules, and their text and torch-CSV forms.

Notation (docs/architecture.md, docs/theory.md §1):

* ``F`` forward, ``B`` backward for the input (activation gradient), ``W`` backward for the
  weights, ``BW`` a fused backward (B and W in one pass, as in 1F1B), ``R`` a recompute of a
  forward (activation recomputation, docs/theory.md §13): it runs on the stage's device after
  its ``F`` and before its ``B`` (or ``BW``).
* Activation offload is not a compute pass: :attr:`Schedule.copies` lists, per device, the
  :class:`Copy` of an activation to host memory (``O``) and back (``L``, a reload).
* ``p`` devices (the paper's *d*), ``m`` microbatches, ``S`` virtual stages; a device holds
  ``v = S / p`` stages, its *chunks*, in ascending stage order (chunk 0 is its lowest stage).
* A :class:`Schedule` is data: for every device, the ordered list of passes it runs.

The compact text form writes a pass as ``<stage><op><microbatch>`` with ctrlmem's letters, for
example ``3F0`` or ``5BW2``; it is the form torch uses, but with our letters. Torch's letters
differ (its ``I`` is our ``B``, its ``B`` is our ``BW``); :meth:`Schedule.to_torch_csv` and
:meth:`Schedule.from_torch_csv` translate. :meth:`Schedule.from_torch_csv` reads a file (torch's
``_dump_csv`` form, which torchtitan also takes, compute-only or compute+comms),
:meth:`Schedule.from_torch_csv_text` the CSV text itself, and :meth:`Schedule.load` a file in
either form (CSV or text). Bad input is refused with a ``ValueError`` naming the line.
"""

from __future__ import annotations

import csv
import enum
import io
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from os import PathLike
from typing import Iterable, NamedTuple, Sequence
from ctrlmem.util.fileio import atomic_write
from ctrlmem.util.userfile import read_bytes

__all__ = ["Op", "Pass", "Placement", "Schedule", "Copy", "RECOMPUTE_MODES"]


class Op(str, enum.Enum):
    """Kind of a pass: forward, input backward, weight backward, fused backward, or recompute."""

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"
    R = "R"

    def __str__(self) -> str:  # "F", not "Op.F"
        return self.value


_TORCH_LETTER = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}
_FROM_TORCH_LETTER = {v: k for k, v in _TORCH_LETTER.items()}
_PASS_RE = re.compile(r"^(\d+)(BW|F|B|W|R)(\d+)$")


class Pass(NamedTuple):
    """One pass of one microbatch through one stage (an immutable tuple ``(op, stage, microbatch)``)."""

    op: Op
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Pass":
        """Parse ``"3F0"`` / ``"5BW2"`` (stage, op, microbatch) back into a :class:`Pass`."""
        match = _PASS_RE.match(text.strip())
        if not match:
            raise ValueError(
                f"cannot parse pass {text!r}: expected <stage><F|B|W|BW|R><microbatch>, e.g. '3F0'"
            )
        return cls(Op(match.group(2)), int(match.group(1)), int(match.group(3)))

    def to_torch(self) -> str:
        """The pass in torch's action letters (``F``, ``I`` for B, ``W``, ``B`` for BW). An ``R``
        has no torch action (torch recomputes inside the backward: :meth:`Schedule.to_torch_csv`)."""
        if self.op is Op.R:
            raise ValueError(f"pass {self} is a recompute, which torch's CSV has no action for; "
                             "Schedule.to_torch_csv drops it (torch.utils.checkpoint recomputes inside the backward)")
        return f"{self.stage}{_TORCH_LETTER[self.op]}{self.microbatch}"


RECOMPUTE_MODES = ("full", "selective")
"""What a schedule's ``R`` passes recompute: ``full`` the whole forward (only the stage's input is
kept until ``R``), ``selective`` attention's s x s part only (:class:`ctrlmem.Costs`)."""

_COPY_RE = re.compile(r"^(\d+)(O|L)(\d+)(?::([0-9.eE+-]+))?(?:@(-?\d+))?$")


class Copy(NamedTuple):
    """One activation copy on a device's copy lanes (docs/theory.md §13).

    ``kind`` is ``"O"`` (offload: device to host, starts when its ``F`` has ended and the
    device-to-host lane is free) or ``"L"`` (reload: host to device, issued when the device's
    compute pass at step ``after`` ends, ``-1`` for time 0; its ``B`` waits for it).
    ``fraction`` (offloads only) is the share of the forward's resident activation copied.
    Text form: ``3O0`` / ``3O0:0.5`` and ``3L0@7``.
    """

    kind: str
    stage: int
    microbatch: int
    fraction: float = 1.0
    after: int = -1

    def __str__(self) -> str:
        if self.kind == "O":
            return f"{self.stage}O{self.microbatch}" + ("" if self.fraction == 1 else f":{self.fraction!r}")
        return f"{self.stage}L{self.microbatch}@{self.after}"

    @classmethod
    def parse(cls, text: str) -> "Copy":
        """Parse ``"3O0"``, ``"3O0:0.5"`` or ``"3L0@7"``."""
        match = _COPY_RE.match(text.strip())
        if not match or (match.group(2) == "O") != (match.group(5) is None) or (
                match.group(2) == "L" and match.group(4) is not None):
            raise ValueError(f"cannot parse copy {text!r}: expected an offload <stage>O<mb>[:FRACTION] "
                             "(e.g. '3O0:0.5') or a reload <stage>L<mb>@<step> (e.g. '3L0@7')")
        stage, kind, mb, frac, after = match.groups()
        try:
            fraction = float(frac) if frac is not None else 1.0
        except ValueError:
            raise ValueError(f"cannot parse copy {text!r}: the fraction must be a number") from None
        return cls(kind, int(stage), int(mb), fraction, int(after) if after is not None else -1)


PLACEMENT_KINDS = ("sequential", "interleaved", "v-shape", "custom")


@dataclass(frozen=True)
class Placement:
    """Which device holds each virtual stage.

    ``stage_device[s]`` is the device of stage ``s``. Use the constructors
    :meth:`sequential`, :meth:`interleaved` and :meth:`v_shape` for the standard layouts; any
    other mapping is ``kind="custom"``. Every device must hold the same number of stages.
    """

    kind: str
    stage_device: tuple[int, ...]
    num_devices: int
    _stages_of: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENT_KINDS:
            raise ValueError(f"unknown placement kind {self.kind!r}; expected one of {PLACEMENT_KINDS}")
        if self.num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {self.num_devices}")
        stages_of: list[list[int]] = [[] for _ in range(self.num_devices)]
        for stage, device in enumerate(self.stage_device):
            if not 0 <= device < self.num_devices:
                raise ValueError(
                    f"placement puts stage {stage} on device {device}, outside 0..{self.num_devices - 1}"
                )
            stages_of[device].append(stage)
        counts = {len(s) for s in stages_of}
        if len(counts) != 1 or 0 in counts:
            shown = [f"device {d}: {len(s)}" for d, s in enumerate(stages_of[:8])]
            more = f", ... ({self.num_devices} devices)" if self.num_devices > 8 else ""
            raise ValueError("every device must hold the same, non-zero number of stages; got "
                             + ", ".join(shown) + more)
        object.__setattr__(self, "_stages_of", tuple(tuple(s) for s in stages_of))

    @classmethod
    def sequential(cls, num_devices: int) -> "Placement":
        """One stage per device: device ``i`` holds stage ``i`` (1F1B, GPipe, ZB-H1/H2)."""
        return cls("sequential", tuple(range(num_devices)), num_devices)

    @classmethod
    def interleaved(cls, num_devices: int, num_chunks: int) -> "Placement":
        """Looped placement: device ``i`` holds stages ``i, i+p, i+2p, ...`` (Megatron VPP)."""
        if num_chunks < 1:
            raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
        return cls(
            "interleaved",
            tuple(s % num_devices for s in range(num_devices * num_chunks)),
            num_devices,
        )

    @classmethod
    def v_shape(cls, num_devices: int) -> "Placement":
        """V-shape: ``2p`` stages; device ``i`` holds stage ``i`` and stage ``2p-1-i`` (docs/theory.md §4)."""
        p = num_devices
        return cls("v-shape", tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p)), p)

    @classmethod
    def infer(cls, stage_device: Sequence[int], num_devices: int) -> "Placement":
        """The placement for an explicit mapping, recognising the standard kinds."""
        mapping = tuple(stage_device)
        num_stages = len(mapping)
        if num_devices >= 1 and num_stages % num_devices == 0:
            v = num_stages // num_devices
            for candidate in (
                cls.sequential(num_devices) if v == 1 else None,
                cls.v_shape(num_devices) if v == 2 else None,
                cls.interleaved(num_devices, v),
            ):
                if candidate is not None and candidate.stage_device == mapping:
                    return candidate
        return cls("custom", mapping, num_devices)

    @property
    def num_stages(self) -> int:
        return len(self.stage_device)

    @property
    def num_chunks(self) -> int:
        """Stages per device (``v``)."""
        return self.num_stages // self.num_devices

    def device_of(self, stage: int) -> int:
        return self.stage_device[stage]

    def stages_of(self, device: int) -> tuple[int, ...]:
        """The stages a device holds, ascending (its chunks 0, 1, ...)."""
        return self._stages_of[device]

    def chunk_of(self, stage: int) -> int:
        """Index of ``stage`` among its device's stages (0 = the device's lowest stage)."""
        return self._stages_of[self.stage_device[stage]].index(stage)

    def to_text(self) -> str:
        return f"{self.kind}:" + ",".join(map(str, self.stage_device))


_HEADER_KEYS = frozenset({"p", "m", "placement", "recompute", "model_copies"})
"""Keys of the text header that a generator parameter of the same name must not shadow."""


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered passes plus the placement they run on.

    Attributes:
        name: the generator's registered name (or any label for hand-written schedules).
        num_devices: ``p``.
        num_microbatches: ``m``.
        placement: which device holds each stage; ``placement.num_stages`` is ``S``.
        device_passes: ``device_passes[d]`` is device ``d``'s passes in execution order.
        params: the generator's parameters (for display and export), e.g. ``{"num_chunks": 2}``.
        recompute_mode: keyword-only; what the ``R`` passes recompute, ``"full"`` (default) or
            ``"selective"`` (:data:`RECOMPUTE_MODES`); meaningless without ``R`` passes.
        copies: keyword-only; per device, its activation copies (:class:`Copy`), ``()`` for none.
        overlaps: (keyword-only) per device, the positions ``i`` where passes ``i`` and ``i + 1``
            run as one overlapped unit (one forward and one backward of different microbatches or
            stages, as DualPipe overlaps them to hide all-to-all; torch's ``OVERLAP_F_B``): both
            start together when both inputs are ready and both end after
            ``Costs.fb_overlap · (their two times)``. Empty (the default) when nothing overlaps;
            otherwise one sorted tuple per device. :func:`ctrlmem.validate` checks the pairs' kinds.
        model_copies: (keyword-only) model copies the stages hold (1 by default; 2 for bidirectional
            DualPipe). The stages split into ``copies`` consecutive blocks of ``S / copies``, each
            a whole model with its own loss; copy ``c`` runs microbatches
            ``c·m/copies … (c+1)·m/copies − 1`` only (each microbatch goes through one copy).

    A ``Schedule`` is only data; :func:`ctrlmem.validate` checks it and
    :func:`ctrlmem.simulate` times it.
    """

    name: str
    num_devices: int
    num_microbatches: int
    placement: Placement
    device_passes: tuple[tuple[Pass, ...], ...]
    params: tuple[tuple[str, object], ...] = ()
    recompute_mode: str = field(default="full", kw_only=True)
    copies: tuple[tuple[Copy, ...], ...] = field(default=(), kw_only=True)
    overlaps: tuple[tuple[int, ...], ...] = field(default=(), kw_only=True)
    model_copies: int = field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        if self.recompute_mode not in RECOMPUTE_MODES:
            raise ValueError(f"recompute_mode must be one of {RECOMPUTE_MODES}, got {self.recompute_mode!r}")
        if self.copies and len(self.copies) != self.num_devices:
            raise ValueError(f"copies has {len(self.copies)} rows but the schedule has {self.num_devices} devices; "
                             "give one tuple of copies per device (or none at all)")
        object.__setattr__(self, "overlaps", _normal_overlaps(self.overlaps, self.device_passes))
        _check_copies(self.model_copies, self.placement.num_stages, self.num_microbatches)
        if self.placement.num_devices != self.num_devices:
            raise ValueError(
                f"placement has {self.placement.num_devices} devices but the schedule has {self.num_devices}"
            )
        if len(self.device_passes) != self.num_devices:
            raise ValueError(
                f"device_passes has {len(self.device_passes)} rows but the schedule has "
                f"{self.num_devices} devices"
            )

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_orders(
        cls,
        name: str,
        placement: Placement,
        num_microbatches: int,
        orders: Iterable[Iterable[Pass | tuple[Op, int, int]]],
        params: dict | None = None,
        overlaps: Iterable[Iterable[int]] = (),
        model_copies: int = 1,
    ) -> "Schedule":
        """Build a schedule from per-device sequences of passes (or ``(op, stage, mb)`` tuples);
        ``overlaps`` as :attr:`overlaps` (per device, the first positions of overlapped pairs)."""
        rows = tuple(
            tuple(x if isinstance(x, Pass) else Pass(Op(x[0]), int(x[1]), int(x[2])) for x in order)
            for order in orders
        )
        return cls(
            name=name,
            num_devices=placement.num_devices,
            num_microbatches=num_microbatches,
            placement=placement,
            device_passes=rows,
            params=tuple(sorted((params or {}).items())),
            overlaps=tuple(tuple(row) for row in overlaps),
            model_copies=model_copies,
        )

    # -- derived ---------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def num_passes(self) -> int:
        return sum(len(row) for row in self.device_passes)

    @property
    def recomputes(self) -> bool:
        """True when the schedule holds ``R`` passes."""
        return any(ps.op is Op.R for row in self.device_passes for ps in row)

    @property
    def offloads(self) -> bool:
        """True when the schedule copies activations to host memory."""
        return any(self.copies)

    def compute_only(self) -> "Schedule":
        """The schedule without its levers: ``R`` passes and copies dropped (what torch's CSV
        carries); every other pass in its order, overlapped pairs and model copies kept."""
        rows = tuple(tuple(ps for ps in row if ps.op is not Op.R) for row in self.device_passes)
        overlaps = tuple(tuple(i - sum(ps.op is Op.R for ps in row[:i]) for i in starts)
                         for row, starts in zip(self.device_passes, self.overlaps))
        return Schedule(self.name, self.num_devices, self.num_microbatches, self.placement, rows, self.params,
                        overlaps=overlaps, model_copies=self.model_copies)

    @property
    def split_backward(self) -> bool:
        """True when the schedule uses separate B and W passes (zero-bubble family)."""
        return any(ps.op is Op.W for row in self.device_passes for ps in row)

    def copy_of_stage(self, stage: int) -> int:
        """The model copy (0 .. copies − 1) that ``stage`` belongs to."""
        return stage // (self.num_stages // self.model_copies)

    def copy_of_microbatch(self, microbatch: int) -> int:
        """The model copy that runs ``microbatch``."""
        return microbatch // (self.num_microbatches // self.model_copies)

    def overlap_starts(self, device: int) -> frozenset[int]:
        """The positions on ``device`` that start an overlapped pair (see :attr:`overlaps`)."""
        return frozenset(self.overlaps[device]) if self.overlaps else frozenset()

    def units(self, device: int) -> list[tuple[Pass, ...]]:
        """``device``'s order as units: a pass alone, or an overlapped pair (two passes)."""
        row, starts = self.device_passes[device], self.overlap_starts(device)
        out: list[tuple[Pass, ...]] = []
        i = 0
        while i < len(row):
            n = 2 if i in starts else 1
            out.append(tuple(row[i:i + n]))
            i += n
        return out

    def __str__(self) -> str:
        return self.to_text()

    # -- text form ---------------------------------------------------------------------------
    def to_text(self) -> str:
        """Compact, human-readable text that :meth:`from_text` parses back exactly.

        ``schedule NAME p=P m=M placement=KIND:DEV,DEV,...`` then one line per device,
        ``dN: 0F0 0F1 ...``; a schedule with ``R`` passes adds ``recompute=MODE`` to the header,
        one with copies a line ``cN: 0O0 0L0@5 ...`` per device after the device lines; an
        overlapped pair is one token, its two passes joined by ``+`` (``0F7+7BW3``).
        """
        head = (
            f"schedule {self.name} p={self.num_devices} m={self.num_microbatches} "
            f"placement={self.placement.to_text()}"
        ) + (f" model_copies={self.model_copies}" if self.model_copies != 1 else "")
        if self.params:
            # a value with spaces or quotes (e.g. a search's description of what it chose) is quoted
            # shell-style, so the header stays one token per key
            # a parameter named like a header key (p, m, placement) is written as param.KEY
            head += " " + " ".join(f"{'param.' + k if k in _HEADER_KEYS else k}={shlex.quote(str(v))}"
                                   for k, v in self.params)
        if self.recomputes:
            head += f" recompute={self.recompute_mode}"
        lines = [head]
        for d in range(self.num_devices):
            lines.append(f"d{d}: " + " ".join("+".join(map(str, unit)) for unit in self.units(d)))
        for d, row in enumerate(self.copies):
            lines.append(f"c{d}: " + " ".join(map(str, row)))
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str, allow_large: bool = False) -> "Schedule":
        """Parse :meth:`to_text`'s form. Blank lines, ``#`` comments and a UTF-8 byte-order
        mark are ignored; a repeated header key or device line, a pass outside the schedule's
        stages or microbatches, and text that is not text (binary) are refused with a
        ``ValueError`` naming the line. Sizes are checked before anything is allocated: the
        header's ``p`` against its placement, ``m`` against the passes the text holds, and more
        than :data:`MAX_PASSES` passes are refused unless
        ``allow_large``."""
        text = _clean_text(text, "schedule text")
        limit = _pass_limit(allow_large)
        body = text.split("\n", 1)[1] if "\n" in text.lstrip() else ""
        body = _COMMENT.sub("", body) if "#" in body else body
        upper = sum(body.count(c) for c in "FBWRO") - body.count("BW")  # the passes, counted without parsing
        if limit is not None and upper > limit:
            raise _too_many("schedule text", limit)
        numbered = [(i, ln) for i, ln in enumerate(text.splitlines(), 1)
                    if ln.strip() and not ln.lstrip().startswith("#")]
        if not numbered or not numbered[0][1].startswith("schedule "):
            raise ValueError("schedule text must start with 'schedule NAME p=P m=M placement=...'")
        head_no, head = numbered[0]
        quoted = any(q in head for q in "'\"\\")
        if quoted and len(head) > _MAX_QUOTED_HEADER:  # shlex reads a character at a time
            raise ValueError(f"line {head_no}: a header with quoted values is at most {_MAX_QUOTED_HEADER:,} "
                             f"characters, this one has {len(head):,}; shorten its parameters")
        try:
            tokens = shlex.split(head) if quoted else head.split()
        except ValueError as exc:  # an unbalanced quote
            raise ValueError(f"line {head_no}: bad header ({exc}): quote values with spaces, e.g. key='a b'") from None
        if len(tokens) < 2:
            raise ValueError(f"line {head_no}: the header needs a name: 'schedule NAME p=P m=M placement=...'")
        name = tokens[1]
        fields: dict[str, str] = {}
        for tok in tokens[2:]:
            key, sep, value = tok.partition("=")
            if not sep:
                raise ValueError(f"line {head_no}: bad header token {tok!r}: expected key=value")
            if key in fields:
                raise ValueError(f"line {head_no}: header key {key!r} is given twice")
            fields[key] = value
        try:
            p, m = int(fields.pop("p")), int(fields.pop("m"))
            model_copies = int(fields.pop("model_copies", "1"))
            kind, _, mapping = fields.pop("placement").partition(":")
        except KeyError as exc:
            raise ValueError(f"line {head_no}: schedule header is missing {exc.args[0]}=...") from None
        except ValueError as exc:
            raise ValueError(f"line {head_no}: p and m must be integers ({exc})") from None
        try:
            stage_device = tuple(int(x) for x in mapping.split(",") if x)
        except ValueError:
            raise ValueError(f"line {head_no}: placement must be KIND:DEV,DEV,..., got "
                             f"{_short(kind + ':' + mapping)}") from None
        if not 1 <= p <= max(1, len(stage_device)):  # every device holds at least one stage
            raise ValueError(f"line {head_no}: p={p} does not fit the placement, which maps {len(stage_device)} "
                             f"stage(s) to devices; every device holds at least one stage, so 1 <= p <= "
                             f"{len(stage_device)}")
        if m < 1:
            raise ValueError(f"line {head_no}: m must be a positive integer, got m={m}")
        if len(stage_device) > max(upper, _SMALL):  # every stage runs a pass: checked before a placement that size exists
            raise ValueError(f"line {head_no}: the placement maps {len(stage_device):,} stages, but the text holds "
                             f"only {upper:,} passes and every stage needs at least one")
        mode = fields.pop("recompute", "full")
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"line {head_no}: recompute={mode!r} is not one of {', '.join(RECOMPUTE_MODES)}")
        placement = Placement(kind, stage_device, p)
        rows: list[tuple[Pass, ...] | None] = [None] * p
        copies: list[tuple[Copy, ...] | None] = [None] * p
        overlaps: list[list[int]] = [[] for _ in range(p)]
        read = 0
        for no, line in numbered[1:]:
            label, sep, rest = line.partition(":")
            label = label.strip()
            if sep and label[:1] == "c" and label[1:].isdigit():
                _read_copies(no, label, rest, copies, placement.num_stages, m)
                continue
            if not sep or not label.startswith("d") or not label[1:].isdigit():
                raise ValueError(f"line {no}: bad device line {line.strip()[:60]!r}: expected 'dN: 0F0 0F1 ...'")
            d = int(label[1:])
            if not 0 <= d < p:
                raise ValueError(f"line {no}: device line {label!r} is outside d0..d{p - 1}")
            if rows[d] is not None:
                raise ValueError(f"line {no}: device line {label!r} is given twice")
            row = []
            for tok in rest.split():
                parts = tok.split("+")
                if len(parts) > 2:
                    raise ValueError(f"line {no}: {tok[:60]!r} joins {len(parts)} passes; an overlapped pair is "
                                     "two passes, e.g. '0F7+7BW3'")
                if len(parts) == 2:
                    overlaps[d].append(len(row))
                for part in parts:
                    try:
                        ps = Pass.parse(part)
                    except ValueError as exc:
                        raise ValueError(f"line {no}: {exc}") from None
                    _check_range(ps, placement.num_stages, m, f"line {no}")
                    row.append(ps)
            rows[d] = tuple(row)
            read += len(row)
            if limit is not None and read > limit:
                raise _too_many("schedule text", limit)
        _check_counts("schedule text", placement.num_stages, m, sum(len(r or ()) for r in rows))
        params = tuple(sorted((k[len("param."):] if k.startswith("param.") else k, _parse_literal(v))
                              for k, v in fields.items()))
        lanes = tuple(c or () for c in copies) if any(c is not None for c in copies) else ()
        return cls(name, p, m, placement, tuple(r or () for r in rows), params, recompute_mode=mode, copies=lanes,
                   overlaps=tuple(map(tuple, overlaps)), model_copies=model_copies)

    # -- torch CSV ---------------------------------------------------------------------------
    def to_torch_csv(self, path: str | PathLike | None = None) -> str:
        """Write (and return) the schedule in ``torch.distributed.pipelining``'s CSV format.

        One row per rank, one cell per action, in torch's letters: ``F``, ``I`` (our B),
        ``W``, ``B`` (our BW); for example ``0F3,7I2,7W2,1B0``.

        Torch's CSV has no recompute or copy action, so the levers are dropped and the compute
        order kept: an ``R`` maps onto ``torch.utils.checkpoint`` around the stage's layers (the
        forward keeps only the checkpoint's inputs and the backward recomputes right before it
        runs, which is where ctrlmem places the ``R``; ``ctrlmem run --recompute``), an offload onto
        ``torch.autograd.graph.saved_tensors_hooks`` packing saved tensors to host memory.
        An overlapped pair is torch's ``(0F7;7B3)OVERLAP_F_B`` (its two sub-actions in our order). A
        schedule of two model copies (bidirectional DualPipe) has no torch form and is refused.
        """
        if self.model_copies != 1:
            raise ValueError(f"schedule {self.name!r} holds {self.model_copies} model copies (each microbatch through one); "
                             "torch's CSV chains every stage into the next, so it has no form for it: export "
                             "dualpipe-v (one copy, V-shape) for torch")
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for d in range(self.num_devices):
            writer.writerow([_torch_cell(unit) for unit in self.units(d) if unit[0].op is not Op.R])
        text = buf.getvalue()
        if path is not None:  # atomically: a failed write keeps the old file (ctrlmem.util.fileio)

            atomic_write(path, text, newline="")
        return text

    @classmethod
    def from_torch_csv(
        cls,
        path: str | PathLike,
        num_microbatches: int | None = None,
        name: str = "torch-csv",
        allow_large: bool = False,
    ) -> "Schedule":
        """Read a file in ``torch.distributed.pipelining``'s CSV form (``_dump_csv`` /
        ``_load_csv``, which torchtitan's ``pipeline_parallel_schedule_csv`` takes): one row per
        rank, one action per cell, ``0F0``, ``1I0``, ``1W0``, ``0B0`` (torch's ``I`` is our B,
        its ``B`` our BW). Its compute+comms variant loads too: communication and FSDP actions
        (``SEND_F``, ``RECV_B``, ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``) are dropped, since
        they follow from the compute order, and ``(a;b)OVERLAP_F_B`` becomes ``a`` then ``b`` as
        an overlapped pair (:attr:`Schedule.overlaps`).
        The placement is inferred from which rank runs each stage; ``m`` from the largest
        microbatch index unless given. ``path`` is always a file name (commas included); for
        CSV text use :meth:`from_torch_csv_text`. Sizes are checked as :meth:`load` checks them."""
        if isinstance(path, str) and "\n" in path:  # ctrlmem <= 0.1 also took the text itself
            warnings.warn("Schedule.from_torch_csv(text) is deprecated: use from_torch_csv_text(text)",
                          DeprecationWarning, stacklevel=2)
            return cls.from_torch_csv_text(path, num_microbatches, name, allow_large=allow_large)
        raw = _read_schedule_file(path, allow_large)
        return cls.from_torch_csv_text(raw, num_microbatches, name, source=str(path), allow_large=allow_large)

    @classmethod
    def from_torch_csv_text(
        cls,
        text: str | bytes,
        num_microbatches: int | None = None,
        name: str = "torch-csv",
        source: str = "torch CSV",
        allow_large: bool = False,
    ) -> "Schedule":
        """:meth:`from_torch_csv` from the CSV text itself (``str``, or ``bytes`` in UTF-8). A
        byte-order mark and blank lines before or after the rows are ignored; a blank line
        between ranks, an unknown action, a microbatch outside ``0..m-1`` and binary data are
        refused with a ``ValueError`` naming the line. Sizes are checked before anything is
        allocated: a stage or microbatch index larger than the passes the file holds could
        ever use, ``m`` beyond them, and more than
        :data:`MAX_PASSES` passes (unless ``allow_large``)."""
        text = _clean_text(text, source)
        limit = _pass_limit(allow_large)
        if limit is not None and _torch_passes(text) > limit:
            raise _too_many(source, limit)
        lines = text.splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.strip(" ,\t")), None)
        if first is None:
            raise ValueError(f"{source} is empty: expected one row of actions per rank")
        last = max(i for i, ln in enumerate(lines) if ln.strip(" ,\t"))
        rows: list[tuple[Pass, ...]] = []
        overlaps: list[tuple[int, ...]] = []
        read = 0
        for i in range(first, last + 1):
            no, rank = i + 1, i - first
            cells = next(csv.reader([lines[i]]), [])
            if not any(c.strip() for c in cells):
                raise ValueError(f"{source}, line {no}: blank line between ranks (rank {rank} would "
                                 "have no actions); remove it")
            row: list[Pass] = []
            pairs: list[int] = []
            for col, cell in enumerate(c.strip() for c in cells):
                if cell:
                    got = _torch_actions(cell, f"{source}, line {no} (rank {rank}), column {col + 1}")
                    if len(got) == 2:  # an OVERLAP_F_B with two compute sub-actions
                        pairs.append(len(row))
                    row += got
            rows.append(tuple(row))
            overlaps.append(tuple(pairs))
            read += len(row)
            if limit is not None and read > limit:
                raise _too_many(source, limit)
        p = len(rows)
        total = sum(len(row) for row in rows)
        stage_device: dict[int, int] = {}
        for d, row in enumerate(rows):
            for ps in row:
                if ps.stage >= max(total, _SMALL):  # every stage below it needs a pass: refused before any list of stages
                    raise ValueError(f"{source}, line {first + 1 + d} (rank {d}): action {ps.to_torch()} names stage "
                                     f"{ps.stage}, but the file holds only {total} compute action(s) and every stage "
                                     f"0..{ps.stage} needs one; stages are numbered from 0")
                prev = stage_device.setdefault(ps.stage, d)
                if prev != d:
                    raise ValueError(f"{source}: stage {ps.stage} appears on rank {prev} and on rank {d}")
        num_stages = max(stage_device) + 1 if stage_device else 0
        missing = [s for s in range(num_stages) if s not in stage_device]
        if missing:
            raise ValueError(f"{source} has no action for stage(s) {_first_few(missing)}")
        placement = Placement.infer([stage_device[s] for s in range(num_stages)], p)
        largest = max(ps.microbatch for row in rows for ps in row)
        if num_microbatches is None:
            num_microbatches = 1 + largest
        elif largest >= num_microbatches:
            no = first + 1 + next(d for d, row in enumerate(rows) if any(ps.microbatch == largest for ps in row))
            raise ValueError(f"{source}, line {no}: microbatch {largest} is outside 0..{num_microbatches - 1} "
                             f"(m={num_microbatches})")
        _check_counts(source, num_stages, num_microbatches, total)
        return cls(name, p, num_microbatches, placement, tuple(rows), overlaps=tuple(overlaps))

    @classmethod
    def load(cls, path: str | PathLike, num_microbatches: int | None = None, allow_large: bool = False) -> "Schedule":
        """A schedule from a file in either form: ctrlmem's text form (first line
        ``schedule NAME ...``) or a torch / torchtitan pipelining CSV. The name is the file's
        stem for a CSV.

        Bounded: a path that is not a regular file (a folder, a FIFO, a device) is refused
        without being opened; a file larger than :data:`MAX_FILE_BYTES` is refused unread, one
        of more than :data:`MAX_PASSES` passes after counting, and
        headers or indices that would need more than the file holds before anything is
        allocated (``allow_large=True`` lifts the size limits, not the others)."""
        raw = _read_schedule_file(path, allow_large)
        text = _clean_text(raw, str(path))
        if text.lstrip().startswith("schedule "):
            return cls.from_text(text, allow_large=allow_large)
        stem = os.path.splitext(os.path.basename(str(path)))[0] or "torch-csv"
        return cls.from_torch_csv_text(text, num_microbatches, name=stem, source=str(path), allow_large=allow_large)


_COMMS = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}
_TORCH_ACTION_RE = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")


def _torch_cell(unit: tuple[Pass, ...]) -> str:
    """One unit of :meth:`Schedule.units` as a torch action cell."""
    if len(unit) == 1:
        return unit[0].to_torch()
    return "(" + ";".join(ps.to_torch() for ps in unit) + ")OVERLAP_F_B"


def _check_copies(copies: object, num_stages: int, num_microbatches: int) -> None:
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"model_copies must be an integer >= 1, got {copies!r}")
    if num_stages % copies or num_microbatches % copies:
        raise ValueError(f"model_copies={copies} must divide the stages ({num_stages}) and the microbatches "
                         f"({num_microbatches}): each copy is a whole model running its share of the microbatches")


def _normal_overlaps(overlaps, device_passes) -> tuple[tuple[int, ...], ...]:
    """:attr:`Schedule.overlaps` as stored: ``()`` when nothing overlaps, else one sorted tuple
    per device; ``ValueError`` for a position without a next pass or two pairs sharing a pass."""
    rows = tuple(tuple(sorted(int(i) for i in row)) for row in overlaps)
    if not any(rows):
        return ()
    if len(rows) != len(device_passes):
        raise ValueError(f"overlaps has {len(rows)} rows but the schedule has {len(device_passes)} devices; "
                         "give one tuple of positions per device")
    for d, (row, passes) in enumerate(zip(rows, device_passes)):
        for a, b in zip(row, row[1:]):
            if b - a < 2:
                raise ValueError(f"device {d}: overlapped pairs at positions {a} and {b} share a pass; a pass "
                                 "overlaps with at most one other")
        bad = [i for i in row if not 0 <= i < len(passes) - 1]
        if bad:
            raise ValueError(f"device {d}: an overlapped pair starts at position {bad[0]}, but the device's passes "
                             f"are at 0..{len(passes) - 1} and a pair needs this one and the next")
    return rows


def _torch_actions(cell: str, where: str) -> list[Pass]:
    """The compute passes of one torch action cell (none for a communication action)."""
    if cell.startswith("(") and cell.endswith(")OVERLAP_F_B"):
        out: list[Pass] = []
        for sub in cell[1:-len(")OVERLAP_F_B")].split(";"):
            if sub.strip():
                out += _torch_actions(sub.strip(), where)
        if len(out) > 2:
            raise ValueError(f"{where}: {cell[:60]!r} overlaps {len(out)} compute actions; ctrlmem overlaps a "
                             "forward with one backward (two sub-actions)")
        return out
    match = _TORCH_ACTION_RE.match(cell)
    if not match:
        raise ValueError(f"{where}: cannot read torch action {cell[:40]!r}; expected e.g. 0F0, 1I0, "
                         "1W0, 0B0 (or a communication action such as 0SEND_F0)")
    stage, letter, mb = match.groups()
    if letter in _COMMS:
        return []
    if not mb:
        raise ValueError(f"{where}: action {cell!r} has no microbatch index")
    return [Pass(_FROM_TORCH_LETTER[letter], int(stage), int(mb))]


def _clean_text(text: str | bytes, source: str) -> str:
    """Text without a byte-order mark; binary data refused, naming the first bad line."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = bytes(text)[:exc.start].count(b"\n") + 1
            raise ValueError(f"{source}, line {line}: not UTF-8 text (binary data?)") from None
    text = text.lstrip("\ufeff")
    bad = _CONTROL.search(text)  # one pass in C, not a Python loop over every character
    if bad is not None:
        no = len(text[: bad.start()].splitlines()) + (1 if bad.start() == 0 or text[bad.start() - 1] in "\n\r" else 0)
        raise ValueError(f"{source}, line {max(1, no)}: contains control characters (binary data?)")
    return text


_COMMENT = re.compile(r"(?m)^[ \t]*#.*$")

# control characters other than the line breaks and tab, \r, \f, \v; and U+FFFD (undecodable)
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\ufffd]")


MAX_PASSES = 2_000_000
"""Schedules of more passes than this are refused (about 5 s to build and as long again to
simulate, a few GB): by :func:`ctrlmem.schedules.build` and by :meth:`Schedule.load` /
:meth:`Schedule.from_text` / :meth:`Schedule.from_torch_csv`; ``allow_large=True``
(``--allow-large``) lifts the limit. Read at call time, so one patch of it changes both."""

MAX_FILE_BYTES = 64 << 20
"""Largest schedule file read without ``allow_large`` (64 MiB: room for
:data:`MAX_PASSES` passes in a compute+comms dump)."""


def _pass_limit(allow_large: bool) -> int | None:
    if not isinstance(allow_large, bool):
        raise TypeError(f"allow_large must be True or False, got {allow_large!r}")
    if allow_large:
        return None
    return MAX_PASSES


def _too_many(source: str, limit: int) -> ValueError:
    return ValueError(f"{source} holds more than {limit:,} passes (ctrlmem.model.ir.MAX_PASSES: slow to "
                      f"simulate, several GB); pass allow_large=True (--allow-large) to load it anyway")


def _torch_passes(text: str) -> int:
    """The compute actions of a torch CSV, counted with ``str.count`` (no parsing): each holds one
    of the letters F, I, W, B; the communication actions holding one (``SEND_F``, ``RECV_B`` ...)
    and ``OVERLAP_F_B``'s two are taken off. Exact for a valid file; the parser also stops at
    the limit, so a file built to fool this count costs no more than the limit."""
    letters = sum(text.count(c) for c in "FIWB")
    return letters - text.count("SEND_") - text.count("RECV_") - 2 * text.count("OVERLAP_F_B")


def _read_schedule_file(path: str | PathLike, allow_large: bool) -> bytes:
    """The bytes of a schedule file through the one user-file reader
    (:func:`ctrlmem.util.userfile.read_bytes`): a path that is not a regular file is refused
    unopened (a FIFO would block), a file above :data:`MAX_FILE_BYTES` unread (unless ``allow_large``)."""

    limit = MAX_FILE_BYTES if _pass_limit(allow_large) is not None else 1 << 62
    return read_bytes(path, "schedule file", limit, fix=f"a schedule of up to {MAX_PASSES:,} passes needs "
                      f"{MAX_FILE_BYTES >> 20} MiB; pass allow_large=True (--allow-large) to load it anyway")


_MAX_QUOTED_HEADER = 100_000
"""Longest text-form header holding quotes (parsed by ``shlex``, a character at a time); a header
without quotes is split as it is, at any length."""

_SMALL = 100_000
"""Below this many stages (or stage × microbatch slots) a schedule that holds too few passes is
left to :func:`ctrlmem.validate`, which names the first missing pass; above it the sizes are
refused at once, before anything that large is allocated."""


def _check_counts(source: str, num_stages: int, num_microbatches: int, passes: int) -> None:
    """A schedule of ``num_stages`` stages and ``num_microbatches`` microbatches runs an ``F`` of
    every microbatch on every stage: ``ValueError`` when the passes read cannot cover that
    (checked arithmetically, before anything of size ``S · m`` is built)."""
    if num_stages * num_microbatches > max(passes, _SMALL):
        raise ValueError(f"{source}: m={num_microbatches} microbatches on {num_stages} stage(s) need at least "
                         f"{num_stages * num_microbatches:,} passes (a forward of every microbatch on every stage), "
                         f"but it holds {passes:,}; give the m the schedule was made for")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_few(items: list, shown: int = 5) -> str:
    head = ", ".join(str(x) for x in items[:shown])
    return f"[{head}]" if len(items) <= shown else f"[{head}, ...] ({len(items):,} in all)"


def _read_copies(no: int, label: str, rest: str, copies: list, num_stages: int, num_microbatches: int) -> None:
    """One text-form line ``cN: 0O0 0L0@5 ...`` into ``copies[N]`` (a ``ValueError`` naming the line)."""
    d = int(label[1:])
    if not 0 <= d < len(copies):
        raise ValueError(f"line {no}: copy line {label!r} is outside c0..c{len(copies) - 1}")
    if copies[d] is not None:
        raise ValueError(f"line {no}: copy line {label!r} is given twice")
    row = []
    for tok in rest.split():
        try:
            cp = Copy.parse(tok)
        except ValueError as exc:
            raise ValueError(f"line {no}: {exc}") from None
        _check_range(Pass(Op.F, cp.stage, cp.microbatch), num_stages, num_microbatches, f"line {no}")
        row.append(cp)
    copies[d] = tuple(row)


def _check_range(ps: Pass, num_stages: int, num_microbatches: int, where: str) -> None:
    if not 0 <= ps.stage < num_stages:
        raise ValueError(f"{where}: pass {ps} names stage {ps.stage}, outside 0..{num_stages - 1}")
    if not 0 <= ps.microbatch < num_microbatches:
        raise ValueError(f"{where}: pass {ps} names microbatch {ps.microbatch}, outside "
                         f"0..{num_microbatches - 1} (m={num_microbatches})")


def _parse_literal(value: str) -> object:
    """A header value back to what :meth:`Schedule.to_text` wrote: int, float, None, True, False
    or the text itself."""
    if value in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[value]
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value
