"""Helpers shared by the artifact modules: registry checks and the unit-cost simulation."""

from __future__ import annotations

from ctrlmem.model.costs import Costs
from ctrlmem.schedules import SCHEDULES
from ctrlmem.schedules import build
from ctrlmem.model.simulate import simulate

def is_registered(name: str) -> bool:

    return name in SCHEDULES


def simulate_named(name: str, p: int, m: int, costs: Costs, **kw):
    """``name`` simulated under ``costs``: a search (given ``memory_limit``) searched for them; a
    named schedule as its unit-cost pattern, the paper's schedule (the claims and tables test the
    patterns' closed forms and Fig. 5's repeating bubble, which the cost-adapted forms remove)."""

    searched = kw.get("memory_limit") is not None
    return simulate(build(name, p, m, costs=costs if searched else None, **kw), costs)


UNIT_TAU = Costs(2, 2, 2, 0)


"""F = B = W with a full device-stage pass = 2τ, so a V-shape chunk pass is 1τ (docs/theory.md §7–8)."""


HOW_UNIT = "simulated (F = B = W, comm 0; bubbles in τ = one chunk pass)"
