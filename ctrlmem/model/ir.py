"""The schedule data model: passes, placements, schedules, and their text and torch-CSV forms.

Notation (docs/architecture.md, docs/theory.md §1):

* ``F`` forward, ``B`` backward for the input (activation gradient), ``W`` backward for the
  weights, ``BW`` a fused backward (B and W in one pass, as in 1F1B).
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

__all__ = ["Op", "Pass", "Placement", "Schedule"]


class Op(str, enum.Enum):
    """Kind of a pass: forward, input backward, weight backward, or fused backward."""

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"

    def __str__(self) -> str:  # "F", not "Op.F"
        return self.value


_TORCH_LETTER = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}
_FROM_TORCH_LETTER = {v: k for k, v in _TORCH_LETTER.items()}
_PASS_RE = re.compile(r"^(\d+)(BW|F|B|W)(\d+)$")


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
                f"cannot parse pass {text!r}: expected <stage><F|B|W|BW><microbatch>, e.g. '3F0'"
            )
        return cls(Op(match.group(2)), int(match.group(1)), int(match.group(3)))

    def to_torch(self) -> str:
        """The pass in torch's action letters (``F``, ``I`` for B, ``W``, ``B`` for BW)."""
        return f"{self.stage}{_TORCH_LETTER[self.op]}{self.microbatch}"


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


_HEADER_KEYS = frozenset({"p", "m", "placement"})
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

    A ``Schedule`` is only data; :func:`ctrlmem.validate` checks it and
    :func:`ctrlmem.simulate` times it.
    """

    name: str
    num_devices: int
    num_microbatches: int
    placement: Placement
    device_passes: tuple[tuple[Pass, ...], ...]
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
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
    ) -> "Schedule":
        """Build a schedule from per-device sequences of passes (or ``(op, stage, mb)`` tuples)."""
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
        )

    # -- derived ---------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def num_passes(self) -> int:
        return sum(len(row) for row in self.device_passes)

    @property
    def split_backward(self) -> bool:
        """True when the schedule uses separate B and W passes (zero-bubble family)."""
        return any(ps.op is Op.W for row in self.device_passes for ps in row)

    def __str__(self) -> str:
        return self.to_text()

    # -- text form ---------------------------------------------------------------------------
    def to_text(self) -> str:
        """Compact, human-readable text that :meth:`from_text` parses back exactly.

        ``schedule NAME p=P m=M placement=KIND:DEV,DEV,...`` then one line per device,
        ``dN: 0F0 0F1 ...``.
        """
        head = (
            f"schedule {self.name} p={self.num_devices} m={self.num_microbatches} "
            f"placement={self.placement.to_text()}"
        )
        if self.params:
            # a value with spaces or quotes (e.g. a search's description of what it chose) is quoted
            # shell-style, so the header stays one token per key
            # a parameter named like a header key (p, m, placement) is written as param.KEY
            head += " " + " ".join(f"{'param.' + k if k in _HEADER_KEYS else k}={shlex.quote(str(v))}"
                                   for k, v in self.params)
        lines = [head]
        for d, row in enumerate(self.device_passes):
            lines.append(f"d{d}: " + " ".join(map(str, row)))
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
        upper = sum(body.count(c) for c in "FBW") - body.count("BW")  # the passes, counted without parsing
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
        placement = Placement(kind, stage_device, p)
        rows: list[tuple[Pass, ...] | None] = [None] * p
        read = 0
        for no, line in numbered[1:]:
            label, sep, rest = line.partition(":")
            label = label.strip()
            if not sep or not label.startswith("d") or not label[1:].isdigit():
                raise ValueError(f"line {no}: bad device line {line.strip()[:60]!r}: expected 'dN: 0F0 0F1 ...'")
            d = int(label[1:])
            if not 0 <= d < p:
                raise ValueError(f"line {no}: device line {label!r} is outside d0..d{p - 1}")
            if rows[d] is not None:
                raise ValueError(f"line {no}: device line {label!r} is given twice")
            row = []
            for tok in rest.split():
                try:
                    ps = Pass.parse(tok)
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
        return cls(name, p, m, placement, tuple(r or () for r in rows), params)

    # -- torch CSV ---------------------------------------------------------------------------
    def to_torch_csv(self, path: str | PathLike | None = None) -> str:
        """Write (and return) the schedule in ``torch.distributed.pipelining``'s CSV format.

        One row per rank, one cell per action, in torch's letters: ``F``, ``I`` (our B),
        ``W``, ``B`` (our BW); for example ``0F3,7I2,7W2,1B0``.
        """
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in self.device_passes:
            writer.writerow([ps.to_torch() for ps in row])
        text = buf.getvalue()
        if path is not None:  # atomically: a failed write keeps the old file (ctrlmem.util.fileio)
            from ctrlmem.util.fileio import atomic_write

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
        they follow from the compute order, and ``(a;b)OVERLAP_F_B`` becomes ``a`` then ``b``.
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
        read = 0
        for i in range(first, last + 1):
            no, rank = i + 1, i - first
            cells = next(csv.reader([lines[i]]), [])
            if not any(c.strip() for c in cells):
                raise ValueError(f"{source}, line {no}: blank line between ranks (rank {rank} would "
                                 "have no actions); remove it")
            row: list[Pass] = []
            for col, cell in enumerate(c.strip() for c in cells):
                if cell:
                    row += _torch_actions(cell, f"{source}, line {no} (rank {rank}), column {col + 1}")
            rows.append(tuple(row))
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
        return cls(name, p, num_microbatches, placement, tuple(rows))

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


def _torch_actions(cell: str, where: str) -> list[Pass]:
    """The compute passes of one torch action cell (none for a communication action)."""
    if cell.startswith("(") and cell.endswith(")OVERLAP_F_B"):
        out: list[Pass] = []
        for sub in cell[1:-len(")OVERLAP_F_B")].split(";"):
            if sub.strip():
                out += _torch_actions(sub.strip(), where)
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
    from ctrlmem.util.userfile import read_bytes

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
