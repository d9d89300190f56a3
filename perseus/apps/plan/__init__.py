"""``perseus-plan``: plan offline from a profile CSV (the console script's ``main``).

* :mod:`.command`: the command and :func:`~.command.run_plan`, the same pipeline as a function;
* :mod:`.stages`: which of the profile's stages are planned, and the planning problem;
* :mod:`.progress`: the progress line (the share of the command's expected work done);
* :mod:`.outputs`: the plan files and the plots, written at the same time.
"""

from perseus.apps.plan.command import main, run_plan, solver_options

__all__ = ["main", "run_plan", "solver_options"]
