"""A job's phases: baseline, profiling, planning, running, watching, failed.

The table of the changes allowed between them and what every phase offers (:mod:`.table`), one
module per phase, and how a running plan is checked (:mod:`.plan_check`) and switched
(:mod:`.plan_switching`).
"""
