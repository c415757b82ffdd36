"""Lower bounds on the longest device span of any schedule, used to skip work that cannot win.

For a placement, ``m`` microbatches and costs, and a per-device memory cap ``C`` (in ``a``),
every schedule (any order) whose devices peak at most at ``C`` has, on each device ``d``,

* **work**: ``span_d ≥ m · Σ_{s on d} (f_s + b_s + w_s)``: the device runs every pass of its
  stages one after another;
* **memory × time**: an ``F`` of stage ``s`` allocates ``act_s`` at its start and the ``W`` (or
  fused ``BW``) releases it at its end, so microbatch ``k`` holds it at least its lifespan
  ``ℓ_s = f_s + chain_s + b_s + w_s``, where ``chain_s`` is the shortest time from the end of
  ``F(s)`` to the start of ``B(s)``: the forwards of every later stage, the backwards back down
  to ``s + 1``, and the hop latency on each change of device along the way. A device holds
  activations only between the start of its first pass and the end of its last, never more than
  ``C`` at once, so ``C · span_d ≥ ∫ memory_d(t) dt ≥ m · Σ_{s on d} act_s · ℓ_s``.

So ``span ≥ max_d max(work_d, m · Σ_{s on d} act_s ℓ_s / C)``; :func:`span_bound` also takes the
makespan bounds *levels* and *ramps* (below) measured from each device's first pass. The second term is what makes
small budgets slow (it is the paper's *repeating bubble* when the budget is below what the
lifespans need, docs/theory.md §3); it decreases as ``C`` grows, which is what the search uses:
a cap whose bound exceeds the best span found cannot hold the winner. docs/theory.md §6 has the
bound's derivation and the tighter additive bounds of the cool-down and warm-up.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement

__all__ = ["span_bound", "shortest_lifespans", "chains", "forward_tails", "makespan_bounds", "makespan_bound"]


def shortest_lifespans(placement: Placement, costs: Costs) -> list[float]:
    """Each stage's shortest activation lifespan ``ℓ_s`` under ``costs`` (see the module docstring)."""
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    comm = float(costs.comm)
    dev = placement.stage_device
    out = [0.0] * S
    after = 0.0  # chain from the end of F(s) to the start of B(s), built from the last stage down
    for s in range(S - 1, -1, -1):
        if s < S - 1:
            hop = comm if dev[s] != dev[s + 1] else 0.0
            # F(s) -> [hop] F(s+1) ... F(S-1) -> B(S-1) ... B(s+1) -> [hop] B(s)
            after = after + f[s + 1] + b[s + 1] + 2 * hop
        out[s] = f[s] + after + b[s] + w[s]
    return out


@lru_cache(maxsize=256)
def _terms(placement: Placement, m: int, costs: Costs) -> tuple[tuple, ...]:
    """Per device: its work, what its microbatches hold (memory × time, ``a`` × time), and what
    :func:`_levels` and :func:`_ramps` need, with the chains measured from the device's own first
    forward (a span starts there)."""
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    act = p / S
    life = shortest_lifespans(placement, costs)
    head_f, head_b, _, _ = chains(placement, costs)
    out = []
    for d in range(p):
        st = sorted(placement.stages_of(d))
        work = m * math.fsum(f[s] + b[s] + w[s] for s in st)
        held = m * math.fsum(act * life[s] for s in st)
        h0 = head_f[st[0]]  # the device's first pass is a forward of its lowest stage
        out.append((work, held, st, [x - h0 for x in head_f], [x - h0 for x in head_b],
                    min(f[s] for s in st), min(w[s] for s in st)))
    return tuple(out)


def span_bound(placement: Placement, m: int, costs: Costs) -> Callable[[float], float]:
    """``bound(cap)``: a lower bound on the longest device span of any schedule of ``placement``
    and ``m`` microbatches under ``costs`` whose devices peak at most at ``cap`` (``a``); the
    default memory model (each stage's activation ``p/S``, released at its ``W``, or fused ``BW``).

    Per device the largest of its work, memory × time (``held / cap``) and, with the cap in whole
    activations ``k``, the makespan bounds *levels* and *ramps* (:func:`_levels`, :func:`_ramps`;
    docs/theory.md §6, bounds 6 and 8) measured from the device's first pass instead of time 0: a
    device's span starts at a forward of its lowest stage, every level-``r`` window of a microbatch
    starts at least the chain from that forward to its ``r``-th stage's forward later, its forwards'
    ramp starts with the span and its releases' ramp (each a ``W`` or ``BW``, at least the shortest
    ``w``) ends with it. So an odd number of half-activations on the V-shape, where only some
    microbatches can hold both of a device's stages, is bounded as the makespan is."""
    terms = _terms(placement, m, costs)
    _, b, w = costs.stage_times(placement.num_stages, placement.num_devices)
    life = shortest_lifespans(placement, costs)
    act = placement.num_devices / placement.num_stages
    seen: dict[float, float] = {}

    def bound(cap: float) -> float:
        if cap <= 0:
            return math.inf
        got = seen.get(cap)
        if got is not None:
            return got
        k = math.floor(cap / act + 1e-9)
        best = 0.0
        for work, held, st, head_f, head_b, f_min, w_min in terms:
            best = max(best, work, held / cap)
            if k >= 1:
                lev, held_all = _levels(st, m, k, head_f, head_b, b, w, life)
                best = max(best, lev, _ramps(0.0, held_all, k, f_min, w_min))
        best *= 1 - 1e-12
        if len(seen) < 4096:
            seen[cap] = best
        return best

    return bound


# ---------------------------------------------------------------------------------------------
# lower bounds on the makespan (docs/theory.md §6 "Bounds on the makespan")


def chains(placement: Placement, costs: Costs, fused: bool = False):
    """Per stage: ``head_F`` (earliest start of ``F(s)``), ``head_B`` (earliest start of its
    backward) and ``tail_B`` (the longest chain after its backward ends: the backwards of the
    stages below, the hop latency on each change of device, and the ``W`` at the end); with
    ``fused`` the backward is ``BW`` (``b + w``, no ``W``). Times of one microbatch alone."""
    S, p = placement.num_stages, placement.num_devices
    f, b, w = costs.stage_times(S, p)
    if fused:
        b, w = [x + y for x, y in zip(b, w)], [0.0] * S
    comm = float(costs.comm)
    dev = placement.stage_device
    hop = [comm if s + 1 < S and dev[s] != dev[s + 1] else 0.0 for s in range(S)]  # between s and s+1
    head_f = [0.0] * S
    for s in range(1, S):
        head_f[s] = head_f[s - 1] + f[s - 1] + hop[s - 1]
    head_b = [0.0] * S
    head_b[S - 1] = head_f[S - 1] + f[S - 1]
    for s in range(S - 2, -1, -1):
        head_b[s] = head_b[s + 1] + b[s + 1] + hop[s]
    tail_b = [0.0] * S
    tail_b[0] = w[0]
    for s in range(1, S):
        tail_b[s] = max(w[s], hop[s - 1] + b[s - 1] + tail_b[s - 1])
    return head_f, head_b, tail_b, (f, b, w)


def forward_tails(placement: Placement, costs: Costs, f: list[float], b: list[float],
                  tail_b: list[float]) -> list[float]:
    """Per stage, the longest chain after its forward ends (the forwards above it, the backwards
    down to stage 0 and ``W(0)``, a hop per change of device): :func:`chains`' ``f``, ``b`` and
    ``tail_b`` in, ``q_F`` out."""
    S, dev, comm = placement.num_stages, placement.stage_device, float(costs.comm)
    tail_f = [0.0] * S
    tail_f[S - 1] = b[S - 1] + tail_b[S - 1]
    for s in range(S - 2, -1, -1):
        tail_f[s] = (comm if dev[s] != dev[s + 1] else 0.0) + f[s + 1] + tail_f[s + 1]
    return tail_f


def makespan_bounds(placement: Placement, m: int, costs: Costs, cap: float | None,
                    fused: bool = False, recompute: str = "none",
                    offload: float | None = None) -> dict[str, float]:
    """Lower bounds on the makespan of every schedule of ``placement``, ``m`` microbatches and
    ``costs`` whose devices peak at most at ``cap`` (``a``; ``None``: no limit), with the
    default memory model (each stage's activation ``p/S``, released at its ``W``, or at its
    fused ``BW`` with ``fused``). Each value holds for every such schedule (docs/theory.md §6,
    where each is derived); the best is their maximum (:func:`makespan_bound`).

    * ``"device"``: per device, the earliest arrival of a pass class, the work of the classes,
      and the shortest chain after them (every subset of the device's pass classes: F, B, W of
      each of its stages; all ``m`` microbatches of a class share its arrival and chain);
    * ``"memory"``: per device, the first forward's arrival plus memory × time over the cap (the
      lifespans of :func:`lifespans`);
    * ``"warm-up"``: per device, work plus the idle forced before its first backward (at most
      ``⌊cap / act⌋`` forwards can run before it: nothing is released earlier) and after its
      last backward (only pending ``W`` s can run then, one per activation still held);
    * ``"last forward"``: the same idle before the first backward, and the idle forced after the
      start of the device's last forward: its chain to the end of the schedule against what the
      activations held then can still run;
    * ``"one at a time"``: when the cap holds just one microbatch's activations on a device, each
      forward of its highest stage waits until the microbatch before has released everything
      there, so the microbatches pass that point one release chain apart;
    * ``"levels"``: per device, the cap in whole activations shared among the microbatches holding
      one, two, … of the device's stages at once, each for at least its shortest time
      (:func:`_levels`; an odd number of activations on the V-shape is what it sees);
    * ``"ramps"``: the memory × time of ``"levels"`` (``r = 1``) with what the cap cannot hold at
      the ends: the device's forwards start one at a time, so at most ``i`` activations are held
      in the ``i``-th shortest forward time after its first arrival, and its releases end one
      at a time (each a ``W``, or fused ``BW``), so at most ``i`` in the ``i``-th shortest release
      before the end (:func:`_ramps`);

    ``recompute`` ``"full"`` or ``"selective"``: the bounds hold for every schedule that may
    recompute any forward in that mode too (docs/theory.md §13). A recomputed forward holds only
    ``κ = Costs.kept_fraction`` of its activation until its ``R`` and the whole of it from the
    ``R``'s start to the ``W``'s end, so each microbatch holds at least
    ``act_s · (κ ℓ_s + (1 − κ) · min(ℓ_s, r_s + b_s + w_s))`` over time in ``"memory"``; the
    bounds that count whole activations held before the first backward (``"warm-up"``, ``"last
    forward"``, ``"one at a time"``, ``"levels"``, ``"ramps"``) do not hold then and are 0 or absent; ``"device"`` holds as it is
    (an ``R`` only adds work). ``"recompute trade"`` (with ``recompute`` and a cap) couples the
    two: every recompute that saves memory × time adds its ``R`` to the device's work, so per
    device the makespan is at least the least, over how many forwards of each stage are
    recomputed (fractions allowed), of the larger of the work with their ``R`` passes and the
    memory × time bound with their saving (:func:`_recompute_trade`): a budget that forces
    recomputation forces its work too.

    ``offload`` (a fraction φ in (0, 1], or ``None``): the bounds hold for every schedule whose
    offloads each copy at most φ of a forward's activation (``1.0``: every schedule that may
    offload; docs/theory.md §13). A copy of a share ψ of stage ``s`` takes ``T = ψ c_s``
    (``c_s = Costs.offload · act_s``) each way; the share leaves at the end of its copy out, at
    least ``f_s + T`` after the forward's start, and is back from the start of its reload, at least
    ``T + b_s + w_s`` before the release, so a microbatch holds at least ``act_s ((1 − ψ) ℓ_s + ψ
    (f_s + b_s + w_s + 2T))`` over time (``ℓ_s`` when that is longer: the copies then lengthen its
    life), least at ``ψ = (ℓ_s − f_s − b_s − w_s) / 4c_s`` clipped to ``[0, φ]``: ``"memory"`` uses
    the least over the levers allowed, and the bounds that count whole activations before the
    first backward are 0, as with recompute. With ``T → 0`` it falls to ``f + b + w``, a forward's
    own passes. ``"lever trade"`` replaces ``"recompute trade"``: copies run one at a time on a
    device's lane from its first forward's end, so their time is at most the makespan less that,
    and each saves at most ``act_s (ℓ_s − f_s − b_s − w_s) / c_s`` of memory × time per unit of
    copy time (and a stage's ``m`` forwards at most ``m`` times the best single saving); the
    makespan is at least the least ``t`` for which the work with the ``R`` passes, the lane with
    the copies and the memory × time bound with both savings all fit (:func:`_lever_trade`).
    """
    S, p = placement.num_stages, placement.num_devices
    head_f, head_b, tail_b, (f, b, w) = chains(placement, costs, fused)
    tail_f = forward_tails(placement, costs, f, b, tail_b)
    act = p / S
    n_act = math.inf if cap is None else math.floor(cap / act + 1e-9)
    whole = life = shortest_lifespans(placement, costs)
    if recompute != "none":  # the least memory × time a microbatch of each stage may hold (above)
        kappa = costs.kept_fraction(recompute)
        rec = costs.recompute_times(S, p, recompute)
        life = [kappa * x + (1 - kappa) * min(x, rec[s] + b[s] + w[s])
                for s, x in enumerate(life)]
        n_act = math.inf
    copies = None
    if offload is not None:  # per stage: (copy time of a whole activation, best saving of one copy, rate)
        copies = [_offload_terms(whole[s], f[s] + b[s] + w[s], float(costs.offload) * act, offload)
                  for s in range(S)]
        life = [min(life[s], whole[s] - copies[s][1]) for s in range(S)]
        n_act = math.inf
    out = {"device": 0.0, "memory": 0.0, "warm-up": 0.0, "last forward": 0.0, "one at a time": 0.0}
    if n_act < math.inf:
        out["levels"] = 0.0
        out["ramps"] = 0.0
    if recompute != "none" and copies is None:
        out["recompute trade"] = 0.0
    if copies is not None and cap is not None:
        out["lever trade"] = 0.0
    for d in range(p):
        st = placement.stages_of(d)
        classes = []  # (arrival, work of the m passes, chain after)
        for s in st:
            classes.append((head_f[s], m * f[s], tail_f[s]))
            classes.append((head_b[s], m * b[s], tail_b[s]))
            if not fused:
                classes.append((head_b[s] + b[s], m * w[s], 0.0))
        work = math.fsum(c[1] for c in classes)
        head = min(c[0] for c in classes)
        best = head + work
        if len(classes) <= 12:
            for mask in range(1, 1 << len(classes)):
                sub = [c for i, c in enumerate(classes) if mask >> i & 1]
                best = max(best, min(c[0] for c in sub) + math.fsum(c[1] for c in sub) + min(c[2] for c in sub))
        out["device"] = max(out["device"], best)
        if cap is not None and cap > 0:
            held = m * math.fsum(act * life[s] for s in st)
            out["memory"] = max(out["memory"], min(head_f[s] for s in st) + held / cap)
            if recompute != "none" and copies is None:
                out["recompute trade"] = max(out["recompute trade"], _recompute_trade(
                    head, work, m, cap, [(rec[s], act * (whole[s] - life[s]), act * whole[s]) for s in st]))
            if copies is not None:
                saves_r = [] if recompute == "none" else [
                    (rec[s], act * (1 - kappa) * (whole[s] - min(whole[s], rec[s] + b[s] + w[s]))) for s in st]
                saves_o = [(act * copies[s][2], m * act * copies[s][1]) for s in st]
                lane0 = min(head_f[s] + f[s] for s in st)
                out["lever trade"] = max(out["lever trade"], _lever_trade(
                    head, work, lane0, m, cap, m * math.fsum(act * whole[s] for s in st), saves_r, saves_o))
        if n_act < math.inf:
            lev, held_all = _levels(sorted(st), m, int(n_act), head_f, head_b, b, w, whole)
            out["levels"] = max(out["levels"], lev)
            out["ramps"] = max(out["ramps"], _ramps(min(head_f[s] for s in st), held_all, int(n_act),
                                                    min(f[s] for s in st),
                                                    min((b[s] if fused else w[s]) for s in st)))
            k = min(n_act, len(st) * m)
            first_b = min(head_b[s] for s in st)
            before = k * max(f[s] for s in st)
            after = 0.0 if fused else k * max(w[s] for s in st)
            last = min(tail_b[s] for s in st)
            idle_start = max(head, first_b - before)
            out["warm-up"] = max(out["warm-up"], work + idle_start + max(0.0, last - after))
            # after the start of the device's last forward (of its highest stage) only that
            # pass's F, B, W and the B, W of the k - 1 other activations still held can run; that
            # forward starts after the first backward can (needs k below the device's forwards)
            if n_act == len(st) and m > 1:
                # the cap holds one microbatch's activations: when the device's highest stage runs
                # a forward, every other microbatch has released everything on it
                top, low = max(st), min(st)
                # the next microbatch enters only after this one's first release here, and its
                # highest-stage forward comes after its own entry; the one after that only when
                # this one has released everything
                cycle = max(max(head_b[s] + b[s] + w[s] for s in st) - head_f[top],
                            min(head_b[s] + b[s] + w[s] for s in st) - head_f[low],
                            _one_window(sorted(st), head_f, head_b, f, b, w))
                out["one at a time"] = max(out["one at a time"],
                                           head_f[top] + (m - 1) * cycle + f[top] + tail_f[top])
            if n_act < len(st) * m:
                top = max(st)
                late = f[top] + b[top] + w[top] + (k - 1) * max(b[s] + w[s] for s in st)
                out["last forward"] = max(out["last forward"],
                                          work + idle_start + max(0.0, f[top] + tail_f[top] - late))
    return out


def _levels(st: list[int], m: int, k: int, head_f: list[float], head_b: list[float], b: list[float],
            w: list[float], life: list[float]) -> tuple[float, float]:
    """The *levels* bound of one device (stages ``st``, ascending) whose cap holds ``k`` whole
    activations (docs/theory.md §6, bound 6). A microbatch holding ``h(t)`` of the device's
    activations at time ``t``; ``n_q(t)`` the microbatches holding at least ``q``: ``Σ_q n_q(t) =
    Σ h ≤ k`` and ``n_1 ≥ n_2 ≥ …``, so ``n_r + … + n_v ≤ g(r) = (v − r + 1)⌊k/v⌋ + max(0, k mod v −
    r + 1)`` (the most a partition of ``k`` into ``v`` parts puts in its ``v − r + 1`` smallest).
    A microbatch holds ``q`` at once at least ``L_q``: any ``q`` of its stages, topped by ``t``, are
    all held from ``F(t)``'s start to the first of their ``W`` s' ends, at least the shortest chain
    from ``F(t)`` to each ``W`` (``L_1`` the longest lifespan). Those windows lie after the
    ``r``-th stage's earliest forward, so ``T ≥ r_F(s_r) + m Σ_{q≥r} L_q / g(r)``; with ``r = 1``
    the lifespans' sum counts too (memory × time with the cap rounded down to whole activations).
    An odd ``k`` is what this sees: at ``k = 3`` and two stages only one microbatch at a time can
    hold both (p = 6, m = 12, 3:4:2, budget 0.25: 273 where memory × time says 197.5; optimum 300).
    Returns the bound and what the microbatches hold in all, in activations × time (``m`` times the
    larger of ``Σ_q L_q`` and the lifespans' sum: :func:`_ramps` starts from it)."""
    v = len(st)
    if k <= 0 or v == 0:
        return 0.0, 0.0
    reach = [[0.0] * v for _ in range(v)]  # reach[i][j]: shortest chain from F(st[j])'s start to W(st[i])'s end
    for j in range(v):
        for i in range(j + 1):
            reach[i][j] = head_b[st[i]] + b[st[i]] + w[st[i]] - head_f[st[j]]
    hold = [0.0] * (v + 1)  # hold[q]: L_q
    if v <= 12:
        for mask in range(1, 1 << v):
            idx = [i for i in range(v) if mask >> i & 1]
            top = idx[-1]
            q = len(idx)
            hold[q] = max(hold[q], min(reach[i][top] for i in idx))
    else:  # the top stage with the lowest stages (the longest reaches): a valid choice, not always the best
        for top in range(v):
            for q in range(1, top + 2):
                hold[q] = max(hold[q], min(reach[i][top] for i in [*range(q - 1), top]))
    a, e = divmod(k, v)
    best = 0.0
    whole = max(math.fsum(hold[1:]), math.fsum(life[s] for s in st))  # one microbatch, every level
    for r in range(1, v + 1):
        g = (v - r + 1) * a + max(0, e - (r - 1))
        if g <= 0:
            break
        need = whole if r == 1 else math.fsum(hold[r:])
        best = max(best, head_f[st[r - 1]] + m * need / g)
    return best, m * whole


#: devices with at most this many stages get :func:`_one_window` (its orders grow as (3v − 1)!)
_WINDOW_MAX_STAGES = 2


def _one_window(st: list[int], head_f: list[float], head_b: list[float], f: list[float], b: list[float],
                w: list[float]) -> float:
    """The shortest time from one forward of a device's highest stage to the next, when the cap
    holds one microbatch's activations on it (bound 5 of docs/theory.md §6, its *window*; stages
    ``st`` ascending, at most :data:`_WINDOW_MAX_STAGES`, else 0).

    At the start of microbatch ``j``'s forward of the top stage the device holds ``j``'s ``v``
    activations, so nothing else is on it: the next microbatch takes its first activation only
    after a release of ``j`` (its ``i``-th after ``i`` of them), and its own top forward only once
    ``j`` has released all. So between the two top forwards the device runs exactly ``j``'s
    backwards and ``W`` s and the next microbatch's lower forwards, one at a time, each at least
    the shortest chain after the pass it depends on (through the other devices, with the hops).
    The least such window over every order of those passes (each started as early as the order
    allows: the best order's earliest start is optimal, all constraints being minimum delays) is
    what the bound multiplies by ``m − 1``. It sees what the two chains alone do not: on the
    bottom device of the V-shape (stages ``p − 1`` and ``p``) the backward chain goes on at once
    on the same device, so the top stage's ``W`` and the next forward queue behind it (p = 6,
    m = 6, F = B = W at the smallest budget: 47.5 → 52.5, the proven optimum)."""
    v = len(st)
    if v == 0 or v > _WINDOW_MAX_STAGES:
        return 0.0
    top = st[-1]
    # passes after the top forward (which runs in [0, f[top])): ("B", s), ("W", s) of j,
    # ("F", s) of the next microbatch for the lower stages
    passes = [("B", s) for s in st] + [("W", s) for s in st] + [("F", s) for s in st[:-1]]
    higher = {st[i]: st[i + 1] for i in range(v - 1)}  # the next stage up on this device
    best = math.inf

    def place(done: dict, t_free: float, released: int, left: list) -> None:
        nonlocal best
        if t_free >= best:
            return
        if not left:
            below = st[-2] if v > 1 else None
            start = t_free if below is None else max(
                t_free, done[("F", below)] + head_f[top] - head_f[below] - f[below])
            best = min(best, start)
            return
        for i, (kind, s) in enumerate(left):
            if kind == "B":
                if s == top:  # its chain from the top forward's start (at 0)
                    ready = head_b[top] - head_f[top]
                elif ("B", higher[s]) in done:
                    ready = done[("B", higher[s])] + head_b[s] - head_b[higher[s]] - b[higher[s]]
                else:
                    continue
                dur = b[s]
            elif kind == "W":
                if ("B", s) not in done:
                    continue
                ready, dur = done[("B", s)], w[s]
            else:  # the next microbatch's forward of a lower stage: after as many releases as it is high
                # (with at most two stages only the lowest; its arrival from the device before is not bounded)
                if released < st.index(s) + 1:
                    continue
                ready, dur = 0.0, f[s]
            end = max(t_free, ready) + dur
            done[(kind, s)] = end
            place(done, end, released + (kind == "W"), left[:i] + left[i + 1:])
            del done[(kind, s)]

    place({}, f[top], 0, passes)
    return 0.0 if best == math.inf else best


def _ramps(head: float, held: float, k: int, f: float, rel: float) -> float:
    """The *ramps* bound of one device (docs/theory.md §6, bound 8): its microbatches hold ``held``
    activations × time in all, after its first arrival ``head``, at most ``k`` at once. Its
    forwards run one at a time, at least ``f`` each, and an activation is taken at a forward's
    start, so in ``[head + (i − 1) f, head + i f)`` at most ``i`` are held; its releases (the ends
    of its ``W`` s, or fused ``BW`` s, at least ``rel`` each) end one at a time, so in the ``i``-th
    ``rel`` before the makespan ``T`` at most ``i`` are. When ``T ≥ head + (k − 1)(f + rel)`` the
    two ramps do not meet and the cap leaves ``k(k − 1)(f + rel) / 2`` unused in them:
    ``T ≥ head + (held + k(k − 1)(f + rel) / 2) / k``. Memory × time (``head + held / k``) proves
    the condition wherever it is at least ``head + (k − 1)(f + rel)`` — always where memory binds;
    elsewhere this returns 0."""
    if k <= 0 or held <= 0:
        return 0.0
    if held / k < (k - 1) * (f + rel):
        return 0.0
    return head + (held + k * (k - 1) * (f + rel) / 2) / k


def _recompute_trade(head: float, work: float, m: int, cap: float,
                     stages: list[tuple[float, float, float]]) -> float:
    """The least of ``max(head + work + R, head + (H − G) / cap)`` over how many of each stage's
    ``m`` forwards a schedule recomputes (fractions allowed: a relaxation, so a lower bound): ``R``
    the time of their ``R`` passes, ``G`` the memory × time they save, ``H`` what the device's
    activations hold without recompute. ``stages``: per stage ``(r, g, h)``, one recompute's
    time, its saving and one microbatch's whole memory × time. The cheapest saving per unit of
    ``R`` time is taken first (fractional knapsack)."""
    lo = head + work  # the device's work: grows with every recompute
    hi = head + m * math.fsum(h for _, _, h in stages) / cap  # memory × time: falls with every one
    for r, g, _ in sorted(stages, key=lambda x: -math.inf if x[0] <= 0 else -x[1] / x[0]):
        if lo >= hi or g <= 0:
            break
        fall = g / cap
        if r <= 0:
            hi -= m * fall
            continue
        t = (hi - lo) / (r + fall)  # recomputes of this stage where the two meet
        if t <= m:
            return lo + t * r
        lo += m * r
        hi -= m * fall
    return max(lo, hi)


def _offload_terms(life: float, base: float, c: float, most: float) -> tuple[float, float, float]:
    """One stage's offload: ``(c, g, rate)`` with ``c`` the copy time of its whole activation,
    ``g`` the most a single offload (a share ψ ≤ ``most``) takes off one microbatch's lifespan
    held (``ψ (life − base − 2ψc)``, per unit of activation), and ``rate`` the most it takes off
    per unit of copy time (``(life − base) / c``; infinite for free copies)."""
    room = max(0.0, life - base)
    if c <= 0:
        return c, most * room, math.inf
    psi = min(most, room / (4 * c))
    return c, psi * (room - 2 * psi * c), room / c


def _knapsack(budget: float, items: list[tuple[float, float]]) -> float:
    """The most saving a fractional knapsack of ``budget`` gets from ``items`` (``(rate per unit,
    capacity in saving)``; an infinite rate for free items)."""
    got = 0.0
    for rate, total in sorted(items, key=lambda x: -x[0]):
        if total <= 0:
            continue
        if math.isinf(rate):
            got += total
            continue
        if budget <= 0:
            break
        take = min(total, budget * rate)
        got += take
        budget -= take / rate
    return got


def _lever_trade(head: float, work: float, lane0: float, m: int, cap: float, held: float,
                 saves_r: list[tuple[float, float]], saves_o: list[tuple[float, float]]) -> float:
    """The least ``t`` with ``head + (held − saving) / cap ≤ t``, the saving being what recomputes
    within ``t − head − work`` of ``R`` time (``saves_r``: per stage one ``R``'s time and saving,
    ``m`` of each) and copies within ``t − lane0`` of lane time (``saves_o``: per stage the saving
    per unit of copy time and the most in all) take off: a relaxation (fractions, and a forward
    may count for both levers), so a lower bound. Bisection, to 1e-9 of ``t``."""
    r_items = [(math.inf if r <= 0 else g / r, m * g) for r, g in saves_r]

    def fits(t: float) -> bool:
        saving = _knapsack(t - head - work, r_items) + _knapsack(t - lane0, saves_o)
        return head + (held - saving) / cap <= t

    lo = max(head + work, lane0)
    if fits(lo):
        return lo
    hi = max(lo, head + held / cap)
    for _ in range(200):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return lo


def makespan_bound(placement: Placement, m: int, costs: Costs, cap: float | None, fused: bool = False,
                   recompute: str = "none", offload: float | None = None) -> float:
    """The best of :func:`makespan_bounds` (a lower bound on every schedule's makespan within ``cap``)."""
    return max(makespan_bounds(placement, m, costs, cap, fused, recompute, offload).values()) * (1 - 1e-12)

