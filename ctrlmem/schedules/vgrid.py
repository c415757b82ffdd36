"""The paper's App. A framework on a unit-slot grid: V-shape building blocks from a device-0
pattern and two offset levels, repeated, squeezed and reordered (docs/theory.md §10).

A third candidate family for the ``v-shape`` search (next to :mod:`ctrlmem.blocks` and the list
scheduler of :mod:`ctrlmem.schedules.listsched`). Everything here is in unit slots, independent
of the costs: a device holds six pass kinds per microbatch, written

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

The result is kept only if it is a valid schedule whose peak is at most the repeated block's.
The orders do not depend on the costs, so they are cached per (p, m); the search simulates them
under the user's costs. For long pipelines the steps run on a shorter one and the periodic stable
phase is then lengthened (:func:`ctrlmem.blocks.extend_stable`).
"""

from __future__ import annotations

import itertools
from functools import lru_cache, partial
from itertools import accumulate

from ..blocks import extend_stable
from ..ir import Op, Pass, Placement, Schedule

# a Pass without the NamedTuple's Python-level constructor (these loops make millions)
_new_pass = partial(tuple.__new__, Pass)

__all__ = ["grid_blocks", "grid_schedule", "grid_schedules"]

T = 6  # slots per interval
_KINDS = "FfBbWw"
_IDLE = " "


def grid_blocks(p: int, reduced: bool = False) -> list[tuple[tuple, list[list[int]]]]:
    """The distinct collision-free blocks of step 1 for ``p`` devices, in search order: (params,
    per-device slots of F, f, B, b, W, w) with params ``(pattern, k0, k1, len0)``.

    ``reduced`` (used for ``p > 12``, to keep the search within seconds): only the 8 device-0
    patterns that won a survey at p = 8 and 12 (seven cost mixes, every budget; see
    ``_SURVEY_PATTERNS``) instead of all 60. Every ``len0`` is kept: it steps the peak."""
    out, seen = [], set()
    lens = list(range(1, p))
    for sf, sb1, sb0 in itertools.permutations(range(1, T), 3):
        if reduced and (sf, sb1, sb0) not in _SURVEY_PATTERNS:
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
# budget in a survey (p = 8 and 12, m = 2p and 4p, seven F:B:W:comm mixes, every budget up to 2.0):
# the patterns tried for p > 12. All have B after f (the loss stage's backward in the same interval).
_SURVEY_PATTERNS = {(1, 2, 3), (3, 4, 5), (1, 3, 2), (2, 3, 4), (2, 3, 5), (1, 2, 4), (1, 4, 3), (1, 3, 5)}


def _fill_w(slots: list[int]) -> list[int] | None:
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
    return out


def _block(p: int, first: tuple[int, int, int, int], k0: int, k1: int, len0: int) -> list[list[int]] | None:
    rows = [_fill_w(list(first))]
    for i in range(p - 1):
        k = k0 if i < len0 else k1
        prev = rows[-1]
        nxt = [(prev[0] + k) % T, (prev[1] - 1) % T, (prev[2] + k) % T, (prev[3] - 1) % T]
        if len(set(nxt)) < 4:
            return None
        nxt = _fill_w(nxt)
        if nxt is None:
            return None
        rows.append(nxt)
    return rows


def _first_at(t: int, residue: int) -> int:
    """The first slot >= t with the given residue modulo T."""
    return t + (residue - t) % T


def _repeat(p: int, M: int, res: list[list[int]]) -> list[list[str]]:
    """Step 2's repeated grid: microbatch 0 of each kind at the first slot of its residue after
    its input (the chain F down the devices, f up, B down, b up; W after B, w after b)."""
    F = [0] * p
    f = [0] * p
    B = [0] * p
    b = [0] * p
    F[0] = res[0][0]
    for i in range(1, p):
        F[i] = _first_at(F[i - 1] + 1, res[i][0])
    f[p - 1] = _first_at(F[p - 1] + 1, res[p - 1][1])
    for i in range(p - 2, -1, -1):
        f[i] = _first_at(f[i + 1] + 1, res[i][1])
    B[0] = _first_at(f[0] + 1, res[0][2])
    for i in range(1, p):
        B[i] = _first_at(B[i - 1] + 1, res[i][2])
    b[p - 1] = _first_at(B[p - 1] + 1, res[p - 1][3])
    for i in range(p - 2, -1, -1):
        b[i] = _first_at(b[i + 1] + 1, res[i][3])
    rows = []
    for i in range(p):
        start = {"F": F[i], "f": f[i], "B": B[i], "b": b[i]}
        start["W"] = _first_at(B[i] + 1, res[i][4])
        start["w"] = _first_at(b[i] + 1, res[i][5])
        length = max(start.values()) + T * (M - 1) + 1
        row = [_IDLE] * length
        for kind, t0 in start.items():
            for k in range(M):
                row[t0 + T * k] = kind
        rows.append(row)
    return rows


_DELTA = {"F": 1, "f": 1, "W": -1, "w": -1, "B": 0, "b": 0, _IDLE: 0}


def _peaks(rows: list[list[str]]) -> list[int]:
    """Each device's peak memory (half-a) along its order."""
    return [max(0, max(accumulate(map(_DELTA.__getitem__, row)), default=0)) for row in rows]


def _dep(p: int, i: int, c: str) -> tuple[int, str] | None:
    """The (device, kind) whose pass of the same microbatch must come first (None: only the
    device's own order, or a same-device input checked by the counts)."""
    if c in "FB":
        return (i - 1, c) if i > 0 else None
    if c in "fb":
        return (i + 1, c) if i < p - 1 else None
    return None


def _own(p: int, i: int, c: str) -> str | None:
    """The kind on the same device whose pass of the same microbatch must come first (the turns
    at the ends of the V, and each W after its backward); None if there is none."""
    if c in "Ww":
        return "B" if c == "W" else "b"
    if c == "B" and i == 0:
        return "f"
    if i == p - 1 and c in "fb":
        return "F" if c == "f" else "B"
    return None


def _same_device_ready(i: int, p: int, c: str, n: int, cnt: dict) -> bool:
    """Whether the same-device input of the n-th ``c`` on device ``i`` has been counted."""
    own = _own(p, i, c)
    return own is None or cnt[own] > n


def _squeeze(rows: list[list[str]], keep: int = 0) -> list[list[str]] | None:
    """As soon as possible in unit slots, each device's order kept; None on a deadlock.
    ``keep``: the slots before it are already as soon as possible (a squeezed grid changed only
    from there on) and stay as they are."""
    p = len(rows)
    starts: list[dict[str, list[int]]] = [{k: [] for k in _KINDS} for _ in range(p)]
    seqs = []
    for i, row in enumerate(rows):
        cnt = dict.fromkeys(_KINDS, 0)
        seq = []
        # per kind: (its start list, the same-device input's, the neighbour input's)
        how = {}
        for c in _KINDS:
            d = _dep(p, i, c)
            own = _own(p, i, c)
            how[c] = (starts[i][c], starts[i][own] if own else None, starts[d[0]][d[1]] if d else None)
        for c in row:
            if c == _IDLE:
                continue
            n = cnt[c]
            cnt[c] = n + 1
            mine, own, dep = how[c]
            seq.append((mine, n, own, dep))
        seqs.append(seq)
    pos = [0] * p
    free = [0] * p
    if keep:
        for i, row in enumerate(rows):
            k = 0
            for j, c in enumerate(row[:keep]):
                if c != _IDLE:
                    seqs[i][k][0].append(j)
                    k += 1
                    free[i] = j + 1
            pos[i] = k
    left = sum(map(len, seqs)) - sum(pos)
    sweep = list(range(p)) + list(range(p - 1, -1, -1))
    while left:
        progress = False
        for i in sweep:
            seq, k, t_free = seqs[i], pos[i], free[i]
            n_seq = len(seq)
            while k < n_seq:
                mine, n, own, dep = seq[k]
                if own is not None and len(own) <= n:
                    return None  # the device's own order needs a later pass first
                t = t_free
                if dep is not None:
                    if len(dep) <= n:
                        break
                    if dep[n] >= t:
                        t = dep[n] + 1
                mine.append(t)
                t_free = t + 1
                k += 1
            if k != pos[i]:
                left -= k - pos[i]
                pos[i], free[i] = k, t_free
                progress = True
        if not progress:
            return None
    width = max(free)
    out = []
    for i in range(p):
        row = [_IDLE] * width
        for c, ts in starts[i].items():
            for t in ts:
                row[t] = c
        out.append(row)
    return out




def _warmup(rows: list[list[str]], m: int) -> list[list[str]]:
    """Step 3 on the order before each device's first ``b`` (later passes unchanged)."""
    p = len(rows)
    peak = min(max(_peaks(rows)), 2 * p)
    out = []
    for i, row in enumerate(rows):
        order = [c for c in row if c != _IDLE]
        cut = order.index("b") if "b" in order else len(order)
        head, tail = order[:cut], order[cut:]
        have = {k: head.count(k) for k in "FfBW"}
        if len(head) != sum(have.values()):  # a w before the first b: leave the device alone
            out.append(order)
            continue
        n_ff = min(i + 1, peak // 2, m)
        n_f = min(peak - n_ff, m)
        used = dict.fromkeys("FfBW", 0)
        new: list[str] = []

        def put(k: str, limit: int) -> None:
            if used[k] < min(limit, have[k]):
                new.append(k)
                used[k] += 1

        for _ in range(2 * (p - 1 - i)):
            put("F", n_f)
        for _ in range(i + 1):
            put("F", n_f)
            put("f", n_ff)
        while any(used[k] < have[k] for k in "FfBW"):
            put("B", have["B"])
            put("W", have["W"])
            if used["f"] < have["f"]:
                put("f", have["f"])
            else:
                put("F", have["F"])
        out.append(new + tail)
    return out


def _drop_extra(rows: list[list[str]], m: int) -> list[list[str]]:
    out = []
    for row in rows:
        cnt = dict.fromkeys(_KINDS, 0)
        new = []
        for c in row:
            if c != _IDLE:
                if cnt[c] >= m:
                    continue
                cnt[c] += 1
            new.append(c)
        out.append(new)
    return out


def _delay_first_w(rows: list[list[str]]) -> list[list[str]]:
    """Step 4 for few microbatches: move each device's first W/w (as many as it lacks to reach
    the highest device's peak) to the end of its order."""
    peaks = _peaks(rows)
    top = min(max(peaks), 2 * len(rows))
    out = []
    for row, pk in zip(rows, peaks):
        order = [c for c in row if c != _IDLE]
        need = max(0, top - pk)
        moved, keep = [], []
        for c in order:
            if c in "Ww" and len(moved) < need:
                moved.append(c)
            else:
                keep.append(c)
        out.append(keep + moved)
    return out


def _cooldown(rows: list[list[str]], m: int) -> list[list[str]] | None:
    """Step 5 on a squeezed grid (positions matter here)."""
    p = len(rows)
    peak = max(_peaks(rows))
    n_bb = min((peak + 1) // 2, m)
    n_b = min(peak - n_bb, m)
    before = rows
    rows = [list(r) for r in rows]
    anchor = None
    for i, row in enumerate(rows):
        c_b = c_bb = c_w = c_ww = 0
        last_f = -1
        for j in range(len(row) - 1, -1, -1):
            c = row[j]
            if c == "f" and last_f < 0:
                last_f = j
            if c == "B" and c_b < i + 1 and c_b < n_b:
                row[j] = _IDLE
                c_b += 1
            if c == "b" and c_bb < n_bb:
                row[j] = _IDLE
                c_bb += 1
        for j in range(len(row) - 1, -1, -1):
            if c_w >= c_b and c_ww >= c_bb and c_w + c_ww >= peak:
                break
            if row[j] == "W":
                row[j] = _IDLE
                c_w += 1
            elif row[j] == "w":
                row[j] = _IDLE
                c_ww += 1
        if i == 0:
            anchor = last_f
        if anchor is None or anchor < 0:
            return None
        for k in range(c_bb):
            if not _put(row, anchor - i + 2 * p - 2 * k, "b"):
                return None
        for k in range(c_b):
            if not _put(row, anchor + 1 + i - 2 * k, "B"):
                return None
        # the removed W go back into the idle slots after the last W left, FIFO over B/b
        last_w = max((j for j, c in enumerate(row) if c in "Ww"), default=-1)
        pend_w = pend_ww = 0
        for j in range(len(row)):
            c = row[j]
            if c == "B":
                pend_w += 1
            elif c == "b":
                pend_ww += 1
            elif c == "W":
                pend_w -= 1
            elif c == "w":
                pend_ww -= 1
            elif j > last_w:
                if pend_w > 0:
                    row[j] = "W"
                    pend_w -= 1
                elif pend_ww > 0:
                    row[j] = "w"
                    pend_ww -= 1
        row.extend("W" * pend_w + "w" * pend_ww)
    # the grid was squeezed and nothing before the first changed slot moved: keep that part
    keep = min(_first_change(a, b) for a, b in zip(before, rows))
    return _squeeze(rows, keep)


def _first_change(old: list[str], new: list[str]) -> int:
    for j, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return j
    return min(len(old), len(new))


def _put(row: list[str], j: int, c: str) -> bool:
    if j < 0:
        return False
    if j >= len(row):
        row.extend(_IDLE * (j + 1 - len(row)))
    if row[j] != _IDLE:
        return False
    row[j] = c
    return True


def _fill(rows: list[list[str]]) -> list[list[str]]:
    """Step 6: fill idle slots with later passes whose inputs are ready, the peak kept."""
    p = len(rows)
    width = max(map(len, rows))
    rows = [list(r) + [_IDLE] * (width - len(r)) for r in rows]
    peak = max(_peaks(rows))
    last = [{c: -1 for c in _KINDS} for _ in range(p)]
    for i, row in enumerate(rows):
        for j, c in enumerate(row):
            if c != _IDLE:
                last[i][c] = j
    cnt = [dict.fromkeys(_KINDS, 0) for _ in range(p)]
    at: list[dict[str, list[int]]] = [{k: [] for k in _KINDS} for _ in range(p)]
    mem = [0] * p
    for j in range(width):
        for i in range(p):
            row = rows[i]
            c = row[j]
            if c == _IDLE:
                c = _fill_one(rows, i, j, width, peak, last[i], cnt, at, mem[i], p)
            if c == _IDLE:
                continue
            at[i][c].append(j)
            cnt[i][c] += 1
            mem[i] += 1 if c in "Ff" else -1 if c in "Ww" else 0
    return rows


def _fill_one(rows, i, j, width, peak, last, cnt, at, mem, p) -> str:
    row = rows[i]
    avail = {c for c in _KINDS if last[c] > j}
    delta = top = 0
    for k in range(j + 1, width):
        if not avail:
            break
        c = row[k]
        if c in "Ff":
            delta += 1
        elif c in "Ww":
            delta -= 1
        before = top
        top = max(top, delta)
        if c == _IDLE or c not in avail:
            continue
        avail.discard(c)
        if c in "Ff" and mem + before >= peak:
            continue
        n = cnt[i][c]
        d = _dep(p, i, c)
        if d is not None:
            got = at[d[0]][d[1]]
            if len(got) <= n or got[n] >= j:
                continue
        elif not _same_device_ready(i, p, c, n, cnt[i]):
            continue
        row[j], row[k] = c, _IDLE
        return c
    return _IDLE


def _to_orders(rows: list[list[str]], p: int) -> list[list[Pass]]:
    """Device orders with microbatches: the n-th pass of a kind is microbatch n; each W/w slot
    takes the earliest backward still waiting for its W (either chunk)."""
    S = 2 * p
    orders = []
    for i, row in enumerate(rows):
        stage = {"F": i, "f": S - 1 - i, "B": S - 1 - i, "b": i}
        cnt = dict.fromkeys("FfBb", 0)
        waiting: list[tuple[int, int]] = []
        head = 0
        out = []
        for c in row:
            if c == _IDLE:
                continue
            if c in "Ww":
                if head >= len(waiting):
                    raise ValueError("a W before its B")
                s, n = waiting[head]
                head += 1
                out.append(_new_pass((Op.W, s, n)))
                continue
            n = cnt[c]
            cnt[c] = n + 1
            if c in "Ff":
                out.append(_new_pass((Op.F, stage[c], n)))
            else:
                out.append(_new_pass((Op.B, stage[c], n)))
                waiting.append((stage[c], n))
        orders.append(out)
    return orders


def grid_schedule(p: int, m: int, slots: list[list[int]], release_w: bool = False) -> Schedule | None:
    """Steps 2–6 for one block (slots from :func:`grid_blocks`) and ``m`` microbatches; None
    when a step fails or the peak rises above the repeated block's. ``release_w``: step 4's
    delay of the first W (the framework applies it when ``m <= p``)."""
    M = max(m, 2 * p)
    rows = _repeat(p, M, slots)
    start_peak = max(_peaks(rows))
    if start_peak > 2 * p:
        return None
    # (the framework squeezes here too; the warm-up step only reads each device's order, which a
    # squeeze keeps, so it goes straight to the warm-up)
    rows = _squeeze(_warmup(rows, M))
    if rows is None or max(_peaks(rows)) > start_peak:
        return None
    if m < M:
        rows = _drop_extra(rows, m)
        if release_w:
            rows = _delay_first_w(rows)
        rows = _squeeze(rows)
        if rows is None:
            return None
        start_peak = max(_peaks(rows))
    rows = _cooldown(rows, m)
    if rows is None:
        return None
    rows = _fill(rows)
    if max(_peaks(rows)) > start_peak:
        return None
    try:
        orders = _to_orders(rows, p)
    except ValueError:
        return None
    if any(sum(1 for x in o if x.op is Op.F) != 2 * m for o in orders):
        return None
    return Schedule.from_orders("v-shape", Placement.v_shape(p), m, orders)


def _short(p: int, m: int) -> int:
    """Microbatches for the steps before lengthening the stable phase (all of them when few):
    the steps need 2p (warm-up and cool-down), plus a few periods of stable phase."""
    return m if m <= 2 * p + 2 else 2 * p + 2


@lru_cache(maxsize=16)
def _peaked_blocks(p: int, M: int) -> tuple[tuple[int, tuple, list[list[int]]], ...]:
    """The blocks of :func:`grid_blocks` with the peak (half-a) of their repeated grid for
    ``M`` microbatches, in search order."""
    out = []
    for params, slots in grid_blocks(p, reduced=p > 12):
        out.append((max(_peaks(_repeat(p, M, slots))), params, slots))
    return tuple(out)


_BUILT: dict[tuple[int, int], dict[tuple, tuple[tuple[str, Schedule], ...]]] = {}


def grid_schedules(p: int, m: int, top: int | None = None) -> tuple[tuple[str, Schedule], ...]:
    """Every valid schedule of the framework for ``p`` devices and ``m`` microbatches from the
    blocks whose repeated grid peaks at most ``top`` half-a (default ``2p``, 1F1B's memory; the
    steps never raise the peak, so a budget of ``top`` needs no other block): (label, schedule),
    deduplicated. Each block's schedules are cached (they do not depend on the costs).
    The steps keep every dependency in each device's order, but a lengthened stable phase is
    not checked here: simulating a schedule raises :class:`ctrlmem.ScheduleError` if it
    deadlocks (the ``v-shape`` search drops such candidates)."""
    top = 2 * p if top is None else min(top, 2 * p)
    ms = _short(p, m)
    done = _BUILT.setdefault((p, m), {})
    if len(_BUILT) > 16:
        _BUILT.pop(next(iter(_BUILT)))
    out, seen = [], set()
    for peak, (pattern, k0, k1, len0), slots in _peaked_blocks(p, max(ms, 2 * p)):
        if peak > top and m >= 2 * p:  # with fewer microbatches the extra ones are dropped later
            continue
        key = (pattern, k0, k1, len0)
        if key not in done:
            got = []
            for release in ((False, True) if ms <= p else (False,)):
                s = grid_schedule(p, ms, slots, release)
                if s is None:
                    continue
                if ms < m:
                    try:
                        s = extend_stable(s, m)
                    except ValueError:
                        continue
                label = f"grid {''.join(map(str, pattern[1:]))} k{k0}/{k1}x{len0}" + (" w-late" if release else "")
                got.append((label, s))
            done[key] = tuple(got)
        for label, s in done[key]:
            if s.device_passes not in seen:
                seen.add(s.device_passes)
                out.append((label, s))
    return tuple(out)


def clear_cache() -> None:
    """Forget every built grid schedule."""
    _BUILT.clear()
    _peaked_blocks.cache_clear()
