"""The planner's recomputation with split-backward schedules (ZB-H1, V-Half, …): each forward gets
an R pass right before its B (what `ctrlmem run --recompute` runs), holds what the lever keeps
until its R, its whole activation from the R to the end of its B and what W needs until its W;
its rows fit where the plain rows do not, their peaks and times are an independent simulation's,
what the lever saves and costs adds up, the budgeted searches order with every forward
recomputed, and the emitted files run it (or say why they cannot)."""

from __future__ import annotations

import subprocess

import pytest

import ctrlmem as cm
from ctrlmem.model.levers import with_recompute
from ctrlmem.planner import core
from ctrlmem.planner.core import row_memory, row_schedule
from ctrlmem.planner.emit import TORCH_SPLIT_RECOMPUTE, emit
from ctrlmem.planner.model import stage_layers

H, HEADS, SEQ, VOCAB, LAYERS = 2048, 16, 2048, 8192, 14
F_LAYER, B_LAYER, W_LAYER, HOP = 0.01, 0.012, 0.01, 0.001  # seconds per layer and sequence, one hop
MODEL = dict(model="custom", layers=LAYERS, hidden=H, heads=HEADS, seq_len=SEQ, vocab=VOCAB,
             costs=f"{F_LAYER},{B_LAYER},{W_LAYER},{HOP}")
BASE = dict(MODEL, gpus=4, global_batch=16, tp=[1], pp=[4], microbatch_sizes=[1, 2, 4], allocator=None,
            exhaustive=True, progress=False)


def _plan(gb: float, **kw):
    return cm.plan(**{**BASE, "gpu_memory_gb": gb, **kw})


def _row(df, schedule: str, rc: str, mb: int):
    sel = df[(df["schedule"] == schedule) & (df["recompute"] == rc) & (df["microbatch_size"] == mb)]
    assert len(sel) == 1, (schedule, rc, mb)
    return sel.index[0], sel.iloc[0]


@pytest.fixture(scope="module")
def roomy():
    """Every row simulated (80 GB: everything fits)."""
    return _plan(80.0, schedules=["1f1b", "zb-h1", "v-half"], recompute="none,full")


def test_full_recomputation_plans_split_backward_schedules_with_less_activation_and_r_time(roomy):
    """Every split-backward schedule has rows with full recomputation; against the same
    configuration without it each holds less activation on its fullest device (or as much: the
    last stage of ZB-H1, whose forward runs straight into its recompute) and less in all, and runs
    longer by its R passes: by more than nothing and by at most all of them (every path of the
    schedule's passes runs at most every R; an R is one layer forward per layer)."""
    for name in ("zb-h1", "v-half"):
        for mb in (1, 2, 4):
            _, plain = _row(roomy, name, "none", mb)
            i, full = _row(roomy, name, "full", mb)
            assert full["status"] == "ok" and "full recompute" in full["method"]
            assert full["total_gb"] < plain["total_gb"] and full["activation_gb"] <= plain["activation_gb"] + 1e-12
            assert full["pipeline_s"] > plain["pipeline_s"]
            m = full["m"]
            assert full["pipeline_s"] - plain["pipeline_s"] <= m * F_LAYER * mb * LAYERS + 1e-9
            sched, _ = row_schedule(roomy, i)
            assert sched.recompute_mode == "full" and sched.split_backward
            assert sum(ps.op is cm.Op.R for row in sched.device_passes for ps in row) == sched.num_stages * m
    assert not any("its W passes run after B" in s for s in roomy.attrs["skipped"])


@pytest.mark.parametrize("name,gb", [("zb-h1", 11.0), ("v-half", 10.0)])
def test_full_recomputation_fits_where_the_plain_rows_do_not(name, gb):
    """Where memory binds, the row with recomputation fits at a microbatch size whose plain row
    does not, and the plan's best row of that schedule then recomputes."""
    df = _plan(gb, schedules=[name], recompute="none,full")
    _, plain = _row(df, name, "none", 4)
    _, full = _row(df, name, "full", 4)
    assert not plain["fits"] and plain["total_gb"] > gb
    assert full["fits"] and full["status"] == "ok" and full["total_gb"] <= gb
    assert full["activation_gb"] < plain["activation_gb"]


def _bytes(mb: int, layers: list[int], per_layer: float) -> list[float]:
    """GB of one microbatch per stage from first principles: the layers' bytes per token, the LM
    head's fp32 logits and final norm (4·V + 4·h) on the last stage."""
    tokens = mb * SEQ
    S = len(layers)
    return [tokens * (n * per_layer + (4 * VOCAB + 4 * H if s == S - 1 else 0)) / 1e9 for s, n in enumerate(layers)]


@pytest.mark.parametrize("name", ["zb-h1", "v-half"])
def test_row_peak_and_time_equal_an_independent_simulation(roomy, name):
    """The row's activation and pipeline time are those of the schedule built on its own, every
    forward given an R before its B, simulated with first-principles bytes (34·h per layer and
    token; 2·h kept under full recomputation; 32·h of the 34·h wait for W) and R passes of one
    layer forward per layer; the plain order's own simulation gives what recomputation saved and
    what it cost (recompute_saved_gb, lever_s)."""
    for mb in (1, 4):
        i, row = _row(roomy, name, "full", mb)
        sched, costs = row_schedule(roomy, i)
        S, m, p = sched.num_stages, int(row["m"]), int(row["pp"])
        layers = stage_layers(LAYERS, S)
        assert row["layer_split"] == "E+" + "|".join(map(str, layers)) + "+H"
        order = cm.build(name, p, m, costs=cm.Costs(costs.f, costs.b, costs.w, costs.comm)
                         if cm.SCHEDULES[name].uses_costs else None)
        assert sched == with_recompute(order, "full")
        redo = [n * F_LAYER * mb * 1e3 for n in layers]  # ms: the stage's layers forward again
        assert costs.recompute == pytest.approx(redo, rel=1e-12)
        # the time the fused fold adds to B is the R's: B + R here is the fold's B (1F1B's full row)
        _, fused = row_schedule(roomy, _row(roomy, "1f1b", "full", mb)[0])
        if S == p:
            assert [b + r for b, r in zip(costs.b, costs.recompute)] == pytest.approx(list(fused.b), rel=1e-12)
        plain_gb, kept_gb = _bytes(mb, layers, 34 * H), _bytes(mb, layers, 2 * H)
        memory = cm.MemoryModel(activation=plain_gb, release_at_b=2 / 34, kept=kept_gb)
        r = cm.simulate(with_recompute(order, "full"), cm.Costs(costs.f, costs.b, costs.w, costs.comm, recompute=redo),
                        memory)
        d = int(row["device"])
        assert row["activation_gb"] == pytest.approx(r.peak_memory[d], rel=1e-9)
        assert row["pipeline_s"] == pytest.approx(r.makespan / 1e3, rel=1e-9)
        planned, extra = row_memory(roomy, i)
        assert extra == 0 and planned.release_at_b == pytest.approx(2 / 34)
        assert planned.activation == pytest.approx(plain_gb) and planned.kept == pytest.approx(kept_gb)
        r0 = cm.simulate(order, cm.Costs(costs.f, costs.b, costs.w, costs.comm),
                         cm.MemoryModel(activation=plain_gb, release_at_b=2 / 34))
        assert row["activation_gb"] + row["recompute_saved_gb"] == pytest.approx(r0.peak_memory[d], rel=1e-9)
        assert row["lever_s"] == pytest.approx((r.makespan - r0.makespan) / 1e3, rel=1e-9)
        assert row["offload_saved_gb"] == 0


def test_selective_recomputation_keeps_all_but_the_scores_and_recomputes_the_attention_core():
    """Without FlashAttention, selective recomputation on a split backward keeps 34·h of the
    34·h + 5·heads·s bytes per layer and token until the R, which takes the attention core's
    share s / (6h + s) of the layers' forward."""
    df = _plan(80.0, schedules=["zb-h1"], recompute="none,selective", flash_attention=False,
               microbatch_sizes=[1])
    i, row = _row(df, "zb-h1", "selective", 1)
    _, plain = _row(df, "zb-h1", "none", 1)
    sched, costs = row_schedule(df, i)
    assert sched.recompute_mode == "selective"
    layers = stage_layers(LAYERS, 4)
    assert costs.recompute == pytest.approx([n * F_LAYER * 1e3 * SEQ / (6 * H + SEQ) for n in layers], rel=1e-12)
    memory, extra = row_memory(df, i)
    assert extra == 0
    assert memory.activation == pytest.approx(_bytes(1, layers, 34 * H + 5 * HEADS * SEQ), rel=1e-12)
    assert memory.kept == pytest.approx(_bytes(1, layers, 34 * H), rel=1e-12)
    assert row["activation_gb"] < plain["activation_gb"] and row["pipeline_s"] > plain["pipeline_s"]


def test_budgeted_searches_order_with_every_forward_recomputed():
    """`v-shape` / `zb` at the memory-fit budget: the budget is the same GB as the plain row's,
    counted in the largest stage's activation without the lever (to an eighth of one), the search
    orders with every forward recomputed under it, and where memory binds that buys microbatches
    in flight: faster than the plain row, within the GPU; below one microbatch per device, where
    no order fits without the lever, a recomputing V row still fits."""
    df = _plan(7.0, schedules=["zb", "v-shape"], recompute="none,full", microbatch_sizes=[4])
    for name, S in (("zb", 4), ("v-shape", 8)):
        i, full = _row(df, name, "full", 4)
        _, plain = _row(df, name, "none", 4)
        assert full["status"] == "ok" and full["total_gb"] <= 7.0
        assert full["samples_per_s"] > plain["samples_per_s"]
        assert plain["memory_limit"] <= full["memory_limit"] < plain["memory_limit"] + 1 / S
        assert (full["memory_limit"] * S * 8) % 1 == 0
        sched, _ = row_schedule(df, i)
        assert sched.recomputes and all(
            sum(ps.op is cm.Op.R for ps in row) == sum(ps.op is cm.Op.F for ps in row) for row in sched.device_passes)
    tight = _plan(6.0, schedules=["v-shape"], recompute="none,full", microbatch_sizes=[4])
    _, plain = _row(tight, "v-shape", "none", 4)
    _, full = _row(tight, "v-shape", "full", 4)
    assert not plain["fits"] and "fewer than one microbatch per device" in plain["reason"]
    assert full["fits"] and full["memory_limit"] * 8 < 2
    # not simulated there (its bound is below the best row's), such a row is not claimed to fit
    pruned = _plan(6.0, schedules=["v-shape"], recompute="none,full", exhaustive=False)
    _, row = _row(pruned, "v-shape", "full", 4)
    assert row["status"] == "bounded" and not row["fits"] and row["reason"].startswith("fit not known")


def test_offload_with_recompute_on_a_split_backward_is_skipped_with_its_reason():
    df = _plan(80.0, schedules=["zb-h1", "1f1b"], recompute="none,full", offload="none,1", microbatch_sizes=[1])
    assert set(zip(df[df["schedule"] == "zb-h1"]["recompute"], df[df["schedule"] == "zb-h1"]["offload"])) == {
        ("none", 0.0), ("none", 1.0), ("full", 0.0)}
    assert len(df[(df["schedule"] == "1f1b") & (df["recompute"] == "full") & (df["offload"] == 1.0)]) == 1
    assert any("offload 1 with full recomputation on zb-h1" in s and "recomputed or offloaded" in s
               for s in df.attrs["skipped"])


def test_emitted_files_run_the_recomputation_or_say_why_not(tmp_path, roomy):
    """A split-backward row with recomputation: schedule.txt is the simulated schedule with its R
    passes and run.sh runs it; torchtitan.sh stops with the reason (torch's own split backward
    recomputes per graph task) and megatron.txt says Megatron runs its own fused schedule. A fused
    row with recomputation launches torchtitan as before."""
    i, _ = _row(roomy, "zb-h1", "full", 1)
    paths = emit(roomy, tmp_path / "zb", i, torchtitan="0.2")
    sched, _ = row_schedule(roomy, i)
    assert cm.Schedule.load(paths["text"]) == sched
    assert f"--schedule {tmp_path / 'zb' / 'schedule.txt'}" in open(paths["run"]).read()
    proc = subprocess.run(["sh", paths["torchtitan"]], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "torchtitan cannot run this row as planned" in proc.stderr
    assert "NOT SUPPORTED AS PLANNED" in open(paths["toml"]).read()
    assert "splits the backward" in open(paths["megatron"]).read()
    assert TORCH_SPLIT_RECOMPUTE.split(":")[0] in proc.stderr
    j, _ = _row(roomy, "1f1b", "full", 1)
    fused = emit(roomy, tmp_path / "fused", j)
    text = open(fused["torchtitan"]).read()
    assert "CTRLMEM_ALLOW_TORCH_SPLIT_RECOMPUTE" not in text and "activation-checkpoint:full" in text
    assert cm.Schedule.load(fused["text"]).recomputes and "splits the backward" not in open(fused["megatron"]).read()


def test_the_build_cache_shares_the_plain_order():
    """A fixed schedule's rows with and without recomputation share one search: the recomputing
    row's order is the plain build with R passes."""
    core.clear_cache()
    _plan(80.0, schedules=["v-half"], recompute="none", microbatch_sizes=[2])
    before = core.cache_info()["builds"]
    _plan(80.0, schedules=["v-half"], recompute="full", microbatch_sizes=[2])
    assert core.cache_info()["builds"] == before


def test_the_explorer_shows_a_recomputing_row_as_the_plan_simulated_it(roomy):
    """The explorer state of a split-backward row with recomputation carries its R passes' times
    (the fourth list of its per-stage costs), so the explorer shows the plan's pipeline time."""
    from ctrlmem.explorer import views

    i, row = _row(roomy, "v-half", "full", 2)
    settings, orders, origins = views.settings_from_plan(roomy, i)
    assert len(settings.stage_costs) == 4 and "R passes" in origins["v-half"]
    view = views.compute(settings, adapt=False, orders=orders, order_origins=origins)
    assert not view.messages
    assert view.results["v-half"].makespan == pytest.approx(row["pipeline_s"] * 1e3, rel=1e-9)
    again, _ = views.state_view(views.state_dict(view))
    assert again.results["v-half"].makespan == pytest.approx(row["pipeline_s"] * 1e3, rel=1e-9)
