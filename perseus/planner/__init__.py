"""The planner: from a measured profile to every Pareto-optimal frequency plan.

Layers (each its own module): :mod:`.problem` (profile + schedule + blocking power as arrays),
:mod:`.dag` (dependency graph), :mod:`.simulate` (how plans are judged), :mod:`.solvers`
(candidate plans; ``lp`` by default, ``lowtime``, ``exact``), :mod:`.frontier` (re-simulated,
Pareto-filtered plans), :mod:`.policies` (which plan to run).

Typical use::

    from perseus.planner import plan_frontier
    from perseus.planner.problem import PlanningProblem
    from perseus.planner.policies import choose

    problem = PlanningProblem(load_profile("profile.csv"), num_microbatches=12, p2p_power_w=83.64)
    frontier = plan_frontier(problem)
    plan = frontier.to_plan(choose(frontier, EnergyConfig(policy="no_slowdown")))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier
    from perseus.planner.problem import PlanningProblem

__all__ = ["plan_frontier"]


def plan_frontier(
    problem: PlanningProblem,
    solver: str = "lp",
    progress: Optional[Callable[[str, float], None]] = None,
    **solver_options: Any,
) -> Frontier:
    """Solve ``problem`` with the named solver and return the honest frontier.

    Args:
        problem: The planning problem.
        solver: A registered solver name (``planner.solver``): ``lp``, ``lowtime``, ``exact``.
        progress: Called with ``(message, fraction_done)`` during long solves.
        **solver_options: Passed to the solver's constructor.

    Returns:
        Every candidate plan re-simulated, duplicates and dominated plans dropped, the
        all-max plan included.
    """
    from perseus.planner.frontier import build_frontier
    from perseus.planner.solvers import get_solver
    from perseus.planner.solvers.base import ChoiceSolver

    instance = get_solver(solver, **solver_options)
    if isinstance(instance, ChoiceSolver):
        return build_frontier(problem, instance.solve_choices(problem, progress))
    return build_frontier(problem, instance.solve(problem, progress))
