"""Single-process properties of the runtime: letters, placement, model split, memory meters,
theory, measured costs, launch validation and Slurm scripts. No process group needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import ctrlmem as cm  # noqa: E402
from ctrlmem.ir import Op  # noqa: E402
from ctrlmem.runtime import adapter, launch, measure, models  # noqa: E402

GRID = [(name, p, m) for name in cm.SCHEDULES for p in (2, 4) for m in (p, 2 * p)]


def test_import_ctrlmem_does_not_import_torch():
    """`import ctrlmem` (and its CLI parser, which lists `run`) must not import torch."""
    code = "import sys, ctrlmem, ctrlmem.cli; ctrlmem.cli.make_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("name,p,m", GRID)
def test_letters_translate_our_b_to_torch_i_and_bw_to_torch_b(name, p, m):
    """Every pass becomes one torch action, in order, with B→I, BW→B, F→F, W→W."""
    s = cm.build(name, p, m)
    actions = adapter.to_torch_actions(s)
    want = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}
    for rank, row in enumerate(s.device_passes):
        assert len(actions[rank]) == len(row)
        for ps, act in zip(row, actions[rank]):
            assert str(act) == f"{ps.stage}{want[ps.op]}{ps.microbatch}"


@pytest.mark.parametrize("name,p,m", GRID)
def test_torch_infers_our_placement(name, p, m):
    """Torch's own validator accepts the actions and places every stage where we do."""
    s = cm.build(name, p, m)
    inferred = adapter.torch_inferred_placement(s)
    assert inferred == {st: s.placement.device_of(st) for st in range(s.num_stages)}


def test_layers_per_stage_even_and_paper_padding():
    """Even split when S | L; the paper's L = kS − 2 takes one layer from the first and last stage."""
    assert models.layers_per_stage(8, 4) == [2, 2, 2, 2]
    assert models.layers_per_stage(30, 16) == [1] + [2] * 14 + [1]
    assert models.layers_per_stage(30, 32) == [0] + [1] * 30 + [0]
    with pytest.raises(ValueError, match="cannot be split among 4 stages"):
        models.layers_per_stage(7, 4)


def test_paper_presets_have_their_parameter_counts():
    """Table 2 presets land within 6 % of their names (embeddings included)."""
    for name, billions in (("9.6b", 9.6), ("21b", 21), ("38.5b", 38.5), ("98.5b", 98.5)):
        n = models.PRESETS[name].num_parameters()
        assert abs(n / 1e9 - billions) / billions < 0.06, (name, n)


def test_split_does_not_change_the_model():
    """The same seed gives the same loss however the model is cut into stages."""
    cfg = models.get_preset("tiny")
    x, y = models.make_batch(cfg, 2)
    with torch.no_grad():
        losses = [float(models.loss_fn(models.FullModel(cfg, S)(x), y)) for S in (1, 2, 4, 8)]
    assert max(losses) - min(losses) < 1e-5


def test_deferred_weight_gradients_equal_autograd():
    """B with the stash active, then W, gives autograd's gradients; B alone leaves linear weights untouched."""
    cfg = models.get_preset("tiny", num_layers=2)
    ref, split = models.FullModel(cfg, 2), models.FullModel(cfg, 2)
    x, y = models.make_batch(cfg, 2)
    models.loss_fn(ref(x), y).backward()
    for st in split.stages:
        st.stash.active = True
    models.loss_fn(split(x), y).backward()
    assert split.stages[0].blocks[0].qkv.weight.grad is None
    for st in split.stages:
        st.stash.take()()
    for (n, a), b in zip(ref.named_parameters(), split.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-5), n


def test_saved_tensor_meter_counts_once_and_releases_at_backward():
    """Peak > 0 after F, back to 0 after the backward frees the graph; parameters never counted."""
    cfg = models.get_preset("tiny", num_layers=2)
    stage = models.build_stages(cfg, 1)[0]
    x, y = models.make_batch(cfg, 1)
    meter = measure.SavedTensorMeter().exclude(stage.parameters())
    with meter:
        loss = models.loss_fn(stage(x), y)
    held = meter.current
    params = sum(p.numel() * p.element_size() for p in stage.parameters())
    assert held > 0
    b, s, h = cfg.microbatch_size, cfg.seq_len, cfg.hidden
    assert held > 2 * 34 * b * s * h  # at least the paper's 34·h per token per layer (fp32 > fp16)
    loss.backward()
    del loss
    assert meter.current == 0 and meter.peak == held
    assert params not in (held,)


def test_stash_holds_exactly_what_w_needs_until_w():
    """With deferral, B leaves each linear's input and output grad in the meter; W drops them."""
    cfg = models.get_preset("tiny", num_layers=2)
    stage = models.build_stages(cfg, 1)[0]
    stage.stash.active = True
    meter = measure.SavedTensorMeter().exclude(stage.parameters())
    stage.stash.meter = meter
    x, y = models.make_batch(cfg, 1)
    with meter:
        loss = models.loss_fn(stage(x), y)
    after_f = meter.current
    loss.backward()
    del loss
    kept = meter.current
    assert 0 < kept < after_f
    stage.stash.take()()
    assert meter.current == 0


@pytest.mark.parametrize("p", [2, 4, 8])
def test_theory_peak_matches_simulator_units(p):
    """theory_peak_bytes with a bytes per stage equals the simulator's peak (in a) times a."""
    a = 1000.0
    for name in cm.SCHEDULES:
        s = cm.build(name, p, 2 * p)
        share = a * p / s.num_stages
        got = measure.theory_peak_bytes(s, [share] * s.num_stages, [share] * s.num_stages)
        sim = cm.simulate(s).peak_memory
        assert got == pytest.approx([x * a for x in sim]), name


def test_costs_from_records_are_per_stage_medians():
    """Measured passes become a per-stage Costs (median), usable by build and simulate."""
    recs = [{"op": op, "stage": s, "microbatch": k, "cpu_s": t * (1 + 0.01 * k)}
            for s in range(2) for k in range(3) for op, t in (("F", 1.0 + s), ("B", 2.0), ("W", 0.5))]
    costs = measure.costs_from_records(recs, 2, comm=0.1)
    assert costs.f == pytest.approx((1.01, 2.02)) and costs.b == pytest.approx((2.02, 2.02))
    assert costs.w == pytest.approx((0.505, 0.505)) and costs.comm == 0.1
    s = cm.build("zb-h1", 2, 4, costs=costs)
    assert cm.simulate(s, costs).makespan > 0


def test_fused_only_costs_keep_bw_as_b():
    """A 1F1B profile (only BW measured) simulates BW with its measured time."""
    recs = [{"op": "F", "stage": 0, "microbatch": 0, "cpu_s": 1.0},
            {"op": "BW", "stage": 0, "microbatch": 0, "cpu_s": 3.0}]
    costs = measure.costs_from_records(recs, 1)
    assert costs.f == (1.0,) and costs.b == (3.0,) and costs.w == (0.0,)


@pytest.mark.parametrize("kwargs,match", [
    (dict(schedule="nope", num_devices=2, num_microbatches=2), "unknown schedule"),
    (dict(schedule="1f1b", num_devices=2, num_microbatches=2, model="huge"), "unknown model preset"),
    (dict(schedule="1f1b", num_devices=4, num_microbatches=2), "too small"),
    (dict(schedule="zb-v", num_devices=2, num_microbatches=2, model_overrides={"num_layers": 5}),
     "cannot be split among 4 stages"),
    (dict(schedule="1f1b", num_devices=2, num_microbatches=2, backend="mpi"), "backend"),
])
def test_invalid_config_fails_before_launch(kwargs, match):
    """Bad configs raise RunError with the reason, and nothing is launched."""
    with pytest.raises(launch.RunError, match=match):
        launch.prepare(launch.RunConfig(**kwargs))


def test_cli_reports_invalid_config_in_one_line(capsys):
    """`ctrlmem run` with a bad preset exits 2 with one line naming the problem."""
    from ctrlmem.cli import main

    assert main(["run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--model", "huge"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model preset 'huge'" in err[0]


def test_emit_sbatch_script(tmp_path):
    """The Slurm script runs torchrun under srun with c10d rendezvous on the first node, per node."""
    from ctrlmem.cli import main

    script = tmp_path / "job.sbatch"
    rc = main(["run", "--schedule", "v-half" if "v-half" in cm.SCHEDULES else "zb-v", "-p", "16", "-m", "32",
               "--model", "9.6b", "--backend", "nccl", "--out", str(tmp_path / "out"),
               "--emit-sbatch", str(script), "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu"])
    assert rc == 0
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    for needle in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                   "#SBATCH --partition=gpu", "srun", "-m torch.distributed.run", "--nnodes=2",
                   "--nproc-per-node=8", "--rdzv-backend=c10d", 'rdzv-endpoint="$head_node:$MASTER_PORT"',
                   "--rdzv-id=\"$SLURM_JOB_ID\"", "-m ctrlmem.runtime.worker", '"backend": "nccl"',
                   '"num_layers": 30'):
        assert needle in text, needle
    with pytest.raises(launch.RunError, match="product is p"):
        launch.emit_sbatch(launch.RunConfig("1f1b", 16, 32, model="9.6b"), 3, 8, tmp_path / "x")


def test_summarize_reports_median_range_and_robust_spread():
    """summarize gives median/min/max, (max−min)/median and the interquartile range / median."""
    s = measure.summarize([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0])
    assert s["median"] == 1.0 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 8
    assert s["spread"] == pytest.approx(9.0) and s["iqr"] == pytest.approx(0.0)
