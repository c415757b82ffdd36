"""Issue 31: the atomic writer replaces only regular files, and the one user-file reader bounds
every read. Devices are private nodes made here (``mknod`` of the null and full devices in a
temporary folder, where allowed), never the machine's ``/dev/null``."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from ctrlmem.util import userfile
from ctrlmem.util.fileio import atomic_write, check_output_folder, check_output_path, record_outputs

REPO = Path(__file__).resolve().parents[1]


def private_device(folder: Path, name: str, minor: int) -> Path:
    """A character device node of the memory driver (1, minor: 3 null, 7 full) in ``folder``."""
    path = folder / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a private device node here ({exc})")
    return path


def ctrlmem(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ctrlmem.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=60)


# ---------------------------------------------------------------------------------------------- writer

def test_export_to_a_character_device_leaves_it_a_character_device(tmp_path):
    null = private_device(tmp_path, "null", 3)
    before = os.stat(null)
    proc = ctrlmem("export", "1f1b", "--torch-csv", str(null), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    after = os.stat(null)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left beside it


def test_a_full_device_is_an_error_naming_it_and_stays_a_device(tmp_path):
    full = private_device(tmp_path, "full", 7)
    proc = ctrlmem("export", "1f1b", "--text", str(full), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "no space left" in lines[0] and str(full) in lines[0]
    assert stat.S_ISCHR(os.stat(full).st_mode)


def test_fifo_without_reader_is_refused_at_once_and_kept(tmp_path):
    fifo = tmp_path / "p.csv"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="no process reads"):
        atomic_write(fifo, "x")
    assert time.monotonic() - t0 < 5 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_fifo_with_a_reader_gets_the_data_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "p.txt"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    time.sleep(0.2)  # the reader is blocked in open(); the writer finds it there
    data = b"0123456789" * 100_000  # more than a pipe holds: the writer waits for the reader
    atomic_write(fifo, data)
    reader.join(10)
    assert got == [data] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_socket_is_never_written_or_replaced(tmp_path):
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(OSError, match="not a regular file"):
            atomic_write(path, "x")
        with pytest.raises(OSError, match="not a regular file"):
            check_output_path(path)
        assert stat.S_ISSOCK(os.stat(path).st_mode)


def test_a_regular_file_is_still_replaced_atomically(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    atomic_write(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_output_folder_refuses_a_users_file_unless_forced(tmp_path):
    out = tmp_path / "emit"
    out.mkdir()
    (out / "schedule.csv").write_text("mine")
    with pytest.raises(ValueError, match="--force"):
        check_output_folder(out, ("schedule.csv",))
    check_output_folder(out, ("schedule.csv",), force=True)
    record_outputs(out, ("schedule.csv",))  # once ctrlmem wrote it, a rerun may replace it
    check_output_folder(out, ("schedule.csv",))
    with pytest.raises(ValueError, match="empty"):
        check_output_folder("", ("x",))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        check_output_folder(tmp_path / "file", ("x",))


# ---------------------------------------------------------------------------------------------- reader

def test_reader_refuses_a_fifo_unopened(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"not a regular file \(a FIFO\)"):
        userfile.read_bytes(fifo, "state file")


def test_reader_refuses_a_large_file_unread(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(10_000)
    with pytest.raises(ValueError, match="larger than 1,000 bytes"):
        userfile.read_bytes(big, "replay file", 1000)
    assert userfile.read_bytes(big, "replay file", 10_000) == b"\0" * 10_000


def test_reader_bounds_nesting_and_inflation():
    with pytest.raises(ValueError, match="more than 64 deep"):
        userfile.parse_json("[" * 200_000 + "]" * 200_000, "state")
    with pytest.raises(ValueError, match="more than 64 deep"):
        userfile.parse_json("[" * 70 + "]" * 70, "state")
    assert userfile.parse_json("[" * 64 + "]" * 64, "state") is not None
    bomb = zlib.compress(b"a" * (64 << 20), 9)  # 64 MiB in about 64 kB
    with pytest.raises(ValueError, match="inflates to more than 1,048,576 bytes"):
        userfile.inflate(bomb, "text", 1 << 20)
    with pytest.raises(ValueError, match="not zlib"):
        userfile.b64_inflate(base64.b64encode(b"not zlib").decode(), "text")
    with pytest.raises(ValueError, match="not base64"):
        userfile.b64_inflate("$$$", "text")
    assert userfile.b64_inflate(base64.b64encode(zlib.compress(b"hello")).decode(), "text") == b"hello"


def test_state_files_through_the_reader(tmp_path):
    """read_state (what draw --state and the explorer load call): a ValueError naming each problem."""
    from ctrlmem.explorer import views as V

    view = V.compute(V.Settings(schedules=("1f1b",), num_devices=2, num_microbatches=4))
    good = V.state_dict(view)
    rec = dict(good["orders"]["1f1b"])
    rec.pop("text")
    rec["text_zlib_base64"] = base64.b64encode(zlib.compress(b"a" * (64 << 20), 9)).decode()
    cases = {
        "nested.json": ("[" * 200_000 + "]" * 200_000, "more than 64 deep"),
        "orders_list.json": (json.dumps({**good, "orders": []}), "must be objects"),
        "order_str.json": (json.dumps({**good, "orders": {"1f1b": "x"}}), "must be an object"),
        "bomb.json": (json.dumps({**good, "orders": {"1f1b": rec}}), "inflates to more than"),
        "style.json": (json.dumps({**good, "style": {"diagram": {"nope": 1}}}), "not an option"),
    }
    for name, (text, needle) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=needle):
            V.read_state(tmp_path / name)
