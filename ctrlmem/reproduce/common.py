"""Helpers shared by the artifact modules: registry checks and the unit-cost simulation."""

from __future__ import annotations

from ctrlmem.model.costs import Costs
from ctrlmem.schedules import SCHEDULES
from ctrlmem.schedules import build
from ctrlmem.model.simulate import simulate

RECOMPUTE_HOW = ("; 1F1B-R predicted with full recomputation modelled (docs/theory.md §13): each forward keeps "
                 "its input, 2h of the 34h + 5·heads·s bytes per layer and token it saves (Korthikanti et al. 2022; "
                 "2/74 of its activation for the 9.6B at seq 1024), until its R right before its BW, the R "
                 "recomputes the whole stage at once (holding the full activation until BW) and costs one forward, "
                 "counted as work; Megatron recomputes layer by layer, so its measured peak is lower")
"""What a 1F1B-R cell adds to its 'how' (the reproduction's cells of the recomputing baseline)."""


def how_for(name: str, how: str) -> str:
    """``how`` with :data:`RECOMPUTE_HOW` for a recomputing schedule (``1f1b-r``)."""
    return how + RECOMPUTE_HOW if name == "1f1b-r" else how


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
