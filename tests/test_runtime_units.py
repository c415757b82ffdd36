"""Single-process properties of the runtime: letters, placement, model split, memory meters,
theory, measured costs, launch validation and Slurm scripts. No process group needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import ctrlmem as cm  # noqa: E402
from ctrlmem.model.ir import Op  # noqa: E402
from ctrlmem.runtime import adapter, launch, measure, models  # noqa: E402

# dualpipe-v needs m >= 2p (torch's ScheduleDualPipeV too): it takes 2p and 3p; bidirectional
# dualpipe holds two model copies, which torch's runtime cannot run (ctrlmem run refuses it)
GRID = [(name, p, m) for name in cm.SCHEDULES if name != "dualpipe" for p in (2, 4)
        for m in ((2 * p, 3 * p) if name == "dualpipe-v" else (p, 2 * p))]


def test_import_ctrlmem_does_not_import_torch():
    """`import ctrlmem` (and its CLI parser, which lists `run`) must not import torch."""
    code = "import sys, ctrlmem, ctrlmem.cli; ctrlmem.cli.make_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("name,p,m", GRID)
def test_letters_translate_our_b_to_torch_i_and_bw_to_torch_b(name, p, m):
    """Every compute pass becomes one torch action, in order, with B→I, BW→B, F→F, W→W (an R
    has none: the checkpointed stage recomputes inside its backward)."""
    s = cm.build(name, p, m)
    actions = adapter.to_torch_actions(s)
    want = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}
    for rank, row in enumerate(s.compute_only().device_passes):
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
        kw = {"time_limit": 1} if name == "optimal" else {}  # (the exact solver's own tests time it)
        s = cm.build(name, p, 2 * p, **kw)
        share = a * p * s.model_copies / s.num_stages  # a copy's layers over its S / copies stages
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


def test_sample_stats_reports_median_range_and_robust_spread():
    """sample_stats gives median/min/max, (max−min)/median and the interquartile range / median."""
    s = measure.sample_stats([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0])
    assert s["median"] == 1.0 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 8
    assert s["spread"] == pytest.approx(9.0) and s["iqr"] == pytest.approx(0.0)


@pytest.mark.parametrize("version,ok", [("2.11.0+cu130", True), ("2.12.1", True), ("2.13.0+cpu", True),
                                        ("2.10.2", False), ("2.14.0", False), ("3.0.0", False), ("nightly", False)])
def test_torch_versions_outside_the_supported_range_are_refused(version, ok, monkeypatch):
    """torch 2.11 to 2.13 pass; anything else raises naming the supported range and the fix."""
    monkeypatch.delenv(adapter.ALLOW_ENV, raising=False)
    if ok:
        assert adapter.check_torch_version(version) == version
    else:
        with pytest.raises(adapter.UnsupportedTorch, match=r"supported: torch 2\.11 to 2\.13.*pip install torch==2\.13\.0"):
            adapter.check_torch_version(version)


def test_unsupported_torch_can_be_forced_with_a_warning(monkeypatch, caplog):
    """CTRLMEM_ALLOW_UNSUPPORTED_TORCH=1 turns the refusal into a logged warning."""
    monkeypatch.setenv(adapter.ALLOW_ENV, "1")
    assert adapter.check_torch_version("2.9.0") == "2.9.0"
    assert "not supported" in caplog.text


def test_installed_torch_is_supported():
    """The pinned torch of this checkout is inside the supported range."""
    adapter.check_torch_version()


def test_run_refuses_unsupported_torch_before_launching(monkeypatch, capsys):
    """`ctrlmem run` on an unsupported torch exits 2 with one line naming the supported range."""
    from ctrlmem.cli import main

    monkeypatch.delenv(adapter.ALLOW_ENV, raising=False)
    monkeypatch.setattr(torch, "__version__", "2.10.0")
    assert main(["run", "--schedule", "1f1b", "-p", "2", "-m", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch 2.10.0 is not supported" in err[0] and "2.11 to 2.13" in err[0]


def test_nccl_preflight_names_ranks_gpus_and_the_fix(monkeypatch, capsys):
    """On a (faked) one-GPU machine `--backend nccl -p 2` stops before launching, with the ranks
    needed, the GPUs seen and what to do instead; with two GPUs it passes the check."""
    from ctrlmem.cli import main

    monkeypatch.setattr(launch, "visible_gpus", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main(["run", "--schedule", "v-half" if "v-half" in cm.SCHEDULES else "zb-v", "-p", "2", "-m", "4",
                 "--backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    for needle in ("needs 2 ranks", "1 GPU(s) are visible", "CUDA_VISIBLE_DEVICES=0", "--backend gloo", "--emit-sbatch"):
        assert needle in err[0], needle
    with pytest.raises(launch.RunError, match="needs 4 ranks"):
        launch.prepare(launch.RunConfig("1f1b", 2, 4, backend="nccl", dp=2))
    monkeypatch.setattr(launch, "visible_gpus", lambda: 2)
    launch.prepare(launch.RunConfig("1f1b", 2, 4, backend="nccl"))
    # a Slurm script is checked on the nodes, not on the (GPU-less) login node
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    launch.prepare(launch.RunConfig("1f1b", 2, 4, backend="nccl"), local=False)


def _run_script_with_fake_slurm(script, tmp_path):
    """Execute a generated batch script with stand-ins for scontrol and srun (srun prints its argv)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node0\n")
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGS"\n')
    for f in ("scontrol", "srun"):
        (bin_dir / f).chmod(0o755)
    import os

    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node0", "SRUN_ARGS": str(tmp_path / "srun_args")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    return proc, (tmp_path / "srun_args").read_text().splitlines() if (tmp_path / "srun_args").exists() else []


def test_sbatch_script_does_not_execute_shell_syntax_in_values(tmp_path):
    """An output folder named `$(touch PWNED)` and a Python path with a space and a quote end up
    as literal arguments of srun: the script runs nothing of them."""
    out = tmp_path / "runs" / "$(touch PWNED) `touch PWNED2` it's"
    script = tmp_path / "job.sbatch"
    launch.emit_sbatch(launch.RunConfig("1f1b", 2, 4, out=str(out)), 1, 2, script,
                       python=f"{sys.executable}")
    proc, argv = _run_script_with_fake_slurm(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    cfg = str(out.resolve() / "worker_config.json")
    assert argv[-1] == cfg and argv[0] == "--kill-on-bad-exit=1"
    assert (out.resolve() / "worker_config.json").is_file()
    assert "--nproc-per-node=2" in argv and "--rdzv-id=42" in argv


@pytest.mark.parametrize("field", ["partition", "account", "time_limit", "out"])
def test_sbatch_refuses_control_characters(tmp_path, field):
    """A newline (or any control character) in a value would add a line or #SBATCH directive: refused."""
    kwargs = {"partition": "gpu", "account": None, "time_limit": "00:10:00"}
    config = launch.RunConfig("1f1b", 2, 4, out=str(tmp_path / "o"))
    bad = "gpu\n#SBATCH --uid=0"
    if field == "out":
        config = launch.RunConfig("1f1b", 2, 4, out=str(tmp_path / "o\nrm -rf x"))
    else:
        kwargs[field] = bad
    with pytest.raises(launch.RunError, match="control character"):
        launch.emit_sbatch(config, 1, 2, tmp_path / "job.sbatch", **kwargs)
    assert not (tmp_path / "job.sbatch").exists()


def test_sbatch_quotes_directive_values(tmp_path):
    """A partition with shell syntax is written quoted in its #SBATCH line; dp x p = nodes x GPUs."""
    text = launch.emit_sbatch(launch.RunConfig("1f1b", 2, 4, dp=2, backend="nccl", out=str(tmp_path / "o")),
                              2, 2, tmp_path / "job.sbatch", partition="gpu;$(id)")
    assert "#SBATCH --partition='gpu;$(id)'" in text
    assert "--nnodes=2 --nproc-per-node=2" in text and '"dp": 2' in text
    with pytest.raises(launch.RunError, match="product is p x dp"):
        launch.emit_sbatch(launch.RunConfig("1f1b", 2, 4, dp=2), 1, 2, tmp_path / "x")


def test_device_init_builds_on_the_target_device_with_finite_weights():
    """build_stages(init='device') lays the stage out on meta and allocates it on the target device
    in the model dtype (no CPU copy first); every weight is initialised (finite, not all zero)."""
    cfg = models.get_preset("tiny", dtype="bfloat16")
    mods = models.build_stages(cfg, 4, stages=[0, 3], device="cpu", init="device")
    for mod in mods.values():
        for name, prm in mod.named_parameters():
            assert prm.device.type == "cpu" and prm.dtype == torch.bfloat16, name
            assert torch.isfinite(prm.float()).all(), name
        assert any(prm.float().abs().sum() > 0 for prm in mod.parameters())
    with pytest.raises(ValueError, match="init must be one of"):
        models.build_stages(cfg, 4, init="gpu")
