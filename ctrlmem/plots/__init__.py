"""plotly figures of schedules, memory, building blocks and Pareto fronts; deterministic figure files
and static-image export.
"""
