"""Run the planner's answer (``ctrlmem plan --emit DIR``): the winner's torch CSV, a launch
script for torchtitan **0.3.0** (``torchrun -m torchtitan.train --module M --config FN`` with
``--section.key value`` overrides and the activation-checkpointing subcommand), a config function
that sets the planned layer split when torchtitan's own rule would split differently, the
Megatron-LM arguments (``--pipeline-model-parallel-layout``), and the ``ctrlmem run`` / Slurm line
for the same configuration. torchtitan 0.2's TOML job file only with ``torchtitan="0.2"``
(``--emit-torchtitan 0.2``).

torchtitan runs a schedule CSV (``[parallelism] pipeline_parallel_schedule_csv``) with torch's
``_PipelineScheduleRuntime``, but it places the stages on the ranks from
``pipeline_parallel_schedule``: a single-stage schedule class (``1F1B``) puts stage ``r`` on rank
``r``; ``ZBVZeroBubble`` (and ``DualPipeV``) put stages ``r`` and ``2p − 1 − r`` on rank ``r``;
any other multi-stage class (``Interleaved1F1B``) puts stages ``r, r + p, …`` on rank ``r``. The
name must therefore match the CSV's placement (:func:`torchtitan_schedule`); with a wrong one
torchtitan deadlocks, aborts in gloo/NCCL or runs the wrong layers on a rank.

**Recomputation.** Torch's CSV has no recompute action: a row that recomputes also gets
``schedule.txt``, the very schedule the planner simulated in ctrlmem's text form (an ``R`` before
every ``B`` / ``BW``), which ``run.sh``'s ``ctrlmem run`` line runs. With a split backward
(ZB-H1, V-Half, …) torchtitan cannot run the row as planned: it runs the CSV's ``I`` and ``W``
with torch's own split backward (``stage_backward_input`` / ``stage_backward_weight``), each a
graph task of its own, and the non-reentrant checkpoint its ``activation-checkpoint`` option
wraps the layers in recomputes a region once per graph task that unpacks from it and keeps what
that task leaves until the graph is freed (docs/theory.md §13: 25 recomputations per forward on
a 4-layer stage, saved tensors several times the plan's; pytorch/pytorch#136766 reports
zero-bubble schedules running out of memory with activation checkpointing). The launch script of
such a row therefore stops with that explanation (:data:`TORCH_SPLIT_RECOMPUTE`) unless
``CTRLMEM_ALLOW_TORCH_SPLIT_RECOMPUTE=1``; ``megatron.txt`` says that Megatron-LM runs its own
fused-backward schedule from its arguments, not the row's split-backward order.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import textwrap
from pathlib import Path

from ctrlmem.model.ir import Schedule
from ctrlmem.model.levers import with_recompute
from ctrlmem.util.fileio import atomic_write, check_output_folder, record_outputs
from ctrlmem.model import paper
from ctrlmem.planner.core import row_schedule
from ctrlmem.planner.model import stage_layers
from ctrlmem.planner.split import megatron_layout
from ctrlmem.planner.split import parse_split_text, torchtitan_modules

__all__ = ["torchtitan_schedule", "toml_fragment", "emit", "run_lines", "TORCHTITAN_NAMES", "TORCHTITAN_VERSION",
           "TORCH_SPLIT_RECOMPUTE",
           "launch_overrides", "launch_script", "config_function", "megatron_args", "AC_SUBCOMMAND"]

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release the launch script is written for."""

AC_SUBCOMMAND = {"none": "activation-checkpoint:none", "selective": "activation-checkpoint:selective",
                 "full": "activation-checkpoint:full"}
"""ctrlmem's recompute lever -> torchtitan 0.3.0's activation-checkpointing subcommand (a
positional token after every ``--flag``). torchtitan's ``selective`` is per-op selective
checkpointing, not exactly Korthikanti et al.'s attention-core recomputation the planner prices."""

TORCH_SPLIT_RECOMPUTE = (
    "torchtitan cannot run this row as planned: its schedule splits the backward (B and W passes, torch's I and W) "
    "and recomputes every forward, and torch runs I and W as separate autograd graph tasks, for each of which the "
    "non-reentrant activation checkpoint recomputes the layers again and keeps what that task leaves until the "
    "graph is freed (ctrlmem measured 25 recomputations per forward on a 4-layer stage and saved tensors several "
    "times the plan's, docs/theory.md §13; pytorch/pytorch#136766: zero-bubble schedules with activation "
    "checkpointing run out of memory). Neither the planned time nor the planned memory holds there. Run it with "
    "run.sh (ctrlmem run recomputes once, in B, and W reuses what B kept), or plan a fused-backward schedule with "
    "recomputation (1f1b, interleaved-1f1b: torchtitan runs those as planned), or this schedule without it.")
"""Why ``torchtitan.sh`` refuses a row that recomputes with a split backward (see the module doc)."""

TORCHTITAN_NAMES = {"sequential": "1F1B", "interleaved": "Interleaved1F1B", "v-shape": "ZBVZeroBubble"}
"""Placement -> the ``pipeline_parallel_schedule`` that makes torchtitan place stages that way."""


def torchtitan_schedule(schedule: Schedule) -> tuple[str, str]:
    """(torchtitan ``pipeline_parallel_schedule`` name, why) for a schedule's placement;
    ``ValueError`` for a placement torchtitan cannot express (a custom mapping)."""
    kind, v = schedule.placement.kind, schedule.placement.num_chunks
    if kind == "sequential":
        return "1F1B", "sequential placement: one stage per rank (torchtitan's single-stage schedules)"
    if kind == "v-shape":
        return "ZBVZeroBubble", "V-shape placement: rank r holds stages r and 2p − 1 − r (torchtitan's V style)"
    if kind == "interleaved":
        return "Interleaved1F1B", (f"looped placement: rank r holds stages r, r + p, … ({v} per rank; torchtitan's "
                                   "loop style)")
    raise ValueError(f"schedule {schedule.name!r} has a custom placement ({schedule.placement.to_text()}); torchtitan "
                     "places stages sequentially, looped or V-shaped only")


def _toml_str(text: str) -> str:
    """A TOML basic string (quotes, backslashes and control characters escaped)."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _comment(text: str) -> str:
    return "\n".join("# " + line for line in str(text).replace("\r", " ").splitlines())


def toml_fragment(schedule: Schedule, csv_path: str, *, dp: int, tp: int, microbatch_size: int, seq_len: int,
                  distributed_optimizer: bool, num_layers: int | None = None, header: str = "",
                  recompute: str = "none") -> str:
    """The ``[parallelism]`` / ``[training]`` / ``[activation_checkpoint]`` lines of a torchtitan
    job config that run ``schedule`` from ``csv_path`` (see the module doc)."""
    name, why = torchtitan_schedule(schedule)
    p, m, v = schedule.num_devices, schedule.num_microbatches, schedule.placement.num_chunks
    lines = []
    if header:
        lines += [_comment(header), ""]
    if recompute != "none" and schedule.split_backward:
        lines += [_comment(textwrap.fill("NOT SUPPORTED AS PLANNED: " + TORCH_SPLIT_RECOMPUTE, 100)), ""]
    lines += [
        "[parallelism]",
        f"pipeline_parallel_degree = {p}",
        f"pipeline_parallel_schedule = {_toml_str(name)}  # {why}",
        f"pipeline_parallel_schedule_csv = {_toml_str(csv_path)}  # relative to where torchtitan starts",
        f"pipeline_parallel_microbatch_size = {microbatch_size}",
    ]
    if schedule.placement.kind == "interleaved" and v != 2:
        if num_layers is None or (num_layers + 2) % (p * v):
            lines.append(f"# {v} stages per rank: set pipeline_parallel_layers_per_stage so that (layers + 2) / it "
                         f"= {p * v} stages (torchtitan's default is 2 per rank)")
        else:
            lines.append(f"pipeline_parallel_layers_per_stage = {(num_layers + 2) // (p * v)}  # {p * v} stages, "
                         f"{v} per rank")
    if distributed_optimizer and dp > 1:
        lines += [f"data_parallel_shard_degree = {dp}  # FSDP: shards weights, gradients and optimizer states "
                  "(at most the plan's memory, which shards the optimizer states only)",
                  "data_parallel_replicate_degree = 1"]
    else:
        lines += ["data_parallel_shard_degree = 1",
                  f"data_parallel_replicate_degree = {dp}"
                  + ("  # DDP: every replica holds all states, as planned" if dp > 1 else "")]
    lines += [
        f"tensor_parallel_degree = {tp}",
        "",
        "[training]",
        f"local_batch_size = {m * microbatch_size}  # per data-parallel rank: {m} microbatches of {microbatch_size}",
        f"global_batch_size = {m * microbatch_size * dp}",
        f"seq_len = {seq_len}",
        "",
        "[activation_checkpoint]",
        ('# the plan assumes every activation is kept (no recomputation)' if recompute == "none" else
         f"# the plan's recompute lever: {recompute}"),
        f'mode = "{recompute}"',
        "",
    ]
    return "\n".join(lines)


def _even_rule(num_layers: int, S: int) -> list[int]:

    return stage_layers(num_layers, S)


def launch_overrides(schedule: Schedule, csv_path: str, *, dp: int, tp: int, ep: int, microbatch_size: int,
                     seq_len: int, distributed_optimizer: bool, layers: list[int] | None,
                     num_layers: int) -> list[tuple[str, str | None, str]]:
    """torchtitan 0.3.0 ``(--section.key, value or None for a flag, why)`` overrides for a row."""
    name, why = torchtitan_schedule(schedule)
    p, m, v = schedule.num_devices, schedule.num_microbatches, schedule.placement.num_chunks
    S = p * v
    out: list[tuple[str, str | None, str]] = [
        ("parallelism.pipeline_parallel_degree", str(p), f"{p} pipeline ranks"),
        ("parallelism.pipeline_parallel_schedule", name, why),
        ("parallelism.pipeline_parallel_schedule_csv", csv_path, "the planned pass order, relative to where torchrun "
                                                                 "starts"),
        ("parallelism.pipeline_parallel_microbatch_size", str(microbatch_size), f"{m} microbatches per step"),
    ]
    even = _even_rule(num_layers, S)
    if layers is None or list(layers) == even:
        if v != 2:
            if (num_layers + 2) % S == 0:
                out.append(("parallelism.pipeline_parallel_layers_per_stage", str((num_layers + 2) // S),
                            f"{S} stages, {v} per rank (torchtitan's default is 2 per rank)"))
    if distributed_optimizer and dp > 1:
        out += [("parallelism.data_parallel_shard_degree", str(dp), "FSDP: shards weights, gradients and optimizer "
                                                                    "states (at most the plan's memory)"),
                ("parallelism.data_parallel_replicate_degree", "1", "")]
    else:
        out += [("parallelism.data_parallel_shard_degree", "1", ""),
                ("parallelism.data_parallel_replicate_degree", str(dp), "DDP: every replica holds all states")]
    out.append(("parallelism.tensor_parallel_degree", str(tp), ""))
    if ep > 1:
        out.append(("parallelism.expert_parallel_degree", str(ep), "EP borrows ranks from FSDP and TP"))
    out += [("training.local_batch_size", str(m * microbatch_size), f"per data-parallel rank: {m} microbatches of "
                                                                    f"{microbatch_size}"),
            ("training.global_batch_size", str(m * microbatch_size * dp), ""),
            ("training.seq_len", str(seq_len), "")]
    if p > 1:
        out.append(("training.disable_cuda_graphs", None, "torchtitan 0.3.0 refuses pipeline parallelism with CUDA "
                                                          "graphs"))
    return out


def launch_script(overrides, *, recompute: str, world: int, gpus_per_node: int, module: str, config: str,
                  split_module: str | None, header: str, split_backward: bool = False) -> str:
    """A ``torchrun -m torchtitan.train`` script for torchtitan 0.3.0. With ``recompute`` on a
    ``split_backward`` schedule it stops first with :data:`TORCH_SPLIT_RECOMPUTE` (exit status
    2) unless ``CTRLMEM_ALLOW_TORCH_SPLIT_RECOMPUTE=1`` is set."""
    nodes = max(1, math.ceil(world / gpus_per_node))
    per_node = world // nodes if world % nodes == 0 else gpus_per_node
    lines = ["#!/bin/sh", _comment(header), f"# torchtitan version: {TORCHTITAN_VERSION} (check: python -c 'import "
             "torchtitan; print(torchtitan.__version__)')", "# TT_MODULE / TT_CONFIG name your model's config "
             "function (torchtitan.models.<TT_MODULE>.config_registry.<TT_CONFIG>)",
             f"TT_MODULE=${{TT_MODULE:-{shlex.quote(module)}}}", f"TT_CONFIG=${{TT_CONFIG:-{shlex.quote(config)}}}",
             "export TT_MODULE TT_CONFIG"]
    if recompute != "none" and split_backward:
        lines += [_comment(textwrap.fill("NOT SUPPORTED AS PLANNED: " + TORCH_SPLIT_RECOMPUTE, 100)),
                  'if [ "${CTRLMEM_ALLOW_TORCH_SPLIT_RECOMPUTE:-0}" != 1 ]; then',
                  f"    echo {shlex.quote('torchtitan.sh: ' + TORCH_SPLIT_RECOMPUTE)} >&2",
                  "    echo 'torchtitan.sh: set CTRLMEM_ALLOW_TORCH_SPLIT_RECOMPUTE=1 to launch it anyway' >&2",
                  "    exit 2",
                  "fi"]
    if split_module:
        here = os.path.dirname(split_module) or "."
        lines += [_comment("the planned layer split differs from torchtitan's even rule: the config function in "
                           f"{os.path.basename(split_module)} loads $TT_MODULE/$TT_CONFIG and sets "
                           "parallelism.module_fqns_per_model_part"),
                  f'export PYTHONPATH="{here}${{PYTHONPATH:+:$PYTHONPATH}}"']
        target = ["--module", "ctrlmem_torchtitan", "--config", "plan"]
    else:
        target = ["--module", '"$TT_MODULE"', "--config", '"$TT_CONFIG"']
    cmd = [f"torchrun --nnodes {nodes} --nproc_per_node {per_node} -m torchtitan.train " + " ".join(target)]
    for key, value, _why in overrides:
        cmd.append(f"--{key}" + ("" if value is None else " " + shlex.quote(value)))
    cmd.append(AC_SUBCOMMAND[recompute])
    lines.append(" \\\n    ".join(cmd))
    notes = [f"#   --{k}: {why}" for k, _, why in overrides if why]
    return "\n".join(lines + ["", "# why each override:", *notes,
                               f"#   {AC_SUBCOMMAND[recompute]}: the plan's recompute lever ({recompute}); positional, "
                               "after every --flag", ""])


def config_function(modules: list[list[str]], module: str, config: str) -> str:
    """A torchtitan 0.3.0 config module (``--module ctrlmem_torchtitan --config plan``) that sets
    the planned ``module_fqns_per_model_part`` on the user's config."""
    return "\n".join([
        f'"""torchtitan {TORCHTITAN_VERSION} config function written by `ctrlmem plan`: your model\'s config with '
        'the planned layer split."""',
        "import importlib",
        "import os",
        "",
        f"TORCHTITAN_VERSION = {TORCHTITAN_VERSION!r}",
        f"MODULE_FQNS_PER_MODEL_PART = {json.dumps(modules)}",
        "",
        "",
        "def plan():",
        f'    registry = importlib.import_module(f"torchtitan.models.{{os.environ.get(\'TT_MODULE\', {module!r})}}'
        '.config_registry")',
        f"    config = getattr(registry, os.environ.get('TT_CONFIG', {config!r}))()",
        "    config.parallelism.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART",
        "    return config",
        ""])


def megatron_args(row, settings: dict, layers: list[int], placement: str, split_backward: bool = False) -> str:
    """Megatron-LM arguments for a row (``--pipeline-model-parallel-layout`` from the split).
    Megatron-LM runs its own schedule from them (1F1B, or interleaved with a virtual pipeline):
    for a row whose schedule splits the backward the file says so, and with recomputation that
    Megatron's is then 1F1B-R, a fused-backward row of the plan."""

    dp, tp, pp, mb, m = (int(row[k]) for k in ("dp", "tp", "pp", "microbatch_size", "m"))
    ep = int(row["ep"]) if row.get("ep") == row.get("ep") and row.get("ep") else 1
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--pipeline-model-parallel-layout", megatron_layout(layers),
            "--micro-batch-size", str(mb), "--global-batch-size", str(dp * m * mb),
            "--seq-length", str(settings["model"]["seq_len"])]
    if tp > 1:
        args.append("--sequence-parallel")
    if ep > 1:
        args += ["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", "1"]
    if row.get("dist_opt"):
        args.append("--use-distributed-optimizer")
    rc = row.get("recompute") or "none"
    if rc == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "selective":
        args += ["--recompute-granularity", "selective"]
    notes = ["# Megatron-LM arguments for the plan's row (E embedding, t layer, L loss/head; | between stages, "
             "in stage order)"]
    if placement == "v-shape":
        notes.append("# the row's schedule is V-shaped (rank r holds stages r and 2p-1-r); Megatron places the "
                     "layout's stages looped, so run this split with torchtitan, or as a looped schedule")
    if split_backward:
        notes.append("# the row's schedule splits the backward (B and W passes); Megatron-LM runs its own fused-backward "
                     "1F1B / interleaved schedule from these arguments, not the row's order (zero-bubble schedules "
                     "run in Megatron forks such as sail-sg/zero-bubble-pipeline-parallelism), so its time is not "
                     "the row's")
        if rc != "none":
            notes.append(f"# with --recompute-granularity {rc} that schedule is 1F1B with {rc} recomputation: the "
                         f"plan's 1f1b row with recompute {rc} at this configuration predicts it; the split-backward "
                         "row with recomputation runs as planned with run.sh (ctrlmem run)")
    return "\n".join(notes + [" ".join(shlex.quote(a) for a in args), ""])


def _runtime_model(name: str) -> str | None:
    lower = name.lower()
    return lower if lower in ("9.6b", "21b", "38.5b", "98.5b") else None


def run_lines(row, csv_path: str, settings: dict, out_dir: str) -> str:
    """The ``ctrlmem run`` command (and its Slurm form) for a plan row, as a shell script with
    comments naming what ``ctrlmem run`` cannot reproduce (tensor parallelism, a custom model).
    ``csv_path`` is the schedule file it runs (``schedule.txt``, with its ``R`` passes, for a row
    that recomputes)."""
    dp, tp, pp, mb, m = (int(row[k]) for k in ("dp", "tp", "pp", "microbatch_size", "m"))
    model = settings["model"]
    gpn = int(settings.get("gpus_per_node", 8))
    world = dp * pp
    nodes = max(1, math.ceil(world / gpn))
    per_node = world // nodes if world % nodes == 0 else gpn
    preset = _runtime_model(model["name"])
    args = ["ctrlmem", "run", "--schedule", csv_path, "-p", str(pp), "-m", str(m)]
    if dp > 1:
        args += ["--dp", str(dp)]
    args += ["--model", preset or "98.5b"]
    if preset is None or model["num_layers"] != _preset_layers(preset):
        args += ["--layers", str(model["num_layers"])]
    args += ["--microbatch-size", str(mb)]
    if model["seq_len"] != 1024:
        args += ["--seq-len", str(model["seq_len"])]
    args += ["--backend", "nccl", "--out", os.path.join(out_dir, "run")]
    local = " ".join(shlex.quote(a) for a in args)
    slurm = local + " " + " ".join(shlex.quote(a) for a in
                                   ["--emit-sbatch", os.path.join(out_dir, "plan.sbatch"), "--nodes", str(nodes),
                                    "--gpus-per-node", str(per_node)])
    notes = [f"ctrlmem run of the plan's row: {row['method']} at DP {dp}, TP {tp}, PP {pp}, microbatch {mb}, m = {m}"]
    rc = row.get("recompute") if isinstance(row.get("recompute"), str) else "none"
    if rc != "none":
        notes.append(f"{os.path.basename(csv_path)} is the simulated schedule with its {rc} recomputation (an R before "
                     "every backward), which torch's CSV cannot carry")
    if tp > 1:
        notes.append(f"ctrlmem run has no tensor parallelism: this runs DP {dp} × PP {pp} = {world} GPUs with "
                     f"full-width layers, so each GPU holds {tp}× the plan's weights and activations; run the TP "
                     "part with torchtitan (torchtitan.toml)")
    if preset is None:
        notes.append(f"{model['name']} is not a ctrlmem run preset: the line uses 98.5b's width with "
                     f"--layers {model['num_layers']}; set the preset closest to your model")
    return "\n".join(["#!/bin/sh", _comment("\n".join(notes)), "", "# one node (or a shell inside an allocation):",
                      local, "", f"# Slurm: writes plan.sbatch for {nodes} node(s) × {per_node} GPUs, then submit it",
                      slurm, f"sbatch {shlex.quote(os.path.join(out_dir, 'plan.sbatch'))}", ""])


def _preset_layers(preset: str) -> int:

    return paper.MODELS[{"9.6b": "9.6B", "21b": "21B", "38.5b": "38.5B", "98.5b": "98.5B"}[preset]].num_layers


_TT_LLAMA3 = {(32, 4096): "llama3_8b", (80, 8192): "llama3_70b", (126, 16384): "llama3_405b"}

#: What :func:`emit` may write into its folder (a file of these names that ctrlmem did not write is
#: refused unless ``force``).
EMIT_FILES = ("schedule.csv", "schedule.txt", "torchtitan.sh", "ctrlmem_torchtitan.py", "megatron.txt", "run.sh",
              "plan-row.json", "torchtitan.toml", "explorer.state.json")  # the last written by `ctrlmem plan` (the explorer's state)


def torchtitan_target(model: dict) -> tuple[str, str, bool]:
    """(config module, config function, whether it is known to be this model's) for a plan's
    model settings: torchtitan's Llama 3 config functions by shape, else ``llama3`` /
    ``llama3_8b`` to be replaced (``--torchtitan-module`` / ``--torchtitan-config``)."""
    name = _TT_LLAMA3.get((model.get("num_layers"), model.get("hidden")))
    if model.get("family") == "llama" and name:
        return "llama3", name, True
    return "llama3", "llama3_8b", False


def emit(df, out_dir: str | os.PathLike, index: int | None = None, *, torchtitan: str = TORCHTITAN_VERSION,
         tt_module: str | None = None, tt_config: str | None = None, force: bool = False) -> dict[str, str]:
    """Write row ``index`` of a plan (default: the fastest row that fits) into ``out_dir``:
    ``schedule.csv`` (torch / torchtitan CSV; for a row that recomputes also ``schedule.txt``,
    the simulated schedule with its ``R`` passes), ``torchtitan.sh`` (the torchtitan 0.3.0 launch;
    with ``ctrlmem_torchtitan.py`` when the planned split is not torchtitan's even rule),
    ``megatron.txt``, ``run.sh`` (``ctrlmem run`` and its Slurm form) and ``plan-row.json``;
    ``torchtitan="0.2"`` writes ``torchtitan.toml`` (the 0.2 job file) as well. Returns
    ``{kind: path}``. Paths inside the files are ``out_dir`` as given (relative paths mean the
    current directory). ``tt_module`` / ``tt_config``: the config function of your model in
    torchtitan (``torchtitan.models.<module>.config_registry.<config>``). Every file is written
    atomically; a file of those names that ctrlmem did not write is refused unless ``force``
    (:func:`ctrlmem.util.fileio.check_output_folder`)."""

    if torchtitan not in (TORCHTITAN_VERSION, "0.2"):
        raise ValueError(f"torchtitan {torchtitan!r}: the launch is written for {TORCHTITAN_VERSION} (default), or "
                         "0.2 for its TOML job file")
    check_output_folder(out_dir, EMIT_FILES, force, "--emit")
    if index is None:
        ok = df.index[df["status"] == "ok"]
        if len(ok) == 0:
            raise ValueError("no configuration of the plan fits; nothing to emit (more GPUs or GB, a smaller batch, "
                             "or --reserve-gb 0)")
        index = int(ok[0])
    row = df.iloc[index]
    if row["status"] not in ("ok", "bounded") or not row["fits"]:
        raise ValueError(f"row {index} does not fit ({row['status']}: {row['reason']}); emit a row that fits")
    schedule, costs = row_schedule(df, index)
    guess_module, guess_config, known = torchtitan_target(df.attrs["settings"]["model"])
    given = tt_module is not None or tt_config is not None
    tt_module, tt_config = tt_module or guess_module, tt_config or guess_config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_rel = os.path.join(str(out_dir), "schedule.csv")
    paths = {"csv": str(out / "schedule.csv"), "torchtitan": str(out / "torchtitan.sh"),
             "megatron": str(out / "megatron.txt"), "run": str(out / "run.sh"), "row": str(out / "plan-row.json")}
    schedule.to_torch_csv(paths["csv"])
    s = df.attrs["settings"]
    L = int(s["model"]["num_layers"])
    split = row.get("layer_split")
    layers = parse_split_text(split) if isinstance(split, str) and split else _even_rule(L, schedule.num_stages)
    rc = row.get("recompute") if isinstance(row.get("recompute"), str) else "none"
    run_schedule = csv_rel
    if rc != "none":  # the R passes (a fused row's recompute is folded into its BW: it gets them here)
        recomputed = schedule if schedule.recomputes else with_recompute(schedule, rc)
        paths["text"] = str(out / "schedule.txt")
        atomic_write(paths["text"], recomputed.to_text() + "\n")
        run_schedule = os.path.join(str(out_dir), "schedule.txt")
    ep = int(row["ep"]) if row.get("ep") == row.get("ep") and row.get("ep") else 1
    header = (f"written by `ctrlmem plan` for torchtitan {TORCHTITAN_VERSION}: {s['model']['name']} on {s['gpus']} "
              f"GPUs of {s['gpu_memory_gb']:g} GB, global batch {s['global_batch']}\n"
              f"row {index}: {row['method']} at DP {row['dp']}, TP {row['tp']}, PP {row['pp']}, EP {ep}, microbatch "
              f"{row['microbatch_size']}, m = {row['m']}, recompute {rc}, layers per stage {split or layers}\n"
              + (f"predicted {row['samples_per_s']:.4g} samples/s" if row["samples_per_s"] == row["samples_per_s"]
                 else "not simulated (bounded)")
              + f", {row['total_gb']:.1f} GB per GPU ({s['costs_description']})"
              + ("" if known or given else f"\nset TT_MODULE / TT_CONFIG (or --torchtitan-module / --torchtitan-config)"
                 f" to your model's torchtitan config function: {tt_module}.{tt_config} is a stand-in"))
    over = launch_overrides(schedule, csv_rel, dp=int(row["dp"]), tp=int(row["tp"]), ep=ep,
                            microbatch_size=int(row["microbatch_size"]), seq_len=int(s["model"]["seq_len"]),
                            distributed_optimizer=bool(row["dist_opt"]), layers=layers, num_layers=L)
    split_module = None
    if layers != _even_rule(L, schedule.num_stages):
        paths["torchtitan_config"] = str(out / "ctrlmem_torchtitan.py")
        split_module = os.path.join(str(out_dir), "ctrlmem_torchtitan.py")
        atomic_write(paths["torchtitan_config"], config_function(torchtitan_modules(layers), tt_module, tt_config))
    world = int(row["dp"]) * int(row["tp"]) * int(row["pp"])
    atomic_write(paths["torchtitan"], launch_script(over, recompute=rc, world=world,
                                                       gpus_per_node=int(s.get("gpus_per_node", 8)), module=tt_module,
                                                       config=tt_config, split_module=split_module, header=header,
                                                       split_backward=schedule.split_backward))
    os.chmod(paths["torchtitan"], 0o755)
    atomic_write(paths["megatron"], megatron_args(row, s, layers, str(row["placement"]), schedule.split_backward))
    if torchtitan == "0.2":
        paths["toml"] = str(out / "torchtitan.toml")
        text = toml_fragment(schedule, csv_rel, dp=int(row["dp"]), tp=int(row["tp"]),
                             microbatch_size=int(row["microbatch_size"]), seq_len=int(s["model"]["seq_len"]),
                             distributed_optimizer=bool(row["dist_opt"]), num_layers=L,
                             header=header.replace(f"torchtitan {TORCHTITAN_VERSION}", "torchtitan 0.2 (TOML job "
                                                   "file)") + "\nmerge these sections into your torchtitan job "
                                                   "config (model, optimizer and data sections are yours)",
                             recompute=rc)
        atomic_write(paths["toml"], text)
    atomic_write(paths["run"], run_lines(row, run_schedule, s, str(out_dir)))
    record = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.to_dict().items()}
    record = {k: (v.item() if hasattr(v, "item") else v) for k, v in record.items()}
    atomic_write(paths["row"], json.dumps({"row": record, "index": index, "settings": s,
                                              "torchtitan_version": TORCHTITAN_VERSION,
                                              "torchtitan_schedule": torchtitan_schedule(schedule)[0],
                                              "layers_per_stage": layers, "megatron_layout": megatron_layout(layers),
                                              "module_fqns_per_model_part": torchtitan_modules(layers),
                                              "costs_ms": costs.to_dict()}, indent=1, default=str) + "\n")
    record_outputs(out, EMIT_FILES)
    return paths
