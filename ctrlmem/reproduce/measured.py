"""Artifacts measured for real on this machine: activation-memory ratios from CPU (gloo) runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctrlmem.model import paper
from ctrlmem.model.paper import NOT_RECOVERED
from ctrlmem.reproduce.table import Cell, Table
from ctrlmem.experiments import load_config, read_records, real_run_available, run_sweep


def cpu_real_memory(quick: bool, root: str | Path | None = None) -> Table:
    """Runs ``<root>/experiments/cpu_real_memory.yaml`` (root: the current directory unless given)."""

    t = Table("cpu-real-memory", "Measured on CPU — activation memory ratios from real runs",
              "Ran experiments/cpu_real_memory.yaml through `ctrlmem sweep` (real gloo runs of `ctrlmem run`, "
              "p = 4, m = 8, tiny GPT, the schedules one after the other in one launch) and divided each "
              "schedule's peak of autograd-saved activation bytes by "
              "1F1B's; the paper column is the exact-values table's exact ratio (peak in a / p).")
    ok, why = real_run_available()
    if not ok:
        t.cells.append(Cell("all schedules", "peak activation / 1F1B", NOT_RECOVERED, f"not available: {why}", "–"))
        return t
    config_path = Path(root or ".") / "experiments" / "cpu_real_memory.yaml"
    if not config_path.is_file():
        raise ValueError(f"cpu-real-memory runs {config_path}, which does not exist; run `ctrlmem reproduce` from the "
                         f"repository folder or give it with --root DIR")
    cfg = load_config(config_path)
    summary = run_sweep(cfg, extra_params={"quick": True} if quick else None, root=root)
    records: dict[str, dict] = {}
    for r in read_records(summary.results_dir):
        if r["run_id"] not in summary.statuses:
            continue
        runs = (r.get("result") or {}).get("runs")
        if runs is None and r["params"].get("schedules"):  # the launch of several failed as a whole
            t.cells.append(Cell(str(r["params"]["schedules"]), "peak activation / 1F1B", NOT_RECOVERED,
                                f"{r['status']}: {r.get('error') or 'no result'}", "–"))
            continue
        if runs is None:  # one schedule per point (a grid over 'schedule')
            records[r["params"]["schedule"]] = r
            continue
        for name, sub in runs.items():  # several schedules in one launch
            records[name] = {"status": sub.get("status", "failed"), "result": sub, "error": sub.get("failure")}
    ref = (records.get("1f1b") or {}).get("result") or {}
    p = int(cfg.params["p"])
    for name, rec in records.items():
        res = rec.get("result") or {}
        try:
            paper_ratio: Any = paper.table_a_memory(name, p) / p
        except ValueError:
            paper_ratio = NOT_RECOVERED
        if rec["status"] != "ok" or "peak_saved_bytes_max" not in res or "peak_saved_bytes_max" not in ref:
            why_not = rec.get("error") or "no peak_saved_bytes in the result"
            t.cells.append(Cell(name, "peak activation / 1F1B", paper_ratio, f"{rec['status']}: {why_not}", "–"))
            continue
        how = "measured on CPU (gloo; autograd saved tensors, max over ranks)"
        t.cells.append(Cell(name, "peak activation / 1F1B", paper_ratio,
                            res["peak_saved_bytes_max"] / ref["peak_saved_bytes_max"], how))
        if "peak_alloc_bytes_max" in res and "peak_alloc_bytes_max" in ref:
            t.cells.append(Cell(name, "allocator peak / 1F1B", NOT_RECOVERED,
                                res["peak_alloc_bytes_max"] / ref["peak_alloc_bytes_max"],
                                "measured on CPU (gloo; allocator profile, max over ranks)"))
    return t
