"""Frequency plans on disk.

The plan JSON the planner writes and the runtime reads (:mod:`.document`), one stage's steps and
the checks every plan format runs on them (:mod:`.steps`), and the folder planning writes
(:mod:`.outputs`).
"""
