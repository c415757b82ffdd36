"""``ctrlmem plan``: the fastest configuration that fits, printed, written as CSV/JSON, and
(``--emit DIR``) turned into a torch CSV, a torchtitan 0.3.0 launch script, Megatron arguments and a
``ctrlmem run`` line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from ctrlmem.cli.args import CliError, float_arg, int_arg
from ctrlmem.planner.core import DEFAULT_SCHEDULES, MAX_GPU_MEMORY_GB, MAX_GPUS, plan
from ctrlmem.planner.emit import EMIT_FILES, emit
from ctrlmem.planner.sources import LayerCosts, cost_source
from ctrlmem.util.fileio import atomic_write, check_output_folder, make_output_folder, record_outputs

__all__ = ["add_commands", "format_table", "write_plan"]

SHOW = [("rank", "rank", "{:>4.0f}"), ("schedule", "schedule", "{:<12}"), ("dp", "DP", "{:>3}"),
        ("tp", "TP", "{:>3}"), ("pp", "PP", "{:>3}"), ("ep", "EP", "{:>3}"), ("recompute", "recomp", "{:<6}"),
        ("offload", "offl", "{:>4g}"), ("microbatch_size", "mb", "{:>3}"), ("m", "m", "{:>4}"),
        ("samples_per_s", "samples/s", "{:>9.4g}"), ("mfu", "MFU %", "{:>6.1%}"), ("bubble_rate", "bubble", "{:>6.3f}"),
        ("step_s", "step s", "{:>7.3f}"), ("total_gb", "GB/GPU", "{:>6.1f}"), ("activation_gb", "act GB", "{:>6.1f}"),
        ("status", "status", "{:<12}"), ("layer_split", "layers per stage", "{:<16}")]


def _cell(fmt: str, value) -> str:
    spec = fmt.split(":")[1].split(".")[0] if ":" in fmt else ""
    width = int("".join(c for c in spec if c.isdigit()) or 0)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–".rjust(width)
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value).rjust(width)


def format_table(df, rows: int = 15) -> str:
    """The first ``rows`` rows of a plan as aligned text."""
    head = df.head(rows)
    widths = [len(_cell(fmt, head.iloc[0][col])) if len(head) else len(title) for col, title, fmt in SHOW]
    titles = "  ".join(title.rjust(w) if not fmt.startswith("{:<") else title.ljust(w)
                       for (col, title, fmt), w in zip(SHOW, widths))
    lines = [titles]
    for _, r in head.iterrows():
        cells = [_cell(fmt, r[col]) for col, _, fmt in SHOW]
        cells = [c.rjust(w) if not fmt.startswith("{:<") else c.ljust(w) for c, (_, _, fmt), w in zip(cells, SHOW, widths)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def best_per_schedule(df):
    ok = df[df["status"] == "ok"]
    return ok.groupby("schedule", sort=False).head(1)


def _lever_words(r) -> str:
    """What the row's levers save, in words (empty without levers)."""
    parts = [f"recompute saves {r['recompute_saved_gb']:.1f}" if r.get("recompute") not in (None, "none") else "",
             f"offload {r['offload']:g} saves {r['offload_saved_gb']:.1f}" if r.get("offload") else ""]
    parts = [x for x in parts if x]
    if not parts:
        return ""
    return f" ({', '.join(parts)} GB; they add {r['lever_s']:.3f} s to the pipeline)"


def winner_memory(df) -> str:
    """The fastest fitting row's memory on its fullest GPU, term by term."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return ""
    r = ok.iloc[0]
    recv = df.attrs["settings"]["allocator"]["ratio"] == 1.0
    experts = f" (experts {r['expert_params_gb']:.1f})" if r.get("expert_params_gb") else ""
    return (f"memory of the fastest row's fullest GPU (device {int(r['device'])} of the pipeline): params {r['params_gb']:.1f}"
            f"{experts} + grads {r['grads_gb']:.1f} + optimizer {r['optimizer_gb']:.1f} + activation "
            f"{r['activation_gb']:.1f}" + _lever_words(r) + " + " + (f"receive buffers {r['recv_gb']:.1f} + " if recv else "")
            + f"allocator margin {r['margin_gb']:.1f}" + (f" + reserve {r['reserve_gb']:.1f}" if r["reserve_gb"] else "")
            + f" = {r['total_gb']:.1f} GB of {r['gpu_memory_gb']:g}"
            + ("" if recv else f" (receive buffers {r['recv_gb']:.1f} GB inside the measured margin)"))


PLAN_FILES = ("plan.csv", "plan.json")
"""What :func:`write_plan` writes into its folder."""


def write_plan(df, out_dir: str, force: bool = False) -> tuple[str, str]:
    """``out_dir/plan.csv`` (every row) and ``out_dir/plan.json`` (settings, assumptions, notes
    and every row), each atomically (a failed write keeps the old file and names it); a file of
    those names that ctrlmem did not write is refused unless ``force``."""

    check_output_folder(out_dir, PLAN_FILES, force, "--out")
    make_output_folder(out_dir)
    csv_path, json_path = os.path.join(out_dir, "plan.csv"), os.path.join(out_dir, "plan.json")
    atomic_write(csv_path, df.to_csv(index=False))
    payload = {k: df.attrs.get(k) for k in ("settings", "assumptions", "notes", "skipped", "seconds", "builds",
                                           "build_hits", "build_s")}
    payload["rows"] = json.loads(df.to_json(orient="records"))
    atomic_write(json_path, json.dumps(payload, indent=1) + "\n")
    record_outputs(out_dir, PLAN_FILES)
    return csv_path, json_path


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out`` and ``--emit``, checked before the plan runs (a file where a folder goes, a
    read-only folder, a user's file in the way without ``--force``, an empty name)."""
    check_output_folder(args.out, PLAN_FILES, args.force, "--out")
    if args.emit is not None:
        check_output_folder(args.emit, EMIT_FILES, args.force, "--emit")


def _yes_no_both(text: str):

    t = str(text).lower()
    if t in ("yes", "true", "1", "on"):
        return True
    if t in ("no", "false", "0", "off"):
        return False
    if t == "both":
        return "both"
    raise CliError(f"--distributed-optimizer takes yes, no or both, got {text!r}")


def _cmd_plan(args: argparse.Namespace) -> int:

    _check_outputs(args)
    source = cost_source(args.costs_from, p2p_gbs=args.p2p_gbs)
    if args.peak_tflops is not None:
        if not isinstance(source, LayerCosts):
            raise CliError("--peak-tflops goes with per-layer costs (--costs-from F,B,W[,HOP]); the A100 model and "
                           "replays know their GPU's peak")
        source = LayerCosts(source.f, source.b, source.w, source.hop_s, args.peak_tflops)
    allocator = {"replay": "replay", "none": None}.get(args.allocator_margin, args.allocator_margin)
    if allocator not in ("replay", None) and not os.path.isfile(allocator):
        raise CliError(f"--allocator-margin {allocator!r}: give replay (the shipped H200 measurement), none, or a "
                       "replay.json that `ctrlmem replay` wrote")
    df = plan(args.model, args.gpus, args.gpu_memory_gb, args.global_batch, costs=source, seq_len=args.seq_len,
              layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab, schedules=args.schedules,
              microbatch_sizes=args.microbatch_sizes, tp=args.tp, pp=args.pp, min_pp=args.min_pp,
              distributed_optimizer=_yes_no_both(args.distributed_optimizer),
              flash_attention=not args.no_flash_attention,
              allocator=allocator, reserve_gb=args.reserve_gb, dp_gbs=args.dp_gbs, gpus_per_node=args.gpus_per_node,
              exhaustive=args.exhaustive, top=args.per_schedule,
              progress=not args.no_progress and sys.stderr.isatty(), layer_split=args.layer_split, ep=args.ep,
              recompute=args.recompute, nvlink_gbs=args.nvlink_gbs, ib_gbs=args.ib_gbs, offload=args.offload,
              host_gbs=args.host_gbs)
    a = df.attrs
    s = a["settings"]
    counts = df["status"].value_counts()
    words = {"ok": "simulated and fit", "bounded": "bounded (fit, not simulated)", "does not fit": "do not fit",
             "m < pp": "with m < pp", "too many stages": "with too many stages"}
    status = ", ".join(f"{int(counts[k])} {w}" for k, w in words.items() if k in counts)
    unsure = int(((df["status"] == "bounded") & ~df["fits"]).sum())
    if unsure:  # recomputing rows below one microbatch per device, not built
        status += f" ({unsure} of the bounded not known to fit)"
    if args.json:
        payload = {k: a.get(k) for k in ("settings", "assumptions", "notes", "skipped", "seconds", "builds")}
        payload["rows"] = json.loads(df.to_json(orient="records"))
        print(json.dumps(payload, indent=1))
    else:
        m = s["model"]
        print(f"ctrlmem plan: {m['name']} ({m['num_layers']} layers, h {m['hidden']}, seq {m['seq_len']}, "
              f"{s['model_params'] / 1e9:.2f}B parameters"
              + (f", {s['model_active_params'] / 1e9:.2f}B active" if m.get("experts") else "") + ") on "
              f"{s['gpus']} GPUs × {s['gpu_memory_gb']:g} GB, global batch {s['global_batch']}; "
              f"{s['costs_description']}")
        print(f"searched {len(df)} configurations in {a['seconds']:.1f} s ({a['builds']} schedule builds, "
              f"{a['build_hits']} reused; {status}); ranked by predicted samples/s")
        print()
        print(format_table(df, args.top))
        best = best_per_schedule(df)
        if len(best):
            print()
            print("best per schedule:")
            print(format_table(best, len(best)))
        print()
        line = winner_memory(df)
        if line:
            print(line)
        for note in a["notes"]:
            print(f"* {note}")
        print()
        print("assumed:")
        for line in a["assumptions"]:
            print(f"  - {line}")
        if a["skipped"]:
            print("not planned: " + "; ".join(a["skipped"]))
    csv_path, json_path = write_plan(df, args.out, args.force)
    print(f"wrote {csv_path} and {json_path}", file=sys.stderr if args.json else sys.stdout)
    if args.emit is not None:
        paths = emit(df, args.emit, force=args.force, torchtitan=args.emit_torchtitan, tt_module=args.torchtitan_module,
                     tt_config=args.torchtitan_config)
        print("wrote " + ", ".join(v for k, v in paths.items() if k != "row") + " (the fastest configuration that fits)",
              file=sys.stderr if args.json else sys.stdout)
        from ctrlmem.explorer.views import plan_state  # noqa: PLC0415 - loads plotly: only with --emit

        state = os.path.join(args.emit, "explorer.state.json")
        atomic_write(state, json.dumps(plan_state(df), indent=1, sort_keys=True).encode("utf-8"))
        print(f"wrote {state} (the winner in the explorer: its load state, or ctrlmem draw --state {state} -o "
              "winner.png)", file=sys.stderr if args.json else sys.stdout)
        with open(paths["row"]) as fh:
            rec = json.load(fh)
        mods = rec["module_fqns_per_model_part"]
        short = " | ".join(f"{p[0]}…{p[-1]}" if len(p) > 2 else ",".join(p) for p in mods)
        print(f"layers per stage {rec['layers_per_stage']}; Megatron --pipeline-model-parallel-layout "
              f"{rec['megatron_layout']}; torchtitan module split: {short}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def add_commands(subparsers) -> None:
    """Add ``plan`` to the ``ctrlmem`` command line."""
    p = subparsers.add_parser(
        "plan", help="the fastest DP × TP × PP, microbatch and schedule that fits N GPUs of G GB",
        description="Rank every DP × TP × PP factorization, microbatch size and schedule by predicted throughput "
                    "(simulated per-stage pass costs) with the memory per GPU in GB; rows that do not fit are kept "
                    "and marked. Writes OUT/plan.csv and OUT/plan.json; --emit DIR writes the winner's torch CSV, a "
                    "torchtitan TOML fragment and its `ctrlmem run` line. See docs/plan.md.")
    p.add_argument("--model", default="98.5b",
                   help="a paper preset (9.6b, 21b, 38.5b, 98.5b), the path of a Hugging Face config.json (Llama, "
                        "Mistral, Qwen2/3, Mixtral, Qwen-MoE, DeepSeek-V2/V3), or 'custom' with --layers/--hidden/"
                        "--heads (default 98.5b)")
    p.add_argument("--layers", type=int_arg(1, 1_000_000), default=None, help="transformer layers (custom model, or override)")
    p.add_argument("--hidden", type=int_arg(1, 10_000_000), default=None, help="hidden size (custom model, or override)")
    p.add_argument("--heads", type=int_arg(1, 1_000_000), default=None, help="attention heads (custom model, or override)")
    p.add_argument("--vocab", type=int_arg(1, 100_000_000), default=None, help="vocabulary (default 50257)")
    p.add_argument("--seq-len", type=int_arg(1, 10_000_000), default=None, help="sequence length (default 1024)")
    p.add_argument("--gpus", type=int_arg(1, MAX_GPUS), required=True, help="number of GPUs N (DP × TP × PP = N)")
    p.add_argument("--gpu-memory-gb", type=float_arg(maximum=MAX_GPU_MEMORY_GB, what="GB"), required=True, help="memory of one GPU, GB (1e9 bytes)")
    p.add_argument("--global-batch", type=int_arg(1, 100_000_000), default=None,
                   help="sequences per step (default: the paper's for its presets)")
    p.add_argument("--costs-from", default="a100",
                   help="a100 (the paper's A100 cost model, default), h200 (the shipped H200 rank replay), a "
                        "replay.json of `ctrlmem replay`, or F,B,W[,HOP]: seconds per layer and sequence, hop seconds")
    p.add_argument("--peak-tflops", type=float_arg(maximum=1e9, what="TFLOP/s"), default=None, help="GPU peak for MFU with per-layer costs")
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                   help="comma-separated schedules; NAME@X fixes a budgeted one's limit (zb@1.0 = ZB-1P); "
                        "v-shape / zb alone take the budget the remaining memory allows")
    p.add_argument("--microbatch-sizes", default=None, help="comma-separated candidates (default 1,2,4,8, or the "
                                                            "replayed ones)")
    p.add_argument("--tp", default=None, help="comma-separated TP candidates (default 1,2,4,8 within a node)")
    p.add_argument("--pp", default=None, help="comma-separated PP candidates (default every divisor >= --min-pp)")
    p.add_argument("--min-pp", type=int_arg(1, MAX_GPUS), default=2, help="smallest pipeline (default 2)")
    p.add_argument("--distributed-optimizer", default="yes",
                   help="yes (default: optimizer states sharded over DP), no, or both")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="activation 34·h + 5·heads·s bytes per layer and token (default 34·h, FlashAttention)")
    p.add_argument("--allocator-margin", default="replay",
                   help="replay (measured on the shipped H200 replay, default), none, or a replay.json")
    p.add_argument("--reserve-gb", type=float_arg(False, MAX_GPU_MEMORY_GB, "GB", minimum=0.0), default=0.0,
                   help="GB per GPU for the CUDA context, NCCL buffers, fragmentation (default 0)")
    p.add_argument("--dp-gbs", type=float_arg(maximum=1e9, what="GB/s"), default=25.0, help="data-parallel gradient bandwidth, GB/s (default 25)")
    p.add_argument("--p2p-gbs", type=float_arg(maximum=1e9, what="GB/s"), default=None, help="pipeline hop bandwidth, GB/s (default 25)")
    p.add_argument("--gpus-per-node", type=int_arg(1, MAX_GPUS), default=8, help="GPUs per node (TP stays within one; default 8)")
    p.add_argument("--layer-split", default="auto", choices=["auto", "balanced", "even"],
                   help="layers per stage: balanced (the busiest device's time, embedding and head included), even "
                        "(torchtitan's rule) or auto (balanced for a config.json model, even for the presets)")
    p.add_argument("--ep", default=None, help="comma-separated expert-parallel candidates (MoE; default every degree "
                                               "dividing the experts and DP × TP)")
    p.add_argument("--recompute", default="auto",
                   help="comma-separated levers among none, selective, full (default auto: none,full for a config.json "
                        "model, none for the presets)")
    p.add_argument("--offload", default="none",
                   help="comma-separated activation-offload levers: none and fractions in (0, 1] of each forward's "
                        "activation copied to host and back (default none; e.g. none,0.5,1)")
    p.add_argument("--host-gbs", type=float_arg(maximum=1e9, what="GB/s"), default=None,
                   help="host-link GB/s per direction for the offload copies (default: the GPU kind's, A100 25, "
                        "H100/H200 50; scripts/gpu-check.sh measures yours)")
    p.add_argument("--nvlink-gbs", type=float_arg(maximum=1e9, what="GB/s"), default=150.0,
                   help="MoE all-to-all bandwidth per GPU within a node, GB/s (default 150)")
    p.add_argument("--ib-gbs", type=float_arg(maximum=1e9, what="GB/s"), default=25.0,
                   help="MoE all-to-all bandwidth per GPU across nodes, GB/s (default 25)")
    p.add_argument("--exhaustive", action="store_true",
                   help="simulate every configuration that fits (default: skip those whose no-bubble bound cannot "
                        "beat their schedule's best, marked bounded)")
    p.add_argument("--per-schedule", type=int_arg(1, 1_000_000), default=1,
                   help="configurations per schedule guaranteed simulated and ranked exactly (default 1: its best)")
    p.add_argument("--top", type=int_arg(1, 1_000_000), default=15, help="rows to print (default 15)")
    p.add_argument("--out", default="build/plan", help="folder for plan.csv and plan.json (default build/plan)")
    p.add_argument("--emit", metavar="DIR", default=None,
                   help="write the winner's schedule.csv, torchtitan.sh (torchtitan 0.3.0 launch), megatron.txt, "
                        "run.sh and explorer.state.json (the winner in the explorer) into DIR")
    p.add_argument("--emit-torchtitan", default="0.3.0", choices=["0.3.0", "0.2"],
                   help="torchtitan release to write for (0.2 adds its TOML job file torchtitan.toml)")
    p.add_argument("--torchtitan-module", default=None,
                   help="torchtitan config module of your model (torchtitan.models.<M>.config_registry; default "
                        "llama3)")
    p.add_argument("--torchtitan-config", default=None,
                   help="torchtitan config function in that module (default: llama3_8b / llama3_70b / llama3_405b "
                        "for those Llama 3 shapes, else llama3_8b as a stand-in the script says to replace)")
    p.add_argument("--force", action="store_true",
                   help="replace files in --out / --emit that ctrlmem did not write there (refused by default)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_plan)
