"""Bounded and atomic (issue 20): no input makes ctrlmem hang or eat the machine, no failure leaves
a half-written file.

* Tiny inputs that would expand without bound (a CSV naming stage 5,000,000, a header saying
  ``p=100000000``, YAML aliases, ``cases`` multiplying to 10^7 points, a 2.4 M-pass file, an
  exact solve of p = 32, m = 256) are refused in a separate process within seconds and a bounded
  memory, in one short line.
* Every file written goes through one atomic helper: on a full disk (a small tmpfs in a private
  mount namespace; skipped where mounting is not allowed) or past the file-size limit (``ulimit
  -f``, which runs everywhere) the old file is kept byte for byte, no temporary file is left, and
  the error names the path and the reason.
* Numbers are checked where they enter (the command line and the API alike) before any work or
  process starts; the sweep checks its folder's layout before the first point runs.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ctrlmem as cm
from ctrlmem import experiments as ex
from ctrlmem.util import fileio
from ctrlmem.plots import figures as plot
from ctrlmem.cli import main
from ctrlmem.runtime import launch

from bad_inputs import FILL, NUMBERS, WRAPPER, expanding, unshare_flags

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10_experiment.ipynb"
PY = sys.executable
CFG = f"name: bounded\ndescription: d\nscale: cpu\nnotebook: {NOTEBOOK}\n"


@pytest.fixture(autouse=True)
def _in_tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def cli_measured(args, cwd: Path, timeout: float = 60) -> tuple[int | None, str, float, float]:
    """``ctrlmem ARGS`` in a fresh process: (exit status, stderr, wall seconds, its peak RSS in MiB)."""
    err_path, rss_path = cwd / f".err-{time.monotonic_ns()}", cwd / f".rss-{time.monotonic_ns()}"
    t0 = time.monotonic()
    try:
        with open(err_path, "w") as err:
            proc = subprocess.Popen([PY, "-S", "-c", WRAPPER, str(rss_path), PY, "-m", "ctrlmem.cli", *args],
                                    cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        wall = time.monotonic() - t0
        rss = int(rss_path.read_text()) / 1024 if rss_path.exists() else float("nan")
        return rc, err_path.read_text(), wall, rss
    finally:
        err_path.unlink(missing_ok=True)
        rss_path.unlink(missing_ok=True)


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


# ---------------------------------------------------------------- 1. tiny inputs, bounded answers

EXPANDING = expanding(CFG)


@pytest.mark.slow  # a command per input with its memory measured: the full tier runs it, --fast does not
@pytest.mark.parametrize("args, files, needle", [c[1:] for c in EXPANDING], ids=[c[0] for c in EXPANDING])
def test_a_tiny_input_is_refused_in_seconds_and_bounded_memory(tmp_path, args, files, needle):
    """One short line, exit status 2, within 10 s and 200 MiB (the process itself takes ~25 MiB;
    before the guards these took 10-145 s, up to 1.7 GB, and printed up to 351 MB)."""
    for name, content in files.items():
        path = tmp_path / name
        if callable(content):
            path.touch()
            content(path)
        else:
            path.write_text(content)
    rc, err, wall, rss = cli_measured(args, tmp_path, timeout=60)
    line = one_line(err)
    assert rc == 2 and needle in line, line[:500]
    assert len(line) <= 2100, len(line)
    assert wall < 10 and rss < 200, (wall, rss)


def test_a_fifo_or_a_folder_is_never_opened_as_a_schedule(tmp_path):
    """A FIFO would block ``open()`` forever: it is named for what it is, at once (API and CLI)."""
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="not a regular file \\(a FIFO\\)"):
        cm.Schedule.load(tmp_path / "pipe.csv")
    with pytest.raises(IsADirectoryError):
        cm.Schedule.load(tmp_path / "folder")
    rc, err, wall, _ = cli_measured(["simulate", "pipe.csv"], tmp_path, timeout=30)
    assert rc == 2 and "a FIFO" in one_line(err) and wall < 10
    rc, err, _, _ = cli_measured(["export", "folder", "--text", "-"], tmp_path, timeout=30)
    assert rc == 2 and "folder is a folder; give a schedule file" in one_line(err)


def test_allow_large_reads_a_file_above_the_pass_limit(tmp_path, monkeypatch):
    """The file guard is the build guard's: ``allow_large`` lifts it (here with a limit of 10)."""
    from ctrlmem.model import ir

    path = tmp_path / "s.csv"
    cm.build("1f1b", 2, 4).to_torch_csv(path)
    monkeypatch.setattr(ir, "MAX_PASSES", 10)
    with pytest.raises(ValueError, match="more than 10 passes"):
        cm.Schedule.load(path)
    assert cm.Schedule.load(path, allow_large=True).num_passes == 16


@pytest.mark.slow
def test_optimal_answers_within_its_time_limit_at_p16_m64():
    """``cm.optimal(16, 64, time_limit=2)`` answers within 5 s (the limit covers the hint search,
    building the model and solving), with unit costs and with 3:4:2 costs, comm and a budget."""
    for kw in ({}, {"costs": "3,4,2,0.1", "memory_limit": 0.5}):
        t0 = time.monotonic()
        r = cm.optimal(16, 64, time_limit=2, **kw)
        wall = time.monotonic() - t0
        assert wall < 5, (kw, wall)
        assert r.status in ("optimal", "feasible", "timeout") and r.makespan > 0
        cm.validate(r.schedule)


def test_optimal_refuses_an_instance_above_its_documented_size_at_once():
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="MAX_PASSES"):
        cm.optimal(32, 256, time_limit=1)
    assert time.monotonic() - t0 < 1


# ---------------------------------------------------------------- 2. atomic writes

def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    """A writer that raises half-way leaves the old bytes and no temporary file."""
    path = tmp_path / "x.txt"
    fileio.atomic_write(path, "old\n")
    os.chmod(path, 0o640)
    with pytest.raises(RuntimeError):
        with fileio.atomic_open(path) as fh:
            fh.write("half")
            raise RuntimeError("writer failed")
    assert path.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["x.txt"]
    fileio.atomic_write(path, "new\n")
    assert path.read_text() == "new\n" and (path.stat().st_mode & 0o777) == 0o640  # the mode is kept


def test_atomic_write_names_the_target_not_the_temporary(tmp_path):
    for target, kind in ((tmp_path / "nodir" / "x.csv", FileNotFoundError), (tmp_path, IsADirectoryError)):
        with pytest.raises(kind) as info:
            fileio.atomic_write(target, "x")
        assert info.value.filename == str(target) and str(target) in fileio.describe_os_error(info.value)
    assert sorted(os.listdir(tmp_path)) == []


def test_atomic_write_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    fileio.atomic_write(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"


def test_export_past_the_file_size_limit_keeps_the_old_file(tmp_path):
    """Fault injection that runs everywhere (``ulimit -f``, RLIMIT_FSIZE, in the child only): the
    write fails with EFBIG; the old file stays byte for byte, no temporary file is left, and the
    one error line names the path and the limit."""
    import resource

    good = tmp_path / "x.csv"
    cm.build("1f1b", 2, 2).to_torch_csv(good)
    before = good.read_bytes()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = subprocess.run([PY, "-m", "ctrlmem.cli", "export", "1f1b", "-p", "8", "-m", "64", "--torch-csv", "x.csv"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, preexec_fn=limit)
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and "x.csv" in line and "file too large" in line, line
    assert good.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["x.csv"]


# A small tmpfs in a private mount namespace: nothing is mounted outside the child.
_UNSHARE = unshare_flags()
small_disk = pytest.mark.skipif(_UNSHARE is None, reason="mounting a tmpfs (unshare + mount) is not allowed here")

def on_small_disk(tmp_path: Path, script: str, size: str = "1m", timeout: float = 120) -> dict:
    """Run ``script`` (Python; ``DISK`` is a folder on a fresh tmpfs of ``size``; ``fill(folder)``
    fills it) in a private mount namespace; returns the JSON it prints last."""
    disk = tmp_path / "disk"
    disk.mkdir()
    code = FILL + f"DISK = {str(disk)!r}\n" + textwrap.dedent(script)
    (tmp_path / "child.py").write_text(code)
    proc = subprocess.run([*_UNSHARE, "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$1" "$2"',
                           str(disk), PY, str(tmp_path / "child.py")],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CLI_ON_DISK = textwrap.dedent("""
    import json, subprocess, sys
    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "ctrlmem.cli", *args], capture_output=True, text=True, cwd=DISK)
        return p.returncode, p.stderr
""")


@pytest.mark.slow  # a full small disk: the full tier runs it, --fast does not
@small_disk
def test_export_on_a_full_disk_keeps_the_old_file_and_names_the_path(tmp_path):
    out = on_small_disk(tmp_path, CLI_ON_DISK + textwrap.dedent("""
        rc0, _ = cli("export", "1f1b", "-p", "2", "-m", "2", "--torch-csv", "x.csv", "--text", "x.txt")
        before = {n: open(os.path.join(DISK, n), "rb").read() for n in ("x.csv", "x.txt")}
        fill(DISK)
        rc1, err1 = cli("export", "1f1b", "-p", "8", "-m", "64", "--torch-csv", "x.csv")
        rc2, err2 = cli("export", "1f1b", "-p", "8", "-m", "64", "--text", "x.txt")
        after = {n: open(os.path.join(DISK, n), "rb").read() for n in ("x.csv", "x.txt")}
        print(json.dumps({"rc": [rc0, rc1, rc2], "err": [err1, err2], "same": before == after,
                          "files": sorted(os.listdir(DISK))}))
    """))
    assert out["rc"] == [0, 2, 2] and out["same"], out
    assert out["files"] == ["filler", "x.csv", "x.txt"], out  # no temporary file left
    for err, name in zip(out["err"], ("x.csv", "x.txt")):
        line = one_line(err)
        assert f"{name}: no space left on the device" in line, line


@small_disk
def test_draw_on_a_full_disk_keeps_the_old_figure(tmp_path):
    """A partial HTML is never left behind: the 4.8 MB page does not fit, the old one stays."""
    out = on_small_disk(tmp_path, CLI_ON_DISK + textwrap.dedent("""
        with open(os.path.join(DISK, "f.html"), "w") as fh:
            fh.write("<html>old figure</html>")
        rc, err = cli("draw", "1f1b", "-o", "f.html")
        print(json.dumps({"rc": rc, "err": err, "old": open(os.path.join(DISK, "f.html")).read(),
                          "files": sorted(os.listdir(DISK))}))
    """), size="1m")
    assert out["rc"] == 2 and out["old"] == "<html>old figure</html>" and out["files"] == ["f.html"], out
    assert "f.html: no space left on the device" in one_line(out["err"])


@small_disk
def test_sweep_on_a_full_disk_keeps_finished_records_and_no_temporary_file(tmp_path):
    """The disk fills during the second point: the sweep stops naming the file it could not write
    (that point's record, or the next point's in-flight marker); every finished record and the
    previous table are intact, the third point never ran, no ``.tmp`` file is left anywhere."""
    out = on_small_disk(tmp_path, f"""
        import json
        from ctrlmem import experiments as ex
        cfg = ex.config_from_dict({{"name": "full", "description": "d", "scale": "cpu", "notebook": {str(NOTEBOOK)!r},
                                   "grid": {{"x": [0, 1, 2]}}}})
        results = os.path.join(DISK, "res")
        def executor(nb, executed, params, out_dir, timeout):
            if params["x"] == 1:
                fill(DISK)
            return ex.RunOutcome("ok", result={{"x": params["x"]}})
        ex.run_sweep(cfg, results_dir=results, build_dir=os.path.join(DISK, "b"), check=False, executor=executor,
                     only=[cfg.runs()[0].run_id])
        table = open(os.path.join(results, "results.csv")).read()
        try:
            ex.run_sweep(cfg, results_dir=results, build_dir=os.path.join(DISK, "b"), check=False, executor=executor)
            error = None
        except OSError as exc:
            from ctrlmem.util.fileio import describe_os_error
            error = describe_os_error(exc)
        tmp = [os.path.join(d, f) for d, _, fs in os.walk(DISK) for f in fs if ".tmp" in f]
        records = {{r["run_id"]: r["status"] for r in ex.read_records(results)}}
        print(json.dumps({{"error": error, "tmp": tmp, "records": records, "first": cfg.runs()[0].run_id,
                          "last": cfg.runs()[2].run_id,
                          "table_kept": open(os.path.join(results, "results.csv")).read() == table}}))
    """, size="256k")
    assert out["error"] and "/disk/res/" in out["error"] and "no space left on the device" in out["error"], out
    assert out["records"].get(out["first"]) == "ok" and out["last"] not in out["records"], out
    assert set(out["records"].values()) == {"ok"} and out["tmp"] == [] and out["table_kept"], out


@small_disk
@pytest.mark.slow
def test_run_on_a_full_disk_fails_naming_the_full_disk_and_leaves_no_empty_record(tmp_path):
    """A real ``ctrlmem run`` (tiny, gloo, p = 2) whose --out fills up: the failure says the file
    system is full (not "no rank reported an error"), and no 0-byte ``rank*.error.json`` is left."""
    out = on_small_disk(tmp_path, CLI_ON_DISK + textwrap.dedent("""
        rc, err = cli("run", "--schedule", "1f1b", "--steps", "1", "--out", "o", "--timeout", "120")
        files = {f: os.path.getsize(os.path.join(DISK, "o", f)) for f in os.listdir(os.path.join(DISK, "o"))}
        try:
            result = json.load(open(os.path.join(DISK, "o", "result.json")))
        except (OSError, ValueError):
            result = None
        print(json.dumps({"rc": rc, "err": err, "files": files, "result": result}))
    """), size="16k", timeout=300)
    assert out["rc"] != 0, out
    empty = [f for f, size in out["files"].items() if size == 0 and f.startswith("rank")]
    assert not empty, out
    text = out["err"] + json.dumps(out["result"])
    assert "full" in text or "no space left" in text, out


# ---------------------------------------------------------------- 3. numbers checked where they enter

@pytest.mark.parametrize("args, needle", NUMBERS, ids=[" ".join(a)[:50] for a, _ in NUMBERS])
def test_a_bad_number_is_refused_before_any_work(tmp_path, capsys, args, needle):
    """Exit status 2, one line naming the argument; nothing written, nothing launched (within 2 s:
    `run` used to start torchrun and fail after 13-79 s)."""
    t0 = time.monotonic()
    assert main(args) == 2
    line = one_line(capsys.readouterr().err)
    assert needle in line, line
    assert time.monotonic() - t0 < 2
    assert sorted(os.listdir(tmp_path)) == [], os.listdir(tmp_path)


def test_a_paper_scale_model_on_cpu_is_refused_with_the_memory_it_needs(tmp_path, capsys):
    """`run --model 9.6b` on CPU: refused before launching, naming the memory estimate, what is
    available and the fixes (it used to be killed by the OOM killer, "rank 0 was killed by SIGKILL")."""
    assert main(["run", "--schedule", "1f1b", "--model", "9.6b", "--out", "o"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "needs about" in line and "GiB of memory" in line and "available" in line and "--allow-large" in line
    assert not (tmp_path / "o").exists()
    est = launch.cpu_memory_estimate(launch.RunConfig("1f1b", 2, 4, model="9.6b"),
                                     __import__("ctrlmem.runtime.models", fromlist=["get_preset"]).get_preset("9.6b"),
                                     cm.build("1f1b", 2, 4))
    assert est["total"] > 2 * 9.6e9 * 2 * 2  # at least the reference's bf16 weights and gradients on each rank


@pytest.mark.parametrize("field, value, needle", [
    ("timeout_s", -1, "timeout_s must be > 0"), ("timeout_s", float("inf"), "timeout_s must be a finite number"),
    ("threads_per_rank", 0, "threads_per_rank must be a positive integer"), ("steps", -1, "steps must be an integer"),
    ("num_devices", True, "num_devices must be a positive integer"), ("dp", 2.5, "dp must be a positive integer"),
    ("seed", -3, "seed must be an integer >= 0"), ("comm_timeout_s", "60", "comm_timeout_s must be a positive number"),
])
def test_run_config_numbers_are_checked_in_the_api_too(field, value, needle):
    config = launch.RunConfig(**{"schedule": "1f1b", "num_devices": 2, "num_microbatches": 4, field: value})
    with pytest.raises(launch.RunError, match=needle):
        launch.prepare(config)


def test_emit_sbatch_refuses_negative_nodes_and_writes_nothing(tmp_path):
    with pytest.raises(launch.RunError, match="nodes must be a positive integer"):
        launch.emit_sbatch(launch.RunConfig("1f1b", 2, 4, out=str(tmp_path / "o")), -1, -2, tmp_path / "j.sbatch")
    assert sorted(os.listdir(tmp_path)) == []


def test_a_gpu_replay_row_with_a_zero_theory_peak_is_refused_naming_the_row(tmp_path, capsys):
    from ctrlmem.model.replayfile import default_replay_path

    data = json.loads(default_replay_path().read_text())
    data["rows"][3]["theory_peak_bytes"] = 0
    (tmp_path / "r.json").write_text(json.dumps(data))
    assert main(["reproduce", "--only", "gpu-replay", "--replay", "r.json", "--out", "o"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "row 3" in line and "theory_peak_bytes must be a positive number" in line
    assert not (tmp_path / "o").exists()


def test_a_static_image_larger_than_chromium_draws_is_refused_before_export(tmp_path):
    """kaleido used to return 3 bytes that are not a PNG for `--scale 1000`, reported as written."""
    fig = plot.schedule_figure(cm.build("1f1b", 2, 2), width=4000)
    with pytest.raises(ValueError, match="more than 16384 on a side"):
        plot.write_figure(fig, tmp_path / "x.png", scale=5)
    with pytest.raises(ValueError, match="scale must be > 0"):
        plot.write_figure(fig, tmp_path / "x.png", scale=0)
    assert sorted(os.listdir(tmp_path)) == []


# ---------------------------------------------------------------- 4. sweeps check their store first

LAYOUTS = {
    "runs is a file": (lambda res: (res / "runs").write_text("x"), "runs is a file"),
    "runs is a symlink loop": (lambda res: (res / "runs").symlink_to(res / "runs"), "runs is a broken symbolic link"),
    ".inflight is a file": (lambda res: (res / ".inflight").write_text("x"), ".inflight is a file"),
    "results.csv is a folder": (lambda res: (res / "results.csv").mkdir(), "results.csv is a folder"),
    ".sweep.lock is a folder": (lambda res: (res / ".sweep.lock").mkdir(), ".sweep.lock is a folder"),
}


@pytest.mark.parametrize("make, needle", LAYOUTS.values(), ids=list(LAYOUTS))
def test_the_store_layout_is_checked_before_the_first_point_runs(tmp_path, make, needle):
    cfg = ex.config_from_dict({"name": "layout", "description": "d", "scale": "cpu", "notebook": str(NOTEBOOK),
                               "grid": {"x": [0, 1]}})
    res = tmp_path / "res"
    res.mkdir()
    make(res)
    calls = []
    with pytest.raises(ex.ConfigError, match=needle) as info:
        ex.run_sweep(cfg, results_dir=res, build_dir=tmp_path / "b", check=False,
                     executor=lambda *a: calls.append(a) or ex.RunOutcome("ok", result={"v": 1}))
    assert calls == [] and ("mv " in str(info.value) or "rm " in str(info.value))


def test_the_launcher_lock_is_reported_in_one_line_for_slurm_too(tmp_path, capsys, monkeypatch):
    """`ctrlmem sweep --launcher slurm` on a folder another sweep holds: exit 2, one line naming
    the holder; no Slurm command is run."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for cmd in ("sbatch", "squeue", "scontrol"):
        (fake / cmd).write_text(f"#!/bin/sh\ntouch {tmp_path}/called-{cmd}\nexit 1\n")
        (fake / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "c.yaml").write_text(CFG + "params: {schedule: 1f1b, p: 2, m: 2, backend: gloo}\n")
    with ex.SweepLock(tmp_path / "res") as lock:
        lock.acquire()
        assert main(["sweep", "c.yaml", "--launcher", "slurm", "--results", "res", "--no-progress"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "in use by another sweep" in line and f"pid {os.getpid()}" in line
    assert not list(tmp_path.glob("called-*"))


# ---------------------------------------------------------------- 5. API parity

def test_optimal_takes_what_build_takes():
    """numpy integers and costs text, as :func:`ctrlmem.build` takes them."""
    r = cm.optimal(np.int64(2), np.int32(3), costs="1,2,1", time_limit=10)
    assert r.schedule.num_devices == 2 and r.schedule.num_microbatches == 3
    assert r.makespan == cm.simulate(r.schedule, cm.Costs(1, 2, 1)).makespan


@pytest.mark.parametrize("kw, exc, needle", [
    ({"time_limit": True}, TypeError, "time_limit"), ({"workers": True}, TypeError, "workers"),
    ({"time_limit": float("inf")}, ValueError, "time_limit"), ({"time_limit": -1}, ValueError, "time_limit"),
    ({"memory_limit": "abc"}, TypeError, "memory_limit"), ({"memory_limit": 1e308}, ValueError, "memory_limit"),
    ({"memory_limit": float("inf")}, ValueError, "memory_limit"), ({"costs": object()}, TypeError, "costs"),
    ({"placement": ["v-shape"]}, ValueError, "placement"), ({"num_devices": "2"}, TypeError, "num_devices"),
])
def test_optimal_names_the_bad_argument(kw, exc, needle):
    args = {"num_devices": 2, "num_microbatches": 2, **kw}
    with pytest.raises(exc, match=needle):
        cm.optimal(**args)


@pytest.mark.parametrize("call, exc, needle", [
    (lambda r: plot.schedule_figure(None), TypeError, "schedule_figure: items must be"),
    (lambda r: plot.schedule_figure([r, "1f1b"]), TypeError, r"items\[1\] must be"),
    (lambda r: plot.memory_figure(None), TypeError, "memory_figure: results must be"),
    (lambda r: plot.lifespans(r, microbatch=99), ValueError, "microbatch must be at most 7"),
    (lambda r: plot.lifespans(r, microbatch=-1), ValueError, "microbatch must be an integer >= 0"),
    (lambda r: plot.lifespans(r, microbatch=1.5), ValueError, "microbatch"),
    (lambda r: plot.lifespans(None), TypeError, "lifespans: item must be"),
    (lambda r: plot.lifespan_figure(r, microbatch=8), ValueError, "microbatch"),
    (lambda r: plot.schedule_figure(r, width=-5), ValueError, "width must be an integer >= 10"),
    (lambda r: plot.tradeoff_points("1f1b", 4, 8), TypeError, "names must be a list"),
    (lambda r: plot.block_figure("1f1b", 0, 8), ValueError, "num_devices"),
])
def test_plot_functions_name_the_bad_argument(call, exc, needle):
    r = cm.simulate(cm.build("1f1b", 4, 8))
    with pytest.raises(exc, match=needle):
        call(r)


def test_plot_functions_take_numpy_integers():
    r = cm.simulate(cm.build("1f1b", 4, 8))
    assert plot.lifespans(r, microbatch=np.int64(3)) == plot.lifespans(r, microbatch=3)
    assert plot.block_figure("1f1b", np.int64(4), np.int64(8)) is not None


# ---------------------------------------------------------------- the house

def _imports(path: Path) -> set[str]:
    """Every module a file imports (top level and inside functions), relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = "ctrlmem." + ".".join(path.relative_to(ROOT / "ctrlmem").with_suffix("").parts[:-1])
    package = package.rstrip(".")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_the_library_does_not_depend_on_the_command_line_layer():
    """`cm.optimal` raises the library's own errors: ctrlmem/solver/optimal.py's library part imports
    neither ctrlmem.cli.args nor ctrlmem.cli (its `add_commands` may use the argument types)."""
    tree = ast.parse((ROOT / "ctrlmem" / "solver" / "optimal.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "add_commands":
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.module in ("args", "cli") and sub.level == 1:
                raise AssertionError(f"optimal.py line {sub.lineno} imports the CLI layer (.{sub.module})")
    assert "CliError" not in (ROOT / "ctrlmem" / "solver" / "optimal.py").read_text()


def test_the_sweep_modules_import_each_other_in_one_direction():
    """sweep -> slurm -> store -> config: neither launcher's module imports the other back."""
    mods = {p.stem: _imports(p) for p in (ROOT / "ctrlmem" / "experiments").glob("*.py")}
    assert not any(m.startswith("ctrlmem.experiments.sweep") for m in mods["slurm"]), mods["slurm"]
    assert not any(m.startswith(("ctrlmem.experiments.sweep", "ctrlmem.experiments.slurm")) for m in mods["store"])


def test_a_run_output_folder_is_git_ignored_wherever_it_is_made(tmp_path):
    """A folder ctrlmem creates for outputs holds a .gitignore of '*': `git status` in a repository
    around it shows nothing; a folder that already existed is left as it was."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    out = tmp_path / "my-run" / "nested"
    fileio.make_output_folder(out)
    fileio.atomic_write(out / "result.json", "{}")
    ex.SweepLock(tmp_path / "my-results").acquire()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", status
    mine = tmp_path / "mine"
    mine.mkdir()
    fileio.make_output_folder(mine)
    assert not (mine / ".gitignore").exists()
