"""The planner's offload lever: rows say which levers they use, their memory adds up to the
activation without them, copies cost time only when the host link is slow, bad input is one line."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.cli.app import main
from ctrlmem.planner.core import offload_levers, row_schedule
from ctrlmem.planner.sources import cost_source

from tests.test_plan_models import DATA

QWEN = DATA / "qwen2-0.5b.json"


def _plan(**kw):
    base = dict(gpus=4, gpu_memory_gb=80, global_batch=16, schedules=["1f1b", "v-min"], tp=[1], pp=[4],
                microbatch_sizes=[1], allocator=None, exhaustive=True, progress=False)
    return cm.plan(QWEN, **{**base, **kw})


def _row(df, schedule, rc, off):
    sel = df[(df["schedule"] == schedule) & (df["recompute"] == rc) & (df["offload"] == off)]
    assert len(sel) == 1, (schedule, rc, off)
    return sel.iloc[0]


def test_offload_rows_name_their_lever_and_add_up_to_the_activation_without_levers():
    df = _plan(recompute="none,full", offload="none,0.5,1", host_gbs=1000.0)
    for schedule, rcs in (("1f1b", ("none", "full")), ("v-min", ("none",))):
        plain = _row(df, schedule, "none", 0.0)
        assert plain["recompute_saved_gb"] == 0 and plain["offload_saved_gb"] == 0 and plain["lever_s"] == 0
        for rc in rcs:
            for off in (0.5, 1.0):
                r = _row(df, schedule, rc, off)
                assert f"offload {off:g}" in r["method"] and (rc == "none" or "full recompute" in r["method"])
                # the head's device (F right before B) cannot hide a copy; with recomputation it is the fullest
                assert r["offload_saved_gb"] >= 0 and r["activation_gb"] < plain["activation_gb"]
                assert rc != "none" or r["offload_saved_gb"] > 0
                # the breakdown: with levers + what each saves = the same schedule's activation without them
                # on the device the row reports (full recomputation moves the fullest device to the head's)
                total = r["activation_gb"] + r["recompute_saved_gb"] + r["offload_saved_gb"]
                if r["device"] == plain["device"]:
                    assert total == pytest.approx(plain["activation_gb"], rel=1e-9)
                assert r["total_gb"] == pytest.approx(r["params_gb"] + r["grads_gb"] + r["optimizer_gb"]
                                                      + r["activation_gb"] + r["margin_gb"] + r["reserve_gb"]
                                                      + r["recv_gb"])
    assert "activation offload" in " ".join(df.attrs["assumptions"])


def test_copies_are_free_on_a_fast_link_and_delay_backwards_on_a_slow_one():
    fast = _row(_plan(schedules=["1f1b"], offload="1", host_gbs=1e6), "1f1b", "none", 1.0)
    slow = _row(_plan(schedules=["1f1b"], offload="1", host_gbs=0.01), "1f1b", "none", 1.0)
    assert fast["lever_s"] == pytest.approx(0.0, abs=1e-6)
    assert slow["lever_s"] > 0.01 and slow["pipeline_s"] > fast["pipeline_s"]
    # with a slow link more is resident while copies are in flight
    assert slow["activation_gb"] >= fast["activation_gb"] - 1e-12
    assert _plan(schedules=["1f1b"], offload="1").attrs["settings"]["host_gbs"] == cost_source("a100").host_gbs()[0]


def test_the_row_schedule_carries_the_offload_copies():
    df = _plan(schedules=["1f1b"], offload="none,1")
    for i, off in enumerate(df["offload"]):
        sched, costs = row_schedule(df, i)
        assert any(sched.copies) == bool(off)
        assert costs.offload == (pytest.approx(1e3 / df.attrs["settings"]["host_gbs"]) if off else 0)
        assert all(c.fraction == 1.0 for row in sched.copies for c in row if c.kind == "O")


@pytest.mark.parametrize("bad", ["0", "1.5", "half", "", True])
def test_bad_offload_is_one_clear_line(bad):
    if bad == "0":
        assert offload_levers(bad) == [0.0]
        return
    with pytest.raises(ValueError, match="offload"):
        offload_levers(bad)
    with pytest.raises(ValueError, match="host_gbs"):
        _plan(host_gbs=-1)


def test_the_cli_prints_the_lever_and_what_it_saves(tmp_path, capsys):
    args = ["plan", "--model", str(QWEN), "--gpus", "4", "--gpu-memory-gb", "80", "--global-batch", "16",
            "--schedules", "1f1b", "--tp", "1", "--pp", "4", "--microbatch-sizes", "1", "--allocator-margin", "none",
            "--recompute", "none", "--offload", "1", "--host-gbs", "1000", "--out", str(tmp_path / "o"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert " offl " in out and "offload 1 saves" in out and "activation offload" in out and "1000 GB/s" in out
    bad = list(args)
    bad[bad.index("--offload") + 1] = "half"
    assert main(bad) == 2
    assert "error: offload 'half'" in capsys.readouterr().err
