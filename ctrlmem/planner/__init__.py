"""The planner: which pipeline configuration is fastest on a given cluster, in GB and seconds
(:func:`plan`, ``ctrlmem plan``), and how to run the answer (:mod:`ctrlmem.planner.emit`).
See docs/plan.md."""

from ctrlmem.planner.core import COLUMNS, DEFAULT_SCHEDULES, METHOD_LABELS, Planner, ScheduleChoice, cache_info, clear_cache, insights, parse_schedules, plan, row_memory, row_schedule
from ctrlmem.planner.model import ModelSpec, default_global_batch, model_spec, stage_layers
from ctrlmem.planner.sources import A100Costs, AllocatorMargin, CostSource, LayerCosts, ReplayCosts, cost_source

__all__ = ["plan", "Planner", "COLUMNS", "DEFAULT_SCHEDULES", "METHOD_LABELS", "ScheduleChoice", "parse_schedules",
           "row_schedule", "row_memory", "cache_info", "clear_cache", "insights", "ModelSpec", "model_spec", "stage_layers",
           "default_global_batch", "CostSource", "A100Costs", "ReplayCosts", "LayerCosts", "AllocatorMargin",
           "cost_source"]
