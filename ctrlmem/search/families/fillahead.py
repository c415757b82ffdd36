"""Fill-ahead list schedules for small pipelines (what the solver's optima at p ≤ 4 do).

Where ``cm.improve`` proves the search's schedules 5–20 % too long at p ≤ 4 (budgets of an odd
number of half-activations on the V-shape, docs/theory.md §12), the optima run the forward of
the device's *higher* stage as soon as it arrives, before a backward of its lower stage that is
also ready: the forward heads for the loss, where the next backward comes from, while the
backward only feeds the device below, which is waiting for its own inputs anyway. The list
family (:mod:`.lists`) always runs a ready backward first and then idles on the forward's
memory. This family runs the list scheduler with that rule (policy ``"upper"``), under the
list family's W modes, at every cap of its grid up to the budget, for pipelines of at most
:data:`FILL_MAX_PM` passes per stage pair (``p·m``). Monotone as the list family: the same
grid of caps for every budget.
"""

from __future__ import annotations

import math

import numpy as np

from ctrlmem.search.encoding import CandidateSet, dedupe, passes_per_device
from ctrlmem.search.engine import LRU, Family, Incumbent, Query
from ctrlmem.search.families.lists import caps, list_schedule, policy_label

__all__ = ["FillAheadFamily", "ForwardFirstFamily", "FILL_POLICIES", "FIRST_POLICIES", "FILL_MAX_PM"]

FILL_MAX_PM = 64
FILL_POLICIES = (("upper", "high", "lazy"), ("upper", "high", "fit"), ("upper", "ready", "fit"),
                 ("upper", "high", "eager"), ("upper", "high", "mem"), ("upper", "high", "upper"),
                 ("upper", "ready", "upper"), ("ready", "high", "lazy"), ("ready", "high", "fit"),
                 ("ready", "high", "eager"), ("ready", "high", "upper"))
#: the forward-first policies (:class:`ForwardFirstFamily`): any ready forward that fits runs
#: before a ready backward, under every forward pick and W mode
FIRST_POLICIES = tuple(("first", fp, wm) for fp in ("high", "ready") for wm in ("lazy", "fit", "eager", "mem", "upper"))


class FillAheadFamily(Family):
    """See the module docstring."""

    name = "fill-ahead"

    def __init__(self) -> None:
        self._cache = LRU(1024)

    def sets(self, q: Query, progress: Incumbent):
        P = q.placement
        p = P.num_devices
        if p * q.m > FILL_MAX_PM or P.num_chunks < 2:
            return
        base = P.num_stages // p
        unit = 1.0 / base
        top = min(int(math.floor(q.cap * base + 1e-9)), base * q.m)
        for h in caps(p, top, base):
            if progress.hopeless(q, h * unit):
                continue
            key = (P, q.m, q.costs, h, q.fused)
            got = self._cache.get(key)
            if got is None:
                got = self._cache.put(key, self._build(q, h, unit))
            if len(got):
                yield got

    policies = FILL_POLICIES

    def _skip(self, pol, banker) -> bool:
        return pol[0] != "upper" and pol[2] != "upper" and not banker  # the list family's own

    def _build(self, q: Query, h: int, unit: float) -> CandidateSet:
        P = q.placement
        S, p = P.num_stages, P.num_devices
        f, b, w = q.costs.stage_times(S, p)
        act = [p / S] * S
        keys, labels = [], []
        for pol in self.policies:
            for banker in (0, 1, 2):
                if self._skip(pol, banker):
                    continue
                res = list_schedule(P, q.m, f, b, w, float(q.costs.comm), act, h * unit, fused=q.fused,
                                    policy=pol, banker=banker)
                if res is None:
                    continue
                keys.append(res.keys)
                labels.append(f"{self.name} cap {h * unit:g}a {policy_label(pol)}{('', ' banker', ' banker+keep')[banker]}")
        arr = np.stack(keys) if keys else np.zeros((0, p, passes_per_device(P, q.m, q.fused)), dtype=np.int64)
        return dedupe(CandidateSet(P, q.m, q.fused, arr, tuple(labels)))


class ForwardFirstFamily(FillAheadFamily):
    """As :class:`FillAheadFamily`, under the forward-first policies (:data:`FIRST_POLICIES`): a
    device runs any ready forward that fits (the banker's admission or the reservation, every W
    mode) before a ready backward, so that with a budget of an odd number of half-activations
    the next microbatch's forwards fill the time the backward chain leaves idle (the stable
    phase of the solver's optima at p ≤ 4, e.g. ``B₂ W₂ F₁ F₂ B₁ W₁`` on the last device at
    p = 2, docs/theory.md §12). Its own cache; the same caps and size limit."""

    name = "forward-first"
    policies = FIRST_POLICIES

    def _skip(self, pol, banker) -> bool:
        return False
