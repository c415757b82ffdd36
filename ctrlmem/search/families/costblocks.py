"""V-shape blocks laid out in the costs' own time slots, as a candidate family (the paper §2.3,
App. A: offsets adapt to F/B/W).

The costs' mean chunk pass times are quantised into whole slots (:func:`ctrlmem.search.buildingblock.slot_lengths`,
the shortest pass at 1, 2 and 3 slots; distinct ratios only, at most 48 slots per interval;
only the first quantisation above ``p = 12``), and :func:`ctrlmem.search.buildingblock.v_cost_block` lays a
block out in them, with a gap after each pass along the device links: uniform gaps (g0, g1),
then, between each two neighbouring peak levels the uniform blocks reach, blocks whose first
``j`` links use one level's gaps and the rest the other's (stepping the peak between the
levels). Each block gives two candidates: the block repeated as it is (its own W slots), and,
for one-slot W, the block through the whole pipeline of :func:`ctrlmem.search.buildingblock.build_from_block`
(place W, reorder under the peak, squeeze).

A block's orders depend only on the quantised lengths and gaps: each is built once per ``p``
for a few microbatches and its periodic stable phase lengthened to any ``m``. Which mixes are
built depends on how the uniform blocks time under the costs (the best of each peak level).
"""

from __future__ import annotations

import math

from ctrlmem.search import steps
from ctrlmem.search.buildingblock import block_rows, short_pipeline, block_keys, slot_lengths, v_cost_block
from ctrlmem.model.costs import Costs
from ctrlmem.search.encoding import CandidateSet, concat, extend
from ctrlmem.search.engine import LRU, Family, Incumbent, Query, timed

__all__ = ["CostBlockFamily", "cost_lengths"]


def cost_lengths(p: int, costs: Costs) -> list[tuple[int, int, int, int]]:
    """The costs' chunk pass times (mean over stages) as slots, at 1, 2 and 3 slots for the
    shortest pass (distinct ratios only; at most 48 slots per interval)."""
    f, b, w = costs.stage_times(2 * p, p)
    fa, ba, wa = (math.fsum(x) / len(x) for x in (f, b, w))
    out: list[tuple[int, int, int, int]] = []
    for r in (1, 2, 3):
        ln = slot_lengths(fa, ba, wa, float(costs.comm), r)
        if 2 * sum(ln[: 1 if p > 16 else 3]) > 48:
            break
        g = math.gcd(*ln)
        if tuple(x // g for x in ln) not in {tuple(x // math.gcd(*o) for x in o) for o in out}:
            out.append(ln)
    return out


def mix_js(p: int, most: int) -> list[int]:
    """Split points ``j`` (links before it use one setting, the rest the other): all of
    ``1 .. p−2``, or about ``most`` of them spread evenly."""
    js = list(range(1, p - 1))
    if len(js) > most:
        step = math.ceil(len(js) / (most - 1))
        js = sorted(set(js[::step]) | {js[-1]})
    return js


def _repeat_set(block, m: int, label: str) -> CandidateSet:
    """The block repeated ``m`` times as it is (its own W slots; the simulator squeezes it)."""
    P = block.placement
    rows = steps.repeat(block_rows(block), block.interval, m)
    return CandidateSet(P, m, False, steps.to_keys(rows, P.num_stages, m)[None], (label,))


class CostBlockFamily(Family):
    """See the module docstring."""

    name = "cost blocks"

    def __init__(self) -> None:
        self._short = LRU(4096)  # (p, lengths, gap0, gap1, reorder) -> ((how, m0, set at m0), ...)
        self._sets = LRU(4096)  # (p, m, lengths, gap0, gap1, reorder) -> set at m

    def _block_set(self, p: int, m: int, ln: tuple, g0: tuple, g1: tuple, label: str, reorder: bool) -> CandidateSet | None:
        key = (p, m, ln, g0, g1, reorder)
        got = self._sets.get(key, False)
        if got is not False:
            return got
        parts = []
        for how, m0, short in self._shorts(p, m, ln, g0, g1, reorder):
            if short is None:
                continue
            if m0 >= m:
                one = short
            else:
                one = extend(short, m)
                if not len(one):
                    one = self._direct(p, m, ln, g0, g1, how)
            if one is not None and len(one):
                parts.append(CandidateSet(one.placement, one.m, one.fused, one.keys,
                                          (f"cost {':'.join(map(str, ln))} gaps {label} {how}",), one.peak))
        return self._sets.put(key, concat(parts) if parts else None)

    def _shorts(self, p, m, ln, g0, g1, reorder):
        """Per variant: (how, m0, the block's schedule at m0 microbatches) (m0 = m when few)."""
        try:
            block = v_cost_block(p, ln, g0, g1)
        except ValueError:  # no collision-free block with these gaps
            return ()
        m0 = short_pipeline(block, m)
        key = (p, ln, g0, g1, reorder, min(m0, m))
        got = self._short.get(key)
        if got is not None:
            return got
        mm = min(m0, m)
        out = [("repeat", m0, _repeat_set(block, mm, "repeat"))]
        if ln[2] == 1 and reorder:  # the reorder rounds of ctrlmem.search.buildingblock assume one-slot W
            keys = block_keys(block, mm)
            if keys is not None:  # (None: the steps deadlock)
                out.append(("reorder", m0, CandidateSet(block.placement, mm, False, keys[None], ("reorder",))))
        return self._short.put(key, tuple(out))

    @staticmethod
    def _direct(p, m, ln, g0, g1, how) -> CandidateSet | None:
        """The variant built for all ``m`` (when its short form has no periodic stable phase):
        the repeat is; the reorder is left out, as its steps assume one."""
        if how != "repeat":
            return None
        return _repeat_set(v_cost_block(p, ln, g0, g1), m, "repeat")

    def sets(self, q: Query, progress: Incumbent):
        p, m, costs = q.p, q.m, q.costs
        if q.fused or q.placement.kind != "v-shape":
            return
        big = p > 16
        for ln in cost_lengths(p, costs)[: 1 if p > 16 else 3]:
            fl, bl, wl, cl = ln
            r = min(fl, bl, wl)
            uniform: dict[float, tuple[tuple, tuple[int, int]]] = {}
            for a in range(0, 2 * max(fl, bl) + 1, r):
                for b in range(0, max(fl, bl) + 1, r):
                    cs = self._block_set(p, m, ln, (a,) * (p - 1), (b,) * (p - 1), f"({a}, {b})", True)
                    if cs is None:
                        continue
                    yield cs
                    tm = timed(cs, costs)
                    for i in range(len(cs)):
                        pk = float(cs.peak[i])
                        k = (float(tm.span[i]), float(tm.makespan[i]), pk)
                        if pk not in uniform or k < uniform[pk][0]:
                            uniform[pk] = (k, (a, b))
            levels = [uniform[k][1] for k in sorted(uniform)]
            for lo, hi in zip(levels, levels[1:]):
                for first, second in ((hi, lo),) if big else ((hi, lo), (lo, hi)):
                    for j in mix_js(p, 5 if big else 12):
                        g0 = (first[0],) * j + (second[0],) * (p - 1 - j)
                        g1 = (first[1],) * j + (second[1],) * (p - 1 - j)
                        cs = self._block_set(p, m, ln, g0, g1, f"{first}x{j}+{second}x{p - 1 - j}", p <= 16)
                        if cs is not None:
                            yield cs
