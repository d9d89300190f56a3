"""The online frequency source.

The coordination server profiles, plans and schedules; a stage leader's link to it, the per-
iteration exchange between a stage's ranks, and their reports.
"""
