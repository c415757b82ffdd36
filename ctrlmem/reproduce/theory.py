"""Artifacts checked against closed forms and the paper's theory tables: Table 1, Table 2, the exact-values table,
the 1F1B / ZB-H1 / ZB-V closed forms, and the offsets of Tables 8 and 9."""

from __future__ import annotations

from typing import Any

from ctrlmem.model import paper
from ctrlmem.model.costs import Costs
from ctrlmem.model.paper import NOT_RECOVERED
from ctrlmem.reproduce.common import HOW_UNIT, UNIT_TAU, is_registered, simulate_named
from ctrlmem.reproduce.table import Cell, Table, pending
from ctrlmem.model.ir import Op
from ctrlmem.search import buildingblock as blocks

TABLE1_FORMULAS = {"1f1b": "p", "v-min": "⌊(p+4)/3⌋", "v-half": "⌊(p+2)/2⌋", "v-zb": "p"}


def table1(quick: bool) -> Table:
    """Table 1 against the finite-p closed forms, with the paper's p → ∞ fraction beside them."""
    ps = (8, 16, 24, 32) if quick else (8, 16, 24, 32, 48, 64)
    t = Table("table1", "Table 1 — peak memory of the V-shape blocks (fraction of 1F1B's M), finite p and p → ∞",
              f"Built each schedule at p = {', '.join(map(str, ps))} (m = 2p), simulated with F = B = W, and divided "
              "the peak by 1F1B's p·a. Each cell compares it with the finite-p closed form (peak in a over p: "
              "V-Min ⌊(p+4)/3⌋/p, V-Half ⌊(p+2)/2⌋/p, V-ZB and 1F1B p/p); Table 1's asymptotic fraction, the "
              "p → ∞ limit of these forms, stands in the first column.",
              grid=True, row_label="schedule")
    group = "Peak / M: each cell finite-p closed form | simulated"
    for name, row in paper.TABLE1.items():
        label = f"{name} ({TABLE1_FORMULAS[name]}·a)"
        t.cells.append(Cell(label, "Table 1 (p → ∞)", row["peak_fraction"], "limit of the closed form",
                            "the paper's Table 1", group=group))
        for p in ps:
            if not is_registered(name):
                t.cells.append(Cell(label, f"p = {p}", paper.table_a_memory(name, p) / p, pending(name), "–",
                                    group=group))
                continue
            r = simulate_named(name, p, 2 * p, UNIT_TAU)
            t.cells.append(Cell(label, f"p = {p}", paper.table_a_memory(name, p) / p, max(r.peak_memory) / p,
                                HOW_UNIT, group=group))
    t.notes += [
        "Comparing a finite p with the p → ∞ fraction alone would show a spurious deviation (e.g. V-Min at "
        "p = 24: 0.3750 against 1/3, 12.5 %); against the finite-p form the comparison is exact (see the agreement line).",
        "The finite-p forms are the exact values of docs/theory.md §7 (our derivation, checked with the "
        "authors' scheduler code); Table 1's l_max and T are in docs/theory.md §4.",
    ]
    return t


def table2(quick: bool) -> Table:
    t = Table("table2", "Table 2 — models (9.6B, 21B, 38.5B, 98.5B)",
              "Parameter count from layers and hidden size (12·L·h² + V·h, V = 50 257 assumed), the 2p − 2 "
              "layer rule, and the A100 cost model's pass times and 1F1B activation at the Table 4 microbatch.")
    for name in ("9.6B", "21B", "38.5B", "98.5B"):
        m = paper.model(name)
        t.cells.append(Cell(name, "parameters (B)", float(name[:-1]), paper.parameter_count(m) / 1e9,
                            "closed form 12·L·h² + V·h"))
        t.cells.append(Cell(name, "layers = 2·GPUs − 2", m.num_layers, 2 * m.num_gpus - 2, "closed form"))
        mb = m.microbatch_size or 1
        c = paper.paper_costs(m, m.num_gpus, mb)
        t.cells.append(Cell(name, f"F / B / W per device-stage, ms (mb {mb})", NOT_RECOVERED,
                            f"{c.f:.2f} / {c.b:.2f} / {c.w:.2f}", "A100 cost model (ctrlmem.model.paper)"))
        if m.microbatch_size:
            gb = m.num_gpus * paper.activation_bytes(m, m.num_layers / m.num_gpus, mb) / 1e9
            t.cells.append(Cell(name, "1F1B activation GB (Table 4 range)", paper.TABLE4_RANGES[("1F1B", "activation_gb")],
                                gb, "closed form p·a, a from 34·h + 5·heads·s bytes/token/layer"))
    for (model, mb), ms in paper.TABLE5.items():
        f, _, _ = paper.pass_times(model, 1, mb)
        t.cells.append(Cell(f"{model} (Table 5)", f"F pass of one layer, ms, mb {mb}", ms, f * 1e3,
                            f"A100 cost model at {paper.DEFAULT_EFFICIENCY:.0%} of peak"))
    return t


def table_a(quick: bool) -> Table:
    t = Table("table-a", "Exact values — peak memory and bubbles of the V schedules (our derivation, docs/theory.md §7, F = B = W, m ≥ 2p)",
              "Simulated every registered schedule on docs/theory.md's (p, m) grid with F = B = W and compared "
              "bubble rates (4 decimals), per-device bubbles in τ and peak memory in a with the closed forms.")
    names = ("1f1b", "v-min", "v-half", "v-zb")
    grid = list(paper.TABLE_A_RATES.items())
    if quick:
        grid = [g for g in grid if g[0][1] <= 4 * g[0][0]]
    for (p, m), rates in grid:
        for name in (n for n in names if n in rates):
            if not is_registered(name):
                t.cells.append(Cell(f"p={p} m={m}", f"{name} bubble rate", rates[name], pending(name), "–"))
                continue
            r = simulate_named(name, p, m, UNIT_TAU)
            t.cells.append(Cell(f"p={p} m={m}", f"{name} bubble rate", rates[name], round(r.bubble_rate, 4), HOW_UNIT))
    for p in sorted({p for (p, _m), _ in grid}):
        for name in (n for n in names if any(n in rates for (q, _m), rates in grid if q == p)):
            if not is_registered(name):
                t.cells.append(Cell(f"p={p}", f"{name} bubble τ / peak a",
                                    f"{paper.table_a_bubble(name, p)} / {paper.table_a_memory(name, p)}",
                                    pending(name), "–"))
                continue
            r = simulate_named(name, p, 2 * p, UNIT_TAU)
            t.cells.append(Cell(f"p={p}", f"{name} bubble per device (τ)", paper.table_a_bubble(name, p),
                                max(r.device_bubbles), HOW_UNIT))
            t.cells.append(Cell(f"p={p}", f"{name} peak memory (a)", paper.table_a_memory(name, p),
                                max(r.peak_memory), HOW_UNIT))
    return t


def closed_forms(quick: bool) -> Table:
    t = Table("closed-forms", "Closed forms — 1F1B, ZB-H1, ZB-V (docs/theory.md §5, §8)",
              "Simulated 1F1B, ZB-H1 and ZB-V with F = B = W (full-stage pass = 1) against their closed forms: "
              "bubble rate (p−1)/(m+p−1), (p−1)/(3m+p−1) and 0; peak memory p·a for all three.")
    ps = (4, 8, 16) if quick else (4, 8, 16, 24, 32)
    unit = Costs(1, 1, 1, 0)
    forms = {
        "1f1b": lambda p, m: (p - 1) / (m + p - 1),
        "zb-h1": lambda p, m: (p - 1) / (3 * m + p - 1),
        "zb-v": lambda p, m: 0.0,
    }
    for p in ps:
        for m in (2 * p, 8 * p):
            for name, form in forms.items():
                if not is_registered(name):
                    t.cells.append(Cell(f"p={p} m={m}", f"{name} bubble rate", form(p, m), pending(name), "–"))
                    continue
                r = simulate_named(name, p, m, unit)
                how = "simulated (F = B = W = 1, comm 0)"
                t.cells.append(Cell(f"p={p} m={m}", f"{name} bubble rate", form(p, m), r.bubble_rate, how))
                t.cells.append(Cell(f"p={p} m={m}", f"{name} peak memory (a)", p, max(r.peak_memory), how))
    return t


def _block_offsets(block) -> dict[str, int]:
    """The Table 8/9 offsets (start-slot differences) of a V-shape building block."""

    start = {(sp.op, sp.stage): sp.start for sp in block.passes}
    p = block.placement.num_devices
    S = 2 * p

    def one(values: set[int]) -> Any:
        return values.pop() if len(values) == 1 else "/".join(str(v) for v in sorted(values))

    F, B = Op.F, Op.B
    return {
        "dF0": one({start[F, i + 1] - start[F, i] for i in range(p - 1)}),
        "dF1": one({start[F, i + 1] - start[F, i] for i in range(p, S - 1)}),
        "dB1": one({start[B, i] - start[B, i + 1] for i in range(p, S - 1)}),
        "dB0": one({start[B, i] - start[B, i + 1] for i in range(p - 1)}),
        "turn_F": start[F, p] - start[F, p - 1],
        "loss_F1_B1": start[B, S - 1] - start[F, S - 1],
        "turn_B": start[B, p - 1] - start[B, p],
    }


def _offset_table(artifact: str, title: str, builders: dict, data: dict, modulus: int) -> Table:
    t = Table(artifact, title,
              f"Built the building block for one p per residue class of d mod {modulus} with ctrlmem.search.buildingblock and "
              "read its offsets (start-slot differences of microbatch 0, unit passes).")
    ps = {0: 6, 1: 4, 2: 5} if modulus == 3 else {0: 6, 1: 5}
    for label, builder_name, kwargs in builders:
        try:

            builder = getattr(blocks, builder_name)
        except (ImportError, AttributeError):
            builder = None
        for residue, expected in data.items():
            p = ps[residue]
            row = f"d mod {modulus} = {residue} (p = {p}) {label}"
            if builder is None:
                for key, val in expected.items():
                    t.cells.append(Cell(row, key, val, f"pending: ctrlmem.search.buildingblock.{builder_name} not available", "–"))
                continue
            got = _block_offsets(builder(p, **kwargs))
            for key, val in expected.items():
                t.cells.append(Cell(row, key, val, got[key], f"ctrlmem.search.buildingblock.{builder_name}({p}"
                                    + "".join(f", {k}={v!r}" for k, v in kwargs.items()) + ")"))
    t.notes.append("Keys: dF0, dF1, dB1, dB0 = the four uniform offsets [δ_F^0, δ_F^1, δ_B^1, δ_B^0]; "
                   "turn_F = δ(F_d^0, F_d^1); loss_F1_B1 = δ(F_0^1, B_0^1); turn_B = δ(B_d^1, B_d^0).")
    return t


def table8(quick: bool) -> Table:
    return _offset_table("table8", "Table 8 — offsets of V-Min (d mod 3)",
                         [("v-min block", "v_min_block", {})], paper.TABLE8, 3)


def table9(quick: bool) -> Table:
    t = _offset_table("table9", "Table 9 — offsets of V-Half (d mod 2)",
                      [("paper variant", "v_half_block", {"variant": "paper"})], paper.TABLE9, 2)
    t.notes.append("The registered v-half uses the authors' code variant (v_half_block(p, variant='code')), which "
                   "mirrors Table 9's turn gaps (F-turn 1, B-turn 2; docs/theory.md §7) with the same peak memory; the "
                   "table compares Table 9 with the paper variant.")
    return t
