"""Merak (``framework=merak``) on perseus-train's ranks.

The job, the engine that holds one rank's stage, its layers, and the launcher's probe of Merak's
interpreter.
"""
