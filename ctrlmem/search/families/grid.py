"""The paper's App. A framework on a unit-slot grid: V-shape building blocks from a device-0
pattern and two offset levels, repeated, squeezed and reordered (docs/theory.md §10).

A candidate family of the ``v-shape`` search. Everything here is in unit slots, independent of
the costs: a device holds six pass kinds per microbatch, written

    ``F`` chunk-0 forward, ``f`` chunk-1 forward, ``B`` chunk-1 backward, ``b`` chunk-0
    backward, ``W`` chunk-1 weight gradient, ``w`` chunk-0 weight gradient

(device ``i`` holds stages ``i`` = chunk 0 and ``2p−1−i`` = chunk 1). The n-th pass of a kind on
a device belongs to microbatch n; memory counts +1 half-a per ``F``/``f`` and −1 per ``W``/``w``.

Steps (App. A of the paper; our own implementation):

1. **block**: device 0 puts ``F`` at slot 0 and ``f``, ``B``, ``b`` at three distinct slots of
   1..5 (60 patterns); device ``i+1``'s slots are device ``i``'s shifted by (δ, −1, δ, −1) modulo
   6 for (``F``, ``f``, ``B``, ``b``), with δ = k0 on the first ``len0`` links and k1 ≤ k0 on the
   rest (k = 1..5); ``W``/``w`` take the first free slot after their backward. Blocks whose
   passes share a slot on a device are dropped.
2. **repeat** every 6 slots (at least ``2p`` microbatches, the extra ones dropped later), then
   **squeeze** (as soon as possible, order kept).
3. **warm-up**: before a device's first ``b``, its passes are laid out again as ``F`` only, then
   ``F f`` pairs, then ``B W f`` (or ``B W F``) triples, with at most ``min(i+1, peak/2)`` ``f``
   and ``peak −`` that many ``F`` before the first ``B``: the device fills its memory at once.
4. drop the extra microbatches; for few microbatches (``m ≤ p``) delay the first ``W`` so every
   device reaches the peak; squeeze.
5. **cool-down**: after the last ``f``, the last ``b`` (up to ``(peak+1)/2``) and ``B`` (up to
   ``min(i+1, peak − #b)``) are put two slots apart, tight behind device 0's last ``f``, and the
   ``W`` removed from the tail go back into the free slots after; squeeze.
6. **fill**: scanning the grid left to right, each idle slot takes the next pass of some kind
   from later on the same device if its input is ready and the device's peak does not rise.

The result is kept only if it is a complete schedule whose peak is at most the repeated
block's. The steps are compiled kernels over an integer grid (``grid[device, slot]``, 0 idle,
1..6 for ``F f B b W w``). The orders do not depend on the costs: each block's schedule is built
once per ``p`` for ``2p + 2`` microbatches and its periodic stable phase lengthened to any ``m``
(:func:`ctrlmem.search.encoding.extend`); the search times them under the user's costs.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from ctrlmem.model.ir import Placement
from ctrlmem.search.encoding import CandidateSet, dedupe, extend
from ctrlmem.search.engine import LRU, Family, Incumbent, Query, on_clear
from ctrlmem.search.kernels import ints, kernel

__all__ = ["grid_blocks", "grid_keys", "grid_set", "GridFamily", "REDUCED_ABOVE", "GRID_MAX_P"]

T = 6  # slots per interval
_KINDS = "FfBbWw"
# kind codes in the grid: 0 idle, 1 F, 2 f, 3 B, 4 b, 5 W, 6 w

#: above this many devices only the survey's device-0 patterns are tried (``grid_blocks(reduced=...)``)
REDUCED_ABOVE = 16
#: above this many devices only the three patterns that won at p = 20–32 (see ``_WIDE_PATTERNS``)
NARROW_ABOVE = 24
#: the family is searched up to this many devices
GRID_MAX_P = 32


def grid_blocks(p: int, reduced: bool | str = False) -> list[tuple[tuple, list[list[int]]]]:
    """The distinct collision-free blocks of step 1 for ``p`` devices, in search order: (params,
    per-device slots of F, f, B, b, W, w) with params ``(pattern, k0, k1, len0)``.

    ``reduced``: only the 8 device-0 patterns that won a survey at p = 8 and 12 (seven cost
    mixes, every budget; see ``_SURVEY_PATTERNS``) instead of all 60; ``"narrow"``: only the
    three that won at p = 20, 24 and 32 (``_WIDE_PATTERNS``). Every ``len0`` is kept: it steps
    the peak."""
    out, seen = [], set()
    lens = list(range(1, p))
    keep = _WIDE_PATTERNS if reduced == "narrow" else _SURVEY_PATTERNS
    for sf, sb1, sb0 in itertools.permutations(range(1, T), 3):
        if reduced and (sf, sb1, sb0) not in keep:
            continue
        for k0 in range(1, T):
            for k1 in range(1, k0 + 1):
                for len0 in (lens if k1 < k0 else (p - 1,)):
                    rows = _block(p, (0, sf, sb1, sb0), k0, k1, len0)
                    if rows is None:
                        continue
                    key = tuple(map(tuple, rows))
                    if key not in seen:
                        seen.add(key)
                        out.append((((0, sf, sb1, sb0), k0, k1, len0), rows))
    return out


# Device-0 slots (f, B, b) of every schedule that was the best of the whole v-shape search at some
# budget in a survey (p = 8 and 12, m = 2p and 4p, seven F:B:W:comm mixes, every budget up to 2.0).
# All have B after f (the loss stage's backward in the same interval).
_SURVEY_PATTERNS = {(1, 2, 3), (3, 4, 5), (1, 3, 2), (2, 3, 4), (2, 3, 5), (1, 2, 4), (1, 4, 3), (1, 3, 5)}
# The device-0 patterns of every grid schedule that was the best of the v-shape search in a survey
# at p = 20, 24, 32 (m = 2p and 4p, six F:B:W:comm mixes, budgets 0.375 to 2.0, all 60 patterns and
# every cap tried): 123 (k3/1, k5/1, k5/3), 234 (k2/1) and 132 (k5/2).
_WIDE_PATTERNS = {(1, 2, 3), (2, 3, 4), (1, 3, 2)}


@lru_cache(maxsize=None)
def _fill_w(slots: tuple[int, int, int, int]) -> tuple[int, ...] | None:
    """A device's row: its ``F, f, B, b`` slots, then ``W`` and ``w`` each at the first free slot
    after its ``B`` / ``b`` (``None`` when none is free). Cached, as :func:`_next_row`."""
    used = set(slots)
    out = list(slots)
    for back in (2, 3):
        for j in range(1, T):
            r = (slots[back] + j) % T
            if r not in used:
                used.add(r)
                out.append(r)
                break
        else:
            return None
    return tuple(out)


@lru_cache(maxsize=None)
def _next_row(prev: tuple[int, ...], k: int) -> tuple[int, ...] | None:
    """The row of the device below ``prev`` (its F, f, B, b slots first) with the ``F`` / ``B`` step
    ``k``; ``None`` where two passes meet. Cached: a grid of every p asks a few hundred distinct rows
    thousands of times."""
    nxt = ((prev[0] + k) % T, (prev[1] - 1) % T, (prev[2] + k) % T, (prev[3] - 1) % T)
    if len(set(nxt)) < 4:
        return None
    return _fill_w(nxt)


def _block(p: int, first: tuple[int, int, int, int], k0: int, k1: int, len0: int) -> list[list[int]] | None:
    row = _fill_w(tuple(first))
    if row is None:
        return None
    rows = [list(row)]
    for i in range(p - 1):
        row = _next_row(row, k0 if i < len0 else k1)
        if row is None:
            return None
        rows.append(list(row))
    return rows


# ---------------------------------------------------------------------------------------------
# the steps, as kernels over int grids: g[i, j] is the kind code at slot j of device i, ln[i] the
# row's length (cells past it are idle)


@kernel(inline=True)
def _delta(c):  # pragma: no cover - compiled
    """Memory change of a kind code: +1 for F/f, -1 for W/w."""
    if c == 1 or c == 2:
        return 1
    if c == 5 or c == 6:
        return -1
    return 0


@kernel
def _peaks(g, ln, out):  # pragma: no cover - compiled
    p = g.shape[0]
    top = 0
    for i in range(p):
        level = 0
        pk = 0
        for j in range(ln[i]):
            level += _delta(g[i, j])
            if level > pk:
                pk = level
        out[i] = pk
        if pk > top:
            top = pk
    return top


@kernel(inline=True)
def _dep_dev(p, i, c):  # pragma: no cover - compiled
    """The device whose pass of the same kind and microbatch must come first, or -1."""
    if c == 1 or c == 3:
        return i - 1 if i > 0 else -1
    if c == 2 or c == 4:
        return i + 1 if i < p - 1 else -1
    return -1


@kernel(inline=True)
def _own(p, i, c):  # pragma: no cover - compiled
    """The kind on the same device whose pass of the same microbatch must come first, or 0."""
    if c == 5:
        return 3
    if c == 6:
        return 4
    if c == 3 and i == 0:
        return 2
    if i == p - 1 and c == 2:
        return 1
    if i == p - 1 and c == 4:
        return 3
    return 0


@kernel
def _repeat(p, M, res, g, ln):  # pragma: no cover - compiled
    """Step 2's repeated grid: microbatch 0 of each kind at the first slot of its residue after
    its input (the chain F down the devices, f up, B down, b up; W after B, w after b)."""
    st = np.zeros((p, 6), np.int64)
    st[0, 0] = res[0, 0]
    for i in range(1, p):
        t = st[i - 1, 0] + 1
        st[i, 0] = t + (res[i, 0] - t) % T
    t = st[p - 1, 0] + 1
    st[p - 1, 1] = t + (res[p - 1, 1] - t) % T
    for i in range(p - 2, -1, -1):
        t = st[i + 1, 1] + 1
        st[i, 1] = t + (res[i, 1] - t) % T
    t = st[0, 1] + 1
    st[0, 2] = t + (res[0, 2] - t) % T
    for i in range(1, p):
        t = st[i - 1, 2] + 1
        st[i, 2] = t + (res[i, 2] - t) % T
    t = st[p - 1, 2] + 1
    st[p - 1, 3] = t + (res[p - 1, 3] - t) % T
    for i in range(p - 2, -1, -1):
        t = st[i + 1, 3] + 1
        st[i, 3] = t + (res[i, 3] - t) % T
    for i in range(p):
        t = st[i, 2] + 1
        st[i, 4] = t + (res[i, 4] - t) % T
        t = st[i, 3] + 1
        st[i, 5] = t + (res[i, 5] - t) % T
        mx = 0
        for c in range(6):
            if st[i, c] > mx:
                mx = st[i, c]
        length = mx + T * (M - 1) + 1
        if length > g.shape[1]:
            return 0
        for j in range(length):
            g[i, j] = 0
        for c in range(6):
            for k in range(M):
                g[i, st[i, c] + T * k] = c + 1
        ln[i] = length
    return 1


@kernel
def _squeeze(g, ln, keep, out, out_ln):  # pragma: no cover - compiled
    """As soon as possible in unit slots, each device's order kept (idle cells ignored);
    returns 0 on a deadlock. ``keep``: the slots before it are already as soon as possible and
    stay as they are. The result has every row as long as the longest."""
    p = g.shape[0]
    n_max = 0
    for i in range(p):
        if ln[i] > n_max:
            n_max = ln[i]
    seq_c = np.zeros((p, n_max), np.int64)
    seq_n = np.zeros((p, n_max), np.int64)
    nseq = np.zeros(p, np.int64)
    per = 0  # most passes of one kind on one device
    for i in range(p):
        seen = np.zeros(6, np.int64)
        k = 0
        for j in range(ln[i]):
            c = g[i, j]
            if c == 0:
                continue
            seq_c[i, k] = c
            seq_n[i, k] = seen[c - 1]
            seen[c - 1] += 1
            if seen[c - 1] > per:
                per = seen[c - 1]
            k += 1
        nseq[i] = k
    # starts[i, c, n]: slot of the n-th pass of kind c on device i; cnt[i, c] how many so far
    starts = np.zeros((p, 6, per + 1), np.int64)
    cnt = np.zeros((p, 6), np.int64)
    pos = np.zeros(p, np.int64)
    free = np.zeros(p, np.int64)
    if keep > 0:
        for i in range(p):
            k = 0
            lim = keep if keep < ln[i] else ln[i]
            for j in range(lim):
                c = g[i, j]
                if c != 0:
                    starts[i, c - 1, cnt[i, c - 1]] = j
                    cnt[i, c - 1] += 1
                    k += 1
                    free[i] = j + 1
            pos[i] = k
    left = 0
    for i in range(p):
        left += nseq[i] - pos[i]
    while left > 0:
        progress = False
        for s in range(2 * p):
            i = s if s < p else 2 * p - 1 - s
            k = pos[i]
            t_free = free[i]
            while k < nseq[i]:
                c = seq_c[i, k]
                n = seq_n[i, k]
                o = _own(p, i, c)
                if o != 0 and cnt[i, o - 1] <= n:
                    return 0  # the device's own order needs a later pass first
                t = t_free
                d = _dep_dev(p, i, c)
                if d >= 0:
                    if cnt[d, c - 1] <= n:
                        break
                    if starts[d, c - 1, n] >= t:
                        t = starts[d, c - 1, n] + 1
                starts[i, c - 1, cnt[i, c - 1]] = t
                cnt[i, c - 1] += 1
                t_free = t + 1
                k += 1
            if k != pos[i]:
                left -= k - pos[i]
                pos[i] = k
                free[i] = t_free
                progress = True
        if not progress:
            return 0
    width = 0
    for i in range(p):
        if free[i] > width:
            width = free[i]
    if width > out.shape[1]:
        return 0
    for i in range(p):
        for j in range(width):
            out[i, j] = 0
        for c in range(6):
            for n in range(cnt[i, c]):
                out[i, starts[i, c, n]] = c + 1
        out_ln[i] = width
    return 1


@kernel
def _warmup(g, ln, m, out, out_ln):  # pragma: no cover - compiled
    """Step 3 on the order before each device's first ``b`` (later passes unchanged); the
    result holds orders (no idle cells)."""
    p = g.shape[0]
    pk = np.zeros(p, np.int64)
    peak = _peaks(g, ln, pk)
    if peak > 2 * p:
        peak = 2 * p
    order = np.zeros(g.shape[1], np.int64)
    for i in range(p):
        n = 0
        for j in range(ln[i]):
            if g[i, j] != 0:
                order[n] = g[i, j]
                n += 1
        cut = n
        for j in range(n):
            if order[j] == 4:
                cut = j
                break
        have = np.zeros(7, np.int64)
        has_w = False
        for j in range(cut):
            have[order[j]] += 1
            if order[j] == 6:
                has_w = True
        if has_w:  # a w before the first b: leave the device alone
            for j in range(n):
                out[i, j] = order[j]
            out_ln[i] = n
            continue
        n_ff = i + 1
        if peak // 2 < n_ff:
            n_ff = peak // 2
        if m < n_ff:
            n_ff = m
        n_f = peak - n_ff
        if m < n_f:
            n_f = m
        used = np.zeros(7, np.int64)
        w = 0
        for _ in range(2 * (p - 1 - i)):
            if used[1] < min(n_f, have[1]):
                out[i, w] = 1
                w += 1
                used[1] += 1
        for _ in range(i + 1):
            if used[1] < min(n_f, have[1]):
                out[i, w] = 1
                w += 1
                used[1] += 1
            if used[2] < min(n_ff, have[2]):
                out[i, w] = 2
                w += 1
                used[2] += 1
        while used[1] < have[1] or used[2] < have[2] or used[3] < have[3] or used[5] < have[5]:
            for c in (3, 5):
                if used[c] < have[c]:
                    out[i, w] = c
                    w += 1
                    used[c] += 1
            if used[2] < have[2]:
                out[i, w] = 2
                w += 1
                used[2] += 1
            elif used[1] < have[1]:
                out[i, w] = 1
                w += 1
                used[1] += 1
        for j in range(cut, n):
            out[i, w] = order[j]
            w += 1
        out_ln[i] = w


@kernel
def _drop_extra(g, ln, m, out, out_ln):  # pragma: no cover - compiled
    """Keep the first ``m`` passes of each kind (idle cells kept)."""
    p = g.shape[0]
    for i in range(p):
        cnt = np.zeros(7, np.int64)
        w = 0
        for j in range(ln[i]):
            c = g[i, j]
            if c != 0:
                if cnt[c] >= m:
                    continue
                cnt[c] += 1
            out[i, w] = c
            w += 1
        out_ln[i] = w


@kernel
def _delay_first_w(g, ln, out, out_ln):  # pragma: no cover - compiled
    """Step 4 for few microbatches: move each device's first W/w (as many as it lacks to reach
    the highest device's peak) to the end of its order."""
    p = g.shape[0]
    pk = np.zeros(p, np.int64)
    top = _peaks(g, ln, pk)
    if top > 2 * p:
        top = 2 * p
    moved = np.zeros(g.shape[1], np.int64)
    for i in range(p):
        need = top - pk[i]
        if need < 0:
            need = 0
        nm = 0
        w = 0
        for j in range(ln[i]):
            c = g[i, j]
            if c == 0:
                continue
            if (c == 5 or c == 6) and nm < need:
                moved[nm] = c
                nm += 1
            else:
                out[i, w] = c
                w += 1
        for j in range(nm):
            out[i, w] = moved[j]
            w += 1
        out_ln[i] = w


@kernel(inline=True)
def _put(g, ln, i, j, c):  # pragma: no cover - compiled
    if j < 0 or j >= g.shape[1]:
        return False
    if j >= ln[i]:
        for u in range(ln[i], j + 1):
            g[i, u] = 0
        ln[i] = j + 1
    if g[i, j] != 0:
        return False
    g[i, j] = c
    return True


@kernel
def _cooldown(g, ln, m, out, out_ln):  # pragma: no cover - compiled
    """Step 5 on a squeezed grid (positions matter here); then a squeeze of what changed."""
    p = g.shape[0]
    pk = np.zeros(p, np.int64)
    peak = _peaks(g, ln, pk)
    n_bb = (peak + 1) // 2
    if m < n_bb:
        n_bb = m
    n_b = peak - n_bb
    if m < n_b:
        n_b = m
    rows = g.copy()
    rl = ln.copy()
    anchor = -1
    for i in range(p):
        c_b = 0
        c_bb = 0
        c_w = 0
        c_ww = 0
        last_f = -1
        for j in range(rl[i] - 1, -1, -1):
            c = rows[i, j]
            if c == 2 and last_f < 0:
                last_f = j
            if c == 3 and c_b < i + 1 and c_b < n_b:
                rows[i, j] = 0
                c_b += 1
            if c == 4 and c_bb < n_bb:
                rows[i, j] = 0
                c_bb += 1
        for j in range(rl[i] - 1, -1, -1):
            if c_w >= c_b and c_ww >= c_bb and c_w + c_ww >= peak:
                break
            if rows[i, j] == 5:
                rows[i, j] = 0
                c_w += 1
            elif rows[i, j] == 6:
                rows[i, j] = 0
                c_ww += 1
        if i == 0:
            anchor = last_f
        if anchor < 0:
            return 0
        for k in range(c_bb):
            if not _put(rows, rl, i, anchor - i + 2 * p - 2 * k, 4):
                return 0
        for k in range(c_b):
            if not _put(rows, rl, i, anchor + 1 + i - 2 * k, 3):
                return 0
        # the removed W go back into the idle slots after the last W left, FIFO over B/b
        last_w = -1
        for j in range(rl[i]):
            if rows[i, j] == 5 or rows[i, j] == 6:
                last_w = j
        pend_w = 0
        pend_ww = 0
        for j in range(rl[i]):
            c = rows[i, j]
            if c == 3:
                pend_w += 1
            elif c == 4:
                pend_ww += 1
            elif c == 5:
                pend_w -= 1
            elif c == 6:
                pend_ww -= 1
            elif j > last_w:
                if pend_w > 0:
                    rows[i, j] = 5
                    pend_w -= 1
                elif pend_ww > 0:
                    rows[i, j] = 6
                    pend_ww -= 1
        if rl[i] + pend_w + pend_ww > rows.shape[1]:
            return 0
        for _ in range(pend_w):
            rows[i, rl[i]] = 5
            rl[i] += 1
        for _ in range(pend_ww):
            rows[i, rl[i]] = 6
            rl[i] += 1
    # the grid was squeezed and nothing before the first changed slot moved: keep that part
    keep = -1
    for i in range(p):
        lim = ln[i] if ln[i] < rl[i] else rl[i]
        fc = lim
        for j in range(lim):
            if g[i, j] != rows[i, j]:
                fc = j
                break
        if keep < 0 or fc < keep:
            keep = fc
    return _squeeze(rows, rl, keep, out, out_ln)


@kernel
def _fill(g, ln):  # pragma: no cover - compiled
    """Step 6 in place: fill idle slots with later passes whose inputs are ready, the peak kept.
    Every row is padded to the longest first."""
    p = g.shape[0]
    width = 0
    for i in range(p):
        if ln[i] > width:
            width = ln[i]
    for i in range(p):
        for j in range(ln[i], width):
            g[i, j] = 0
        ln[i] = width
    pk = np.zeros(p, np.int64)
    peak = _peaks(g, ln, pk)
    last = np.full((p, 7), -1, np.int64)
    for i in range(p):
        for j in range(width):
            if g[i, j] != 0:
                last[i, g[i, j]] = j
    per = 0
    for i in range(p):
        seen = np.zeros(7, np.int64)
        for j in range(width):
            seen[g[i, j]] += 1
        for c in range(1, 7):
            if seen[c] > per:
                per = seen[c]
    cnt = np.zeros((p, 7), np.int64)
    at = np.zeros((p, 7, per + 1), np.int64)
    mem = np.zeros(p, np.int64)
    avail = np.zeros(7, np.int64)
    for j in range(width):
        for i in range(p):
            c = g[i, j]
            if c == 0:
                # _fill_one: the first later pass of each kind that may move here
                n_avail = 0
                for q in range(1, 7):
                    avail[q] = 1 if last[i, q] > j else 0
                    n_avail += avail[q]
                delta = 0
                top = 0
                for k in range(j + 1, width):
                    if n_avail == 0:
                        break
                    ck = g[i, k]
                    delta += _delta(ck)
                    before = top
                    if delta > top:
                        top = delta
                    if ck == 0 or avail[ck] == 0:
                        continue
                    avail[ck] = 0
                    n_avail -= 1
                    if (ck == 1 or ck == 2) and mem[i] + before >= peak:
                        continue
                    n = cnt[i, ck]
                    d = _dep_dev(p, i, ck)
                    if d >= 0:
                        if cnt[d, ck] <= n or at[d, ck, n] >= j:
                            continue
                    else:
                        o = _own(p, i, ck)
                        if o != 0 and cnt[i, o] <= n:
                            continue
                    g[i, j] = ck
                    g[i, k] = 0
                    c = ck
                    break
            if c == 0:
                continue
            at[i, c, cnt[i, c]] = j
            cnt[i, c] += 1
            mem[i] += _delta(c)


@kernel
def _to_keys(g, ln, m, out):  # pragma: no cover - compiled
    """Device orders as pass keys (2p stages, ``m`` microbatches): the n-th pass of a kind is
    microbatch n; each W/w slot takes the earliest backward still waiting for its W (either
    chunk). Returns 0 when the grid is not a complete schedule."""
    p = g.shape[0]
    S = 2 * p
    sm = S * m
    L = out.shape[1]
    wait = np.zeros(2 * m + 1, np.int64)
    for i in range(p):
        cnt = np.zeros(7, np.int64)
        head = 0
        tail = 0
        w = 0
        for j in range(ln[i]):
            c = g[i, j]
            if c == 0:
                continue
            if w >= L:
                return 0
            if c == 5 or c == 6:
                if head >= tail:
                    return 0  # a W before its B
                out[i, w] = 2 * sm + wait[head]
                head += 1
                w += 1
                continue
            n = cnt[c]
            cnt[c] += 1
            if n >= m:
                return 0
            if c == 1:
                out[i, w] = i * m + n
            elif c == 2:
                out[i, w] = (S - 1 - i) * m + n
            else:
                st = S - 1 - i if c == 3 else i
                out[i, w] = sm + st * m + n
                wait[tail] = st * m + n
                tail += 1
            w += 1
        if w != L or cnt[1] != m or cnt[2] != m or cnt[3] != m or cnt[4] != m:
            return 0
    return 1


@kernel
def _schedule(p, m, res, release_w, keys):  # pragma: no cover - compiled
    """Steps 2–6 for one block (``res[i]``: device ``i``'s six residues) and ``m``
    microbatches, into ``keys`` (``[p, 6m]``); returns 0 when a step fails or the peak rises
    above the repeated block's. ``release_w``: step 4's delay of the first W."""
    M = m if m > 2 * p else 2 * p
    width = 28 * p + 6 * M + 64
    a = np.zeros((p, width), np.int64)
    la = np.zeros(p, np.int64)
    b = np.zeros((p, width), np.int64)
    lb = np.zeros(p, np.int64)
    pk = np.zeros(p, np.int64)
    if not _repeat(p, M, res, a, la):
        return 0
    start_peak = _peaks(a, la, pk)
    if start_peak > 2 * p:
        return 0
    # (the framework squeezes here too; the warm-up step only reads each device's order, which a
    # squeeze keeps, so it goes straight to the warm-up)
    _warmup(a, la, M, b, lb)
    if not _squeeze(b, lb, 0, a, la):
        return 0
    if _peaks(a, la, pk) > start_peak:
        return 0
    if m < M:
        _drop_extra(a, la, m, b, lb)
        if release_w:
            _delay_first_w(b, lb, a, la)
            if not _squeeze(a, la, 0, b, lb):
                return 0
        elif not _squeeze(b, lb, 0, a, la):
            return 0
        else:
            for i in range(p):
                for j in range(la[i]):
                    b[i, j] = a[i, j]
                lb[i] = la[i]
        start_peak = _peaks(b, lb, pk)
        for i in range(p):
            for j in range(lb[i]):
                a[i, j] = b[i, j]
            la[i] = lb[i]
    if not _cooldown(a, la, m, b, lb):
        return 0
    _fill(b, lb)
    if _peaks(b, lb, pk) > start_peak:
        return 0
    return _to_keys(b, lb, m, keys)



def grid_keys(p: int, m: int, slots: list[list[int]], release_w: bool = False) -> np.ndarray | None:
    """Device orders (pass keys ``[p, 6m]``) of the framework for one block, or ``None``."""
    keys = np.zeros((p, 6 * m), dtype=np.int64)
    ok = _schedule(p, m, ints(slots), bool(release_w), keys)
    return keys if ok else None


@kernel
def _block_peak(p, M, res):  # pragma: no cover - compiled
    width = 24 * p + 6 * M + 64
    g = np.zeros((p, width), np.int64)
    ln = np.zeros(p, np.int64)
    pk = np.zeros(p, np.int64)
    _repeat(p, M, res, g, ln)
    return _peaks(g, ln, pk)


# ---------------------------------------------------------------------------------------------
# the family


def short_m(p: int, m: int) -> int:
    """Microbatches for the steps before lengthening the stable phase (all of them when few):
    the steps need 2p (warm-up and cool-down), plus a few periods of stable phase."""
    return m if m <= 2 * p + 2 else 2 * p + 2


@lru_cache(maxsize=32)
def peaked_blocks(p: int, M: int) -> tuple[tuple[int, tuple, tuple], ...]:
    """The blocks of :func:`grid_blocks` with the peak (half-a) of their repeated grid for
    ``M`` microbatches, in search order."""
    out = []
    reduced = "narrow" if p > NARROW_ABOVE else p > REDUCED_ABOVE
    for params, slots in grid_blocks(p, reduced=reduced):
        out.append((int(_block_peak(p, M, ints(slots))), params, tuple(map(tuple, slots))))
    return tuple(out)


for _fn in (peaked_blocks, _next_row, _fill_w):
    on_clear(_fn.cache_clear)


def _label(params: tuple, release: bool) -> str:
    pattern, k0, k1, len0 = params
    return f"grid {''.join(map(str, pattern[1:]))} k{k0}/{k1}x{len0}" + (" w-late" if release else "")


_BUILT = LRU(8192)  # (p, ms, params) -> tuple of (label, keys) at ms microbatches


def grid_set(p: int, m: int, top: int | None = None) -> CandidateSet:
    """Every valid schedule of the framework for ``p`` devices and ``m`` microbatches from the
    blocks whose repeated grid peaks at most ``top`` half-a (default ``2p``, 1F1B's memory; the
    steps never raise the peak, so a budget of ``top`` needs no other block), deduplicated, in
    search order. Each block's orders are cached (they do not depend on the costs). A lengthened
    stable phase is not checked for deadlock here: timing gives such a candidate an infinite
    span (the search drops it)."""
    top = 2 * p if top is None else min(top, 2 * p)
    ms = short_m(p, m)
    placement = Placement.v_shape(p)
    sets = []
    for peak, params, slots in peaked_blocks(p, max(ms, 2 * p)):
        if peak > top and m >= 2 * p:  # with fewer microbatches the extra ones are dropped later
            continue
        got = _BUILT.get((p, ms, params))
        if got is None:
            made = []
            for release in ((False, True) if ms <= p else (False,)):
                keys = grid_keys(p, ms, [list(r) for r in slots], release)
                if keys is not None:
                    made.append((_label(params, release), keys))
            got = _BUILT.put((p, ms, params), tuple(made))
        for label, keys in got:
            sets.append((label, keys))
    if not sets:
        return CandidateSet(placement, m, False, np.zeros((0, p, 6 * m), dtype=np.int64), ())
    cs = CandidateSet(placement, ms, False, np.stack([k for _, k in sets]), tuple(lab for lab, _ in sets))
    cs = dedupe(cs)
    return extend(cs, m) if ms < m else cs


class GridFamily(Family):
    """The App. A framework (see the module docstring) for ``p <=`` :data:`GRID_MAX_P`: the
    blocks whose repeated grid fits the cap (so a larger cap holds every smaller cap's)."""

    name = "grid"

    def __init__(self) -> None:
        self._sets = LRU(64)

    def sets(self, q: Query, progress: Incumbent):
        p = q.p
        if p > GRID_MAX_P or q.fused or q.placement.kind != "v-shape":
            return
        top = min(2 * p, int(np.floor(2 * q.cap + 1e-9)))
        key = (p, q.m, top)
        got = self._sets.get(key)
        if got is None:
            got = self._sets.put(key, grid_set(p, q.m, top))
        yield got

