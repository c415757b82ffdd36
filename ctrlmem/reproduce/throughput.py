"""Throughput artifacts predicted on the A100 cost model: Table 4 (pure pipeline parallelism) and
Table 3 (the 98.5B grid search and the '16 %' claim, through the planner ``cm.plan``; also with the
H200 rank replay's pass costs)."""

from __future__ import annotations


from pathlib import Path

from ctrlmem.model import paper
from ctrlmem.model.paper import NOT_RECOVERED
from ctrlmem.reproduce.common import how_for, is_registered
from ctrlmem.reproduce.table import Cell, Table, write_json, pending
from ctrlmem.experiments import simulate_point
import ctrlmem as cm
from ctrlmem.model.replayfile import default_replay_path, gpu_label, load_replay

TABLE4_METHODS = {
    # paper method -> (schedule, build kwargs)
    "1F1B": ("1f1b", {}),
    "1F1B-R": ("1f1b-r", {}),
    "ZB-1P": ("zb", {"memory_limit": 1.0}),
    "V-Min": ("v-min", {}),
    "V-Half": ("v-half", {}),
    "V-ZB": ("v-zb", {}),
}


def _point(name: str, model: str, p: int, m: int, mb: int, **kw) -> dict:

    return simulate_point(name, p, m, costs="paper", model=model, microbatch_size=mb, **kw)


TABLE4_METRICS = (
    ("bubble_percent", "Bubble rate (%)"),
    ("activation_gb", "Activation memory (GB)"),
    ("total_memory_gb", "Total memory (GB)"),
    ("mfu_percent", "MFU (%)"),
)
THROUGHPUT_GROUP = "Throughput / 1F1B's (paper: MFU ratio where both cells are known)"


def table4(quick: bool) -> Table:
    """Table 4 in the paper's layout: one grid per metric, rows model × m, methods as columns."""
    t = Table("table4", "Table 4 — pure pipeline parallelism (predicted on the A100 cost model)",
              "Simulated each registered method on the Table 4 grid (p = #GPUs, m = p … 16p, microbatch 4/2/1) "
              "with the A100 cost model of ctrlmem.model.paper; compared bubble rate, activation memory, total memory "
              "and MFU with the paper's known cells and per-method ranges (ranges span all models and m). "
              "GPU-measured activation memory and throughput predicted from GPU pass costs: gpu-replay.md.",
              grid=True, row_label="model, m")
    how = f"simulated, A100 cost model ({paper.DEFAULT_EFFICIENCY:.0%} of peak, seq {paper.ASSUMED_SEQ_LEN})"
    ratios = []
    for model, (p, mb, ms) in paper.TABLE4_SETUP.items():
        if quick:
            ms = (ms[0], ms[-1])
        for m in ms:
            base = None
            row = f"{model} m={m}"
            for label, (name, kw) in TABLE4_METHODS.items():
                if not is_registered(name):
                    for _key, group in TABLE4_METRICS:
                        t.cells.append(Cell(row, label, NOT_RECOVERED, pending(name),
                                            f"no generator for {name!r} in ctrlmem", group=group))
                    continue
                r = _point(name, model, p, m, mb, **kw)
                ours = {"bubble_percent": 100 * r["bubble_rate"], "activation_gb": r["activation_gb"],
                        "total_memory_gb": r["total_memory_gb"], "mfu_percent": 100 * r["mfu_predicted"]}
                for key, group in TABLE4_METRICS:
                    pv = paper.TABLE4_CELLS.get((model, m, label, key), paper.TABLE4_RANGES.get((label, key),
                                                                                               NOT_RECOVERED))
                    t.cells.append(Cell(row, label, pv, ours[key], how_for(name, how), group=group))
                if label == "1F1B":
                    base = r
                elif base is not None:
                    mine = paper.TABLE4_CELLS.get((model, m, label, "mfu_percent"))
                    ref = paper.TABLE4_CELLS.get((model, m, "1F1B", "mfu_percent"))
                    t.cells.append(Cell(row, label, round(mine / ref, 4) if mine and ref else NOT_RECOVERED,
                                        base["makespan"] / r["makespan"], how_for(name, how), group=THROUGHPUT_GROUP))
                    if label == "V-ZB":
                        ratios.append(base["makespan"] / r["makespan"])
    # "7 % to 55 %": best V method over 1F1B (V-ZB), over the grid above
    if ratios:
        group = "The abstract's '7 % to 55 %' (assumed: V-ZB / 1F1B throughput over Table 4)"
        t.cells.append(Cell("V-ZB / 1F1B over the grid", "min", 1.07, min(ratios), how, group=group))
        t.cells.append(Cell("V-ZB / 1F1B over the grid", "max", 1.55, max(ratios), how, group=group))
    t.notes += [
        "Paper ranges (e.g. 35–56 GB) are over all three models and every m; 'within range' means our cell "
        "lies inside the paper's range for that method, not that the matching paper cell is known.",
        "The abstract's '7 % to 55 %' is assumed to be the V-ZB / 1F1B throughput ratio across Table 4 "
        "(docs/theory.md §9.2); its exact rows were not recovered.",
        "Predicted MFU omits the optimizer step, data loading and communication not on the critical path, so it "
        "overestimates measured MFU; ratios between methods are the meaningful output.",
    ]
    return t


TABLE3_TOP = 3
"""Configurations shown per method in Table 3's artifact."""


def _plan_schedule(name: str, kw: dict) -> str:
    return f"{name}@{kw['memory_limit']:g}" if "memory_limit" in kw else name


def _config(r) -> str:
    return f"(DP, TP, PP, mb) = ({r['dp']}, {r['tp']}, {r['pp']}, {r['microbatch_size']})"


TABLE3_METHODS = {label: ("1f1b", {}, "full") if label == "1F1B-R" else (name, kw, "none")
                  for label, (name, kw) in TABLE4_METHODS.items()}
"""Table 3's methods on the planner: paper method -> (schedule, build kwargs, recompute lever).
1F1B-R is the planner's 1F1B row with full recomputation (each layer keeps its input, B adds the
layers' forward), the way Megatron's ``--recompute-granularity full`` runs it."""

TABLE3_HOW = {"none": "", "full": ", 1F1B with full recomputation: each layer keeps its input, B adds its forward"}


def _table3_plans(seq: int, batch: int, costs, mbs, methods: dict) -> dict:
    """The planner on the paper's 98.5B setting, one plan per recompute lever (the planner bounds
    its search per schedule): every method's configurations ranked."""

    out = {}
    for rc in dict.fromkeys(lever for _, _, lever in methods.values()):
        names = [_plan_schedule(n, kw) for n, kw, lever in methods.values() if lever == rc]
        out[rc] = cm.plan("98.5b", 40, 80.0, batch, seq_len=seq, costs=costs, schedules=names, microbatch_sizes=mbs,
                          distributed_optimizer=True, flash_attention=True, top=TABLE3_TOP, progress=False,
                          recompute=rc)
    return out


def table3(quick: bool, out: str | Path = "figures", replay: str | Path | None = None) -> Table:
    """Table 3 through the planner: ``cm.plan`` on the paper's 98.5B setting (40 GPUs of 80 GB,
    seq 1024 / batch 160 and seq 3072 / batch 640; ``quick``: seq 1024 only), every DP × TP × PP,
    microbatch 1, 2, 4 and the paper's methods, on the A100 cost model and from the H200 rank
    replay's pass costs (``replay``: another replay file); writes ``out/table3.json`` (the best
    configuration per method and setting, read by the ``claims`` artifact)."""

    replay_path = Path(replay) if replay is not None else default_replay_path()
    gpu = gpu_label(load_replay(replay_path))
    t = Table("table3", "Table 3 — 98.5B grid search and the '16 %' claim, through the planner",
              "Ran the planner (`cm.plan` / `ctrlmem plan --model 98.5b --gpus 40 --gpu-memory-gb 80`) on the paper's "
              "setting: every DP × TP × PP = 40 with TP ≤ 8, microbatch 1, 2, 4, each method's schedule simulated "
              "exactly with per-stage pass costs, memory per GPU (states with a distributed optimizer, FlashAttention "
              "activations, the H200-measured allocator margin) within 80 GB; kept the planner's top configurations "
              f"per method on the A100 cost model and from the {gpu} rank replay's pass costs, next to Table 3's "
              "best MFU and its ratios.")
    methods = {label: spec for label, spec in TABLE3_METHODS.items() if is_registered(spec[0])}
    for (seq, batch), row in paper.TABLE3.items():
        for method, mfu in row.items():
            t.cells.append(Cell(f"seq {seq} batch {batch}", f"{method} / 1F1B (paper arithmetic)",
                                NOT_RECOVERED, round(mfu / row["1F1B"], 4), "arithmetic on the paper's Table 3"))
    t.cells.append(Cell("abstract", "'16 %' = V-ZB / 1F1B at seq 1024", 1.16,
                        round(paper.TABLE3[(1024, 160)]["V-ZB"] / paper.TABLE3[(1024, 160)]["1F1B"], 3),
                        "arithmetic on the paper's Table 3 (57.58 / 49.81)"))
    mbs = (1, 2, 4)
    settings = [(1024, 160)] if quick else list(paper.TABLE3)
    evidence: dict = {"quick": quick, "settings": {}}
    for seq, batch in settings:
        where = f"seq {seq} batch {batch}"
        row = paper.TABLE3[(seq, batch)]
        record: dict = {}
        for source, costs, how0 in (("a100", "a100", "simulated, A100 cost model (planner)"),
                                    ("replay", str(replay_path), f"predicted from {gpu} pass costs (planner)")):
            plans = _table3_plans(seq, batch, costs, mbs, methods)
            best: dict[str, dict] = {}
            for label, (name, kw, lever) in TABLE3_METHODS.items():
                if label not in methods:
                    if source == "a100":
                        t.cells.append(Cell(where, f"{label} best MFU %", row[label], pending(name), "–"))
                    continue
                ok = plans[lever][plans[lever]["status"] == "ok"]
                rows = ok[ok["schedule"] == _plan_schedule(name, kw)]
                how = how0 + TABLE3_HOW[lever]
                col = f"{label} best MFU %" if source == "a100" else f"{label} best MFU % ({gpu} pass costs)"
                if rows.empty:
                    t.cells.append(Cell(where, col, row[label], "no configuration fits in 80 GB", how))
                    continue
                r = rows.iloc[0]
                best[label] = {"mfu": float(r["mfu"]), "dp": int(r["dp"]), "tp": int(r["tp"]), "pp": int(r["pp"]),
                               "microbatch_size": int(r["microbatch_size"]), "total_gb": float(r["total_gb"]),
                               "bubble_rate": float(r["bubble_rate"])}
                t.cells.append(Cell(where, col, row[label] if source == "a100" else NOT_RECOVERED, 100 * r["mfu"],
                                    f"{how}; best {_config(r)}, {r['total_gb']:.1f} GB per GPU"))
                if source == "a100":
                    for k, (_, rr) in enumerate(rows.head(TABLE3_TOP).iterrows(), start=1):
                        t.cells.append(Cell(where, f"{label} top {k} MFU % (planner)", NOT_RECOVERED,
                                            100 * rr["mfu"], f"{how}; {_config(rr)}, bubble {rr['bubble_rate']:.3f}, "
                                                             f"{rr['total_gb']:.1f} GB, rank {int(rr['rank'])} overall"))
            for label, b in best.items():
                if label != "1F1B" and "1F1B" in best:
                    ratio = b["mfu"] / best["1F1B"]["mfu"]
                    col = (f"{label} / 1F1B best MFU (predicted)" if source == "a100"
                           else f"{label} / 1F1B best MFU ({gpu} pass costs)")
                    t.cells.append(Cell(where, col, round(row[label] / row["1F1B"], 4), ratio,
                                        f"{how0}; ratio of the best configurations"))
            record[source] = best
            if source == "a100":
                _paper_setup_cells(t, where, seq, batch, mbs, how0)
        evidence["settings"][f"{seq},{batch}"] = record
    evidence["gpu"] = gpu
    write_json(Path(out) / "table3.json", evidence)
    t.notes += [
        "The planner's assumptions, stated once: docs/plan.md (pass costs per source, memory per GPU, the allocator "
        "margin measured on the H200 replay, the data-parallel gradient exchange at 25 GB/s after the pipeline, not "
        "overlapped; the optimizer step is not modelled, so predicted MFU is an upper estimate and ratios compare).",
        f"The {gpu} rows use the replay's measured 98.5B layer (device 1 at p = 40, microbatch 1: larger microbatches "
        "scale it linearly) with the LM head at its FLOP ratio to a layer, and keep the paper's 80 GB per GPU; MFU is "
        f"over the {gpu}'s peak, so only the ratios compare with the paper's.",
        "1F1B-R is the planner's 1F1B with full recomputation (recompute='full': each layer keeps only its input, "
        "2·s·b·h bytes, and its backward runs the layer's forward again first; docs/plan.md), predicted like the "
        "other methods. Table 3's microbatch and parallel grid is the paper's; the planner also tries the "
        "DP × TP × PP factorizations the paper did not list (TP ≤ 8).",
        "Best configurations per method and setting: table3.json (read by claims.md).",
    ]
    return t


def _paper_setup_cells(t: Table, where: str, seq: int, batch: int, mbs, how0: str) -> None:
    """The paper's best 1F1B setup next to the planner's, and why the planner prefers another."""

    setup = paper.TABLE3_BEST_1F1B_SETUP.get((seq, batch))
    if not setup:
        return
    ones = cm.plan("98.5b", 40, 80.0, batch, seq_len=seq, schedules=["1f1b"], microbatch_sizes=mbs,
                   distributed_optimizer=True, flash_attention=True, exhaustive=True, progress=False)
    fit = ones[ones["status"] == "ok"].reset_index(drop=True)
    key = (fit["dp"] == setup["dp"]) & (fit["tp"] == setup["tp"]) & (fit["pp"] == setup["pp"]) & (
        fit["microbatch_size"] == setup["microbatch"])
    label = f"1F1B at the paper's best setup (DP, TP, PP, mb) = ({setup['dp']}, {setup['tp']}, {setup['pp']}, " \
            f"{setup['microbatch']})"
    if not key.any():
        row = ones[(ones["dp"] == setup["dp"]) & (ones["tp"] == setup["tp"]) & (ones["pp"] == setup["pp"])
                   & (ones["microbatch_size"] == setup["microbatch"])]
        why = row.iloc[0]["reason"] if len(row) else "not in the planner's grid"
        t.cells.append(Cell(where, label, paper.TABLE3[(seq, batch)]["1F1B"], f"does not fit: {why}", how0))
        return
    mine = fit[key].iloc[0]
    rank = int(fit.index[key][0]) + 1
    top = fit.iloc[0]
    t.cells.append(Cell(where, f"{label}, MFU %", paper.TABLE3[(seq, batch)]["1F1B"], 100 * mine["mfu"],
                        f"{how0}; rank {rank} of {len(fit)} 1F1B configurations that fit, {mine['total_gb']:.1f} GB"))
    if rank == 1:
        t.notes.append(f"{where}: the planner's best 1F1B setup is the paper's, {_config(mine)}.")
        return
    eff = paper.tp_efficiency
    t.notes.append(
        f"{where}: the planner's best 1F1B setup is {_config(top)} at {100 * top['mfu']:.2f} % predicted MFU, not the "
        f"paper's {_config(mine)}, which it predicts at {100 * mine['mfu']:.2f} % (rank {rank} of {len(fit)} 1F1B "
        f"setups that fit). On the A100 cost model the paper's setup runs every pass at TP {mine['tp']}'s efficiency, "
        f"{eff(int(mine['tp'])) / eff(int(top['tp'])):.3f} of TP {top['tp']}'s (Fig. 12(a)'s single-pass MFU), its "
        f"pipeline bubble is {mine['bubble_rate']:.3f} against {top['bubble_rate']:.3f}, and its data-parallel "
        f"gradient exchange adds {mine['dp_sync_s']:.2f} s to a {mine['step_s']:.2f} s step against "
        f"{top['dp_sync_s']:.2f} s of {top['step_s']:.2f} s. The paper measured its setups on its cluster; what this "
        "model leaves out (the cost of tensor-parallel communication against pipeline hops between nodes, overlap of "
        "the gradient reduction, kernel efficiency at each shape beyond Fig. 12's four readings) can order them "
        "differently.")
