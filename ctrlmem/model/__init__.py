"""The schedule model: passes, placements, schedules, costs, validation and the simulator.

The lowest layer: it imports nothing else of ctrlmem (docs/architecture.md).
"""
