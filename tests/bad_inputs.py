"""The bad inputs of issue 20 ("bounded and atomic"), as data: one table that
``tests/test_bounded.py`` asserts on and ``scripts/probe_inputs.py`` probes with, so the two never
drift apart. Each row names the input and the text its one-line refusal must hold.

Nothing here runs anything at import; the helpers are what both callers need to build the inputs
(a 2.4 M-pass CSV, a tmpfs in a private mount namespace, a wrapper that measures a command's own
peak RSS).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

# A child forked from a large process would count that process's memory in its peak RSS (the
# kernel keeps the high-water mark across exec): a command starts from this small wrapper, which
# forks it and writes the command's own peak (``wait4``, KiB) into the file named by its first
# argument. Run it as ``python -S -c WRAPPER RSS_FILE COMMAND...``.
WRAPPER = ("import os, sys\n"
           "pid = os.fork()\n"
           "if pid == 0:\n    os.execvp(sys.argv[2], sys.argv[2:])\n"
           "_, status, usage = os.wait4(pid, 0)\n"
           "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
           "sys.exit(os.waitstatus_to_exitcode(status) % 256)\n")


def huge_csv(path: Path) -> None:
    """2.4 M passes (8 ranks x 300,000 forwards, 21 MB)."""
    with open(path, "w") as fh:
        for dev in range(8):
            fh.write(",".join(f"{dev}F{i}" for i in range(300_000)) + "\n")


def sparse_70mb(path: Path) -> None:
    """A 70 MB file of zeros that takes no disk (a schedule file is never that large)."""
    os.truncate(path, 70 << 20)


#: A 432-byte YAML document whose aliases expand to 9^7 leaves.
ALIASES = ("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
           "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
           "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nparams: {x: *g}\n")

#: Seven case groups of ten: 10^7 points.
CASES_1E7 = "cases:\n" + "".join(f"  g{g}:\n" + "".join(f"    - {{x{g}: {i}}}\n" for i in range(10))
                                  for g in range(7))


def expanding(config_head: str) -> list[tuple[str, list[str], dict, str]]:
    """Tiny inputs that would expand without bound: (id, ``ctrlmem`` arguments, files to create
    (name -> text, or a function that makes the file at a path), text the error line holds).
    ``config_head`` starts every sweep config (name, description, scale, notebook)."""
    cfg = config_head
    return [
        ("csv naming stage 5,000,000", ["simulate", "s.csv"], {"s.csv": "5000000F0\n"}, "names stage 5000000"),
        ("csv naming microbatch 10^9", ["simulate", "s.csv", "--json"], {"s.csv": "0F0,0F999999999\n"},
         "need at least"),
        ("csv with -m 10^11", ["simulate", "s.csv", "-m", "100000000000"], {"s.csv": "0F0,0B0,0W0\n"},
         "need at least"),
        ("text header p=10^8", ["simulate", "s.txt"],
         {"s.txt": "schedule x p=100000000 m=4 placement=v-shape:0,1,1,0\nd0: 0F0\n"}, "p=100000000 does not fit"),
        ("text header m=10^11", ["simulate", "s.txt"],
         {"s.txt": "schedule x p=2 m=100000000000 placement=v-shape:0,1,1,0\nd0: 0F0\n"}, "need at least"),
        ("text placement of 10^6 stages", ["simulate", "s.txt"],
         {"s.txt": "schedule x p=1 m=1 placement=custom:" + ",".join(["0"] * 1_000_000) + "\nd0: 0F0\n"},
         "maps 1,000,000 stages"),
        ("quoted 2 MB header", ["simulate", "s.txt"],
         {"s.txt": "schedule x p=1 m=1 placement=sequential:0 note='" + "a" * 2_000_000 + "'\nd0: 0F0\n"},
         "at most 100,000 characters"),
        ("2.4 M-pass csv, --json", ["simulate", "big.csv", "--json"], {"big.csv": huge_csv},
         "more than 2,000,000 passes"),
        ("70 MB file read unread", ["simulate", "sparse.csv"], {"sparse.csv": sparse_70mb},
         "more than a schedule file"),
        ("YAML alias bomb", ["sweep", "c.yaml", "--list"], {"c.yaml": cfg + ALIASES}, "expands to more than"),
        ("recursive YAML alias", ["sweep", "c.yaml", "--list"], {"c.yaml": cfg + "params: &p {x: 1, y: *p}\n"},
         "contains itself"),
        ("cases multiplying to 10^7", ["sweep", "c.yaml", "--yes", "--no-progress"], {"c.yaml": cfg + CASES_1E7},
         "10,000,000 points"),
        ("grid of 10^6 with --yes", ["sweep", "c.yaml", "--yes", "--no-progress"],
         {"c.yaml": cfg + f"grid:\n  p: {list(range(1000))}\n  m: {list(range(1000))}\n"}, "1,000,000 points"),
        ("huge value in a config", ["sweep", "c.yaml", "--list"],
         {"c.yaml": cfg + "params: {x: [" + "1," * 100_000 + "1]}\n"}, "holds a list"),
        ("optimal p=32 m=256", ["optimal", "-p", "32", "-m", "256", "--time-limit", "1"], {}, "more than the 20000"),
        ("simulate optimal p=16 m=256", ["simulate", "optimal", "-p", "16", "-m", "256"], {}, "more than the 20000"),
        ("schedule name of 100 kB", ["simulate", "x" * 100_000], {}, "unknown schedule"),
    ]


#: Numbers checked where they enter, before any work or process starts: (``ctrlmem`` arguments,
#: text the one error line holds). None of them needs a file.
NUMBERS = [
    (["simulate", "v-shape", "--memory-limit", "1e308"], "--memory-limit: must be at most 1e+06"),
    (["simulate", "v-shape", "--memory-limit", "inf"], "--memory-limit: must be a positive fraction"),
    (["simulate", "v-shape", "--memory-limit", "nan"], "--memory-limit: must be a positive fraction"),
    (["optimal", "--memory-limit", "inf"], "--memory-limit: must be a positive fraction"),
    (["optimal", "--memory-limit", "1e308"], "--memory-limit: must be at most 1e+06"),
    (["optimal", "--time-limit", "0"], "--time-limit: must be > 0"),
    (["bound", "-p", "1000000", "--relax", "0"], "--devices: must be at most 10000"),
    (["bound", "-m", "1" + "0" * 400, "--relax", "0"], "--microbatches: must be at most 1000000000"),
    (["bound", "--memory-limit", "nan"], "--memory-limit: must be a positive fraction"),
    (["bound", "--memory-limit", "0.5", "--relax", "inf"], "--relax: must be a finite number"),
    (["optimal", "--time-limit", "inf"], "--time-limit: must be a finite number"),
    (["optimal", "--workers", "0"], "--workers: must be a positive integer"),
    (["optimal", "--offload", "2"], "offload must be none, auto (offload whole activations) or a fraction"),
    (["optimal", "--offload-cost", "nan"], "--offload-cost: must be a finite number"),
    (["optimal", "-p", "8", "-m", "32", "--offload", "auto"], "MAX_OFFLOAD_PASSES"),
    (["run", "--schedule", "1f1b", "--timeout", "-1"], "--timeout: must be > 0"),
    (["run", "--schedule", "1f1b", "--timeout", "inf"], "--timeout: must be a finite number"),
    (["run", "--schedule", "1f1b", "--timeout", "nan"], "--timeout: must be a finite number"),
    (["run", "--schedule", "1f1b", "--threads", "0"], "--threads: must be a positive integer"),
    (["run", "--schedule", "1f1b", "--steps", "-1"], "--steps: must be an integer >= 0"),
    (["run", "--schedule", "1f1b", "--comm-timeout", "0"], "--comm-timeout: must be > 0"),
    (["run", "--schedule", "1f1b", "--dp", "0"], "--dp: must be a positive integer"),
    (["run", "--schedule", "1f1b", "--hang-timeout", "0"], "--hang-timeout: must be > 0"),
    (["run", "--schedule", "1f1b", "--emit-sbatch", "j.sbatch", "--nodes", "-1", "--gpus-per-node", "-2"],
     "--nodes: must be a positive integer"),
    (["run", "--schedule", "1f1b", "--emit-sbatch", "j.sbatch", "--time-limit", "1 hour"], "is not a Slurm time"),
    (["replay", "--model", "tiny", "-p", "0"], "-p/--pipeline: must be a positive integer"),
    (["replay", "--model", "tiny", "-p", "2", "-m", "0"], "-m/--microbatches: must be a positive integer"),
    (["draw", "1f1b", "-o", "x.png", "--scale", "1000"], "--scale: must be at most 10"),
    (["draw", "1f1b", "-o", "x.png", "--scale", "-2"], "--scale: must be > 0"),
    (["draw", "1f1b", "-o", "x.png", "--width", "-5"], "--width: must be an integer >= 100"),
    (["draw", "1f1b", "-o", "x.html", "--width", "1000000000"], "--width: must be at most 16384"),
    (["figures", "-p", "1000000"], "-p/--devices: must be at most 64"),
    (["figures", "-p", "0"], "-p/--devices: must be an integer >= 2"),
    (["export", "1f1b", "--torch-csv", "x.csv", "--text", "x.csv"], "name the same file"),
    (["export", "1f1b", "--torch-csv", ""], "--torch-csv is empty"),
    (["export", "1f1b", "--text", " "], "--text is empty"),
    (["sweep", "c.yaml", "--launcher", "local", "--poll", "0"], "--poll: must be > 0"),
    (["sweep", "c.yaml", "--poll", "-1"], "--poll: must be > 0"),
]


def unshare_flags() -> list[str] | None:
    """The ``unshare`` flags that give a private mount namespace where a tmpfs can be mounted
    (nothing is mounted outside the child), or ``None`` where that is not allowed."""
    if shutil.which("unshare") is None:
        return None
    for flags in (["-m"], ["-rm"]) if os.geteuid() == 0 else (["-rm"],):
        probe = subprocess.run(["unshare", *flags, "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0"', "/tmp"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["unshare", *flags]
    return None


#: Python source of ``fill(folder)``: fills the file system of ``folder`` to the last byte
#: (unbuffered writes), for a child running on a small tmpfs.
FILL = '''
import os
def fill(folder):
    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for size in (1 << 16, 4096, 512, 1):
        try:
            while True:
                os.write(fd, b"\\0" * size)
        except OSError:
            pass
    os.close(fd)
'''


# ---------------------------------------------------------------------------------------------------------
# Issue 31 (round 3): the surfaces added since issue 20 — explorer state files and HTML reports,
# `ctrlmem plan` and its outputs, `--memory-gb` — as one table of command-line probes. Each row:
# (class, id, ``ctrlmem`` arguments, files to create (name -> text, or a function making the file at
# a path), text the one error line holds). Every row must answer with exit status 2 and that line,
# within the probes' time and memory limits. The classes are the issue's: [6] script injection is
# checked by tests/test_htmlsafe.py (it needs a page, not an error line) and the [6] rows of
# scripts/probe_inputs.py; [10] signals by their own probes.

HOSTILE_NAME = "</script><script>alert(1)</script><img/src=x/onerror=alert(2)>"
"""A schedule name that closes a script element and opens an element of its own."""


def state_file(path: Path, **change) -> None:
    """A valid explorer state (1F1B, p = 2, m = 4) written to ``path``, with ``change`` applied
    to its top level (``orders=[]``...); ``bomb=N`` replaces the order's text by zlib data that
    inflates to N bytes; ``name=`` renames the order's schedule."""
    import base64
    import json
    import zlib

    from ctrlmem.explorer import views as V

    view = V.compute(V.Settings(schedules=("1f1b",), num_devices=2, num_microbatches=4))
    data = V.state_dict(view)
    bomb, name = change.pop("bomb", None), change.pop("name", None)
    rec = data["orders"]["1f1b"]
    if bomb is not None:
        rec.pop("text")
        z, chunk = zlib.compressobj(9), b"a" * (1 << 20)  # a MiB at a time: the maker stays small
        data_z = b"".join(z.compress(chunk) for _ in range(bomb >> 20)) + z.compress(b"a" * (bomb % (1 << 20)))
        rec["text_zlib_base64"] = base64.b64encode(data_z + z.flush()).decode()
    if name is not None:
        rec["text"] = rec["text"].replace("schedule 1f1b", f"schedule {name}", 1)
        data["orders"] = {name: rec}
    data.update(change)
    path.write_text(json.dumps(data))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _sparse_300mb(path: Path) -> None:
    os.truncate(path, 300 << 20)


def _replay_without(key: str):
    def make(path: Path) -> None:
        import json

        from ctrlmem.model.replayfile import default_replay_path

        data = json.loads(default_replay_path().read_text())
        data["rows"][0].pop(key)
        path.write_text(json.dumps(data))
    return make


_SETTINGS = {"schedules": ["1f1b"], "num_devices": 2, "num_microbatches": 4}
_NOT_ZLIB = {"orders": {"1f1b": {"name": "1f1b", "text_zlib_base64": "bm90IHpsaWI="}}}
_PLAN = ["plan", "--model", "9.6b", "--gpus", "8", "--gpu-memory-gb", "80", "--no-progress"]

ROUND3 = [
    # [8] each traceback of the issue, one line now
    ("8", "plan --gpu-memory-gb 1e308", _PLAN[:5] + ["--gpu-memory-gb", "1e308"], {}, "--gpu-memory-gb: must be at most"),
    ("8", "simulate --memory-gb --tp 0", ["simulate", "v-shape", "--memory-gb", "5", "--model", "9.6b", "--tp", "0"], {},
     "--tp: must be a positive integer"),
    ("8", "draw --state nested 200,000 deep", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": "[" * 200_000 + "]" * 200_000}, "more than 64 deep"),
    ("8", "--param of 100,000 [", ["simulate", "interleaved-1f1b", "--param", "num_chunks=" + "[" * 100_000], {},
     "more than 64 deep"),
    ("8", "state whose orders is a list", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, orders=[])}, "must be objects"),
    ("8", "state whose order is a string", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, orders={"1f1b": "x"})}, "must be an object"),
    ("8", "text_zlib_base64 that is not zlib", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, **_NOT_ZLIB)}, "not zlib-compressed"),
    # [9] unbounded before
    ("9", "plan --gpus 963761198400", _PLAN[:3] + ["--gpus", "963761198400", "--gpu-memory-gb", "80"], {},
     "--gpus: must be at most 1000000"),
    ("9", "state inflating to 512 MiB", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, bomb=512 << 20)}, "inflates to more than"),
    ("9", "300 MB state read unread", ["draw", "--state", "s.json", "-o", "r.html"], {"s.json": _sparse_300mb},
     "larger than 67,108,864 bytes"),
    ("9", "draw -p 100000 (a 35 s, multi-GB raster before)", ["draw", "1f1b", "-p", "100000", "-m", "4", "-o", "x.html"],
     {}, "a figure draws at most 4,096 devices"),
    ("9", "state with p = 100000", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, orders={}, settings={**_SETTINGS, "num_devices": 100_000})},
     "more than the 4,096 devices"),
    ("9", "FIFO as a state", ["draw", "--state", "s.json", "-o", "r.html"], {"s.json": _fifo}, "(a FIFO)"),
    ("9", "FIFO as a replay", ["reproduce", "--only", "gpu-replay", "--replay", "r.json", "--out", "o"],
     {"r.json": _fifo}, "(a FIFO)"),
    # [11] plan outputs checked before the work
    ("11", "--emit into a folder with the user's schedule.csv", _PLAN + ["--emit", "e"], {"e/schedule.csv": "mine"},
     "ctrlmem did not write it; pass --force"),
    ("11", "--emit FILE", _PLAN + ["--emit", "f"], {"f": "x"}, "is a file, not a folder"),
    ("11", "--emit ''", _PLAN + ["--emit", ""], {}, "--emit is empty"),
    ("11", "--out FILE", _PLAN + ["--out", "f"], {"f": "x"}, "is a file, not a folder"),
    ("11", "--out holding the user's plan.csv", _PLAN + ["--out", "o"], {"o/plan.csv": "mine"}, "pass --force"),
    # [12] silently accepted or unclear before
    ("12", "--memory-gb --microbatch-size 0",
     ["simulate", "v-shape", "--memory-gb", "5", "--model", "9.6b", "--microbatch-size", "0"], {},
     "--microbatch-size: must be a positive integer"),
    ("12", "plan --microbatch-sizes 1000000000", _PLAN + ["--microbatch-sizes", "1000000000"], {},
     "microbatch_sizes must be at most"),
    ("12", "replay row without peak_alloc_bytes", _PLAN + ["--allocator-margin", "r.json"],
     {"r.json": _replay_without("peak_alloc_bytes")}, "lacks peak_alloc_bytes"),
    ("12", "FIFO as --costs-from", _PLAN + ["--costs-from", "c.json"], {"c.json": _fifo}, "(a FIFO)"),
    ("12", "--tp -2 named as --tp", ["simulate", "v-shape", "--memory-gb", "5", "--model", "9.6b", "--tp", "-2"], {},
     "--tp: must be a positive integer"),
    ("12", "a state's style reaching the plot unchecked", ["draw", "--state", "s.json", "-o", "r.html"],
     {"s.json": lambda p: state_file(p, style={"diagram": {"colors": {"x": 1}}})}, "must be a number, text or a bool"),
    ("12", "plan --top 0", _PLAN + ["--top", "0"], {}, "--top: must be a positive integer"),
    ("12", "plan --reserve-gb -1", _PLAN + ["--reserve-gb", "-1"], {}, "--reserve-gb: must be >= 0"),
]

#: cm.plan's arguments (issue 31, [13]): (id, keyword arguments over gpus=8, gpu_memory_gb=80, text the
#: ValueError / TypeError holds, or None where the call must be accepted).
PLAN_API = [
    ("gpus=np.int64(8) accepted", {"gpus": np.int64(8)}, None),
    ("costs={'kind': 'layers'}", {"costs": {"kind": "layers"}}, "lacks f, b, w"),
    ("schedules=123", {"schedules": 123}, "schedules must be names"),
    ("flash_attention='no'", {"flash_attention": "no"}, "flash_attention must be True or False"),
    ("gpus=True", {"gpus": True}, "gpus must be a positive integer"),
    ("gpus=10**12", {"gpus": 10**12}, "gpus must be at most"),
    ("gpu_memory_gb=inf", {"gpu_memory_gb": float("inf")}, "gpu_memory_gb must be a finite number"),
    ("tp=[0]", {"tp": [0]}, "tp must be a positive integer"),
    ("microbatch_sizes=np.int64(2) accepted", {"microbatch_sizes": np.int64(2)}, None),
    ("exhaustive='yes'", {"exhaustive": "yes"}, "exhaustive must be True or False"),
]
