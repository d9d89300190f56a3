"""Hydra sweeper that runs a recurring job N times, choosing each run's batch size.

Installed with ``perseus-energy`` into Hydra's ``hydra_plugins`` namespace package, where Hydra
looks for plugins. See :mod:`hydra_plugins.perseus_batch_size_sweeper.sweeper`.
"""
