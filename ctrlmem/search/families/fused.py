"""Fused-backward V-shape candidates (``1f1b-v``): the paper's App. I construction of 1F1B-V.

Its building block is :func:`ctrlmem.search.buildingblock.v_1f1b_block` (App. I, Fig. 16(a): chunk-0 forwards
``F`` down the devices, chunk-1 forwards ``f`` back up, then the fused backwards of two slots,
``B`` (chunk 1) down and ``b`` (chunk 0) back up). The steps, our own implementation of the
construction the authors publish (their ``v1f1b`` scheduler):

1. **repeat** the device rows of the block for ``4p + m + 1`` intervals;
2. **trim**: walking the chain ``F`` (devices up), ``f`` (down), ``B`` (up), ``b`` (down), each
   device's first pass of the kind is the first slot of its residue after the previous device's;
   the copies before it and from ``m`` intervals on are cleared (so a device has ``m`` of each);
3. **warm-up**: in slot order, each pass moves to the first free slot after the same kind's
   previous microbatch and its input (a fused backward needs two free slots); a forward only as
   far back as the device's memory stays below its peak;
4. the order of each device's passes is its schedule (the ``W`` slot is part of the fused ``BW``).

Cost-independent (cached per (p, m)); the ``1f1b-v`` schedule is this order, and the search
times it under the user's costs. It reproduces the authors' published 1F1B-V spans and peaks.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.buildingblock import block_set, greedy_block, v_1f1b_block
from ctrlmem.model.ir import Op, Placement
from ctrlmem.search.encoding import CandidateSet, concat, dedupe
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.kernels import ints, kernel

__all__ = ["block_residues", "construction_keys", "greedy_1f1b_v_block", "FusedConstructionFamily"]


def block_residues(p: int) -> np.ndarray:
    """Each device's slot (mod 6) for F, f, B, b and the W halves of B and b (``[p, 6]``) in the
    block of :func:`ctrlmem.search.buildingblock.v_1f1b_block`, counted from one slot before its first pass
    (the construction's trim walks from the block's second interval)."""
    block = v_1f1b_block(p)
    S = 2 * p
    out = np.zeros((p, 6), dtype=np.int64)
    for sp in block.passes:
        d = block.placement.device_of(sp.stage)
        chunk1 = sp.stage >= p
        t = sp.start + 1
        if sp.op is Op.F:
            out[d, 1 if chunk1 else 0] = t % 6
        else:  # the fused backward: its B slot, then its W slot
            out[d, 2 if chunk1 else 3] = t % 6
            out[d, 4 if chunk1 else 5] = (t + 1) % 6
    del S
    return out


@kernel
def _construct(p, m, res, out):  # pragma: no cover - compiled; py_func tested
    """Steps 1–4 of the module docstring into ``out`` (``[p, 4m]`` pass keys); 1 on success."""
    T = 6
    width = T * (4 * p + m + 1)
    g = np.zeros((p, width), np.int64)  # 0 idle, 1 F, 2 f, 3 B, 4 b, 5 W (of B), 6 w (of b)
    for i in range(p):
        for j in range(width):
            r = j % T
            for c in range(6):
                if res[i, c] == r:
                    g[i, j] = c + 1
    # 2. trim along the chain
    index = T
    for c in (1, 2, 3, 4):
        for step in range(p):
            i = step if (c == 1 or c == 3) else p - 1 - step
            for _ in range(T):
                if index < width and g[i, index] == c:
                    pos = index - T
                    while pos >= 0:
                        g[i, pos] = 0
                        pos -= T
                    pos = index + T * m
                    while pos < width:
                        g[i, pos] = 0
                        pos += T
                    index += 1
                    if c == 3 or c == 4:
                        wc = c + 2
                        for k in range(T):
                            q = index + k
                            if q < width and g[i, q] == wc:
                                pos = q - T
                                while pos >= 0:
                                    g[i, pos] = 0
                                    pos -= T
                                pos = q + T * m
                                while pos < width:
                                    g[i, pos] = 0
                                    pos += T
                                break
                    break
                index += 1
    # 3. warm-up under the peak
    mem = np.zeros((p, width), np.int64)
    peak = 0
    for i in range(p):
        cur = 0
        for j in range(width):
            c = g[i, j]
            if c == 1 or c == 2:
                cur += 1
            elif c == 5 or c == 6:
                cur -= 1
            mem[i, j] = cur
            if cur > peak:
                peak = cur
    loc = np.full((p, m + 2, 7), -1, np.int64)
    cnt = np.zeros((p, 7), np.int64)
    for j in range(width):
        for i in range(p):
            c = g[i, j]
            if c == 0:
                continue
            cnt[i, c] += 1
            n = cnt[i, c]
            if n > m:
                return 0
            pos = -1
            if n > 1:
                pos = loc[i, n - 1, c]
            if c == 5:
                pos = max(pos, loc[i, n, 3])
            elif c == 6:
                pos = max(pos, loc[i, n, 4])
            elif c == 1 and i > 0:
                pos = max(pos, loc[i - 1, n, 1])
            elif c == 2:
                pos = max(pos, loc[i + 1, n, 2] if i != p - 1 else loc[i, n, 1])
            elif c == 3:  # a fused backward: after the previous device's whole BW
                pos = max(pos, loc[i - 1, n, 5] if i != 0 else loc[i, n, 2])
            elif c == 4:
                pos = max(pos, loc[i + 1, n, 6] if i != p - 1 else loc[i, n, 5])
            pos += 1
            while g[i, pos] != 0 and pos < j:
                pos += 1
            if c == 3 or c == 4:
                while pos < j and (g[i, pos] != 0 or g[i, pos + 1] != 0):
                    pos += 1
            if pos == j:
                loc[i, n, c] = j
                continue
            if c >= 3:
                g[i, pos] = c
                g[i, j] = 0
                if c >= 5:
                    for u in range(pos, j):
                        mem[i, u] -= 1
                loc[i, n, c] = pos
                continue
            place = j
            while place > pos and mem[i, place - 1] < peak:
                place -= 1
            while place < j and g[i, place] != 0:
                place += 1
            if place == j:
                loc[i, n, c] = j
                continue
            g[i, place] = c
            g[i, j] = 0
            for u in range(place, j):
                mem[i, u] += 1
            loc[i, n, c] = place
    # 4. orders (the W halves dropped: part of the fused BW)
    S = 2 * p
    sm = S * m
    L = out.shape[1]
    for i in range(p):
        seen = np.zeros(5, np.int64)
        w = 0
        for j in range(width):
            c = g[i, j]
            if c == 0 or c >= 5:
                continue
            n = seen[c]
            seen[c] += 1
            if n >= m or w >= L:
                return 0
            if c == 1:
                out[i, w] = i * m + n
            elif c == 2:
                out[i, w] = (S - 1 - i) * m + n
            elif c == 3:
                out[i, w] = sm + (S - 1 - i) * m + n
            else:
                out[i, w] = sm + i * m + n
            w += 1
        if w != L:
            return 0
    return 1


def construction_keys(p: int, m: int) -> np.ndarray | None:
    """Device orders (pass keys, ``[p, 4m]``, fused backward) of the construction, or ``None``."""
    out = np.zeros((p, 4 * m), dtype=np.int64)
    return out if _construct(p, m, ints(block_residues(p)), out) else None


def greedy_1f1b_v_block(p: int):
    """A fused V block with each chunk pass at the earliest slot free modulo 6 after its input
    (:func:`ctrlmem.search.buildingblock.greedy_block`): another layout of the 1F1B-V block, half a slot better
    than the paper's for some p and costs."""
    return greedy_block("1f1b-v", Placement.v_shape(p), 6, 1, 2, None, None, {"fused": True})


class FusedConstructionFamily(Family):
    """For fused-backward V-shape queries: the construction of the module docstring, and the
    paper's block and the greedy-layout block through the block pipeline of
    :func:`ctrlmem.search.buildingblock.build_from_block` (cost-independent; cached per (p, m))."""

    name = "1f1b-v blocks"

    def __init__(self) -> None:
        self._cache = LRU(32)

    def sets(self, q: Query, progress: Incumbent):
        if not q.fused or q.placement.kind != "v-shape" or q.p < 2:
            return
        key = (q.p, q.m)
        got = self._cache.get(key, False)
        if got is False:
            parts = []
            keys = construction_keys(q.p, q.m)
            if keys is not None:
                parts.append(CandidateSet(Placement.v_shape(q.p), q.m, True, keys[None], ("1f1b-v construction",)))
            for label, block in (("1f1b-v block pipeline", v_1f1b_block(q.p)),
                                 ("1f1b-v greedy block", greedy_1f1b_v_block(q.p))):
                cs = block_set(block, q.m, label) or block_set(block, q.m, label, direct=True)
                if cs is not None:
                    parts.append(cs)
            got = self._cache.put(key, dedupe(concat(parts)) if parts else None)
        if got is not None:
            yield got
