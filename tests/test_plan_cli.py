"""`ctrlmem plan` prints a ranked table and writes CSV/JSON; `--emit` writes a torch CSV that loads
back to the winner's schedule, a torchtitan TOML fragment naming the schedule that places the
stages as the CSV does (sequential, looped, V), and the `ctrlmem run` line; `ctrlmem export` names
the torchtitan schedule; `--memory-gb` converts GB into a budget the schedule meets; bad input is
one line, exit status 2."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

import ctrlmem as cm
from ctrlmem.cli import main
from ctrlmem.planner.emit import TORCHTITAN_NAMES, emit, toml_fragment, torchtitan_schedule

SMALL = ["--model", "custom", "--layers", "6", "--hidden", "2048", "--heads", "16", "--vocab", "32000",
         "--gpus", "8", "--gpu-memory-gb", "4", "--global-batch", "32", "--tp", "1,2", "--microbatch-sizes", "1,2,4",
         "--no-progress"]
PLAN_KW = dict(model="custom", layers=6, hidden=2048, heads=16, vocab=32000, seq_len=1024, gpus=8, global_batch=32,
               gpu_memory_gb=4.0, tp=(1,), microbatch_sizes=(2,), progress=False)


@pytest.fixture(autouse=True)
def _in_tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_plan_prints_a_ranked_table_and_writes_csv_and_json(tmp_path, capsys):
    assert main(["plan", *SMALL, "--out", "out", "--top", "5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("ctrlmem plan: custom (6 layers")
    assert "searched" in lines[1] and " s (" in lines[1]
    header = next(i for i, ln in enumerate(lines) if ln.startswith("rank"))
    assert lines[header + 1].split()[0] == "1" and lines[header + 5].split()[0] == "5"
    assert "best per schedule:" in out and "* fastest:" in out and "assumed:" in out
    df = pd.read_csv(tmp_path / "out" / "plan.csv")
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert len(df) == len(data["rows"]) > 20
    assert data["settings"]["gpus"] == 8 and data["assumptions"] and data["notes"]
    first = data["rows"][0]
    assert first["rank"] == 1 and first["status"] == "ok"
    # the printed winner is the file's first row
    cells = lines[header + 1].split()
    assert (cells[1], int(cells[2]), int(cells[3]), int(cells[4]), int(cells[5])) == (
        first["schedule"], first["dp"], first["tp"], first["pp"], first["microbatch_size"])


def test_plan_json_output(capsys):
    assert main(["plan", *SMALL, "--json", "--out", "o"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["rows"][0]["rank"] == 1 and "wrote o/plan.csv" in captured.err


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "0", "--gpu-memory-gb", "80"], "--gpus: must be a positive integer"),
    (["--gpus", "8", "--gpu-memory-gb", "0"], "--gpu-memory-gb: must be > 0"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--costs-from", "nofile.json"], "no such file"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--model", "custom"], "custom model needs layers, hidden, heads"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--distributed-optimizer", "maybe"], "yes, no or both"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--schedules", "v-haf"], "unknown schedule 'v-haf'"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--peak-tflops", "100"], "--peak-tflops goes with per-layer costs"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--allocator-margin", "x.json"], "--allocator-margin 'x.json'"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--model", "custom", "--layers", "6", "--hidden", "2048", "--heads",
      "16", "--costs-from", "h200", "--global-batch", "32"], "no rows for model 'custom'"),
])
def test_plan_bad_input_is_one_line(args, needle, capsys):
    assert main(["plan", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ctrlmem plan: error:") and needle in err[0], err


def test_emit_nothing_fits_is_one_line(capsys):
    small = [x if x != "4" else "0.5" for x in SMALL]  # 0.5 GB per GPU: nothing fits
    assert small[small.index("--gpu-memory-gb") + 1] == "0.5"
    assert main(["plan", *small, "--emit", "e"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to emit" in err[0]


# -- emit: CSV, TOML, run line ---------------------------------------------------------------------

@pytest.mark.parametrize("schedule,placement,chunks", [("zb-h1", "sequential", 1), ("v-half", "v-shape", 2),
                                                       ("interleaved-1f1b", "interleaved", 2)])
def test_emit_writes_a_csv_toml_and_run_line_for_the_winner(schedule, placement, chunks, tmp_path):
    df = cm.plan(schedules=[schedule], pp=[2], **PLAN_KW)
    paths = emit(df, "em", torchtitan="0.2")
    row = df.iloc[0]
    assert row["status"] == "ok"
    # the CSV is the winner's schedule, and torch's loader reads it
    sched = cm.Schedule.load(paths["csv"])
    assert (sched.num_devices, sched.num_microbatches, sched.placement.kind, sched.placement.num_chunks) == (
        row["pp"], row["m"], placement, chunks)
    built, _ = cm.planner.row_schedule(df, 0)
    assert sched.device_passes == built.device_passes
    # the TOML: torchtitan's name for this placement, the degrees, the batch split
    text = Path(paths["toml"]).read_text()
    cfg = tomllib.loads(text)
    par, train = cfg["parallelism"], cfg["training"]
    assert par["pipeline_parallel_schedule"] == TORCHTITAN_NAMES[placement]
    assert par["pipeline_parallel_degree"] == row["pp"] and par["tensor_parallel_degree"] == row["tp"]
    assert par["pipeline_parallel_microbatch_size"] == row["microbatch_size"]
    assert Path(par["pipeline_parallel_schedule_csv"]) == Path("em/schedule.csv")
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == row["dp"]
    assert train["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == row["m"]
    assert train["global_batch_size"] == 32 and train["seq_len"] == 1024
    assert cfg["activation_checkpoint"]["mode"] == "none"
    # torchtitan's stage-to-rank rule for that name gives the CSV's placement
    assert _torchtitan_stages(par["pipeline_parallel_schedule"], sched.num_devices, sched.num_stages) == [
        list(sched.placement.stages_of(r)) for r in range(sched.num_devices)]
    run = Path(paths["run"]).read_text()
    assert f"ctrlmem run --schedule em/schedule.csv -p {row['pp']} -m {row['m']}" in run
    assert "--emit-sbatch em/plan.sbatch" in run and "--microbatch-size 2" in run
    record = json.loads(Path(paths["row"]).read_text())
    assert record["torchtitan_schedule"] == TORCHTITAN_NAMES[placement]


def _torchtitan_stages(name: str, pp: int, num_stages: int) -> list[list[int]]:
    """torchtitan's pipeline_module_split: the stages rank r builds for a schedule name (single-stage
    classes one stage per rank; ZBVZeroBubble / DualPipeV the V pairs; others looped)."""
    from torch.distributed.pipelining.schedules import (PipelineScheduleSingle, ScheduleDualPipeV,
                                                        ScheduleZBVZeroBubble, get_schedule_class)

    cls = get_schedule_class(name)
    per_rank = 1 if issubclass(cls, PipelineScheduleSingle) else num_stages // pp
    assert per_rank * pp == num_stages, f"{name} builds {per_rank * pp} stages, the CSV has {num_stages}"
    if cls in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
        return [[r, num_stages - 1 - r] for r in range(pp)]
    return [[r + s * pp for s in range(per_rank)] for r in range(pp)]


def test_toml_strings_are_escaped_and_parse_back():
    sched = cm.build("v-half", 2, 4)
    text = toml_fragment(sched, 'we"ird\\path\n.csv', dp=2, tp=1, microbatch_size=1, seq_len=128,
                         distributed_optimizer=False, header='a "header"\nsecond line')
    cfg = tomllib.loads(text)
    assert cfg["parallelism"]["pipeline_parallel_schedule_csv"] == 'we"ird\\path\n.csv'
    assert cfg["parallelism"]["data_parallel_replicate_degree"] == 2


def test_looped_with_more_chunks_sets_the_layers_per_stage():
    sched = cm.build("interleaved-1f1b", 2, 4, num_chunks=4)
    cfg = tomllib.loads(toml_fragment(sched, "s.csv", dp=1, tp=1, microbatch_size=1, seq_len=128,
                                      distributed_optimizer=True, num_layers=14))
    assert cfg["parallelism"]["pipeline_parallel_layers_per_stage"] == 2  # (14 + 2) / 8 stages


def test_a_custom_placement_has_no_torchtitan_name():
    sched = cm.Schedule.from_torch_csv_text("1F0,1B0\n0F0,0B0\n")  # stage 1 on rank 0, stage 0 on rank 1
    assert sched.placement.kind == "custom"
    with pytest.raises(ValueError, match="custom placement"):
        torchtitan_schedule(sched)


@pytest.mark.parametrize("name,title", [("1f1b", "1F1B"), ("zb-h1", "1F1B"), ("interleaved-1f1b", "Interleaved1F1B"),
                                        ("v-half", "ZBVZeroBubble"), ("zb-v", "ZBVZeroBubble")])
def test_export_names_the_torchtitan_schedule(name, title, capsys):
    assert main(["export", name, "-p", "4", "-m", "8", "--torch-csv", "s.csv"]) == 0
    out = capsys.readouterr().out
    assert f'pipeline_parallel_schedule = "{title}"' in out and 'pipeline_parallel_schedule_csv = "s.csv"' in out
    assert main(["export", name, "-p", "4", "-m", "8", "--torch-csv", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out == cm.build(name, 4, 8).to_torch_csv()  # stdout stays a clean CSV
    assert f'"{title}"' in captured.err


# -- memory in GB ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gb", [12.0, 20.0, 30.0])
def test_memory_gb_budget_is_met(gb, capsys):
    """v-shape built for --memory-gb G on 9.6B (p = 16, microbatch 4) holds at most G GB of
    activation on every device (each stage's own bytes), and the command says how it converted."""
    assert main(["simulate", "v-shape", "-p", "16", "-m", "32", "--memory-gb", str(gb), "--model", "9.6b"]) == 0
    out = capsys.readouterr().out
    assert f"--memory-gb {gb:g} = " in out and "of 1F1B's peak (9.6B, p = 16, microbatch 4" in out
    from ctrlmem.planner.gb import memory_limit_from_gb, simulated_gb

    limit, _ = memory_limit_from_gb(gb, "9.6b", 16)
    peak = max(simulated_gb(cm.build("v-shape", 16, 32, memory_limit=limit), "9.6b"))
    assert peak <= gb and f"activation GB {peak:.2f}" in out


@pytest.mark.parametrize("args,needle", [
    (["simulate", "v-shape", "--memory-gb", "20"], "--memory-gb needs --model"),
    (["simulate", "v-shape", "--memory-gb", "20", "--model", "9.6b", "--memory-limit", "0.5"], "not both"),
    (["simulate", "v-shape", "--memory-gb", "-1", "--model", "9.6b"], "--memory-gb: must be > 0"),
    (["draw", "v-shape", "--memory-gb", "20", "--model", "9.7b", "-o", "x.html"], "unknown model '9.7b'"),
    (["export", "v-shape", "--microbatch-size", "2"], "give --model too"),
])
def test_memory_gb_bad_input_is_one_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_draw_takes_memory_gb(tmp_path, capsys):
    assert main(["draw", "v-shape", "-p", "4", "-m", "8", "--memory-gb", "12", "--model", "9.6b", "-o", "d.html"]) == 0
    err = capsys.readouterr().err
    assert "--memory-gb 12 = " in err and (tmp_path / "d.html").is_file()


def test_explorer_memory_panel_gets_a_gb_axis():
    from ctrlmem.explorer import ui
    from ctrlmem.planner.gb import bytes_per_a

    view = ui.compute(ui.Settings(schedules=("1f1b", "v-half"), num_devices=8, num_microbatches=16, model="21B"))
    layout = view.memory_spec["layout"]
    overlays = {k: v for k, v in layout.items() if k.startswith("yaxis") and "overlaying" in v}
    assert len(overlays) == 2  # one per panel
    a_gb = bytes_per_a("21b", 8, 2) / 1e9  # 21B's paper microbatch is 2
    for ax in overlays.values():
        base = layout["yaxis" + ax["overlaying"][1:]]
        assert ax["range"][1] == pytest.approx(base["range"][1] * a_gb)
        assert ax["title"]["text"] == "GB: 21B, mb 2"
    plain = ui.compute(ui.Settings(num_devices=8, num_microbatches=16))
    assert not any("overlaying" in v for k, v in plain.memory_spec["layout"].items() if k.startswith("yaxis"))


def test_ctrlmem_run_takes_the_emitted_csv(tmp_path):
    """`ctrlmem run --schedule FILE` (the line run.sh holds) prepares the emitted schedule as it is,
    with the planned microbatch size; a CSV with another number of ranks is refused."""
    launch = pytest.importorskip("ctrlmem.runtime.launch")
    df = cm.plan(schedules=["v-half"], pp=[2], **PLAN_KW)
    paths = emit(df, "em", torchtitan="0.2")
    row = df.iloc[0]
    cfg = launch.RunConfig(schedule=paths["csv"], num_devices=2, num_microbatches=int(row["m"]), model="tiny",
                           model_overrides={"microbatch_size": 2, "num_layers": 6})
    sched, worker = launch.prepare(cfg)
    assert sched.device_passes == cm.Schedule.load(paths["csv"]).device_passes
    assert worker["model"]["microbatch_size"] == 2
    with pytest.raises(launch.RunError, match="-p 4 does not match"):
        launch.prepare(launch.RunConfig(schedule=paths["csv"], num_devices=4, num_microbatches=int(row["m"])))
    with pytest.raises(launch.RunError, match="no such file"):
        launch.prepare(launch.RunConfig(schedule="nope/x.csv", num_devices=2, num_microbatches=4))


def test_plan_form_plans_and_reports_bad_values():
    """The notebook's form: a plan fills the table and the notes; a bad value is a message, not a
    traceback."""
    pytest.importorskip("ipywidgets")
    from ctrlmem.planner.views import PlanForm

    form = PlanForm("9.6b", 8, 40.0, 256, "h200", tp=[1], pp=[8], microbatch_sizes=[2, 4],
                    schedules=["1f1b", "v-half"], progress=False)
    df = form.run()
    assert df is form.df and "samples/s" in form.table.value and "buys microbatch 4" in form.message.value
    assert len(form.plots.shown) == 2 and "--emit build/plan/emit" in form.command.value
    bad = PlanForm("9.6b", 8, 40.0, 256, "h200", microbatch_sizes="x", progress=False)
    assert bad.run() is None and "Cannot plan" in bad.message.value and "microbatch_sizes" in bad.message.value


FORM_KW = dict(layers=6, hidden=2048, heads=16, vocab=32000, seq_len=1024, tp=(1,), microbatch_sizes=(2,),
               progress=False)


def _small_form():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from ctrlmem.planner.views import PlanForm

    return PlanForm("custom", 8, 4.0, 32, "a100", **FORM_KW)


def _shown_winner_title(form):
    front, winner = form.plots.shown
    return front["layout"]["title"]["text"], winner["layout"]["title"]["text"], front["data"]


def test_plan_form_replans_replace_both_figures_and_nothing_fits_clears_them():
    """Every plan replaces the throughput–memory figure and the winner's diagram (they follow the
    form, not the first plan); when nothing fits both are cleared and the message says so."""
    form = _small_form()
    form.run()
    first = _shown_winner_title(form)
    assert "on 8 GPUs, batch 32" in first[0] and f"PP {form.df[form.df.status == 'ok'].iloc[0]['pp']}" in first[1]
    seq = form.plots.seq
    form.gpus.value, form.batch.value = 4, 16
    form.run()
    second = _shown_winner_title(form)
    assert form.plots.seq > seq and "on 4 GPUs, batch 16" in second[0] and second[2] != first[2]
    assert f"DP {form.df[form.df.status == 'ok'].iloc[0]['dp']}" in second[1]
    assert not form.emit_button.disabled and "nothing fits" not in form.message.value
    form.gb.value = 0.5  # not even the parameters fit
    form.run()
    assert form.plots.shown == [None, None] and "nothing fits: no figure" in form.message.value
    assert form.emit_button.disabled and "--gpu-memory-gb 0.5" in form.command.value


def test_plan_form_command_line_reproduces_the_plan_and_emit_writes_its_files(tmp_path, capsys):
    """The line the form shows plans the same rows from a shell and its --emit writes the same
    files as the form's button; the button refuses a user's file unless the box is ticked."""
    import shlex

    form = _small_form()
    form.gpus.value = 4
    form.run()
    form.folder.value = str(tmp_path / "form")
    paths = form.write_emit()
    assert paths is not None and "wrote" in form.emitted.value
    line = form.command_line()
    assert line.startswith("ctrlmem plan --model custom --gpus 4 ") and "--layers 6" in line and "--tp 1" in line
    words = shlex.split(line.replace(str(tmp_path / "form"), str(tmp_path / "cli")))
    assert main([*words[1:], "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    cli = pd.read_csv(tmp_path / "out" / "plan.csv")
    assert list(cli["method"]) == list(form.df["method"]) and list(cli["pp"]) == list(form.df["pp"])
    for name in ("schedule.csv", "megatron.txt"):
        assert (tmp_path / "cli" / name).read_text() == (tmp_path / "form" / name).read_text().replace(
            str(tmp_path / "form"), str(tmp_path / "cli"))
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "run.sh").write_text("mine\n")
    form.folder.value = str(tmp_path / "user")
    assert form.write_emit() is None and "already exists" in form.emitted.value
    form.force.value = True
    assert "--force" in form.command.value and form.write_emit() is not None
    assert (tmp_path / "user" / "run.sh").read_text() != "mine\n"
