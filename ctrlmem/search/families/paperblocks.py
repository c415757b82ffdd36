"""The paper's V-shape building blocks as a candidate family (docs/theory.md §4, §7).

The V-Min, V-Half and V-ZB blocks and the Zero Bubble paper's ZB-V order, and, for ``p <= 12``,
blocks whose device links mix two offset levels (δ0, δ1) — the first ``j`` links at one level,
the rest at the other — for neighbouring levels among (1,1), (2,1), (3,1), (4,2) (above
``p = 12`` the App. A grid family covers the same offset levels with every turn pattern, at a
fraction of the cost). Each block runs the steps of :func:`ctrlmem.search.buildingblock.build_from_block`
(repeat, place W, reorder under the peak, squeeze). Nothing here depends on the costs: each
block's schedule is built once per ``p`` for a few microbatches and its periodic stable phase
lengthened to any ``m`` (:func:`ctrlmem.search.encoding.extend`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ctrlmem.model.ir import Schedule

from ctrlmem.search.buildingblock import BuildingBlock, short_pipeline, block_set, v_half_block, v_min_block, v_shape_block, v_zb_block
from ctrlmem.search.encoding import CandidateSet, concat, extend, from_schedules
from ctrlmem.search.engine import LRU, Family, Incumbent, Query

__all__ = ["BlockFamily", "MIXES", "mixed_block"]

# pairs of offset levels whose mixes the family contains: (wide, narrow, wide links first?)
MIXES = (
    ((2, 1), (1, 1), True), ((2, 1), (1, 1), False),
    ((3, 1), (2, 1), True), ((3, 1), (2, 1), False),
    ((4, 2), (2, 1), True), ((4, 2), (3, 1), True),
)
MIX_MAX_P = 16


def mixed_block(p: int, first: tuple[int, int], second: tuple[int, int], j: int) -> BuildingBlock:
    """A V-shape block whose first ``j`` device links use offsets ``first`` (δ0, δ1) and the
    rest ``second``."""
    d0 = [first[0]] * j + [second[0]] * (p - 1 - j)
    d1 = [first[1]] * j + [second[1]] * (p - 1 - j)
    return v_shape_block(p, d0, d1, name="v-shape")


#: A fixed schedule generator ``(p, m) -> Schedule`` that stands among the blocks (e.g. ZB-V).
Fixed = Callable[[int, int], Schedule]


def _blocks(p: int, fixed: Sequence[tuple[str, Fixed]] = ()) -> list[tuple[str, BuildingBlock | Fixed]]:
    """(label, block or fixed generator) in search order: the paper's three blocks, the fixed
    schedules, the mixes."""
    out: list[tuple[str, BuildingBlock | Fixed]] = [
        ("v-min", v_min_block(p)), ("v-half", v_half_block(p)), ("v-zb", v_zb_block(p)), *fixed,
    ]
    if p <= MIX_MAX_P:
        for wide, narrow, wide_first in MIXES:
            first, second = (wide, narrow) if wide_first else (narrow, wide)
            for j in range(1, p - 1):
                try:
                    out.append((f"mix {first}x{j}+{second}x{p - 1 - j}", mixed_block(p, first, second, j)))
                except ValueError:  # no collision-free block for this mix
                    continue
    return out


def _short_len(p: int, block: BuildingBlock | Fixed, m: int) -> int:
    if not isinstance(block, BuildingBlock):  # a fixed schedule (ZB-V: its pattern needs 2p - 1 microbatches, then a stable phase)
        return 2 * p + 2
    return short_pipeline(block, m)


_SHORT = LRU(256)  # (p, label) -> the block's candidate at its short length
_BUILT = LRU(512)  # (p, m, label) -> the block's candidate at m


def _direct(p: int, label: str, block: BuildingBlock | Fixed, m: int) -> CandidateSet | None:
    """The candidate built for ``m`` microbatches directly (no lengthening)."""
    if not isinstance(block, BuildingBlock):
        return from_schedules([(label, block(p, m))])
    return block_set(block, m, label, direct=True)


def block_candidate(p: int, m: int, label: str, block: BuildingBlock | Fixed) -> CandidateSet | None:
    """``block``'s schedule (or a fixed generator's, e.g. ZB-V's) for ``m`` microbatches as a one-candidate set:
    built once per ``p`` at its short length and lengthened (cached; the named schedules'
    patterns come from here too)."""
    key = (p, m, label)
    got = _BUILT.get(key, False)
    if got is not False:
        return got
    m0 = _short_len(p, block, m)
    if m0 >= m:
        one = _direct(p, label, block, m)
    else:
        short = _SHORT.get((p, label), False)
        if short is False:
            short = _SHORT.put((p, label), _direct(p, label, block, m0))
        one = extend(short, m) if short is not None else None
        if one is not None and not len(one):  # no periodic stable phase: build it all
            one = _direct(p, label, block, m)
    return _BUILT.put(key, one if one is not None and len(one) else None)


class BlockFamily(Family):
    """See the module docstring. One set per ``(p, m)`` (all its candidates, whatever the cap:
    the engine keeps those within it). ``fixed``: (label, ``(p, m) -> Schedule``) generators
    searched after the paper's three blocks (the recipe passes ZB-V: the search knows no
    schedule of its own)."""

    name = "blocks"

    def __init__(self, fixed: Sequence[tuple[str, Fixed]] = ()) -> None:
        self._fixed = tuple(fixed)
        self._sets = LRU(32)  # (p, m) -> set

    def sets(self, q: Query, progress: Incumbent):
        key = (q.p, q.m)
        got = self._sets.get(key)
        if got is None:
            parts = [block_candidate(q.p, q.m, label, block) for label, block in _blocks(q.p, self._fixed)]
            got = self._sets.put(key, concat([x for x in parts if x is not None]))
        yield got
