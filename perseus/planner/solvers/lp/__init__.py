"""The ``lp`` solver and its parts (the default solver; see :mod:`.solver`).

* :mod:`.hull`: lower convex hulls of each instruction's options;
* :mod:`.layout`: which instructions share a clock (the 1F1B steady state) in the LP;
* :mod:`.model`: the convex-hull LP, re-solved for many deadlines;
* :mod:`.rounding`: LP optima to real plans, many at once;
* :mod:`.refine`: long hull segments decided instruction by instruction;
* :mod:`.milp`: the mixed-integer program over discrete choices;
* :mod:`.polish`: MILPs over windows of the schedule improve one deadline's plan;
* :mod:`.gaps`: filling frontier gaps wider than 0.5 %;
* :mod:`.bounds`: proven lower bounds on the least energy at a deadline.
"""

from perseus.planner.solvers.lp.solver import LPSolver

__all__ = ["LPSolver"]
