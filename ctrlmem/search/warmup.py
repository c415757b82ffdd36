"""Run every compiled kernel once on a tiny input, so numba compiles them (or loads them from its
cache) before a user's first search: :func:`ctrlmem.search.kernels.compile_all`, called by
``scripts/setup.sh``."""

from __future__ import annotations

__all__ = ["run"]


def run() -> None:
    """Build one small instance of every search and pipeline step (a few seconds the first time
    numba compiles them; milliseconds once cached)."""
    from ctrlmem.search import buildingblock as blocks
    from ctrlmem.model.costs import Costs
    from ctrlmem.schedules import build
    from ctrlmem.search.engine import clear_caches

    costs = Costs(3, 4, 2, 0.1)
    for name, p, m, limit in (("v-shape", 3, 4, 2.0), ("v-shape", 4, 8, 0.5), ("zb", 3, 5, 2.0)):
        build(name, p, m, costs=costs, memory_limit=limit)
    for name in ("v-min", "v-half", "v-zb", "1f1b-v"):
        build(name, 4, 9, costs=costs)
    blocks.pipeline_steps(blocks.v_cost_block(3, (2, 2, 1, 0), (1, 1), (0, 0)), 4)
    clear_caches()
