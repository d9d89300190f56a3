"""The planner: from a measured profile to every Pareto-optimal frequency plan.

Layers (each its own module): :mod:`.problem` (profile + schedule + blocking power as arrays),
:mod:`.dag` (dependency graph), :mod:`.simulate` (how plans are judged), :mod:`.solvers`
(candidate plans; ``lp`` by default, ``lowtime``, ``exact``), :mod:`.frontier` (re-simulated,
Pareto-filtered plans), :mod:`.policies` (which plan to run). Around them: :mod:`.limits`
(time and memory a solve will need), :mod:`.derived` (stage subsets and deeper pipelines of a
profile), :mod:`.cases` (the published benchmark cases), :mod:`.plots`.

:func:`plan_frontier` computes every Pareto-optimal plan; :func:`plan_policy` only the plans
around the deadline an energy policy asks for (seconds instead of minutes for thousands of
microbatches).

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
    from perseus.config.schema import EnergyConfig
    from perseus.planner.frontier import Frontier
    from perseus.planner.problem import PlanningProblem

__all__ = ["plan_frontier", "plan_policy"]

#: Deadline step of the coarse sweep :func:`plan_policy` uses for policies without a deadline.
COARSE_STEP = 0.02


def plan_frontier(
    problem: PlanningProblem,
    solver: str = "lp",
    progress: Optional[Callable[[str, float], None]] = None,
    effort: Optional[str] = None,
    **solver_options: Any,
) -> Frontier:
    """Solve ``problem`` with the named solver and return the honest frontier.

    Args:
        problem: The planning problem.
        solver: A registered solver name (``planner.solver``): ``lp``, ``lowtime``, ``exact``.
        progress: Called with ``(message, fraction_done)`` during long solves.
        effort: ``planner.effort`` (``fast``, ``balanced``, ``thorough``) for solvers that
            take one (``lp``); None: the solver's default (``balanced``).
        **solver_options: Passed to the solver's constructor.

    Returns:
        Every candidate plan re-simulated, duplicates and dominated plans dropped, the
        all-max plan included.
    """
    from perseus.planner.frontier import build_frontier
    from perseus.planner.solvers import get_solver, solver_accepts
    from perseus.planner.solvers.base import ChoiceSolver

    if effort is not None and solver_accepts(solver, "effort"):
        solver_options = {"effort": str(effort), **solver_options}
    instance = get_solver(solver, **solver_options)
    if isinstance(instance, ChoiceSolver):
        frontier = build_frontier(problem, instance.solve_choices(problem, progress))
    else:
        frontier = build_frontier(problem, instance.solve(problem, progress))
    # Steps the solver proved to hold no Pareto-optimal plan (lp solver).
    frontier.empty_gaps = list(getattr(instance, "empty_gaps", []))
    return frontier


def plan_policy(
    problem: PlanningProblem,
    energy: EnergyConfig,
    solver: str = "lp",
    progress: Optional[Callable[[str, float], None]] = None,
    effort: Optional[str] = None,
    **solver_options: Any,
) -> Frontier:
    """Plan only what ``energy``'s policy needs; the policy then chooses from the result.

    With the ``lp`` solver, policies with a deadline (``no_slowdown``, ``slowdown``,
    ``deadline``) are solved at that deadline only, ``max_speed`` needs no solve, and
    ``min_energy`` / ``zeus_cost`` get a coarse sweep (deadlines 2 % apart, no gap filling).
    Other solvers compute the full frontier. Every plan is re-simulated as in
    :func:`plan_frontier`; :func:`perseus.planner.policies.choose` picks the same kind of
    plan from it.

    Args:
        problem: The planning problem.
        energy: The energy policy.
        solver: A registered solver name.
        progress: Called with ``(message, fraction_done)`` during long solves.
        effort: As :func:`plan_frontier`.
        **solver_options: Passed to the solver's constructor.

    Raises:
        ConfigError: as :func:`perseus.planner.policies.choose` for a bad policy.
    """
    from perseus.planner.frontier import build_frontier
    from perseus.planner.policies import policy_deadline
    from perseus.planner.simulate import simulate_choices

    if solver != "lp":
        return plan_frontier(problem, solver, progress, effort, **solver_options)
    if energy.policy == "max_speed":
        return build_frontier(problem, [])
    t_allmax = float(simulate_choices(problem, problem.allmax_choices()[None, :])[0][0])
    deadline_s = policy_deadline(energy, t_allmax)
    if deadline_s is None:
        options = {"relative_step": COARSE_STEP, "max_gap_rel": 0.0, **solver_options}
    else:
        options = {"deadlines_s": [deadline_s], **solver_options}
    return plan_frontier(problem, solver, progress, effort, **options)
