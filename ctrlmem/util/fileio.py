"""Every file the product writes goes through here: atomically, or not at all.

A file is written to a temporary file in the same folder (``.NAME.XXXXXX.tmp``), flushed and
``fsync``-ed, given the mode of the file it replaces (a new file gets ``0o666 & ~umask``, like
``open``), and renamed over the target with ``os.replace``; the folder is then ``fsync``-ed. A
reader sees either the old file or the whole new one. When anything fails (a full disk, a quota,
a read-only file system, a writer that raises), the temporary file is removed, an existing file
at the path is left exactly as it was, and the error names the **target path** and the OS
reason: an :class:`OSError` of the usual subclass (``PermissionError``, ``IsADirectoryError``...,
``errno`` kept) whose ``filename`` is the target, never the temporary file.

API:

* :func:`atomic_write` ``(path, data)`` — ``str`` (UTF-8 unless ``encoding``) or ``bytes``;
* :func:`atomic_path` ``(path)`` — a context manager yielding a temporary path for writers that
  want a file name (pandas, kaleido); on a clean exit the file is synced and renamed into place;
* :func:`atomic_open` ``(path, mode="w")`` — a context manager yielding an open file;
* :func:`describe_os_error` ``(exc)`` — one line for an ``OSError``: the path, what went wrong,
  the fix (the command line prints it; library errors carry the same facts).

A symlink at the target is followed: the file it points to is replaced, the link kept.

**What may be replaced: only a regular file.** A character device (``/dev/null``, a terminal) or
a FIFO at the target is written in place (opened for writing, never created, truncated, chmod-ed
or renamed over; its temporary file lives in the system's temporary folder), so it stays what it
is; a FIFO that no process reads is refused at once (``ENXIO``) instead of blocking. Anything
else that is not a regular file (a block device, a socket) is refused (``EINVAL``) and left alone.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

__all__ = ["atomic_write", "atomic_path", "atomic_open", "describe_os_error", "make_output_folder",
           "check_output_path", "check_output_folder", "record_outputs", "OUTPUTS_RECORD"]

log = logging.getLogger(__name__)


def _special_kind(path: str | os.PathLike) -> str | None:
    """``None`` for a regular file or nothing at ``path`` (links followed); else what is there:
    ``"a character device"`` or ``"a FIFO"`` (written directly, never replaced), ``OSError`` for
    anything else that is not a regular file (a block device, a socket: never written)."""
    try:
        st = os.stat(path)
    except OSError:  # nothing there (or unreachable): the write itself reports it
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISCHR(st.st_mode):
        return "a character device"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file"
    raise OSError(_errno.EINVAL, f"not a regular file ({kind}), which ctrlmem never writes or replaces; give a file "
                                 "name", os.fspath(path))


def _target(path: str | os.PathLike) -> Path:
    path = Path(os.fspath(path))
    if str(path) == "":
        raise FileNotFoundError(_errno.ENOENT, "empty file name; give a file name", "''")
    if _special_kind(path) is not None:  # written in place, through the name given (/dev/stdout too)
        return path
    if path.is_symlink():  # replace what the link points to, keep the link
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise IsADirectoryError(_errno.EISDIR, "Is a directory", str(path))
    return path


def _write_special(tmp: Path, target: Path, kind: str) -> None:
    """Copy the finished temporary file into the character device or FIFO ``target`` (opened for
    writing, never created, truncated or renamed over). A FIFO nobody reads is refused at once
    (``ENXIO``) instead of waiting for a reader forever."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)
    if kind == "a FIFO":
        flags |= os.O_NONBLOCK
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if exc.errno == _errno.ENXIO and kind == "a FIFO":
            raise OSError(_errno.ENXIO, "a FIFO that no process reads; start its reader first, or give a file name",
                          str(target)) from None
        raise
    try:
        if kind == "a FIFO":
            os.set_blocking(fd, True)  # a reader is there: a full pipe waits for it, as a pipe does
        with open(tmp, "rb") as src:
            while chunk := src.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _renamed(exc: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """``exc`` as the same kind of ``OSError`` naming ``path`` (not the temporary file); an
    error that already names another file is kept as it is."""
    if exc.filename is not None and (tmp is None or os.fspath(exc.filename) != str(tmp)):
        return exc
    if exc.errno is None:
        return OSError(f"{path}: {exc}")
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the rename itself is atomic
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without an exception, the
    file written there is synced and renamed to ``path``. On any exception (or when the block
    wrote nothing) the temporary file is removed and an existing ``path`` is left unchanged;
    ``OSError`` names ``path``. ``suffix`` ends the temporary name (e.g. ``".png"`` for writers
    that read the format from it)."""
    target = _target(path)
    special = _special_kind(target)  # a device or FIFO: written in place, its temporary file elsewhere
    try:
        fd, tmp_name = tempfile.mkstemp(dir=None if special else target.parent, prefix=f".{target.name}.",
                                        suffix=suffix)
    except OSError as exc:  # the folder is missing, not writable, full...: name the target
        raise _renamed(exc, target, Path(os.fspath(exc.filename)) if exc.filename else None) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(_errno.ENOENT, "the writer produced no file", str(target))
        if special:
            _write_special(tmp, target, special)
            _remove(tmp)
            return
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        new = _renamed(exc, target, tmp)
        if new is exc:
            raise
        raise new from exc
    except BaseException:
        _remove(tmp)
        raise
    _sync_folder(target.parent)


def _remove(tmp: Path) -> None:
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # never hide the original error behind this one
        log.warning("could not remove the temporary file %s: %s", tmp, exc)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                newline: str | None = None) -> Iterator[IO]:
    """An open file (``"w"`` text or ``"wb"`` bytes) whose content replaces ``path``
    atomically when the block ends without an exception (see :func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp:
        kw = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with open(tmp, mode, **kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def atomic_write(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8",
                 newline: str | None = None) -> Path:
    """Replace ``path`` with ``data`` (``str`` or ``bytes``) atomically; returns the path
    written (a symlink's target). See the module docstring for what happens on failure."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        with atomic_open(path, "wb") as fh:
            fh.write(data)
    elif isinstance(data, str):
        with atomic_open(path, "w", encoding=encoding, newline=newline) as fh:
            fh.write(data)
    else:
        raise TypeError(f"atomic_write writes str or bytes, got {type(data).__name__}")
    return _target(path)


def check_output_path(path: str | os.PathLike) -> Path:
    """Raise the ``OSError`` a write to ``path`` would meet, before any work is done: an empty
    name, a folder, a missing folder or a file where a folder should be, a folder that cannot be
    written to. Returns the path. (A full disk is only found by writing.)"""
    text = os.fspath(path)
    if not str(text).strip():
        raise FileNotFoundError(_errno.ENOENT, "empty file name; give a file name", repr(text))
    target = Path(text)
    if target.is_dir():
        raise IsADirectoryError(_errno.EISDIR, "Is a directory", str(target))
    if _special_kind(target) is not None:  # a character device or FIFO, written in place: its folder never is
        if not os.access(target, os.W_OK):
            raise PermissionError(_errno.EACCES, "Permission denied", str(target))
        return target
    parent = target.parent
    if not parent.exists():
        for up in parent.parents:
            if up.exists():
                if not up.is_dir():
                    raise NotADirectoryError(_errno.ENOTDIR, "Not a directory", str(target))
                break
        raise FileNotFoundError(_errno.ENOENT, "No such file or directory", str(target))
    if not parent.is_dir():
        raise NotADirectoryError(_errno.ENOTDIR, "Not a directory", str(target))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(_errno.EACCES, "Permission denied", str(target))
    return target


OUTPUTS_RECORD = ".ctrlmem-outputs"
"""The file in an output folder listing the files ctrlmem wrote there (one name a line): those it
may replace on the next run; any other file at one of its names is the user's."""


def _recorded(folder: Path) -> set[str]:
    try:
        with open(folder / OUTPUTS_RECORD, encoding="utf-8") as fh:
            return {ln.strip() for ln in fh.read(1 << 16).splitlines() if ln.strip() and not ln.startswith("#")}
    except (OSError, UnicodeDecodeError):
        return set()


def check_output_folder(folder: str | os.PathLike, names: tuple[str, ...] | list[str], force: bool = False,
                        option: str = "the output folder") -> Path:
    """Check, before any work, that ``names`` can be written into ``folder``: a non-empty name, a
    folder (or nothing yet, under a writable folder) that can be written to, and no file at one of
    ``names`` that ctrlmem did not write there (:data:`OUTPUTS_RECORD`) unless ``force``. Raises
    the ``OSError`` the writes would meet, or ``ValueError`` naming the user's file and the fix
    (``--force``). Returns the folder's path."""
    text = os.fspath(folder)
    if not str(text).strip():
        raise ValueError(f"{option} is empty ({text!r}); give a folder")
    path = Path(text)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise NotADirectoryError(_errno.ENOTDIR, "Not a directory", str(path))
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(_errno.EACCES, "Permission denied", str(path))
    else:  # created with its parents: the nearest that exists must be a folder we can write to
        up = next((u for u in path.absolute().parents if u.exists()), None)
        if up is not None and not up.is_dir():
            raise NotADirectoryError(_errno.ENOTDIR, "Not a directory", str(path))
        if up is not None and not os.access(up, os.W_OK | os.X_OK):
            raise PermissionError(_errno.EACCES, "Permission denied", str(path))
    if force:
        return path
    ours = _recorded(path)
    for name in names:
        target = path / name
        if os.path.lexists(target) and name not in ours:
            raise ValueError(f"{target} already exists and ctrlmem did not write it; pass --force to replace it, or "
                             f"choose another folder for {option}")
    return path


def record_outputs(folder: str | os.PathLike, names: tuple[str, ...] | list[str]) -> None:
    """Add ``names`` to ``folder``'s :data:`OUTPUTS_RECORD` (after writing them)."""
    path = Path(folder)
    names_all = sorted(_recorded(path) | set(names))
    atomic_write(path / OUTPUTS_RECORD, "# files written by ctrlmem (it may replace these)\n" + "\n".join(names_all)
                 + "\n")


def make_output_folder(path: str | os.PathLike, ignore: bool = True) -> Path:
    """Create the output folder ``path`` (and its parents). A folder this call creates gets a
    ``.gitignore`` holding ``*`` (``ignore=True``), so run outputs are never committed by
    accident wherever they are made (as Python's ``venv`` and pytest's cache do); a folder that
    already exists is left as it is. Returns the path."""
    path = Path(path)
    existed = path.is_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FileExistsError(_errno.EEXIST, "File exists", str(path)) from None
    if ignore and not existed:
        try:
            atomic_write(path / ".gitignore", "# written by ctrlmem: run outputs are not committed\n*\n")
        except OSError as exc:  # the folder itself is what matters; the next write reports a full disk
            log.debug("no .gitignore in %s: %s", path, exc)
    return path


_FIXES = {
    _errno.ENOSPC: "no space left on the device; free some space or choose another location",
    _errno.EROFS: "read-only file system; choose a writable location",
    _errno.EFBIG: "file too large for this file system or the process's file-size limit (ulimit -f); "
                  "choose another location or raise the limit",
    _errno.ENAMETOOLONG: "file name too long; choose a shorter path",
    _errno.ELOOP: "too many levels of symbolic links (a link loop?); fix or remove the link",
    _errno.EACCES: "permission denied; choose a location you can write to (or fix its permissions)",
    _errno.EPERM: "operation not permitted; choose a location you can write to (or fix its permissions)",
}
if hasattr(_errno, "EDQUOT"):
    _FIXES[_errno.EDQUOT] = "disk quota exceeded; free some space or choose another location"


def describe_os_error(exc: OSError) -> str:
    """One line for a file or OS error: the path, what went wrong and the fix (never a bare errno)."""
    where = exc.filename
    where2 = getattr(exc, "filename2", None)
    if where is None:
        path = None
    else:
        path = f"{where}" + (f" -> {where2}" if where2 else "")
    if isinstance(exc, IsADirectoryError):
        return f"{path} is a folder; give a file name (e.g. {where}/NAME)"
    if isinstance(exc, NotADirectoryError):
        return f"{path}: part of this path is a file, not a folder; choose a path whose folders are folders"
    if isinstance(exc, FileExistsError):
        return f"{path} already exists and is not a folder; give a folder path, or remove the file"
    if isinstance(exc, FileNotFoundError):
        return (f"{path}: no such file or folder; check the path, or create the folder first "
                f"(mkdir -p {'$(dirname ' + str(where) + ')' if where else 'DIR'})")
    reason = _FIXES.get(exc.errno) if exc.errno is not None else None
    if reason is None:
        reason = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno is not None:
            reason += f" ({_errno.errorcode.get(exc.errno, exc.errno)})"
    if path is None:
        return f"{reason} (the operating system named no file)"
    return f"{path}: {reason}"
