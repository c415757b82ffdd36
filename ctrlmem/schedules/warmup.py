"""Run every compiled kernel once on a tiny input, so numba compiles them (or loads them from its
cache) before a user's first search. ``scripts/setup.sh`` calls :func:`compile_all` once after
installing.

It lives above the search engine, beside the generators it runs: the engine
(:mod:`ctrlmem.search`) knows no schedule.
"""

from __future__ import annotations

import time

from ctrlmem.model.costs import Costs
from ctrlmem.schedules.registry import build
from ctrlmem.search import buildingblock
from ctrlmem.search.engine import clear_caches
from ctrlmem.search.kernels import jit_enabled

__all__ = ["compile_all", "run"]


def run() -> None:
    """Build one small instance of every search and pipeline step (a few seconds the first time
    numba compiles them; milliseconds once cached)."""
    costs = Costs(3, 4, 2, 0.1)
    for name, p, m, limit in (("v-shape", 3, 4, 2.0), ("v-shape", 4, 8, 0.5), ("zb", 3, 5, 2.0)):
        build(name, p, m, costs=costs, memory_limit=limit)
    for name in ("v-min", "v-half", "v-zb", "1f1b-v"):
        build(name, 4, 9, costs=costs)
    buildingblock.pipeline_steps(buildingblock.v_cost_block(3, (2, 2, 1, 0), (1, 1), (0, 0)), 4)
    clear_caches()


def compile_all() -> float:
    """Compile (or load from the cache) every kernel now, by running :func:`run`; returns the
    seconds it took (numba or not: :func:`ctrlmem.search.kernels.jit_enabled`)."""
    t0 = time.perf_counter()
    jit_enabled()
    run()
    return time.perf_counter() - t0
