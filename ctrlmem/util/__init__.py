"""Small helpers with no knowledge of schedules: argument checks, atomic file writes, process trees.
"""
