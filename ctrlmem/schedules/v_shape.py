"""The V-shape schedules with controllable memory built from their blocks: V-Min, V-Half, V-ZB
(docs/theory.md §4, §2.1) and 1F1B-V (App. I).

Each generator takes the block of :mod:`ctrlmem.search.buildingblock`, repeats it for ``m`` microbatches,
places the weight passes, reorders the warm-up and cool-down without raising the peak and
squeezes (:func:`ctrlmem.search.buildingblock.build_from_block`). With F = B = W and no communication cost the
results are the exact values of docs/theory.md §7 exactly: peak ⌊(p+4)/3⌋·a, ⌊(p+2)/2⌋·a and p·a; bubble per device
4p−5 τ (4p−7 when 3 | p), 3p−7 τ (even p) or 3p−4 τ (odd p), and 0 τ, for m ≥ 2p (τ is a
chunk pass: with ``Costs(1, 1, 1)`` one τ is 0.5 time units). The orders are those of the
unit-cost pattern; their simulated times follow whatever costs are given (the authors' runtime
does the same for V-Min / V-Half, docs/theory.md §10).

With ``costs`` given, each generator adapts to them while keeping its memory level: it returns
the best schedule (shortest longest device span, then makespan) among the pattern, the
cost-aware blocks and the list schedules capped at the pattern's level, whose peak is at most
the unit pattern's (⌊(p+4)/3⌋·a, ⌊(p+2)/2⌋·a, p·a; 1F1B-V's pattern peak with
the fused backward), the pattern itself included and kept on ties. So with costs that suit the
pattern it is the pattern, and otherwise offsets and orders follow the costs (per-stage lists
and ``comm`` included). Without ``costs`` they are the exact unit-cost patterns.
"""

from __future__ import annotations

from ctrlmem.search.buildingblock import block_set, v_1f1b_block, v_half_block, v_min_block, v_zb_block
from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement, Schedule
from ctrlmem.search.encoding import CandidateSet
from ctrlmem.schedules.registry import register
from ctrlmem.search.families.paperblocks import block_candidate
from ctrlmem.schedules.budgeted import search_v
from ctrlmem.search.families.fused import construction_keys

__all__ = ["v_min", "v_half", "v_zb", "one_f_one_b_v"]


def _check(p: int, m: int, name: str) -> None:
    if p < 2:
        raise ValueError(
            f"{name} needs num_devices >= 2: the V-shape puts stages i and 2p-1-i on device i, so "
            f"with p={p} there is no pipeline; use '1f1b' (or 'gpipe') with num_devices=1"
        )
    if m < 1:
        raise ValueError(f"{name} needs num_microbatches >= 1, got {m}")


def _pattern(block, m: int, name: str) -> CandidateSet:
    """The unit-cost pattern of ``block`` for ``m`` microbatches as a one-candidate set (the
    block's pipeline, :func:`ctrlmem.search.buildingblock.build_from_block`, without making a Schedule; shared
    with the search's block family, which has the same block)."""

    cs = block_candidate(block.num_devices, m, name, block)
    if cs is None:  # pragma: no cover - a paper block always builds
        cs = block_set(block, m, name, direct=True)
    return cs


def _adapt(name: str, pattern: CandidateSet, costs: Costs | None) -> Schedule:
    """The ``pattern`` without costs; with costs, the best schedule of the V-shape search (the
    fused-backward one for a fused pattern) at the pattern's peak, the pattern tried first (it
    wins ties). Only the result is made a ``Schedule``."""
    if costs is None or pattern.m < 2:
        return pattern.schedule(0, name)

    found = search_v(pattern.num_devices, pattern.m, costs, float(pattern.peak[0]), fused=pattern.fused,
                     first=pattern)
    if found is None or found.cs is pattern:
        return pattern.schedule(0, name) if found is None else found.schedule(name)
    return found.schedule(name, {"costs_adapted": found.label})


@register("v-min", source="Qi et al. 2024 (this paper) §3.1, Table 8; docs/theory.md §7")
def v_min(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> Schedule:
    """V-Min: V-shape block with all offsets 1 (δ0 = δ1 = 1), about 1/3 of 1F1B's memory.

    Block of :func:`ctrlmem.search.buildingblock.v_min_block` (an extra gap of 2 at the loss when 3 | p).
    Peak ⌊(p+4)/3⌋·a; bubble 4p−5 τ, or 4p−7 τ when 3 | p, with F = B = W (docs/theory.md §7);
    when F, B and W differ the stable phase itself has a bubble, so it grows with m (§1.5).
    """
    _check(num_devices, num_microbatches, "v-min")
    return _adapt("v-min", _pattern(v_min_block(num_devices), num_microbatches, "v-min"), costs)


@register("v-half", source="Qi et al. 2024 (this paper) §3.1, Table 9; docs/theory.md §7")
def v_half(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> Schedule:
    """V-Half: V-shape block with δ0 = 2, δ1 = 1, about 1/2 of 1F1B's memory.

    Uses the authors' code variant of the block (F turn gap 1, B turn gap 2; the paper's
    Table 9 prints the mirror, F turn 2 and B turn 1): both are collision-free with the same
    peak, and the code's is the one whose bubbles the exact values of docs/theory.md §7 records, so the results
    can be checked against it. ``ctrlmem.search.buildingblock.v_half_block(p, variant="paper")`` gives the
    other. Peak ⌊(p+2)/2⌋·a; bubble 3p−7 τ (even p ≥ 4) or 3p−4 τ (odd p); no repeating
    bubble whenever W + 2B ≥ 2F and W + 2F ≥ 2B (§1.5).
    """
    _check(num_devices, num_microbatches, "v-half")
    return _adapt("v-half", _pattern(v_half_block(num_devices), num_microbatches, "v-half"), costs)


@register("v-zb", source="Qi et al. 2024 (this paper) §3.1, Fig. 3(d); docs/theory.md §7")
def v_zb(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> Schedule:
    """V-ZB: V-shape block with δ0 = 4, δ1 = 2 and turn gaps 1: zero bubble at 1F1B's memory.

    Peak p·a; bubble 0 with F = B = W and m ≥ 2p (docs/theory.md §7).
    """
    _check(num_devices, num_microbatches, "v-zb")
    return _adapt("v-zb", _pattern(v_zb_block(num_devices), num_microbatches, "v-zb"), costs)


@register("1f1b-v", source="Qi et al. 2024 (this paper) App. I, Fig. 16(a)/17(a); docs/theory.md §8")
def one_f_one_b_v(num_devices: int, num_microbatches: int, costs: Costs | None = None) -> Schedule:
    """1F1B-V: V-shape placement with the fused backward (no B/W split), about 2/3–3/4 of
    1F1B's memory.

    Block of :func:`ctrlmem.search.buildingblock.v_1f1b_block` (App. I, Fig. 16(a)), repeated, trimmed to ``m``
    microbatches along the dependency chain and its warm-up moved earlier under the peak
    (:mod:`ctrlmem.search.families.fused`, the construction the authors publish; it
    reproduces their 1F1B-V spans and peaks). With F = B = W: peak 0.75 / 0.75 / 0.6875 of 1F1B
    at p = 4 / 8 / 16, bubble 33 τ at p = 8 and 75 τ at p = 16 (docs/theory.md §8).
    """
    _check(num_devices, num_microbatches, "1f1b-v")

    p, m = num_devices, num_microbatches
    keys = construction_keys(p, m)
    if keys is None:  # (not met for p >= 2, m >= 1; kept as a guard) the block's own pipeline
        pattern = _pattern(v_1f1b_block(p), m, "1f1b-v")
    else:
        pattern = CandidateSet(Placement.v_shape(p), m, True, keys[None], ("pattern",))
    return _adapt("1f1b-v", pattern, costs)
