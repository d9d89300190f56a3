"""The mixed-integer program over discrete clock choices.

Its model, cuts, time windows, and the proven lower bounds it gives.
"""
