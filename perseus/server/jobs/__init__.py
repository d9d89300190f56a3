"""The jobs a coordination server holds.

One job's lock, ranks, reports, schedules, kept state and summary, and the registry of every job.
"""
