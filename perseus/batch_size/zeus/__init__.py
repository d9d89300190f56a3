"""Zeus's NSDI'23 evaluation.

Its trace format, its published optimizers (re-implemented from the paper), and the replay of its
protocol.
"""
