"""The emulated GPU.

A device model that behaves like the recorded hardware, for machines without a usable NVIDIA GPU
(clocks, power limit, asynchronous timeline, energy counter and its readings).
"""
