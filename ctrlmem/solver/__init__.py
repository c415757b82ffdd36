"""The exact solver (CP-SAT): optimal schedules for small pipelines, windowed improvement at any size,
and the optimality-gap measurement.
"""
