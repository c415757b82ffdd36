"""Rank replay: one device's pass order in one process, real kernels, stand-in neighbours."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import ctrlmem as cm
from ctrlmem.runtime.models import get_preset
from ctrlmem.runtime.replay import replay_device, theory_per_device


SLOW = pytest.mark.slow
NAMES = [pytest.param(n, marks=() if n == "zb-v" else SLOW)
         for n in ("1f1b", "zb-h1", "zb-v", "v-half", "v-min", "v-zb") if n in cm.SCHEDULES]


@pytest.mark.parametrize("name", NAMES)
def test_replay_memory_follows_theory_and_times_every_pass_kind(name):
    """Replayed saved-tensor peak within 5 % of the schedule's theory on the peak device; the
    allocator peak within 25 %; every pass kind the device runs has a positive time."""
    p = 4
    cfg = get_preset("tiny", num_layers=2 * p - 2)
    s = cm.build(name, p, 2 * p)
    theory = theory_per_device(s, cfg)
    d = max(range(p), key=lambda i: theory[i])
    r = replay_device(s, d, cfg)
    assert r.theory_peak_bytes == pytest.approx(theory[d])
    assert abs(r.peak_saved_bytes / r.theory_peak_bytes - 1) < 0.05
    assert 0.95 < r.peak_alloc_bytes / r.theory_peak_bytes < 1.25
    kinds = {ps.op.value for ps in s.device_passes[d]}
    for stage in r.stages:
        assert set(r.pass_times_s[str(stage)]) == kinds
        assert all(v["median"] > 0 for v in r.pass_times_s[str(stage)].values())


@pytest.mark.slow
def test_replay_ranks_schedules_like_theory():
    """At p=4, 1F1B's replayed peak is below interleaved-1F1B's, itself below GPipe's, as theory says."""
    p = 4
    cfg = get_preset("tiny", num_layers=2 * p - 2)
    peaks = {}
    for name in ("gpipe", "1f1b", "interleaved-1f1b"):
        s = cm.build(name, p, 2 * p)
        theory = theory_per_device(s, cfg)
        d = max(range(p), key=lambda i: theory[i])
        peaks[name] = replay_device(s, d, cfg, measure_allocator=False).peak_saved_bytes
    assert peaks["1f1b"] < peaks["interleaved-1f1b"] < peaks["gpipe"]


import json  # noqa: E402
from pathlib import Path  # noqa: E402

SHARED_REPLAY = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "h200_rank_replay.json"
ROW_KEYS = {"model", "p", "m", "schedule", "device", "stages", "peak_saved_bytes", "peak_alloc_bytes",
            "theory_peak_bytes", "pass_times_s", "wall_s", "elapsed_s", "tag"}
TOP_KEYS = {"what", "date", "gpu", "torch", "models", "rows"}


def test_replay_command_writes_the_gpu_replay_form(tmp_path, capsys):
    """`ctrlmem replay --model tiny -p 4 ... --device cpu --out DIR` writes DIR/replay.json with the
    top-level keys and per-row keys of the GPU replay files (what / date / gpu / torch / models /
    rows; model, p, m, schedule, device, stages, the three peaks, pass_times_s, wall_s, elapsed_s,
    tag), one row per schedule and device, with each device's stages and the theory of the schedule."""
    from ctrlmem.cli import main

    names = [n for n in ("1f1b", "v-half") if n in cm.SCHEDULES]
    rc = main(["replay", "--model", "tiny", "-p", "4", "-m", "8", "--schedules", ",".join(names),
               "--devices", "0,3", "--device", "cpu", "--out", str(tmp_path), "--tag", "t"])
    assert rc == 0
    data = json.loads((tmp_path / "replay.json").read_text())
    assert TOP_KEYS <= set(data)
    if SHARED_REPLAY.is_file():  # the reference GPU file: same keys at both levels
        ref = json.loads(SHARED_REPLAY.read_text())
        assert set(ref) <= set(data)
        assert {k for k in ref["rows"][0]} <= set(data["rows"][0])
    assert data["models"]["tiny"].startswith("p=4, 8 layers, h=64, mb 2")
    assert [(r["schedule"], r["device"]) for r in data["rows"]] == [(n, d) for n in names for d in (0, 3)]
    cfg = get_preset("tiny")
    for r in data["rows"]:
        assert ROW_KEYS <= set(r) and r["tag"] == "t" and r["p"] == 4 and r["m"] == 8
        s = cm.build(r["schedule"], 4, 8)
        assert r["stages"] == list(s.placement.stages_of(r["device"]))
        assert set(r["pass_times_s"]) == {str(x) for x in r["stages"]}
        assert abs(r["peak_saved_bytes"] / r["theory_peak_bytes"] - 1) < 0.05
    assert r["theory_peak_bytes"] == pytest.approx(theory_per_device(cm.build(r["schedule"], 4, 8), cfg)[3])
    assert "wrote" in capsys.readouterr().out


def test_replay_command_merges_rows_into_an_existing_file(tmp_path):
    """A second replay into the same folder keeps the other rows and replaces the same one."""
    from ctrlmem.runtime.replay import run_replay

    run_replay("tiny", 2, 4, "1f1b", "0,1", device="cpu", out=tmp_path)
    first = json.loads((tmp_path / "replay.json").read_text())
    run_replay("tiny", 2, 4, "1f1b", "1", device="cpu", out=tmp_path, num_layers=4)
    second = json.loads((tmp_path / "replay.json").read_text())
    assert len(first["rows"]) == 2 and len(second["rows"]) == 2
    assert [r["device"] for r in second["rows"]] == [0, 1]
    assert second["rows"][0] == first["rows"][0]
    assert second["rows"][1]["peak_saved_bytes"] != first["rows"][1]["peak_saved_bytes"]  # 4 layers, not 8


@pytest.mark.parametrize("argv,needle", [
    (["--devices", "0,4"], "outside the pipeline"),
    (["--schedules", "1f1b,nope"], "unknown schedule"),
    (["--layers", "7"], "cannot be split"),
    (["-m", "2"], "too small"),
    (["--device", "cuda"], None),
])
def test_replay_command_bad_arguments_exit_2_in_one_line(tmp_path, capsys, argv, needle):
    """Bad devices, schedules, layer counts, m < p (and CUDA without a GPU) exit 2 with one line."""
    import torch

    from ctrlmem.cli import main

    if argv[0] == "--device":
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        needle = "no GPU"
    rc = main(["replay", "--model", "tiny", "-p", "4", "--device", "cpu", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "replay.json").exists()
