"""Wide check of the searches beyond any reference data: sizes and costs no development file has.

    .venv/bin/python benchmarks/check_wide.py            # p in {3,5,6,7,12,16,24}, m in {p,2p,4p}, 15 cost sets
    .venv/bin/python benchmarks/check_wide.py --quick    # p in {3,5,6,7}, m in {p,2p}

Over a grid of p (powers of two and not), m, F:B:W mixes (1:1:1, 3:4:2, 2:1:1, 1:2:2 and a
profiled mix) and hop latencies (0, 5 % and 20 % of F), it checks, and prints the count of
violations and the worst value of each:

1. **named ≤ pattern**: ``v-min``, ``v-half``, ``v-zb``, ``1f1b-v`` with costs are never slower than
   their own unit-cost pattern under the same costs, at no more memory;
2. **named = v-shape at its peak**: ``v-min`` / ``v-half`` / ``v-zb`` with costs have exactly the
   longest span of ``v-shape`` at their own memory level (each searches what the other does);
3. **monotone**: ``v-shape`` never gets slower as the budget grows (1/p … 2.0), and ``zb`` too;
4. **bound**: the search's lower bound (docs/theory.md §6) never exceeds a result within its cap;
5. **6p − 1 − 3k** (F = B = W, no latency, m ≥ 2p): ``v-shape``'s bubble at k half-a is never below
   the paper's bound, and how far above it is reported (from V-Min's memory up);
6. **optimum** (p = 3, m = p): ``v-shape`` against the CP-SAT optimum (``cm.optimal``, 20 s) at
   budgets 0.5 and 1.0 — never below it, and the gap reported;
7. **cross-family**: ``v-shape`` at 1.0 against ``zb`` at 1.0 and at 2.0 (the V placement's 2×
   communication against the sequential one's memory), reported.

Everything is simulated with ``ctrlmem.simulate``; the numbers are ratios of longest device spans.
"""

from __future__ import annotations

import argparse
import time

import ctrlmem as cm
from ctrlmem.model.ir import Placement
from ctrlmem.search.bounds import span_bound

MIXES = {"1:1:1": (1, 1, 1), "3:4:2": (3, 4, 2), "2:1:1": (2, 1, 1), "1:2:2": (1, 2, 2),
         "profiled": (9918, 10434, 7038)}
COMMS = (0.0, 0.05, 0.2)  # as a fraction of F
BUDGETS = (0.25, 0.375, 0.5, 0.625, 0.75, 1.0, 1.25, 1.5, 2.0)


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, list] = {}

    def add(self, check: str, ok: bool, value: float | None = None, where: str = "") -> None:
        row = self.rows.setdefault(check, [0, 0, None, ""])
        row[0] += 1
        if not ok:
            row[1] += 1
        if value is not None and (row[2] is None or value > row[2]):
            row[2], row[3] = value, where


def span(s, costs) -> tuple[float, float]:
    r = cm.simulate(s, costs)
    return max(r.device_spans), max(r.peak_memory)


def check(p: int, m: int, mix: str, comm_frac: float, tally: Tally) -> None:
    f, b, w = MIXES[mix]
    costs = cm.Costs(f, b, w, comm_frac * f)
    where = f"p={p} m={m} {mix} comm={comm_frac:g}F"
    for name in ("v-min", "v-half", "v-zb", "1f1b-v"):
        pattern = cm.build(name, p, m)
        ps, pk = span(pattern, costs)
        adapted, ak = span(cm.build(name, p, m, costs=costs), costs)
        tally.add("1 named <= pattern", adapted <= ps + 1e-9 and ak <= pk + 1e-9, adapted / ps, where + f" {name}")
        if name != "1f1b-v" and m >= 2:
            vs, vk = span(cm.build("v-shape", p, m, costs=costs, memory_limit=pk / p), costs)
            tally.add("2 named = v-shape at its peak", abs(vs - adapted) <= 1e-9 * max(1, vs), vs / adapted, where + f" {name}")
    if m < 2:
        return
    bound_v = span_bound(Placement.v_shape(p), m, costs)
    prev = None
    for lim in (1 / p,) + tuple(x for x in BUDGETS if x > 1 / p):
        sv, kv = span(cm.build("v-shape", p, m, costs=costs, memory_limit=lim), costs)
        tally.add("3 monotone (v-shape)", prev is None or sv <= prev + 1e-9, None if prev is None else sv / prev, where)
        tally.add("4 bound <= result (v-shape)", bound_v(kv) <= sv + 1e-9, bound_v(kv) / sv, where + f" {lim:g}")
        prev = sv
        if mix == "1:1:1" and comm_frac == 0 and m >= 2 * p:
            tau = 0.5  # a chunk pass with Costs(1, 1, 1)
            bubble = (sv - 6 * m * tau) / tau
            k = 2 * kv
            lb = max(0.0, 6 * p - 1 - 3 * k)
            # (how far above is reported from V-Min's memory up: below it the repeating bubble of
            # docs/theory.md §6 dominates and the additive bound says little)
            above = bubble - lb if k >= 2 * ((p + 4) // 3) else None
            tally.add("5 bubble >= 6p-1-3k (tau above it, k >= V-Min's)", bubble >= lb - 1e-9, above, where + f" k={k:g}")
    bound_s = span_bound(Placement.sequential(p), m, costs)
    prev = None
    for lim in (1 / p, 0.5, 1.0, 1.5, 2.0):
        sz, kz = span(cm.build("zb", p, m, costs=costs, memory_limit=lim), costs)
        tally.add("3 monotone (zb)", prev is None or sz <= prev + 1e-9, None if prev is None else sz / prev, where)
        tally.add("4 bound <= result (zb)", bound_s(kz) <= sz + 1e-9, bound_s(kz) / sz, where + f" {lim:g}")
        prev = sz
    v1, _ = span(cm.build("v-shape", p, m, costs=costs, memory_limit=1.0), costs)
    for lim in (1.0, 2.0):
        z, _ = span(cm.build("zb", p, m, costs=costs, memory_limit=lim), costs)
        tally.add(f"7 v-shape@1.0 / zb@{lim:g} (reported)", True, v1 / z, where)


def optimum_checks(tally: Tally, time_limit: float) -> None:
    for mix in ("1:1:1", "3:4:2"):
        f, b, w = MIXES[mix]
        for comm in (0.0, 0.2):
            costs = cm.Costs(f, b, w, comm * f)
            for lim in (0.5, 1.0):
                res = cm.optimal(3, 3, costs, memory_limit=lim, time_limit=time_limit)
                if res.status != "optimal":
                    continue
                opt = max(cm.simulate(res.schedule, costs).device_spans)
                ours, _ = span(cm.build("v-shape", 3, 3, costs=costs, memory_limit=lim), costs)
                tally.add("6 v-shape / CP-SAT optimum (p=3, m=3)", ours >= opt - 1e-9, ours / opt,
                          f"{mix} comm={comm:g}F limit={lim:g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--optimal-seconds", type=float, default=20.0)
    args = ap.parse_args()
    ps = (3, 5, 6, 7) if args.quick else (3, 5, 6, 7, 12, 16, 24)
    tally = Tally()
    t0 = time.perf_counter()
    n = 0
    for p in ps:
        for m in ((p, 2 * p) if args.quick else (p, 2 * p, 4 * p)):
            for mix in MIXES:
                for comm in COMMS:
                    check(p, m, mix, comm, tally)
                    n += 1
    try:
        optimum_checks(tally, args.optimal_seconds)
    except ImportError as exc:
        print(f"(no CP-SAT check: {exc})")
    print(f"{n} (p, m, costs) settings in {time.perf_counter() - t0:.0f} s (simulated with ctrlmem.simulate)")
    print(f"{'check':<40} {'cases':>6} {'violations':>10} {'worst':>8}  where")
    bad = 0
    for check_name in sorted(tally.rows):
        cases, viol, worst, where = tally.rows[check_name]
        bad += viol
        print(f"{check_name:<40} {cases:>6} {viol:>10} {'-' if worst is None else format(worst, '.4f'):>8}  {where}")
    print(f"{bad} violation(s)")


if __name__ == "__main__":
    main()
