"""Which clock every instruction of a stage runs at while it is profiled.

The sweep, its windows, and when it stops.
"""
