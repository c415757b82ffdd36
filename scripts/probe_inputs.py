"""Probe ctrlmem with bad inputs and faults; count the clean answers.

A *clean* answer is: for the command line, exit status 2 (or the status the case names), one
line on stderr, no traceback, within the time limit; for the Python API, a ``TypeError`` /
``ValueError`` whose message names the argument (or a correct result where the input is a
sensible form, e.g. a numpy integer). Fault probes check that nothing of the run is left running
and that no success record is left for a failed run.

Usage: ``python scripts/probe_inputs.py [--faults] [-v] [-k TEXT]`` (run from anywhere; every probe
runs in a fresh temporary working directory and the checkout is compared before and after). With
``--faults`` it also runs the process fault probes, the five classes of "bounded and atomic"
(``[1]`` tiny inputs that would expand without bound, ``[2]`` writes on a full disk, ``[3]``
numbers checked before work starts, ``[4]`` sweeps that check what they find, ``[5]`` API
parity) and round 3's (issue 31: ``[6]`` script injection, ``[7]`` special files as outputs,
``[8]`` former tracebacks, ``[9]`` formerly unbounded inputs, ``[10]`` signals of ``optimal``,
``[11]`` plan outputs, ``[12]`` inputs silently accepted before, ``[13]`` ``cm.plan``'s argument
types): each must answer within :data:`FAST_S` seconds and :data:`MAX_RSS_MIB` MiB. The inputs
are the tables of ``tests/bad_inputs.py``, which the tests assert on too. The summary
prints the slowest probe and the worst peak RSS (from ``wait4``) of any process a probe started.
Exit status 1 when a probe is not clean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from bad_inputs import (FILL, HOSTILE_NAME, NUMBERS, PLAN_API, ROUND3, WRAPPER, expanding, state_file,  # noqa: E402
                        unshare_flags)

NOTEBOOK = REPO / "notebooks" / "10_experiment.ipynb"
PY = sys.executable
CFG = "name: probe\ndescription: d\nscale: cpu\n"


#: The peak RSS (MiB) and wall time (s) of every process the current probe started.
MEASURED: list[tuple[float, float]] = []


def run_measured(cmd, cwd, timeout=60, env=None, preexec_fn=None):
    """Run ``cmd``; (rc, stdout, stderr) or (None, '', 'timeout'). Its own peak RSS and wall time go
    to :data:`MEASURED`; output goes through files (a pipe could fill and block)."""
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        t0 = time.monotonic()
        proc = subprocess.Popen([PY, "-S", "-c", WRAPPER, rss.name, *cmd], cwd=cwd, stdout=out, stderr=err,
                                text=True, env=env, preexec_fn=preexec_fn, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        rss.seek(0)
        peak = rss.read().strip()
        MEASURED.append((int(peak) / 1024 if peak.isdigit() else 0.0, time.monotonic() - t0))
        out.seek(0)
        err.seek(0)
        if rc is None:
            return None, "", "timeout"
        return rc, out.read(), err.read()


def cli(args, cwd, timeout=60, files=None, env=None, preexec_fn=None):
    """Run ``ctrlmem ARGS`` in ``cwd``; (rc, stdout, stderr) or (None, '', 'timeout')."""
    for name, text in (files or {}).items():
        path = Path(cwd) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(text):
            path.touch()
            text(path)
        else:
            path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return run_measured([PY, "-m", "ctrlmem.cli", *args], cwd, timeout, env, preexec_fn)


def clean_cli(res, want_rc=2, needle=None):
    rc, out, err = res
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    ok = rc == want_rc and len(lines) == (1 if want_rc else 0) and "Traceback" not in err
    if needle:
        ok = ok and needle.lower() in err.lower()
    return ok, f"rc={rc} err={err.strip()[-300:]!r}"


def api(fn, exc_types=(TypeError, ValueError), needle=None, accept=False):
    """Clean if fn() raises one of exc_types naming ``needle``, or (accept=True) returns."""
    try:
        fn()
    except exc_types as exc:
        if accept:
            return False, f"rejected a sensible form: {type(exc).__name__}: {exc}"
        ok = needle is None or needle.lower() in str(exc).lower()
        return ok, f"{type(exc).__name__}: {exc}"[:300]
    except BaseException as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"[:300]
    return (True, "accepted") if accept else (False, "accepted silently")


def probes(tmp: Path, faults: bool):
    import numpy as np

    import ctrlmem as cm

    def d(name):
        path = tmp / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    s = cm.build("1f1b", 4, 8)
    out = []

    def add(name, fn):
        out.append((name, fn))

    # ------------------------------------------------------------ size guards (CLI)
    add("simulate -m 10^7", lambda: clean_cli(cli(["simulate", "1f1b", "-p", "4", "-m", "10000000"], d("a1"), 30),
                                              needle="10000000"))
    add("simulate -p 10^6", lambda: clean_cli(cli(["simulate", "1f1b", "-p", "1000000", "-m", "8"], d("a2"), 30)))
    add("simulate num_chunks=100000", lambda: clean_cli(cli(
        ["simulate", "interleaved-1f1b", "-p", "4", "-m", "8", "--param", "num_chunks=100000"], d("a3"), 30)))
    # ------------------------------------------------------------ file / OS errors (CLI)
    add("export to a missing folder", lambda: clean_cli(cli(["export", "1f1b", "--torch-csv", "nodir/x.csv"],
                                                            d("b1")), needle="nodir"))
    add("export to a folder", lambda: clean_cli(cli(["export", "1f1b", "--torch-csv", "."], d("b2"))))
    add("export --text to a folder", lambda: clean_cli(cli(["export", "1f1b", "--text", "."], d("b3"))))
    add("export under a file", lambda: clean_cli(cli(["export", "1f1b", "--torch-csv", "f/x.csv"], d("b4"),
                                                     files={"f": "x"})))
    add("export to /proc", lambda: clean_cli(cli(["export", "1f1b", "--text", "/proc/nope/x"], d("b5"))))
    def draw_missing():
        cwd = d("b6")
        rc, so, se = cli(["draw", "1f1b", "-o", "nodir/x.html"], cwd)
        if rc == 0:  # creating the folder the user named is a sensible answer too
            return (cwd / "nodir" / "x.html").is_file(), "created the folder"
        return clean_cli((rc, so, se))
    add("draw to a missing folder", draw_missing)
    add("run --out is a file", lambda: clean_cli(cli(["run", "--schedule", "1f1b", "--out", "f", "--steps", "0"],
                                                     d("b7"), files={"f": "x"})))
    cfg_ok = CFG + "params: {schedule: 1f1b, p: 2, m: 2}\n"
    add("sweep --results is a file", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--results", "f", "--no-progress", "--root", str(REPO)], d("b8"),
        files={"c.yaml": cfg_ok, "f": "x"})))
    add("sweep --results is a file (no --root)", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--results", "f", "--no-progress"], d("b9"),
        files={"c.yaml": cfg_ok.replace("scale: cpu\n", f"scale: cpu\nnotebook: {NOTEBOOK}\n"), "f": "x"})))
    add("sweep config is a folder", lambda: clean_cli(cli(["sweep", "."], d("b10"))))
    # ------------------------------------------------------------ configs
    add("YAML error keeps line/column", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c1"), files={"c.yaml": CFG + "params: {p: [1, 2}\n"}), needle="line 4"))
    add("grid: {} is an error", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c2"), files={"c.yaml": CFG + f"notebook: {NOTEBOOK}\ngrid: {{}}\n"}),
        needle="grid"))
    add("cases: [] is an error", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c3"),
        files={"c.yaml": CFG + f"notebook: {NOTEBOOK}\nparams: {{p: 2}}\ncases: []\n"}), needle="cases"))
    add("notebook: not a notebook", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c4"),
        files={"c.yaml": CFG + "notebook: c.txt\nparams: {p: 2}\n", "c.txt": "hello\nworld\n" * 50}),
        needle="notebook"))
    add("notebook: relative to cwd", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c5"),
        files={"c.yaml": CFG + "notebook: nb.ipynb\nparams: {schedule: 1f1b, p: 2, m: 2}\n",
               "nb.ipynb": NOTEBOOK.read_text()}), want_rc=0))
    add("default notebook missing in cwd", lambda: clean_cli(cli(
        ["sweep", "c.yaml", "--list"], d("c6"), files={"c.yaml": cfg_ok}), needle="notebook"))
    big = CFG + f"notebook: {NOTEBOOK}\ngrid:\n  p: {list(range(100))}\n  m: {list(range(1, 101))}\n"
    add("10^4-point grid needs --yes", lambda: clean_cli(cli(["sweep", "c.yaml", "--no-progress"], d("c7"), 60,
                                                            files={"c.yaml": big}), needle="--yes"))
    # ------------------------------------------------------------ records
    def bad_record(content):
        def probe():
            from ctrlmem import experiments as ex

            res = d(f"r{abs(hash(content))}")
            (res / "runs").mkdir(parents=True, exist_ok=True)
            cfg = ex.config_from_dict({"name": "rec", "description": "d", "scale": "cpu",
                                       "notebook": str(NOTEBOOK), "params": {"schedule": "1f1b", "p": 2, "m": 2}})
            run = cfg.runs()[0]
            (res / "runs" / f"{run.run_id}.json").write_text(content)
            calls = []

            def fake(nb, executed, params, out_dir, timeout):
                calls.append(params)
                return ex.RunOutcome("ok", result={"makespan": 1.0})
            try:
                ex.run_sweep(cfg, results_dir=res, build_dir=res / "build", executor=fake, check=False)
            except Exception as exc:  # noqa: BLE001
                return False, f"{type(exc).__name__}: {exc}"[:300]
            return (len(calls) == 1), f"re-ran: {len(calls)}"
        return probe

    for content in ('{"status": "ok"}', "[]", "null", '{"status": "ok", "run_id": "x', ""):
        add(f"record {content!r} is not done", bad_record(content))

    def truncated_only():
        cwd = d("r_only")
        cfg = CFG + f"notebook: {NOTEBOOK}\nparams: {{schedule: 1f1b, p: 2, m: 2}}\n"
        (cwd / "c.yaml").write_text(cfg)
        rc, so, se = cli(["sweep", "c.yaml", "--list"], cwd)
        run_id = so.split()[0]
        runs = cwd / "experiments" / "results" / "probe" / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        (runs / f"{run_id}.json").write_text('{"status": "ok", "run_id": "x')
        from ctrlmem import experiments as ex
        try:
            ex.read_records(runs.parent)
        except Exception as exc:  # noqa: BLE001
            return (run_id in str(exc)), f"{type(exc).__name__}: {exc}"[:300]
        return True, "skipped with a warning"
    add("truncated record read names the file", truncated_only)
    # ------------------------------------------------------------ API
    add("build numpy ints", lambda: api(lambda: cm.build("1f1b", np.int64(4), np.int64(8)), accept=True))
    add("Costs numpy floats", lambda: api(lambda: cm.Costs(np.float64(1), np.float32(2), np.int64(1), np.float64(0)),
                                          accept=True))
    add("build numpy memory_limit", lambda: api(lambda: cm.build("v-shape", 4, 8, memory_limit=np.float64(0.5)),
                                                accept=True))
    add("simulate costs tuple", lambda: api(lambda: cm.simulate(s, (1, 1, 1, 0)), needle="costs", accept=True))
    add("simulate costs string", lambda: api(lambda: cm.simulate(s, "1,1,1,0"), needle="costs", accept=True))
    add("simulate costs dict", lambda: api(lambda: cm.simulate(s, {"f": 1}), needle="costs", accept=True))
    add("simulate costs object", lambda: api(lambda: cm.simulate(s, object()), needle="costs"))
    add("simulate memory str", lambda: api(lambda: cm.simulate(s, None, "x"), needle="memory"))
    add("simulate None schedule", lambda: api(lambda: cm.simulate(None), needle="schedule"))
    add("validate(None)", lambda: api(lambda: cm.validate(None), needle="schedule"))
    add("validate(str)", lambda: api(lambda: cm.validate("1f1b"), needle="schedule"))
    add("memory_limit=True", lambda: api(lambda: cm.build("v-shape", 4, 8, memory_limit=True), needle="memory_limit"))
    add("memory_limit='0.5'", lambda: api(lambda: cm.build("v-shape", 4, 8, memory_limit="0.5"), needle="memory_limit"))
    add("num_devices=True", lambda: api(lambda: cm.build("1f1b", True, 8), needle="num_devices"))
    add("num_devices='4'", lambda: api(lambda: cm.build("1f1b", "4", 8), needle="num_devices"))
    add("num_microbatches=4.5", lambda: api(lambda: cm.build("1f1b", 4, 4.5), needle="num_microbatches"))
    add("build name=5", lambda: api(lambda: cm.build(5, 4, 8), needle="name"))
    add("build costs tuple", lambda: api(lambda: cm.build("1f1b", 4, 8, costs=(1, 1, 1, 0)), needle="costs",
                                         accept=True))
    add("build m=10^7 refused with limit", lambda: api(lambda: cm.build("1f1b", 4, 10**7), needle="10"))
    add("build p=10^6 refused", lambda: api(lambda: cm.build("1f1b", 10**6, 8), needle="num_devices"))
    add("build num_chunks=10^5 refused", lambda: api(lambda: cm.build("interleaved-1f1b", 4, 8, num_chunks=100000),
                                                     needle="passes"))
    add("Costs per-stage all zero", lambda: api(lambda: cm.Costs([0, 0], [0, 0], [0, 0]), needle="f + b + w"))
    add("Costs 1e308 overflow", lambda: api(lambda: cm.simulate(s, cm.Costs(1e308, 1e308, 1e308)).makespan,
                                            needle="1e+308"))
    add("Costs bool", lambda: api(lambda: cm.Costs(True, 1, 1), needle="f"))
    add("Costs str", lambda: api(lambda: cm.Costs("1", 1, 1), needle="f"))
    add("Costs comm list", lambda: api(lambda: cm.Costs(1, 1, 1, [0, 1]), needle="comm"))
    add("MemoryModel release_at_b=True", lambda: api(lambda: cm.MemoryModel(release_at_b=True),
                                                     needle="release_at_b"))
    # ------------------------------------------------------------ faults (slow)
    if faults:
        add("run --timeout leaves nothing running, no ok record", lambda: fault_run_timeout(d("f1")))
        add("SIGTERM to run: 143, one line, nothing left", lambda: fault_run_signal(d("f2"), signal.SIGTERM, 143))
        bounded_probes(d, add)
        round3_probes(d, add)
    return out


# ---------------------------------------------------------------- issue 20: bounded and atomic

FAST_S = 10.0
"""A probe of the bounded/atomic classes is clean only if every process it started answered
within this many seconds (2 shared cores; most answer in under 1 s)."""

MAX_RSS_MIB = 512.0
"""... and stayed below this peak RSS (the command itself takes about 25 MiB, one that imports torch,
as ``run`` does before its memory preflight, about 310 MiB; before the guards a 14-byte CSV took
349 MB and a 432-byte config 1.7 GB)."""


def fast(result):
    """``result`` of a probe, unclean when one of its processes took longer than :data:`FAST_S`
    or more memory than :data:`MAX_RSS_MIB`."""
    ok, detail = result
    worst = max(MEASURED, default=(0.0, 0.0), key=lambda x: x[0])
    slow = max((w for _, w in MEASURED), default=0.0)
    if slow > FAST_S or worst[0] > MAX_RSS_MIB:
        return False, f"{detail}; took {slow:.1f} s, {worst[0]:.0f} MiB"
    return ok, detail


# ``cli(*args)`` for a child on a small disk (``DISK`` is set before this text).
_CLI_ON_DISK = """
import json, subprocess, sys
def cli(*args):
    p = subprocess.run([sys.executable, "-m", "ctrlmem.cli", *args], capture_output=True, text=True, cwd=DISK)
    return p.returncode, p.stderr
"""


def small_disk(cwd: Path, script: str, size: str):
    """Run ``script`` with ``DISK`` on a fresh tmpfs of ``size`` (private mount namespace); the JSON
    it prints last, or ``None`` when mounting is not allowed here."""
    flags = unshare_flags()
    if flags is None:
        return None
    disk = cwd / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    (cwd / "child.py").write_text(f"DISK = {str(disk)!r}\n" + FILL + _CLI_ON_DISK + script)
    rc, out, err = run_measured([*flags, "sh", "-c", 'mount -t tmpfs -o size=$3 tmpfs "$0" && exec "$1" "$2"',
                                 str(disk), PY, str(cwd / "child.py"), size], cwd, 120,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    if rc != 0:
        raise RuntimeError(f"the small-disk child failed: {err[-300:]}")
    return json.loads(out.strip().splitlines()[-1])


def disk_full_export(cwd: Path):
    out = small_disk(cwd, """
rc0, _ = cli("export", "1f1b", "-p", "2", "-m", "2", "--torch-csv", "x.csv")
before = open(os.path.join(DISK, "x.csv"), "rb").read()
fill(DISK)
rc, err = cli("export", "1f1b", "-p", "8", "-m", "64", "--torch-csv", "x.csv")
print(json.dumps({"rc": [rc0, rc], "err": err, "same": open(os.path.join(DISK, "x.csv"), "rb").read() == before,
                  "files": sorted(os.listdir(DISK))}))
""", "256k")
    if out is None:
        return disk_limit_export(cwd)  # no tmpfs here: the same check through ulimit -f
    ok = (out["rc"] == [0, 2] and out["same"] and out["files"] == ["filler", "x.csv"]
          and "x.csv: no space left on the device" in out["err"] and len(out["err"].strip().splitlines()) == 1)
    return ok, f"tmpfs: {out}"[:300]


def disk_full_draw(cwd: Path):
    out = small_disk(cwd, """
open(os.path.join(DISK, "f.html"), "w").write("<html>old</html>")
rc, err = cli("draw", "1f1b", "-o", "f.html")
print(json.dumps({"rc": rc, "err": err, "old": open(os.path.join(DISK, "f.html")).read(),
                  "files": sorted(os.listdir(DISK))}))
""", "1m")
    if out is None:
        return True, "skipped: mounting a tmpfs is not allowed here (the ulimit -f probe covers the write path)"
    ok = out["rc"] == 2 and out["old"] == "<html>old</html>" and out["files"] == ["f.html"] and \
        "f.html: no space left" in out["err"]
    return ok, f"tmpfs: {out}"[:300]


def disk_full_sweep(cwd: Path):
    out = small_disk(cwd, f"""
from ctrlmem import experiments as ex
cfg = ex.config_from_dict({{"name": "full", "description": "d", "scale": "cpu", "notebook": {str(NOTEBOOK)!r},
                           "grid": {{"x": [0, 1, 2]}}}})
res = os.path.join(DISK, "res")
def executor(nb, executed, params, out_dir, timeout):
    if params["x"] == 1:
        fill(DISK)
    return ex.RunOutcome("ok", result={{"x": params["x"]}})
try:
    ex.run_sweep(cfg, results_dir=res, build_dir=os.path.join(DISK, "b"), check=False, executor=executor)
    error = None
except OSError as exc:
    error = str(exc)
tmp = [f for _, _, fs in os.walk(DISK) for f in fs if ".tmp" in f]
print(json.dumps({{"error": error, "tmp": tmp, "records": sorted(r["params"]["x"] for r in ex.read_records(res))}}))
""", "256k")
    if out is None:
        return True, "skipped: mounting a tmpfs is not allowed here"
    ok = bool(out["error"]) and "No space left" in out["error"] and not out["tmp"] and 0 in out["records"] \
        and 2 not in out["records"]
    return ok, f"tmpfs: {out}"[:300]


def disk_limit_export(cwd: Path):
    """Past the file-size limit (RLIMIT_FSIZE in the child: runs everywhere): the old file stays."""
    import resource

    rc, _, _ = cli(["export", "1f1b", "-p", "2", "-m", "2", "--torch-csv", "x.csv"], cwd)
    before = (cwd / "x.csv").read_bytes()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    res = cli(["export", "1f1b", "-p", "8", "-m", "64", "--torch-csv", "x.csv"], cwd, preexec_fn=limit)
    ok, detail = clean_cli(res, needle="x.csv: file too large")
    left = sorted(p.name for p in cwd.iterdir())
    return ok and (cwd / "x.csv").read_bytes() == before and left == ["x.csv"], f"{detail} files={left}"


def copied_folder(cwd: Path):
    """A marker copied from a live sweep's folder: its processes are left alone."""
    import socket

    from ctrlmem import experiments as ex
    from ctrlmem.util import proctree
    from ctrlmem.experiments.store import folder_identity, process_started

    cfg = ex.config_from_dict({"name": "copy", "description": "d", "scale": "cpu", "notebook": str(NOTEBOOK),
                               "grid": {"x": [0, 1]}})
    tag = proctree.new_tag("probe-copy")
    live = proctree.start([PY, "-c", "import time; time.sleep(60)"], tag)
    try:
        original, copy = cwd / "orig", cwd / "copy"
        original.mkdir()
        info = {"run_id": cfg.runs()[1].run_id, "tag": tag, "sweep_pid": live.pid,
                "sweep_started": process_started(live.pid), "host": socket.gethostname(),
                "results": folder_identity(original)}
        (copy / ".inflight").mkdir(parents=True)
        (copy / ".inflight" / f"{info['run_id']}.json").write_text(json.dumps(info))
        messages = []
        ex.run_sweep(cfg, results_dir=copy, build_dir=cwd / "b", check=False, on_message=messages.append,
                     executor=lambda *a: ex.RunOutcome("ok", result={"v": 1}))
        time.sleep(0.3)
        return live.poll() is None, " | ".join(messages)[:300]
    finally:
        proctree.kill_tree(live, tag)


def slurm_locked(cwd: Path):
    """`--launcher slurm` on a folder another sweep holds: refused, no Slurm command run."""
    from ctrlmem import experiments as ex

    fake = cwd / "bin"
    fake.mkdir()
    for cmd in ("sbatch", "squeue", "scontrol"):
        (fake / cmd).write_text(f"#!/bin/sh\ntouch {cwd}/called\nexit 1\n")
        (fake / cmd).chmod(0o755)
    (cwd / "c.yaml").write_text(CFG + f"notebook: {NOTEBOOK}\nparams: {{schedule: 1f1b, p: 2, m: 2, backend: gloo}}\n")
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    with ex.SweepLock(cwd / "res") as lock:
        lock.acquire()
        res = cli(["sweep", "c.yaml", "--launcher", "slurm", "--results", "res", "--no-progress"], cwd, env=env)
    ok, detail = clean_cli(res, needle="in use by another sweep")
    return ok and not (cwd / "called").exists(), detail


def store_layout(cwd: Path, make, needle: str):
    from ctrlmem import experiments as ex

    cfg = ex.config_from_dict({"name": "lay", "description": "d", "scale": "cpu", "notebook": str(NOTEBOOK),
                               "grid": {"x": [0, 1]}})
    res = cwd / "res"
    res.mkdir(parents=True, exist_ok=True)
    make(res)
    calls = []
    try:
        ex.run_sweep(cfg, results_dir=res, build_dir=cwd / "b", check=False,
                     executor=lambda *a: calls.append(1) or ex.RunOutcome("ok", result={"v": 1}))
    except ex.ConfigError as exc:
        return (needle in str(exc) and not calls), str(exc)[:300]
    return False, f"accepted; {len(calls)} point(s) ran"


def api_in_child(code: str, cwd: Path, needle: str):
    """Run ``code`` (Python) in a child that must print ``needle`` within :data:`FAST_S` (an API
    call that could block, e.g. opening a FIFO, cannot hang the probes)."""
    rc, out, err = run_measured([PY, "-c", code], cwd, timeout=FAST_S + 5)
    return (rc == 0 and needle in out), f"rc={rc} out={out.strip()[-200:]!r} err={err.strip()[-200:]!r}"


def bounded_probes(d, add) -> None:
    """Issue 20's five classes, each with probes of our own besides the issue's examples."""
    import numpy as np

    import ctrlmem as cm
    from ctrlmem.plots import figures as plot
    from ctrlmem.runtime import launch

    def c(args, cwd, needle, files=None, want_rc=2, **kw):
        return lambda: fast(clean_cli(cli(args, d(cwd), 60, files=files, **kw), want_rc=want_rc, needle=needle))

    nb = f"notebook: {NOTEBOOK}\n"
    # 1. tiny inputs that would expand without bound
    for i, (name, args, files, needle) in enumerate(expanding(CFG + nb)):
        add(f"[1] {name}", c(args, f"x{i}", needle, files))

    def optimal_in_time():
        t0 = time.monotonic()
        r = cm.optimal(16, 64, cm.Costs(3, 4, 2, 0.1), memory_limit=0.5, time_limit=2)
        wall = time.monotonic() - t0
        return wall < 5, f"status {r.status} in {wall:.1f} s"
    add("[1] cm.optimal(16, 64, time_limit=2) within 5 s", optimal_in_time)
    add("[1] Schedule.load of a FIFO never blocks", lambda: fast(api_in_child(
        "import os, ctrlmem as cm\nos.mkfifo('p.csv')\ntry:\n    cm.Schedule.load('p.csv')\n"
        "except ValueError as e:\n    print(e)\n", d("x17"), "a FIFO")))
    # 2. writes that are not atomic
    add("[2] export on a full disk keeps the old file", lambda: fast(disk_full_export(d("w1"))))
    add("[2] draw on a full disk keeps the old figure", lambda: fast(disk_full_draw(d("w2"))))
    add("[2] sweep on a full disk: records kept, no .tmp", lambda: fast(disk_full_sweep(d("w3"))))
    add("[2] export past ulimit -f keeps the old file", lambda: fast(disk_limit_export(d("w4"))))

    def scale_keeps_old():
        cwd = d("w5")
        (cwd / "x.png").write_bytes(b"old")
        ok, detail = clean_cli(cli(["draw", "1f1b", "-o", "x.png", "--scale", "1000"], cwd), needle="--scale")
        return ok and (cwd / "x.png").read_bytes() == b"old", detail
    add("[2] draw --scale 1000 writes nothing", lambda: fast(scale_keeps_old()))
    add("[2] export to a path whose folder is a file", c(["export", "1f1b", "--text", "f/x.txt"], "w6",
                                                         "is a file, not a folder", {"f": "x"}))
    # 3. numbers checked before work starts
    for i, (args, needle) in enumerate(NUMBERS):
        add(f"[3] {' '.join(args)[:60]}", c(args, f"n{i}x", needle))
    add("[3] run --model 9.6b on CPU: memory named", c(["run", "--schedule", "1f1b", "--model", "9.6b"], "n1",
                                                       "GiB of memory"))
    add("[3] a folder as a schedule", c(["simulate", "adir"], "n2", "is a folder", {"adir/x": "x"}))

    def fifo_cli():
        cwd = d("n3")
        os.mkfifo(cwd / "p.csv")
        return fast(clean_cli(cli(["simulate", "p.csv"], cwd), needle="a FIFO"))
    add("[3] a FIFO as a schedule", fifo_cli)

    def link_loop():
        cwd = d("n4")
        (cwd / "a.csv").symlink_to("b.csv")
        (cwd / "b.csv").symlink_to("a.csv")
        return fast(clean_cli(cli(["simulate", "a.csv"], cwd), needle="link"))
    add("[3] a symlink loop as a schedule", link_loop)

    def replay_zero():
        from ctrlmem.model.replayfile import default_replay_path

        data = json.loads(default_replay_path().read_text())
        data["rows"][0]["theory_peak_bytes"] = 0
        return fast(clean_cli(cli(["reproduce", "--only", "gpu-replay", "--replay", "r.json", "--out", "o"], d("n5"),
                                  files={"r.json": json.dumps(data)}), needle="theory_peak_bytes"))
    add("[3] GPU-replay row with a zero theory peak", replay_zero)
    for field, value in (("timeout_s", -1), ("threads_per_rank", 0), ("hang_timeout_s", float("inf")), ("dp", True)):
        add(f"[3] RunConfig({field}={value!r})", lambda f=field, v=value: api(
            lambda: launch.prepare(launch.RunConfig(**{"schedule": "1f1b", "num_devices": 2, "num_microbatches": 4,
                                                       f: v})), (launch.RunError,), needle=f))
    add("[3] emit_sbatch(nodes=-1)", lambda: api(lambda: launch.emit_sbatch(
        launch.RunConfig("1f1b", 2, 4, out=str(d("n6") / "o")), -1, -2, d("n6") / "j.sbatch"), (launch.RunError,),
        needle="nodes"))
    add("[3] cm.optimal(memory_limit=1e308)", lambda: api(lambda: cm.optimal(2, 2, memory_limit=1e308),
                                                          needle="memory_limit"))
    # 4. sweeps that trust what they find
    add("[4] copied results folder: the live sweep's processes left alone", lambda: copied_folder(d("s1")))
    add("[4] --launcher slurm refuses a locked folder", lambda: fast(slurm_locked(d("s2"))))
    add("[4] runs is a file: refused before a point runs",
        lambda: store_layout(d("s3"), lambda r: (r / "runs").write_text("x"), "runs is a file"))
    add("[4] runs is a symlink loop: refused before a point runs",
        lambda: store_layout(d("s4"), lambda r: (r / "runs").symlink_to(r / "runs"), "link loop"))
    add("[4] results.csv is a folder: right advice",
        lambda: store_layout(d("s5"), lambda r: (r / "results.csv").mkdir(), "results.csv is a folder"))
    add("[4] .inflight is a file: refused",
        lambda: store_layout(d("s6"), lambda r: (r / ".inflight").write_text("x"), ".inflight is a file"))
    # 5. API parity
    add("[5] cm.optimal numpy ints", lambda: api(lambda: cm.optimal(np.int64(2), np.int32(2), time_limit=10),
                                                 accept=True))
    add("[5] cm.optimal costs text", lambda: api(lambda: cm.optimal(2, 2, costs="1,2,1", time_limit=10), accept=True))
    add("[5] cm.optimal(time_limit=True)", lambda: api(lambda: cm.optimal(2, 2, time_limit=True), needle="time_limit"))
    add("[5] cm.optimal(workers=True)", lambda: api(lambda: cm.optimal(2, 2, workers=True), needle="workers"))
    add("[5] cm.optimal(time_limit=inf)", lambda: api(lambda: cm.optimal(2, 2, time_limit=math.inf),
                                                      needle="time_limit"))
    add("[5] cm.optimal(memory_limit='abc')", lambda: api(lambda: cm.optimal(2, 2, memory_limit="abc"),
                                                          needle="memory_limit"))
    r = cm.simulate(cm.build("1f1b", 4, 8))
    add("[5] plot.schedule_figure(None)", lambda: api(lambda: plot.schedule_figure(None), needle="items"))
    add("[5] plot.memory_figure([r, 'x'])", lambda: api(lambda: plot.memory_figure([r, "x"]), needle="results[1]"))
    add("[5] plot.lifespans(r, microbatch=99)", lambda: api(lambda: plot.lifespans(r, microbatch=99),
                                                            needle="microbatch"))
    add("[5] plot.lifespans(r, microbatch=np.int64(2))", lambda: api(lambda: plot.lifespans(r, np.int64(2)),
                                                                     accept=True))
    add("[5] plot.schedule_figure(width=-5)", lambda: api(lambda: plot.schedule_figure(r, width=-5), needle="width"))
    add("[5] plot.write_figure(scale=0)", lambda: api(lambda: plot.write_figure(
        plot.schedule_figure(r), str(d("p1") / "x.png"), scale=0), needle="scale"))


# ---------------------------------------------------------------- issue 31: round 3

def _page_tags(page: str):
    """The start tags of an HTML page, counted."""
    from collections import Counter
    from html.parser import HTMLParser

    tags: Counter = Counter()

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags[tag] += 1

    P().feed(page)
    return tags


def _html_of(cwd: Path, args: list[str], files) -> str | None:
    rc, _, _ = cli(args, cwd, 120, files=files)
    out = cwd / args[args.index("-o") + 1]
    return out.read_text(encoding="utf-8") if rc == 0 and out.is_file() else None


def injection(cwd: Path, kind: str):
    """[6] a hostile schedule name gives a page with the elements a benign name gives."""
    import ctrlmem as cm

    pages = []
    for i, name in enumerate((HOSTILE_NAME, "benign-name")):
        text = cm.build("1f1b", 2, 4).to_text().replace("schedule 1f1b", f"schedule {name}", 1)
        if kind == "draw":
            page = _html_of(cwd, ["draw", f"s{i}.txt", "-o", f"x{i}.html"], {f"s{i}.txt": text})
        else:
            page = _html_of(cwd, ["draw", "--state", f"s{i}.json", "-o", f"x{i}.html"],
                            {f"s{i}.json": lambda p, n=name: state_file(p, name=n)})
        if page is None:
            return False, f"no page for {name!r}"
        pages.append(page)
    hostile, benign = (_page_tags(p) for p in pages)
    ok = hostile == benign and "img" not in hostile and HOSTILE_NAME not in pages[0]
    return ok, f"tags {dict(hostile - benign) or 'as benign'}; script elements {hostile['script']}"


def char_device(cwd: Path):
    """[7] export to a private null device node: it stays a character device."""
    import stat

    node = cwd / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as exc:
        return True, f"skipped: no device node can be made here ({exc})"
    rc, _, err = cli(["export", "1f1b", "--torch-csv", str(node)], cwd)
    st = os.stat(node)
    return rc == 0 and stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3), f"rc={rc} err={err.strip()[-200:]!r}"


def fifo_target(cwd: Path):
    """[7] a FIFO nobody reads as an output: refused at once, still a FIFO."""
    import stat

    os.mkfifo(cwd / "p.csv")
    ok, detail = clean_cli(cli(["export", "1f1b", "--torch-csv", "p.csv"], cwd, 30), needle="no process reads")
    return ok and stat.S_ISFIFO(os.stat(cwd / "p.csv").st_mode), detail


def _signalled(args: list[str], cwd: Path, token: str, after_s: float, sig):
    """``ctrlmem ARGS`` (its processes marked with ``token``) sent ``sig`` after ``after_s``
    seconds: ``(proc, stdout, stderr, seconds from the signal to its end)``, or ``None`` (killed)
    when it did not end within 30 s."""
    env = {**os.environ, "CTRLMEM_PROBE": token}
    # SIGINT at its default in the child (a probe started in the background ignores it, and so
    # would the child it starts)
    proc = subprocess.Popen([PY, "-m", "ctrlmem.cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        so, se = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
    return proc, so, se, time.monotonic() - t0


def optimal_signal(cwd: Path, sig, want: int):
    """[10] `ctrlmem optimal` signalled mid-search: the status at once, no result, nothing left."""
    token = f"o{os.getpid()}{time.time()}"
    ended = _signalled(["optimal", "-p", "8", "-m", "32", "--time-limit", "60"], cwd, token, 4, sig)
    if ended is None:
        return False, "did not end within 30 s"
    proc, so, se, took = ended
    left = _descendants_alive(token)
    ok = proc.returncode == want and took < 5 and not so and not left and len(se.strip().splitlines()) == 1
    return ok, f"rc={proc.returncode} in {took:.1f} s, stdout {len(so)} chars, left={left}"


def plan_atomic(cwd: Path):
    """[11] plan past ``ulimit -f``: the old plan.csv stays, the line names it."""
    import resource

    args = ["plan", "--model", "9.6b", "--gpus", "8", "--gpu-memory-gb", "80", "--no-progress", "--schedules", "1f1b",
            "--out", "o"]
    rc, _, err = cli(args, cwd, 120)
    old = (cwd / "o" / "plan.csv").read_bytes() if rc == 0 else b""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(old) // 2, len(old) // 2))

    # stdout to /dev/null: the limit must meet plan.csv, not the probe's file holding the printed table
    proc = subprocess.run([PY, "-m", "ctrlmem.cli", *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=120, preexec_fn=limit)
    ok, detail = clean_cli((proc.returncode, "", proc.stderr), needle="plan.csv: file too large")
    return bool(ok and old and (cwd / "o" / "plan.csv").read_bytes() == old), detail


def round3_probes(d, add) -> None:
    """Issue 31's classes: [6] script injection, [7] special files, [8] tracebacks, [9] unbounded,
    [10] signals of `optimal`, [11] plan outputs, [12] silently accepted, [13] cm.plan's types."""
    import ctrlmem as cm

    add("[6] ctrlmem draw -o x.html of a hostile name", lambda: fast(injection(d("h1"), "draw")))
    add("[6] draw --state -o r.html of a hostile name", lambda: fast(injection(d("h2"), "state")))
    add("[7] export to a private char device: still a device", lambda: fast(char_device(d("k1"))))
    add("[7] export to a FIFO nobody reads: refused at once", lambda: fast(fifo_target(d("k2"))))
    for i, (klass, name, args, files, needle) in enumerate(ROUND3):
        add(f"[{klass}] {name}", lambda a=args, f=files, n=needle, i=i: fast(clean_cli(cli(a, d(f"r3_{i}"), 60, files=f),
                                                                                       needle=n)))
    add("[10] optimal SIGINT: 130 at once, no result", lambda: optimal_signal(d("g1"), signal.SIGINT, 130))
    add("[10] optimal SIGTERM: 143 at once, no result", lambda: optimal_signal(d("g2"), signal.SIGTERM, 143))
    add("[11] plan past ulimit -f keeps the old plan.csv", lambda: plan_atomic(d("o1")))
    for name, kwargs, needle in PLAN_API:
        call = {"model": "9.6b", "gpus": 8, "gpu_memory_gb": 80, "progress": False, "schedules": "1f1b", **kwargs}
        add(f"[13] cm.plan({name})", lambda c=call, n=needle: api(lambda: cm.plan(**c), needle=n, accept=n is None))


def _descendants_alive(token: str) -> list[int]:
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("CTRLMEM_PROBE") == token:
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            pass
    return pids


def fault_run_timeout(cwd: Path):
    token = f"t{os.getpid()}{time.time()}"
    env = {**os.environ, "CTRLMEM_PROBE": token}
    rc, so, se = cli(["run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "5000", "--timeout", "6",
                      "--out", "o"], cwd, 120, env=env)
    time.sleep(1)
    left = _descendants_alive(token)
    res = cwd / "o" / "result.json"
    status = json.loads(res.read_text()).get("status") if res.is_file() else None
    time.sleep(8)
    status2 = json.loads(res.read_text()).get("status") if res.is_file() else None
    ok = rc == 1 and not left and status == "failed" and status2 == "failed"
    return ok, f"rc={rc} left={left} status={status}->{status2}"


def fault_run_signal(cwd: Path, sig, want):
    token = f"s{os.getpid()}{time.time()}"
    ended = _signalled(["run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "5000", "--out", "o"],
                       cwd, token, 6, sig)
    if ended is None:
        return False, "did not end within 30 s"
    proc, so, se, _ = ended
    time.sleep(1)
    left = _descendants_alive(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    lines = [ln for ln in se.strip().splitlines() if ln.strip()]
    ok = proc.returncode == want and not left and "Traceback" not in se and len(lines) <= 1
    return ok, f"rc={proc.returncode} left={left} err={se.strip()[-200:]!r}"


def checkout_state() -> set[str]:
    p = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True)
    return set(p.stdout.splitlines())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", action="store_true", help="also run the (slow) process fault probes")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("-k", action="append", default=None,
                    help="run only the probes whose name contains this text (repeatable: any of them)")
    args = ap.parse_args()
    before = checkout_state()
    tmp = Path(tempfile.mkdtemp(prefix="ctrlmem-probe-"))
    os.chdir(tmp)
    results = []
    timings: list[tuple[float, float, str]] = []  # (wall s, peak RSS MiB of its processes, name)
    try:
        for name, fn in probes(tmp, args.faults):
            if args.k and not any(k in name for k in args.k):
                continue
            MEASURED.clear()
            t0 = time.monotonic()
            try:
                ok, detail = fn()
            except Exception as exc:  # noqa: BLE001
                ok, detail = False, f"probe crashed: {type(exc).__name__}: {exc}"
            wall = time.monotonic() - t0
            rss = max((r for r, _ in MEASURED), default=0.0)
            timings.append((wall, rss, name))
            results.append(ok)
            if args.verbose or not ok:
                mem = f", {rss:.0f} MiB" if MEASURED else ""
                print(f"{'clean' if ok else 'NOT  '}  {name}  ({wall:.1f} s{mem})  {detail}")
    finally:
        os.chdir(REPO)
        shutil.rmtree(tmp, ignore_errors=True)
    after = checkout_state()
    touched = sorted(after - before)
    results.append(not touched)
    if touched:
        print(f"NOT    the checkout changed: {touched[:10]}")
    if timings:
        import resource

        slowest = max(timings)
        worst = max(timings, key=lambda t: t[1])
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        classes = [t for t in timings if t[2].startswith("[")]
        print(f"slowest probe: {slowest[2]} ({slowest[0]:.1f} s); worst peak RSS of a probe's process: "
              f"{worst[1]:.0f} MiB ({worst[2]}); this process (the in-process API probes): {own:.0f} MiB")
        if classes:
            print(f"bounded/atomic classes: {len(classes)} probes, slowest {max(classes)[2]} ({max(classes)[0]:.1f} s), "
                  f"worst peak RSS {max(classes, key=lambda t: t[1])[1]:.0f} MiB "
                  f"({max(classes, key=lambda t: t[1])[2]})")
    print(f"{sum(results)} of {len(results)} probes answered cleanly")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
