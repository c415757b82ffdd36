"""Run the planner's answer: the winner's torch CSV, a torchtitan TOML fragment, and the
``ctrlmem run`` / Slurm line for the same configuration (``ctrlmem plan --emit DIR``).

torchtitan runs a schedule CSV (``[parallelism] pipeline_parallel_schedule_csv``) with torch's
``_PipelineScheduleRuntime``, but it places the stages on the ranks from
``pipeline_parallel_schedule``: a single-stage schedule class (``1F1B``) puts stage ``r`` on rank
``r``; ``ZBVZeroBubble`` (and ``DualPipeV``) put stages ``r`` and ``2p − 1 − r`` on rank ``r``;
any other multi-stage class (``Interleaved1F1B``) puts stages ``r, r + p, …`` on rank ``r``. The
name must therefore match the CSV's placement (:func:`torchtitan_schedule`); with a wrong one
torchtitan deadlocks, aborts in gloo/NCCL or runs the wrong layers on a rank.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path

from ctrlmem.model.ir import Schedule

__all__ = ["torchtitan_schedule", "toml_fragment", "emit", "run_lines", "TORCHTITAN_NAMES"]

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
                  distributed_optimizer: bool, num_layers: int | None = None, header: str = "") -> str:
    """The ``[parallelism]`` / ``[training]`` / ``[activation_checkpoint]`` lines of a torchtitan
    job config that run ``schedule`` from ``csv_path`` (see the module doc)."""
    name, why = torchtitan_schedule(schedule)
    p, m, v = schedule.num_devices, schedule.num_microbatches, schedule.placement.num_chunks
    lines = []
    if header:
        lines += [_comment(header), ""]
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
        '# the plan assumes every activation is kept (no recomputation)',
        'mode = "none"',
        "",
    ]
    return "\n".join(lines)


def _runtime_model(name: str) -> str | None:
    lower = name.lower()
    return lower if lower in ("9.6b", "21b", "38.5b", "98.5b") else None


def run_lines(row, csv_path: str, settings: dict, out_dir: str) -> str:
    """The ``ctrlmem run`` command (and its Slurm form) for a plan row, as a shell script with
    comments naming what ``ctrlmem run`` cannot reproduce (tensor parallelism, a custom model)."""
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
    from ctrlmem.model import paper

    return paper.MODELS[{"9.6b": "9.6B", "21b": "21B", "38.5b": "38.5B", "98.5b": "98.5B"}[preset]].num_layers


EMIT_FILES = ("schedule.csv", "torchtitan.toml", "run.sh", "plan-row.json")
"""What :func:`emit` writes into its folder."""


def emit(df, out_dir: str | os.PathLike, index: int | None = None, force: bool = False) -> dict[str, str]:
    """Write row ``index`` of a plan (default: the fastest row that fits) into ``out_dir``:
    ``schedule.csv`` (torch / torchtitan CSV), ``torchtitan.toml``, ``run.sh`` (``ctrlmem run``
    and its Slurm form) and ``plan-row.json``, each atomically. Returns ``{kind: path}``. Paths
    inside the files are ``out_dir`` as given (relative paths mean the current directory). A file
    of those names that ctrlmem did not write is refused unless ``force``
    (:func:`ctrlmem.util.fileio.check_output_folder`)."""
    from ctrlmem.planner.core import row_schedule
    from ctrlmem.util.fileio import atomic_write, check_output_folder, record_outputs

    check_output_folder(out_dir, EMIT_FILES, force, "--emit")

    if index is None:
        ok = df.index[df["status"] == "ok"]
        if len(ok) == 0:
            raise ValueError("no configuration of the plan fits; nothing to emit (more GPUs or GB, a smaller batch, "
                             "or --reserve-gb 0)")
        index = int(ok[0])
    row = df.iloc[index]
    if row["status"] not in ("ok", "bounded"):
        raise ValueError(f"row {index} does not fit ({row['status']}: {row['reason']}); emit a row that fits")
    schedule, costs = row_schedule(df, index)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_rel = os.path.join(str(out_dir), "schedule.csv")
    paths = {"csv": str(out / "schedule.csv"), "toml": str(out / "torchtitan.toml"), "run": str(out / "run.sh"),
             "row": str(out / "plan-row.json")}
    schedule.to_torch_csv(paths["csv"])
    s = df.attrs["settings"]
    header = (f"torchtitan fragment written by `ctrlmem plan`: {s['model']['name']} on {s['gpus']} GPUs of "
              f"{s['gpu_memory_gb']:g} GB, global batch {s['global_batch']}\n"
              f"row {index}: {row['method']} at DP {row['dp']}, TP {row['tp']}, PP {row['pp']}, microbatch "
              f"{row['microbatch_size']}, m = {row['m']}\n"
              + (f"predicted {row['samples_per_s']:.4g} samples/s" if row["samples_per_s"] == row["samples_per_s"]
                 else "not simulated (bounded)")
              + f", {row['total_gb']:.1f} GB per GPU ({s['costs_description']})\n"
              "merge these sections into your torchtitan job config (model, optimizer and data sections are yours)")
    text = toml_fragment(schedule, csv_rel, dp=int(row["dp"]), tp=int(row["tp"]),
                         microbatch_size=int(row["microbatch_size"]), seq_len=int(s["model"]["seq_len"]),
                         distributed_optimizer=bool(row["dist_opt"]), num_layers=int(s["model"]["num_layers"]),
                         header=header)
    atomic_write(paths["toml"], text)
    atomic_write(paths["run"], run_lines(row, csv_rel, s, str(out_dir)))
    record = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.to_dict().items()}
    record = {k: (v.item() if hasattr(v, "item") else v) for k, v in record.items()}
    atomic_write(paths["row"], json.dumps({"row": record, "index": index, "settings": s,
                                          "torchtitan_schedule": torchtitan_schedule(schedule)[0],
                                          "costs_ms": costs.to_dict()}, indent=1, default=str) + "\n")
    record_outputs(out, EMIT_FILES)
    return paths
