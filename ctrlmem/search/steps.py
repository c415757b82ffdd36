"""The paper's pipeline steps on slot timelines, as compiled kernels: repeat a block, place the
weight passes, reorder the warm-up and cool-down under the peak, squeeze (docs/theory.md §2, §10).

One implementation serves both users: :mod:`ctrlmem.search.buildingblock` wraps each step for its
:class:`~ctrlmem.search.buildingblock.Timeline` objects (the figures and notebooks show every step), and the
search's block families run the whole pipeline on arrays and get pass keys
(:func:`pipeline_keys`), never making a ``Timeline`` or a ``Schedule``.

A timeline here is a set of arrays ``(n, st, ln, op, sg, mb)``: ``n[d]`` passes on device ``d``,
and per pass its start slot, length in slots, op code (0 F, 1 B, 2 W, 3 BW), stage and
microbatch, each row sorted by start (no two passes of a device overlap). The semantics of each
step are documented on its wrapper in :mod:`ctrlmem.search.buildingblock`.
"""

from __future__ import annotations

import numpy as np

from ctrlmem.search.encoding import OP_B, OP_BW, OP_F, OP_W
from ctrlmem.search.kernels import ints, kernel

__all__ = ["OP_F", "OP_B", "OP_W", "OP_BW", "repeat", "place_w_rows", "squeeze_rows", "reorder_rows", "pipeline",
           "pipeline_keys", "Rows", "to_keys"]



class Rows:
    """A slot timeline as arrays (see the module docstring); ``cap`` passes of room per device."""

    __slots__ = ("n", "st", "ln", "op", "sg", "mb")

    def __init__(self, p: int, cap: int):
        self.n = np.zeros(p, dtype=np.int64)
        self.st = np.zeros((p, cap), dtype=np.int64)
        self.ln = np.zeros((p, cap), dtype=np.int64)
        self.op = np.zeros((p, cap), dtype=np.int64)
        self.sg = np.zeros((p, cap), dtype=np.int64)
        self.mb = np.zeros((p, cap), dtype=np.int64)

    @property
    def arrays(self):
        return self.n, self.st, self.ln, self.op, self.sg, self.mb

    def copy(self) -> "Rows":
        out = Rows.__new__(Rows)
        for name in Rows.__slots__:
            setattr(out, name, getattr(self, name).copy())
        return out


@kernel
def _sort_row(n, st, ln, op, sg, mb, d):  # pragma: no cover - compiled
    """Sort device ``d``'s passes by start slot."""
    k = n[d]
    order = np.argsort(st[d, :k])
    for arr in (st, ln, op, sg, mb):
        tmp = arr[d, :k].copy()
        for j in range(k):
            arr[d, j] = tmp[order[j]]


@kernel
def _repeat(bn, bst, bln, bop, bsg, T, m, n, st, ln, op, sg, mb):  # pragma: no cover - compiled
    """Device ``d``'s block passes (``bn[d]`` of them) repeated every ``T`` slots for ``m``
    microbatches, sorted by start."""
    p = bn.shape[0]
    for d in range(p):
        c = 0
        for k in range(m):
            for j in range(bn[d]):
                st[d, c] = bst[d, j] + k * T
                ln[d, c] = bln[d, j]
                op[d, c] = bop[d, j]
                sg[d, c] = bsg[d, j]
                mb[d, c] = k
                c += 1
        n[d] = c
        _sort_row(n, st, ln, op, sg, mb, d)


@kernel
def _drop_w(n, st, ln, op, sg, mb):  # pragma: no cover - compiled
    """Remove every W pass, in place."""
    p = n.shape[0]
    for d in range(p):
        c = 0
        for j in range(n[d]):
            if op[d, j] != 2:
                st[d, c] = st[d, j]
                ln[d, c] = ln[d, j]
                op[d, c] = op[d, j]
                sg[d, c] = sg[d, j]
                mb[d, c] = mb[d, j]
                c += 1
        n[d] = c


@kernel
def _place_w(n, st, ln, op, sg, mb, stages_desc, S, m, on, ost, oln, oop, osg, omb):  # pragma: no cover - compiled
    """Every W into the first free slots after its B (W in the input are dropped first): per
    device one FIFO of pending W per stage; a gap takes pending W, higher stage first, while
    they fit; the rest follow the device's last pass. A W lasts as long as the first W or B of
    its stage met in device order in the input."""
    p = n.shape[0]
    v = stages_desc.shape[1]
    wlen = np.zeros(S, np.int64)
    for d in range(p):
        for j in range(n[d]):
            s = sg[d, j]
            if wlen[s] == 0 and (op[d, j] == 2 or op[d, j] == 1):
                wlen[s] = ln[d, j]
    q = np.zeros((v, m + 1), np.int64)
    for d in range(p):
        head = np.zeros(v, np.int64)
        tail = np.zeros(v, np.int64)
        c = 0
        t = 0
        for j in range(n[d]):
            if op[d, j] != 2:
                t = st[d, j]
                break
        for j in range(n[d] + 1):
            if j < n[d] and op[d, j] == 2:
                continue
            stop = st[d, j] if j < n[d] else -1
            # fill the gap [t, stop) (to the end when stop < 0)
            while True:
                placed = False
                for x in range(v):
                    s = stages_desc[d, x]
                    if head[x] < tail[x]:
                        w = wlen[s]
                        if stop < 0 or t + w <= stop:
                            ost[d, c] = t
                            oln[d, c] = w
                            oop[d, c] = 2
                            osg[d, c] = s
                            omb[d, c] = q[x, head[x]]
                            c += 1
                            head[x] += 1
                            t += w
                            placed = True
                            break
                if not placed:
                    break
            if j == n[d]:
                break
            ost[d, c] = st[d, j]
            oln[d, c] = ln[d, j]
            oop[d, c] = op[d, j]
            osg[d, c] = sg[d, j]
            omb[d, c] = mb[d, j]
            c += 1
            if op[d, j] == 1:
                for x in range(v):
                    if stages_desc[d, x] == sg[d, j]:
                        q[x, tail[x]] = mb[d, j]
                        tail[x] += 1
                        break
            t = st[d, j] + ln[d, j]
        on[d] = c


@kernel(inline=True)
def _kind(o):  # pragma: no cover - compiled
    return 0 if o == 0 else (2 if o == 2 else 1)


@kernel
def _squeeze(n, st, ln, op, sg, mb, S, m):  # pragma: no cover - compiled
    """Every pass as early as possible, each device's order kept, in slots (no latency); the
    starts are rewritten in place. Returns 0 on a deadlock."""
    p = n.shape[0]
    sm = S * m
    end = np.full(3 * sm, -1, np.int64)
    ptr = np.zeros(p, np.int64)
    free = np.zeros(p, np.int64)
    remaining = 0
    for d in range(p):
        remaining += n[d]
    while remaining > 0:
        moved = 0
        for s in range(2 * p):
            d = s if s < p else 2 * p - 1 - s
            i = ptr[d]
            t_free = free[d]
            i0 = i
            while i < n[d]:
                kd = _kind(op[d, i])
                r = sg[d, i] * m + mb[d, i]
                key = kd * sm + r
                if kd == 0:
                    q = key - m if sg[d, i] > 0 else -1
                elif kd == 1:
                    q = key + m if sg[d, i] < S - 1 else r
                else:
                    q = key - sm
                t = t_free
                if q >= 0:
                    e = end[q]
                    if e < 0:
                        break
                    if e > t:
                        t = e
                st[d, i] = t
                t_free = t + ln[d, i]
                end[key] = t_free
                i += 1
            moved += i - i0
            ptr[d] = i
            free[d] = t_free
        if moved == 0:
            return 0
        remaining -= moved
    return 1


@kernel(inline=True)
def _cell_step(x, c, pe):  # pragma: no cover - compiled
    """One slot of a device's memory timeline: ``x`` is the slot's cell (0 idle, 1 a forward's
    first slot, 2 the last slot of a ``B`` whose ``W`` is pending, 3 any other busy slot, 4 a
    ``W``'s last slot); ``c`` the activations held, ``pe`` the ``W`` s pending (an idle slot runs
    one implicitly). Returns the new ``(c, pe)``."""
    if x == 0:
        if pe > 0:
            pe -= 1
            c -= 1
    elif x == 1:
        c += 1
    elif x == 2:
        pe += 1
    elif x == 4:
        c -= 1
    return c, pe


@kernel
def _reorder(n, st, ln, op, sg, mb, S, m, warmup, cooldown, cap_in, stable):  # pragma: no cover - compiled
    """Move warm-up and cool-down passes earlier without raising the peak, in place (see
    :func:`ctrlmem.search.buildingblock.reorder`). ``warmup``: -1 for the default (move the warm-up when the
    timeline has W passes or fuses its backward). ``cap_in``: -1 for the timeline's own peak."""
    p = n.shape[0]
    sm = S * m
    explicit_w = False
    any_b = False
    end_slot = 0
    for d in range(p):
        for j in range(n[d]):
            if op[d, j] == 2:
                explicit_w = True
            if op[d, j] == 1:
                any_b = True
            e = st[d, j] + ln[d, j]
            if e > end_slot:
                end_slot = e
    if warmup < 0:
        do_warm = explicit_w or not any_b
    else:
        do_warm = warmup == 1
    end_slot += 2
    start = np.full(3 * sm, -1, np.int64)
    length = np.zeros(3 * sm, np.int64)
    w_keys = np.zeros((p, sm + 1), np.int64)
    nw = np.zeros(p, np.int64)
    w_index = np.full(3 * sm, -1, np.int64)
    b0_t = -1
    b0_d = 0
    fl_t = -1
    fl_d = 0
    has_b0 = False
    has_fl = False
    for d in range(p):
        for j in range(n[d]):
            o = op[d, j]
            key = _kind(o) * sm + sg[d, j] * m + mb[d, j]
            start[key] = st[d, j]
            length[key] = ln[d, j]
            if o == 2:
                w_index[key] = nw[d]
                w_keys[d, nw[d]] = key
                nw[d] += 1
            elif sg[d, j] == 0:
                if o == 0 and mb[d, j] == m - 1:
                    fl_t = st[d, j]
                    fl_d = d
                    has_fl = True
                elif o != 0 and ((not has_b0) or st[d, j] < b0_t or (st[d, j] == b0_t and d < b0_d)):
                    b0_t = st[d, j]
                    b0_d = d
                    has_b0 = True
    INF = 1 << 60
    if not has_b0:
        b0_t = INF
        b0_d = 0
    if has_fl:
        if not has_b0:
            se_t = INF
            se_d = 0
        elif (fl_t > b0_t) or (fl_t == b0_t and fl_d > b0_d):
            se_t = fl_t
            se_d = fl_d
        else:
            se_t = b0_t
            se_d = b0_d
    else:
        se_t = INF
        se_d = 0
    # the passes that may move, in slot order: warm-up (< b0), stable, cool-down (> stable end)
    total = 0
    for d in range(p):
        total += n[d]
    mv_t = np.zeros(total, np.int64)
    mv_d = np.zeros(total, np.int64)
    mv_i = np.zeros(total, np.int64)
    nm = 0
    for d in range(p):
        for j in range(n[d]):
            t0 = st[d, j]
            if t0 < b0_t or (t0 == b0_t and d < b0_d):
                ok = do_warm
            elif t0 < se_t or (t0 == se_t and d <= se_d):
                ok = stable
            else:
                ok = cooldown
            if ok:
                mv_t[nm] = t0
                mv_d[nm] = d
                mv_i[nm] = j
                nm += 1
    # sort movable by (start, device, index)
    order = np.argsort(mv_t[:nm] * (p * (total + 1)) + mv_d[:nm] * (total + 1) + mv_i[:nm])
    # memory per device
    level = np.zeros((p, end_slot), np.int64)
    cell = np.zeros((p, end_slot), np.int64)
    cur = np.zeros((p, end_slot), np.int64)
    pend = np.zeros((p, end_slot), np.int64)
    top = 0
    for d in range(p):
        if explicit_w:
            diff = np.zeros(end_slot + 1, np.int64)
            for j in range(n[d]):
                if op[d, j] == 0:
                    diff[st[d, j]] += 1
                elif op[d, j] == 2 or op[d, j] == 3:
                    e = st[d, j] + ln[d, j]
                    diff[e if e < end_slot else end_slot] -= 1
            c = 0
            for t in range(end_slot):
                c += diff[t]
                level[d, t] = c
                if c > top:
                    top = c
        else:
            for j in range(n[d]):
                for t in range(st[d, j], st[d, j] + ln[d, j]):
                    cell[d, t] = 3
                if op[d, j] == 0:
                    cell[d, st[d, j]] = 1
                elif op[d, j] == 1:
                    cell[d, st[d, j] + ln[d, j] - 1] = 2
                elif op[d, j] == 3:
                    cell[d, st[d, j] + ln[d, j] - 1] = 4
            c = 0
            pe = 0
            for t in range(end_slot):
                c, pe = _cell_step(cell[d, t], c, pe)
                cur[d, t] = c
                pend[d, t] = pe
                if c > top:
                    top = c
    cap = cap_in if cap_in >= 0 else top
    # B starts per device, sorted, and each device's B length
    b_st = np.zeros((p, sm + 1), np.int64)
    nb = np.zeros(p, np.int64)
    b_len = np.ones(p, np.int64)
    for d in range(p):
        got = False
        for j in range(n[d]):
            if op[d, j] == 1:
                b_st[d, nb[d]] = st[d, j]
                nb[d] += 1
                if not got:
                    b_len[d] = ln[d, j]
                    got = True
        srt = np.sort(b_st[d, :nb[d]])
        for j in range(nb[d]):
            b_st[d, j] = srt[j]
    occ = np.zeros((p, end_slot + 2), np.int64)
    for d in range(p):
        for j in range(n[d]):
            for t in range(st[d, j], st[d, j] + ln[d, j]):
                occ[d, t] = 1
    new_st = st.copy()
    changed = np.zeros(p, np.int64)
    for oi in range(nm):
        x = order[oi]
        t0 = mv_t[x]
        d = mv_d[x]
        i = mv_i[x]
        o = op[d, i]
        kd = _kind(o)
        s = sg[d, i]
        k = mb[d, i]
        L = ln[d, i]
        key = kd * sm + s * m + k
        if kd == 2:  # anonymous W: after the j-th B of the device and the previous W
            j = w_index[key]
            ready = b_st[d, j] + b_len[d]
            if j > 0:
                prev = w_keys[d, j - 1]
                if start[prev] + length[prev] > ready:
                    ready = start[prev] + length[prev]
        else:
            ready = 0
            if kd == 0:
                if s > 0:
                    q = key - m
                    if start[q] + length[q] > ready:
                        ready = start[q] + length[q]
            else:
                q = key + m if s < S - 1 else s * m + k
                if start[q] + length[q] > ready:
                    ready = start[q] + length[q]
            if k > 0:
                q = key - 1
                if start[q] + length[q] > ready:
                    ready = start[q] + length[q]
        if ready >= t0:
            continue
        for u in range(t0, t0 + L):
            occ[d, u] = 0
        new = t0
        t = _find_hole(occ, d, L, ready)
        while 0 <= t < t0:
            if explicit_w:
                okm = _try_explicit(level, d, o, t0, t, L, cap, end_slot)
            else:
                okm = _try_implicit(cell, cur, pend, d, t0, t, L, cap, end_slot)
            if okm:
                new = t
                break
            t = _find_hole(occ, d, L, t + 1)
        for u in range(new, new + L):
            occ[d, u] = 1
        if new != t0:
            start[key] = new
            if o == 1:
                # b_st: remove t0, insert new (sorted)
                cnt = nb[d]
                pos = 0
                for u in range(cnt):
                    if b_st[d, u] == t0:
                        pos = u
                        break
                for u in range(pos, cnt - 1):
                    b_st[d, u] = b_st[d, u + 1]
                ins = 0
                while ins < cnt - 1 and b_st[d, ins] <= new:
                    ins += 1
                for u in range(cnt - 1, ins, -1):
                    b_st[d, u] = b_st[d, u - 1]
                b_st[d, ins] = new
            new_st[d, i] = new
            changed[d] = 1
    for d in range(p):
        if changed[d]:
            for j in range(n[d]):
                st[d, j] = new_st[d, j]
            _sort_row(n, st, ln, op, sg, mb, d)


@kernel(inline=True)
def _find_hole(occ, d, L, frm):  # pragma: no cover - compiled
    """The first slot >= ``frm`` starting ``L`` free slots on device ``d`` (-1: none)."""
    W = occ.shape[1]
    t = frm
    while t + L <= W:
        good = True
        for u in range(t, t + L):
            if occ[d, u] != 0:
                good = False
                t = u + 1
                break
        if good:
            return t
    return -1


@kernel(inline=True)
def _try_explicit(level, d, o, t0, t, L, cap, n):  # pragma: no cover - compiled
    """Move the pass at ``t0`` to ``t < t0`` if the peak stays within ``cap`` (W explicit: an F
    holds from its start, a W/BW releases at its end)."""
    if o == 0:
        mx = level[d, t]
        for u in range(t, t0):
            if level[d, u] > mx:
                mx = level[d, u]
        if mx + 1 > cap:
            return False
        for u in range(t, t0):
            level[d, u] += 1
    elif o == 2 or o == 3:
        hi = t0 + L if t0 + L < n else n
        for u in range(t + L, hi):
            level[d, u] -= 1
    return True


@kernel
def _try_implicit(cell, cur, pend, d, t0, t, L, cap, n):  # pragma: no cover - compiled
    """As :func:`_try_explicit` with W implicit: every idle slot releases one pending activation
    of an earlier B (as ``place_w`` would); BW releases at its end."""
    moved = cell[d, t0 : t0 + L].copy()
    for u in range(t0, t0 + L):
        cell[d, u] = 0
    for u in range(L):
        cell[d, t + u] = moved[u]
    c = cur[d, t - 1] if t > 0 else 0
    pe = pend[d, t - 1] if t > 0 else 0
    stop = t0 + L - 1
    nc = 0
    curs = np.zeros(n - t, np.int64)
    pends = np.zeros(n - t, np.int64)
    u = t
    ok = True
    while u < n:
        c, pe = _cell_step(cell[d, u], c, pe)
        if c > cap:
            ok = False
            break
        curs[nc] = c
        pends[nc] = pe
        nc += 1
        if u >= stop and c == cur[d, u] and pe == pend[d, u]:
            break
        u += 1
    if not ok:
        for u2 in range(L):
            cell[d, t + u2] = 0
        for u2 in range(L):
            cell[d, t0 + u2] = moved[u2]
        return False
    for u2 in range(nc):
        cur[d, t + u2] = curs[u2]
        pend[d, t + u2] = pends[u2]
    return True


# ---------------------------------------------------------------------------------------------
# Python entry points on Rows


def repeat(blk: Rows, T: int, m: int) -> Rows:
    p = len(blk.n)
    out = Rows(p, int(blk.n.max()) * m if p else 0)
    _repeat(blk.n, blk.st, blk.ln, blk.op, blk.sg, T, m, *out.arrays)
    return out


def place_w_rows(rows: Rows, stages_desc: np.ndarray, S: int, m: int) -> Rows:
    """W placed, any there dropped first (:func:`ctrlmem.search.buildingblock.place_w`)."""
    p = len(rows.n)
    out = Rows(p, int(rows.n.max()) + (int(stages_desc.shape[1]) * m if p else 0) + 1)
    _place_w(*rows.arrays, stages_desc, S, m, *out.arrays)
    return out


def squeeze_rows(rows: Rows, S: int, m: int) -> Rows | None:
    out = rows.copy()
    return out if _squeeze(*out.arrays, S, m) else None


def reorder_rows(rows: Rows, S: int, m: int, warmup: bool | None = None, cooldown: bool = True,
            memory_cap: int | None = None, stable: bool = False) -> Rows:
    out = rows.copy()
    _reorder(*out.arrays, S, m, -1 if warmup is None else int(bool(warmup)), bool(cooldown),
             -1 if memory_cap is None else int(memory_cap), bool(stable))
    return out


def pipeline(blk: Rows, T: int, m: int, S: int, stages_desc: np.ndarray, reorder_phases: bool = True,
             keep_steps: bool = False) -> tuple[Rows | None, dict[str, Rows]]:
    """The steps of :func:`ctrlmem.search.buildingblock.pipeline_steps` on arrays: (the squeezed result or
    ``None`` on a deadlock, the intermediate timelines when ``keep_steps``)."""
    steps: dict[str, Rows] = {}
    t = repeat(blk, T, m)
    if keep_steps:
        steps["repeat"] = t
    split = _has(t, OP_W)
    if split:
        t = place_w_rows(_without_w(t), stages_desc, S, m)
        if keep_steps:
            steps["place_w"] = t
    if reorder_phases:
        t = reorder_rows(t, S, m)
        if split:
            t = place_w_rows(_without_w(t), stages_desc, S, m)  # the reorder moved W as anonymous releases
        # the rounds that count W as filling idle slots assume one-slot W (V-shape chunks)
        if split and _w_all_one(t):
            sq = squeeze_rows(t, S, m)
            if sq is None:
                return None, steps
            t = place_w_rows(reorder_rows(_without_w(sq), S, m, warmup=True), stages_desc, S, m)
            sq = squeeze_rows(t, S, m)
            if sq is None:
                return None, steps
            t = place_w_rows(_without_w(reorder_rows(sq, S, m, warmup=False, cooldown=False, stable=True)), stages_desc, S, m)
        if keep_steps:
            steps["reorder"] = t
    out = squeeze_rows(t, S, m)
    if keep_steps and out is not None:
        steps["squeeze"] = out
    return out, steps


def _has(t: Rows, code: int) -> bool:
    for d in range(len(t.n)):
        if (t.op[d, : t.n[d]] == code).any():
            return True
    return False


def _w_all_one(t: Rows) -> bool:
    for d in range(len(t.n)):
        k = t.n[d]
        sel = t.op[d, :k] == OP_W
        if (t.ln[d, :k][sel] != 1).any():
            return False
    return True


def _without_w(t: Rows) -> Rows:
    r = t.copy()
    _drop_w(*r.arrays)
    return r


@kernel
def _keys(n, op, sg, mb, S, m, out):  # pragma: no cover - compiled
    sm = S * m
    for d in range(n.shape[0]):
        for j in range(n[d]):
            out[d, j] = _kind(op[d, j]) * sm + sg[d, j] * m + mb[d, j]


def to_keys(rows: Rows, S: int, m: int) -> np.ndarray:
    """Each device's passes in order as pass keys (``int64[p, L]``; every device the same count)."""
    L = int(rows.n[0])
    if (rows.n != L).any():
        raise ValueError("devices run different numbers of passes")
    out = np.zeros((len(rows.n), L), dtype=np.int64)
    _keys(rows.n, rows.op, rows.sg, rows.mb, S, m, out)
    return out


def pipeline_keys(blk: Rows, T: int, m: int, S: int, stages_desc: np.ndarray) -> np.ndarray | None:
    """The final order of :func:`pipeline` as pass keys, or ``None`` on a deadlock."""
    out, _ = pipeline(blk, T, m, S, stages_desc)
    return None if out is None else to_keys(out, S, m)


_ = ints
