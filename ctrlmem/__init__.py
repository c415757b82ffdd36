"""ctrlmem: design, simulate, draw and run pipeline-parallel schedules with controllable memory.

A research kit for *Pipeline Parallelism with Controllable Memory* (Qi et al., NeurIPS 2024).
Public API (docs/architecture.md)::

    import ctrlmem as cm
    s = cm.build("1f1b", num_devices=8, num_microbatches=32)
    cm.validate(s)
    r = cm.simulate(s, cm.Costs(f=1, b=1, w=1, comm=0))
    r.makespan, r.device_spans, r.bubble_rate, r.peak_memory, r.passes
    best = cm.optimal(4, 8, cm.Costs(6, 8, 4), memory_limit=0.5)   # CP-SAT, small pipelines
    best.schedule, best.makespan, best.lower_bound, best.status
    df = cm.plan("98.5b", gpus=40, gpu_memory_gb=80, global_batch=160)   # fastest config that fits, in GB
    better = cm.improve(cm.build("v-shape", 8, 32, memory_limit=0.5), time_limit=30)  # any size

Importing ctrlmem does not import torch; real execution lives in ``ctrlmem.runtime``.
"""

from ctrlmem.search.buildingblock import BuildingBlock, Timeline, build_from_block, pipeline_steps
from ctrlmem.model.costs import Costs, MemoryModel
from ctrlmem.model.ir import Op, Pass, Placement, Schedule
from ctrlmem.schedules import SCHEDULES, ScheduleSpec, build, register
from ctrlmem.model.simulate import SimResult, TimedPass, simulate
from ctrlmem.model.validate import ScheduleError, validate
from ctrlmem.solver.optimal import OptimalResult, optimal
from ctrlmem.planner import plan
from ctrlmem.solver.improve import improve

__version__ = "0.1.0"

__all__ = [
    "BuildingBlock",
    "Timeline",
    "build_from_block",
    "pipeline_steps",
    "Costs",
    "MemoryModel",
    "Op",
    "Pass",
    "Placement",
    "Schedule",
    "SCHEDULES",
    "ScheduleSpec",
    "build",
    "register",
    "SimResult",
    "TimedPass",
    "simulate",
    "ScheduleError",
    "validate",
    "optimal",
    "OptimalResult",
    "plan",
    "improve",
]
