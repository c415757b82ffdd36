"""Activation copies in the exact solver: the CP-SAT constraints that make :func:`ctrlmem.optimal`
time offloads exactly as :func:`ctrlmem.simulate` does (docs/theory.md §12-13).

Why the model needs more than intervals. Without copies a device's memory depends only on its
order (every allocation and release is a compute pass's start or end), so the solver may leave
slack anywhere: the simulator's as-soon-as-possible run of the same orders is no longer and holds
the same memory. With copies it does not: an offload frees memory when its copy *ends*, a time
that no compute pass waits for, so a solver schedule that delays a forward until an offload has
freed room has no counterpart in the IR (the simulator would start that forward earlier, while
the room is still taken). The model therefore times every pass exactly as the simulator does:

* **as soon as possible** (a semi-active schedule): each compute pass starts at one of its inputs'
  arrivals (the time 0 for the first stage's forwards) or at the end of another pass of its
  device; with positive pass times the latter is the pass right before it, so every pass starts
  at ``max(inputs, device free)``, the simulator's rule;
* **offloads** (device-to-host lane): one optional interval per forward, ``φ·Costs.offload`` per
  ``a`` copied, in the order of the device's forwards (the simulator's lane order), each starting
  when its forward has ended and the copy before it on the lane has;
* **reloads** (host-to-device lane): one optional interval per offloaded forward, issued at the end
  of a compute pass of the device at or after the forward (the IR's ``Copy.after``; a Boolean per
  candidate pass), starting at ``max(issue, offload end, lane free)``, in the simulator's lane
  order — by issue pass, then by the backwards' order — and ending before its backward starts;
* **memory**: a reservoir per device with the offloaded share leaving at the copy's end and
  coming back at the reload's start.

So a solution is the simulator's timeline of the schedule it encodes (the same makespan, the same
peak), and every schedule the IR can express with these copies is a solution: the model is
exact, its bound a lower bound on every such schedule. Order Booleans (pairwise, per device) carry
the forwards', backwards' and reloads' orders. The constraints grow with the square of a device's
passes, which is why they are only added when offload is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ctrlmem.model.ir import Copy

__all__ = ["CopyModel", "share_units"]

F_, B_, W_, R_ = 0, 1, 2, 3


def share_units(fraction: float) -> tuple[int, int, bool]:
    """``fraction`` as ``(N, D, exact)`` with ``N / D`` it (``D`` ≤ 1000), rounded *down* when no
    such ``D`` is exact: the model then frees a little less than the truth, so its schedules fit."""
    q = Fraction(fraction).limit_denominator(1000)
    if abs(float(q) - fraction) < 1e-12:
        return q.numerator, q.denominator, True
    d = 1000
    return max(1, int(fraction * d + 1e-12)), d, False


@dataclass
class CopyModel:
    """The copy variables and constraints of one :func:`ctrlmem.optimal` model (see the module
    docstring). Build with :meth:`add`; ``hint`` and ``read`` use the same keys as the caller's
    ``st`` / ``en`` (``(op, stage, mb)``, ``op`` 0 F, 1 B, 2 W, 3 R)."""

    off: dict = field(default_factory=dict)        # (s, mb) -> Bool: offloaded
    o_st: dict = field(default_factory=dict)       # (s, mb) -> offload start / end
    o_en: dict = field(default_factory=dict)
    l_st: dict = field(default_factory=dict)       # (s, mb) -> reload start / end
    l_en: dict = field(default_factory=dict)
    issue: dict = field(default_factory=dict)      # (s, mb) -> [(pass key, Bool)]: the pass it is issued after
    issue_end: dict = field(default_factory=dict)  # (s, mb) -> the end of that pass
    aux: list = field(default_factory=list)        # (Bool, rule(times) -> bool) for the hint
    fraction: float = 1.0                          # the share each offload copies

    # -----------------------------------------------------------------------------------------
    def add(self, model, *, P, m, copy_len, comm, st, en, use, horizon) -> None:
        """Add the copies and the as-soon-as-possible rules to ``model``. ``copy_len[s]``: one copy of stage ``s`` (scaled; the same each
        way); ``st`` / ``en``: the passes' start and end variables; ``use``: ``(s, mb) -> Bool``
        of an optional ``R`` (empty without recompute)."""
        S, p = P.num_stages, P.num_devices
        dev = [P.device_of(s) for s in range(S)]
        self._st, self._en, self._use, self._horizon, self._len = st, en, use, horizon, copy_len
        for s in range(S):
            for k in range(m):
                on = model.NewBoolVar(f"off_{s}_{k}")
                self.off[s, k] = on
                if (s, k) in use:  # a forward is recomputed or offloaded, not both
                    model.AddBoolOr([on.Not(), use[s, k].Not()])
                for name, box_s, box_e in (("o", self.o_st, self.o_en), ("l", self.l_st, self.l_en)):
                    a = model.NewIntVar(0, horizon, f"{name}s_{s}_{k}")
                    e = model.NewIntVar(0, horizon, f"{name}e_{s}_{k}")
                    model.Add(e == a + copy_len[s])
                    box_s[s, k], box_e[s, k] = a, e
                model.Add(self.o_st[s, k] >= en[F_, s, k]).OnlyEnforceIf(on)
                model.Add(self.l_st[s, k] >= self.o_en[s, k]).OnlyEnforceIf(on)
                model.Add(st[B_, s, k] >= self.l_en[s, k]).OnlyEnforceIf(on)
        for d in range(p):
            stages = [s for s in range(S) if dev[s] == d]
            fwd = [(s, k) for s in stages for k in range(m)]
            passes = [(o, s, k) for s in stages for k in range(m) for o in (F_, B_, W_)]
            passes += [(R_, s, k) for s in stages for k in range(m) if (s, k) in use]
            self._lanes(model, fwd, passes)
            self._asap(model, passes, S, dev, comm)

    # -----------------------------------------------------------------------------------------
    @staticmethod
    def _order(model, name, first_st, first_en, second_st, second_en):
        """A Boolean "first before second" with both sides of their no-overlap enforced (two passes
        of one device)."""
        lit = model.NewBoolVar(name)
        model.Add(second_st >= first_en).OnlyEnforceIf(lit)
        model.Add(first_st >= second_en).OnlyEnforceIf(lit.Not())
        return lit

    def _lanes(self, model, fwd, passes) -> None:
        st, en, off = self._st, self._en, self.off
        # the forwards' order (the offload lane's) and the backwards' order (the reload lane's tie rule)
        f_before, b_before = {}, {}
        for i, x in enumerate(fwd):
            for y in fwd[i + 1:]:
                f_before[x, y] = self._order(model, f"fo_{x}_{y}", st[(F_, *x)], en[(F_, *x)], st[(F_, *y)], en[(F_, *y)])
                f_before[y, x] = f_before[x, y].Not()
                self.aux.append((f_before[x, y], lambda t, x=x, y=y: t[(F_, *x)][0] < t[(F_, *y)][0]))
                b_before[x, y] = self._order(model, f"bo_{x}_{y}", st[(B_, *x)], en[(B_, *x)], st[(B_, *y)], en[(B_, *y)])
                b_before[y, x] = b_before[x, y].Not()
                self.aux.append((b_before[x, y], lambda t, x=x, y=y: t[(B_, *x)][0] < t[(B_, *y)][0]))
        # offloads: in the forwards' order, each at its forward's end or the previous copy's end
        for x in fwd:
            ways = [self._equal(model, self.o_st[x], en[(F_, *x)], [off[x]],
                                lambda t, x=x: t[("O", *x)][0] == t[(F_, *x)][1])]
            for y in fwd:
                if y == x:
                    continue
                both = [off[x], off[y], f_before[y, x]]
                model.Add(self.o_st[x] >= self.o_en[y]).OnlyEnforceIf(both)
                ways.append(self._equal(model, self.o_st[x], self.o_en[y], both,
                                        lambda t, x=x, y=y: ("O", *x) in t and ("O", *y) in t
                                        and t[(F_, *y)][0] < t[(F_, *x)][0] and t[("O", *x)][0] == t[("O", *y)][1]))
            model.AddBoolOr(ways + [off[x].Not()])
        # reloads: issued after a compute pass of the device, at or after the forward
        for x in fwd:
            cands = []
            for key in passes:
                o, s, k = key
                if (s, k) == x and o != F_:
                    continue  # its own B, W, R come after the reload's backward or are not issue points of it
                lit = model.NewBoolVar(f"is_{x}_{key}")
                model.Add(self.l_st[x] >= en[key]).OnlyEnforceIf(lit)
                model.Add(en[key] >= en[(F_, *x)]).OnlyEnforceIf(lit)
                if o == R_:
                    model.AddImplication(lit, self._use[s, k])
                cands.append((key, lit))
                self.aux.append((lit, lambda t, x=x, key=key: t.get(("I", *x), {}).get("after") == key))
            model.Add(sum(lit for _, lit in cands) == 1).OnlyEnforceIf(off[x])
            model.Add(sum(lit for _, lit in cands) == 0).OnlyEnforceIf(off[x].Not())
            self.issue[x] = cands
        issue_end = {}
        for x in fwd:  # the issue time, as a variable: the end of the chosen pass
            v = model.NewIntVar(0, self._horizon, f"it_{x}")
            for key, lit in self.issue[x]:
                model.Add(v == en[key]).OnlyEnforceIf(lit)
            issue_end[x] = v
        # the reload lane: ordered by issue pass, then by the backwards' order; each reload at the
        # largest of its issue, its offload's end and the previous reload's end
        l_before = {}
        for i, x in enumerate(fwd):
            for y in fwd[i + 1:]:
                q = model.NewBoolVar(f"lo_{x}_{y}")
                both = [off[x], off[y]]
                model.Add(self.l_st[y] >= self.l_en[x]).OnlyEnforceIf([q, *both])
                model.Add(self.l_st[x] >= self.l_en[y]).OnlyEnforceIf([q.Not(), *both])
                model.Add(issue_end[x] <= issue_end[y]).OnlyEnforceIf([q, *both])
                model.Add(issue_end[y] <= issue_end[x]).OnlyEnforceIf([q.Not(), *both])
                # one issue pass for both: the backwards' order decides
                model.Add(issue_end[x] + 1 <= issue_end[y]).OnlyEnforceIf([q, b_before[y, x], *both])
                model.Add(issue_end[y] + 1 <= issue_end[x]).OnlyEnforceIf([q.Not(), b_before[x, y], *both])
                l_before[x, y], l_before[y, x] = q, q.Not()
                self.aux.append((q, lambda t, x=x, y=y: ("L", *x) in t and ("L", *y) in t
                                 and t[("L", *x)][0] < t[("L", *y)][0]))
        for x in fwd:
            ways = [self._equal(model, self.l_st[x], issue_end[x], [off[x]],
                                lambda t, x=x: ("L", *x) in t and t[("L", *x)][0] == t[t[("I", *x)]["after"]][1]),
                    self._equal(model, self.l_st[x], self.o_en[x], [off[x]],
                                lambda t, x=x: ("L", *x) in t and t[("L", *x)][0] == t[("O", *x)][1])]
            for y in fwd:
                if y != x:
                    ways.append(self._equal(model, self.l_st[x], self.l_en[y], [off[x], off[y], l_before[y, x]],
                                            lambda t, x=x, y=y: ("L", *x) in t and ("L", *y) in t
                                            and t[("L", *y)][0] < t[("L", *x)][0] and t[("L", *x)][0] == t[("L", *y)][1]))
            model.AddBoolOr(ways + [off[x].Not()])
        for x in fwd:  # no copy when the forward is not offloaded: pin the unused variables
            model.Add(self.o_st[x] == 0).OnlyEnforceIf(off[x].Not())
            model.Add(self.l_st[x] == 0).OnlyEnforceIf(off[x].Not())
            model.Add(issue_end[x] == 0).OnlyEnforceIf(off[x].Not())
        self.issue_end.update(issue_end)

    def _equal(self, model, a, b, conds, rule):
        """A Boolean that, when true, makes ``a == b`` and needs every literal of ``conds``."""
        lit = model.NewBoolVar("eq")
        model.Add(a == b).OnlyEnforceIf(lit)
        for c in conds:
            model.AddImplication(lit, c)
        self.aux.append((lit, rule))
        return lit

    def _asap(self, model, passes, S, dev, comm) -> None:
        """Each compute pass of a device starts at an input's arrival or at another pass's end."""
        st, en, use = self._st, self._en, self._use
        for key in passes:
            o, s, k = key
            inputs = []  # (value, needs) with value an int or an expression
            if o == F_:
                if s == 0:
                    inputs.append((0, []))
                else:
                    inputs.append((en[F_, s - 1, k] + (comm if dev[s - 1] != dev[s] else 0), []))
            elif o == B_:
                if s == S - 1:
                    inputs.append((en[F_, s, k], []))
                else:
                    inputs.append((en[B_, s + 1, k] + (comm if dev[s + 1] != dev[s] else 0), []))
                inputs.append((self.l_en[s, k], [self.off[s, k]]))
            else:  # W after its B, R after its F
                inputs.append((en[B_ if o == W_ else F_, s, k], []))
            ways = []
            for i, (value, needs) in enumerate(inputs):
                ways.append(self._equal(model, st[key], value, needs, _input_rule(key, i, S, dev)))
            for other in passes:
                if other == key or _descends(other, key):
                    continue
                needs = [use[other[1], other[2]]] if other[0] == R_ else []
                ways.append(self._equal(model, st[key], en[other], needs,
                                        lambda t, key=key, other=other: other in t and key in t
                                        and t[key][0] == t[other][1]))
            model.AddBoolOr(ways + ([use[s, k].Not()] if o == R_ else []))

    # -----------------------------------------------------------------------------------------
    def hint(self, model, times: dict, comm: int) -> None:
        """Hint every copy variable and Boolean from a timeline: ``times`` maps ``(op, s, mb)`` and
        ``("O" | "L", s, mb)`` to ``(start, end)`` (scaled) and ``("I", s, mb)`` to
        ``{"after": (op, s, mb)}`` (the pass the reload is issued after)."""
        times = dict(times)
        times["comm"] = comm
        for x, on in self.off.items():
            has = ("O", *x) in times
            model.AddHint(on, has)
            model.AddHint(self.o_st[x], times[("O", *x)][0] if has else 0)
            model.AddHint(self.l_st[x], times[("L", *x)][0] if has else 0)
            model.AddHint(self.o_en[x], times[("O", *x)][1] if has else self._len[x[0]])
            model.AddHint(self.l_en[x], times[("L", *x)][1] if has else self._len[x[0]])
            model.AddHint(self.issue_end[x], times[times[("I", *x)]["after"]][1] if has else 0)
        for lit, rule in self.aux:
            try:
                model.AddHint(lit, bool(rule(times)))
            except KeyError:
                model.AddHint(lit, False)

    def read(self, solver, position: dict) -> list[list[Copy]]:
        """The solution's copies per device (``position``: ``(op, s, mb)`` -> ``(device, step)`` in
        the solution's orders), offloads in forward order, reloads in issue order."""
        rows: dict[int, list[tuple]] = {}
        for x, on in self.off.items():
            if not solver.Value(on):
                continue
            d, f_step = position[(F_, *x)]
            key = next(k for k, lit in self.issue[x] if solver.Value(lit))
            rows.setdefault(d, []).append((f_step, x, position[key][1]))
        out: dict[int, list[Copy]] = {}
        for d, items in rows.items():
            items.sort()
            out[d] = [Copy("O", s, k, self.fraction) for _, (s, k), _ in items]
            out[d] += [Copy("L", s, k, after=a) for _, (s, k), a in sorted(items, key=lambda it: it[2])]
        return out


def _descends(a: tuple, b: tuple) -> bool:
    """Whether pass ``a`` depends on pass ``b`` (so cannot end before ``b`` starts): the same
    microbatch, downstream in its chain F(0) .. F(S-1), B(S-1) .. B(0), with W(s) after B(s) and
    R(s) between F(s) and B(s)."""
    oa, sa, ka = a
    ob, sb, kb = b
    if ka != kb:
        return False
    if ob == F_:
        return (oa == F_ and sa > sb) or oa in (B_, W_) or (oa == R_ and sa >= sb)
    if ob == R_:
        return oa in (B_, W_) and sa <= sb
    if ob == B_:
        return (oa == B_ and sa < sb) or (oa == W_ and sa <= sb)
    return False


def _input_rule(key, i, S, dev):
    """The hint rule of "``key`` starts at its ``i``-th input's arrival"."""
    o, s, k = key

    def rule(t):
        if key not in t:
            return False
        start = t[key][0]
        if o == F_:
            if s == 0:
                return start == 0
            return start == t[F_, s - 1, k][1] + (t["comm"] if dev[s - 1] != dev[s] else 0)
        if o == B_:
            if i == 1:
                return ("L", s, k) in t and start == t["L", s, k][1]
            if s == S - 1:
                return start == t[F_, s, k][1]
            return start == t[B_, s + 1, k][1] + (t["comm"] if dev[s + 1] != dev[s] else 0)
        return start == t[B_ if o == W_ else F_, s, k][1]

    return rule
