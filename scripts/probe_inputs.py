"""Probe ctrlmem with bad inputs and faults; count the clean answers.

A *clean* answer is: for the command line, exit status 2 (or the status the case names), one
line on stderr, no traceback, within the time limit; for the Python API, a ``TypeError`` /
``ValueError`` whose message names the argument (or a correct result where the input is a
sensible form, e.g. a numpy integer). Fault probes check that nothing of the run is left running
and that no success record is left for a failed run.

Usage: ``python scripts/probe_inputs.py [--faults] [-v]`` (run from anywhere; every probe runs in
a fresh temporary working directory and the checkout is compared before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "10_experiment.ipynb"
PY = sys.executable
CFG = "name: probe\ndescription: d\nscale: cpu\n"


def cli(args, cwd, timeout=60, files=None, env=None):
    """Run ``ctrlmem ARGS`` in ``cwd``; (rc, stdout, stderr) or (None, '', 'timeout')."""
    for name, text in (files or {}).items():
        path = Path(cwd) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    try:
        p = subprocess.run([PY, "-m", "ctrlmem.cli", *args], cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "", "timeout"
    return p.returncode, p.stdout, p.stderr


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
    big = CFG + f"notebook: {NOTEBOOK}\ngrid:\n  p: {list(range(1000))}\n  m: {list(range(1, 1001))}\n"
    add("10^6-point grid needs --yes", lambda: clean_cli(cli(["sweep", "c.yaml", "--no-progress"], d("c7"), 60,
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
    return out


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
    rc, so, se = cli(["run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "50", "--timeout", "6",
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
    env = {**os.environ, "CTRLMEM_PROBE": token}
    proc = subprocess.Popen([PY, "-m", "ctrlmem.cli", "run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps",
                             "50", "--out", "o"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(6)
    proc.send_signal(sig)
    try:
        so, se = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return False, "did not end within 30 s"
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
    ap.add_argument("-k", default=None, help="run only the probes whose name contains this text")
    args = ap.parse_args()
    before = checkout_state()
    tmp = Path(tempfile.mkdtemp(prefix="ctrlmem-probe-"))
    os.chdir(tmp)
    results = []
    try:
        for name, fn in probes(tmp, args.faults):
            if args.k and args.k not in name:
                continue
            t0 = time.monotonic()
            try:
                ok, detail = fn()
            except Exception as exc:  # noqa: BLE001
                ok, detail = False, f"probe crashed: {type(exc).__name__}: {exc}"
            results.append(ok)
            if args.verbose or not ok:
                print(f"{'clean' if ok else 'NOT  '}  {name}  ({time.monotonic() - t0:.1f} s)  {detail}")
    finally:
        os.chdir(REPO)
        shutil.rmtree(tmp, ignore_errors=True)
    after = checkout_state()
    touched = sorted(after - before)
    results.append(not touched)
    if touched:
        print(f"NOT    the checkout changed: {touched[:10]}")
    print(f"{sum(results)} of {len(results)} probes answered cleanly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
