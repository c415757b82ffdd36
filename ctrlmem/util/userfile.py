"""The one reader for files a user hands to ctrlmem: state files, replay files, cost files,
schedule files. Each read is bounded before it starts:

* **type before open** — the path is ``stat``-ed first and must be a regular file: a folder, a
  FIFO (``open`` would wait for a writer forever), a device or a socket is refused unopened; the
  file is then opened non-blocking and checked again (a path swapped for a FIFO in between is
  still refused);
* **size before read** — a file larger than the caller's cap is refused unread, and never more
  than the cap plus one byte is read (a file that grows while read is refused too);
* **nesting** — JSON nested deeper than :data:`MAX_JSON_DEPTH` is refused (the parser would
  otherwise recurse until ``RecursionError``);
* **inflation** — compressed data (zlib) is inflated to at most a cap; a bomb is refused after
  the cap, not after filling memory.

Every refusal is a ``ValueError`` whose message names the file (or the field), what is wrong and
the fix; a missing or unreadable path is the usual ``OSError`` naming it (the command line turns
both into one line).

API: :func:`read_bytes`, :func:`read_text`, :func:`read_json`, :func:`parse_json`,
:func:`inflate`, :func:`b64_inflate`, :func:`file_kind`, :func:`nesting_depth`.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import stat
import zlib
from typing import Any

__all__ = ["read_bytes", "read_text", "read_json", "parse_json", "inflate", "b64_inflate", "file_kind",
           "nesting_depth", "MAX_JSON_DEPTH", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 64 << 20
"""Largest user file read unless the caller says otherwise (64 MiB)."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of lists / objects accepted in a user's JSON (ctrlmem's own files nest at
most 6 deep)."""


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: ``"a regular file"``, ``"a FIFO"``, ``"a folder"`` ..."""
    for test, word in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a file"


def _refuse_kind(path: str, mode: int, what: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    raise ValueError(f"{what} {path} is not a regular file ({file_kind(mode)}); give the file itself "
                     f"(a FIFO or a device is never read)")


def read_bytes(path: str | os.PathLike, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES,
               fix: str = "") -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them (see the module
    doc). ``what`` names the file in messages ("state file", "replay file"); ``fix`` ends the
    too-large message."""
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not str(name).strip():
        raise FileNotFoundError(errno.ENOENT, "empty file name; give a file name", repr(name))
    st = os.stat(name)  # OSError (missing, link loop...) names the path
    _refuse_kind(name, st.st_mode, what)
    too_big = (f"{what} {name} is larger than {max_bytes:,} bytes, more than a {what} can be"
               + (f"; {fix}" if fix else ""))
    if st.st_size > max_bytes:
        raise ValueError(too_big)
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        _refuse_kind(name, os.fstat(fd).st_mode, what)  # swapped for a FIFO after the first look
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise ValueError(too_big)
    return data


def read_text(path: str | os.PathLike, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES, fix: str = "") -> str:
    """:func:`read_bytes` decoded as UTF-8 (a byte-order mark dropped); binary data refused."""
    data = read_bytes(path, what, max_bytes, fix)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{what} {os.fspath(path)}, line {line}: not UTF-8 text (binary data?)") from None


def nesting_depth(obj: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of ``obj`` (lists and dicts), counted without recursion, stopping past
    ``limit``."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
            stack.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text: str | bytes, what: str = "JSON", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, refusing text that is not JSON or nests deeper than ``max_depth``
    with a ``ValueError`` naming ``what``."""
    deep = f"{what} nests lists / objects more than {max_depth} deep; no ctrlmem file does, give the file ctrlmem wrote"
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(deep) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except (UnicodeDecodeError, ValueError) as exc:  # bytes that are not UTF-8, numbers too long...
        raise ValueError(f"{what} is not JSON ({str(exc)[:120]})") from None
    if nesting_depth(data, max_depth) > max_depth:
        raise ValueError(deep)
    return data


def read_json(path: str | os.PathLike, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES,
              max_depth: int = MAX_JSON_DEPTH, fix: str = "") -> Any:
    """The JSON in the regular file ``path`` (:func:`read_text`, then :func:`parse_json`)."""
    return parse_json(read_text(path, what, max_bytes, fix), f"{what} {os.fspath(path)}", max_depth)


def inflate(data: bytes, what: str = "compressed data", max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """zlib-inflate ``data`` to at most ``max_bytes`` bytes; ``ValueError`` for data that is not
    zlib or would inflate further (a compression bomb stops at the cap)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ValueError(f"{what} is not zlib-compressed data ({exc}); give what ctrlmem wrote") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise ValueError(f"{what} inflates to more than {max_bytes:,} bytes, more than such data can be")
    if not d.eof:
        raise ValueError(f"{what} is cut short (the compressed stream does not end); give what ctrlmem wrote")
    return out


def b64_inflate(text: Any, what: str = "compressed data", max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Base64 text of zlib data, decoded and inflated (:func:`inflate`)."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be base64 text, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64 text; give what ctrlmem wrote") from None
    return inflate(raw, what, max_bytes)
