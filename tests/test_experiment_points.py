"""What the experiment notebook calls for one point: A100 fit only for the paper's models, `dp`
on the real-run path, and collecting a result the Slurm launcher's job already wrote."""

from __future__ import annotations

import json

import pytest

from ctrlmem.experiments import points


def test_a100_fit_is_reported_for_the_paper_models_only():
    """The CPU-scale stand-in (cpu-tiny) gets activation numbers but no A100 80 GB verdict;
    the paper's 9.6B does get one."""
    tiny = points.simulate_point("1f1b", 4, 8, model="cpu-tiny")
    assert "fits_a100_80gb" not in tiny and "activation_gb" in tiny
    paper = points.simulate_point("1f1b", 16, 32, costs="paper", model="9.6B", microbatch_size=4)
    assert paper["fits_a100_80gb"] in (True, False)


def test_real_run_command_carries_dp():
    """dp > 1 becomes `ctrlmem run --dp`; dp = 1 adds nothing."""
    cmd = points.run_command("v-half", 2, 4, "gloo", "out", model="cpu-tiny", quick=True, dp=2)
    assert cmd[cmd.index("--dp") + 1] == "2" and cmd[cmd.index("--model") + 1] == "tiny"
    assert "--dp" not in points.run_command("v-half", 2, 4, "gloo", "out")


def test_result_of_a_finished_slurm_job_is_collected_not_rerun(tmp_path, monkeypatch):
    """With the Slurm launcher's marker and the job's result.json in out_dir/run, the point's
    result is that file's (labelled with the job), and no command runs."""
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"status": "ok", "peak_saved_bytes": [3, 5], "loss": 1.0}))
    (run_dir / points.SLURM_MARKER).write_text(json.dumps({"job_id": "77", "state": "COMPLETED"}))

    def no_subprocess(*a, **k):
        raise AssertionError("nothing must run")

    monkeypatch.setattr(points.subprocess, "run", no_subprocess)
    r = points.real_run_point("1f1b", 2, 4, backend="gloo", launcher="local", quick=True, out_dir=tmp_path)
    assert r["status"] == "ok" and r["peak_saved_bytes_max"] == 5 and r["loss"] == 1.0
    assert r["how"] == "measured (CPU, gloo; launcher slurm, job 77)"


def test_several_schedules_are_named_once_each_in_one_command():
    """`schedules` "a, b" becomes one `ctrlmem run` with a --schedule per name, in order; an empty
    name, a repeated one, or several schedules for the Slurm launcher are refused by name."""
    assert points.schedule_names(" 1f1b, v-min ,zb-h1") == ["1f1b", "v-min", "zb-h1"]
    cmd = points.run_command(["1f1b", "v-min"], 4, 8, "gloo", "out")
    assert [cmd[i + 1] for i, x in enumerate(cmd) if x == "--schedule"] == ["1f1b", "v-min"]
    with pytest.raises(ValueError, match="given twice"):
        points.schedule_names("1f1b,v-min,1f1b")
    with pytest.raises(ValueError, match="separated by commas"):
        points.schedule_names("1f1b,,v-min")
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="one local launch"):
        points.real_run_point(["1f1b", "v-min"], 2, 4, backend="gloo", launcher="slurm", quick=True, out_dir="unused")
    with pytest.raises(ValueError, match="not registered"):
        points.real_run_point(["1f1b", "no-such"], 2, 4, backend="gloo", launcher="local", quick=True,
                              out_dir="unused")


def test_run_ids_name_the_schedules_of_a_point():
    """A point with `schedules` is labelled by them; points without keep their old ids."""
    from ctrlmem.experiments.config import make_run_id

    assert make_run_id({"schedules": "1f1b,v-min", "model": "cpu-tiny", "p": 4, "m": 8}).startswith("1f1b-v-min_cpu-tiny_4_8_")
    assert make_run_id({"schedule": "v-min", "model": "cpu-tiny", "p": 4, "m": 8}).startswith("v-min_cpu-tiny_4_8_")
    assert make_run_id({"schedule": "v-min", "schedules": "", "p": 4}).startswith("v-min_4_")


def test_run_refuses_a_repeated_schedule_and_several_in_one_slurm_script(tmp_path, capsys):
    """`ctrlmem run` with a --schedule given twice, or several with --emit-sbatch, stops before
    launching with one line naming the problem."""
    pytest.importorskip("torch")
    from ctrlmem.cli import main

    assert main(["run", "--schedule", "v-min", "--schedule", "v-min", "--out", str(tmp_path)]) == 2
    assert "given twice for v-min" in capsys.readouterr().err
    assert main(["run", "--schedule", "1f1b", "--schedule", "v-min", "--emit-sbatch", str(tmp_path / "x.sbatch"),
                 "--out", str(tmp_path)]) == 2
    assert "one --schedule" in capsys.readouterr().err
    assert not (tmp_path / "x.sbatch").exists()


@pytest.mark.slow
def test_notebook_simulates_several_schedules_in_one_point(tmp_path):
    """The experiment notebook with `schedules`: one result per schedule under `runs`; an
    unregistered name fails the point with that name and the reason."""
    import papermill as pm
    from pathlib import Path

    nb = Path(__file__).resolve().parents[1] / "notebooks" / "10_experiment.ipynb"
    pm.execute_notebook(str(nb), str(tmp_path / "a.ipynb"), parameters={"schedules": "1f1b,v-min",
                        "out_dir": str(tmp_path / "a")}, progress_bar=False)
    got = json.loads((tmp_path / "a" / "result.json").read_text())
    assert got["status"] == "ok" and list(got["runs"]) == ["1f1b", "v-min"]
    assert got["runs"]["v-min"]["bubble_rate"] < got["runs"]["1f1b"]["bubble_rate"]
    pm.execute_notebook(str(nb), str(tmp_path / "b.ipynb"), parameters={"schedules": "1f1b,no-such",
                        "out_dir": str(tmp_path / "b")}, progress_bar=False)
    bad = json.loads((tmp_path / "b" / "result.json").read_text())
    assert bad["status"] == "failed" and bad["reason"].startswith("no-such: schedule 'no-such' is not registered")


def test_simulated_points_take_the_levers():
    """recompute/offload/offload_cost reach cm.build on the simulated path: full recomputation is
    1F1B-R (same makespan and peak, an R per forward), an offload counts its copies and frees
    memory, and 1F1B stays the baseline the ratios are taken against."""
    import ctrlmem as cm

    plain = points.simulate_point("1f1b", 4, 8)
    full = points.simulate_point("1f1b", 4, 8, recompute="full")
    ref = cm.simulate(cm.build("1f1b-r", 4, 8))
    assert full["recomputed_forwards"] == 4 * 8 and full["offloaded_forwards"] == 0
    assert (full["makespan"], full["peak_memory_a"]) == (ref.makespan, ref.max_peak_memory)
    assert full["memory_vs_1f1b"] == ref.max_peak_memory / plain["peak_memory_a"] < 1
    off = points.simulate_point("1f1b", 4, 8, offload=0.5, offload_cost=0.25)
    assert off["offloaded_forwards"] > 0 and off["peak_memory_a"] < plain["peak_memory_a"]
    assert off["costs"]["offload"] == 0.25 and "offload cost 0.25" in off["how"]
    assert points.simulate_point("1f1b", 4, 8, offload=0)["offloaded_forwards"] == 0
    with pytest.raises(ValueError, match="recompute must be one of"):
        points.simulate_point("1f1b", 4, 8, recompute="yes")


def test_real_run_commands_carry_fixed_levers_and_refuse_auto():
    """A real point's levers become `ctrlmem run --recompute/--offload`; none (or offload 0) adds
    nothing; 'auto' (a simulated search) is refused with what to give instead, and so are both
    levers at once (a forward is recomputed or offloaded, not both)."""
    cmd = points.run_command("1f1b", 2, 4, "gloo", "out", recompute="selective")
    assert cmd[cmd.index("--recompute") + 1] == "selective" and "--offload" not in cmd
    cmd = points.run_command("1f1b", 2, 4, "gloo", "out", offload=0.5)
    assert float(cmd[cmd.index("--offload") + 1]) == 0.5 and "--recompute" not in cmd
    with pytest.raises(ValueError, match="recomputed or offloaded, not both"):
        points.run_command("1f1b", 2, 4, "gloo", "out", recompute="selective", offload=0.5)
    bare = points.run_command("1f1b", 2, 4, "gloo", "out", offload=0)
    assert "--recompute" not in bare and "--offload" not in bare
    for kw in ({"recompute": "auto"}, {"offload": "auto"}):
        with pytest.raises(ValueError, match="real run takes fixed levers"):
            points.run_command("1f1b", 2, 4, "gloo", "out", **kw)
    with pytest.raises(ValueError, match="fraction in"):
        points.real_run_point("1f1b", 2, 4, backend="gloo", launcher="local", quick=True, out_dir="unused",
                              offload=2)


def test_run_ids_name_the_levers_of_a_point():
    """Points that differ only in their levers get ids that say so; points without levers keep
    their old ids."""
    from ctrlmem.experiments.config import make_run_id

    assert make_run_id({"schedule": "1f1b", "p": 2, "m": 4, "recompute": "full"}).startswith("1f1b_2_4_recompute-full_")
    assert make_run_id({"schedule": "1f1b", "p": 2, "m": 4, "offload": 0.5}).startswith("1f1b_2_4_offload-0.5_")
    assert make_run_id({"schedule": "1f1b", "p": 2, "m": 4, "offload": "none"}).startswith("1f1b_2_4_")
    assert make_run_id({"schedule": "1f1b", "p": 2, "m": 4, "offload": "none"}).count("_") == 3
