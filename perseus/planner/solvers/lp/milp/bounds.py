"""Proven lower bounds on the least energy of any plan meeting a deadline.

* :func:`lp_bound`: the LP relaxation of the MILP (:mod:`.milp`): every instruction on the
  convex hull of its options that fit its time window, the iteration time a variable
  (``tau <= T``, blocking energy ``sum(P_block) * tau``). Every plan with iteration time
  ``<= T`` is a feasible point, so the optimum bounds them all. Seconds. With path cuts
  (:mod:`.cuts`, rows every plan satisfies) it is tighter where a few instructions share a
  fixed stretch of time.
* :func:`milp_bound`: the mixed-integer program (:mod:`.milp`) with every instruction's
  discrete options, or only those of some stages (the others on the hulls of the options that
  fit their windows: a relaxation
  that is smaller and often nearly as tight). HiGHS' dual bound is valid whenever the search
  stops, so a time budget gives a bound; a closed gap gives the optimum itself.

``scripts/prove_planner_bounds.py`` runs these offline on the published cases and records
the results that ``scripts/bench_planner.py`` prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp.milp.cuts import MAX_PATH_NODES
from perseus.planner.solvers.lp.milp.program import solve_milp_result


@dataclass
class Bound:
    """A proven lower bound at one deadline.

    Attributes:
        deadline_s: Iteration-time budget (s).
        energy_j: No plan with iteration time <= ``deadline_s`` uses less energy (J).
        method: How it was proven (``lp``, ``milp`` or ``milp(stages 5,6)``).
        seconds: Time the proof took.
        optimal: The bound is the least energy itself (a plan reaches it).
        plan: The best plan the method found (None for relaxations).
        plan_energy_j: Its re-simulated energy (inf when there is none).
    """

    deadline_s: float
    energy_j: float
    method: str
    seconds: float
    optimal: bool = False
    plan: Optional[np.ndarray] = None
    plan_energy_j: float = float("inf")


def lp_bound(problem: PlanningProblem, deadline_s: float, cut_path_nodes: int = 0) -> Bound:
    """The convex-hull relaxation's optimum (see the module docstring).

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        cut_path_nodes: Add the path cuts of paths up to this many instructions (0: none).
    """
    began = time.perf_counter()
    result = solve_milp_result(
        problem, deadline_s, time_limit_s=3600.0, relax=True, cut_path_nodes=cut_path_nodes
    )
    method = "lp+cuts" if cut_path_nodes >= 2 else "lp"
    return Bound(
        deadline_s=deadline_s,
        energy_j=result.bound_j,
        method=method,
        seconds=time.perf_counter() - began,
    )


def milp_bound(
    problem: PlanningProblem,
    deadline_s: float,
    time_limit_s: float,
    discrete_stages: Optional[Sequence[int]] = None,
    start: Optional[np.ndarray] = None,
    mip_rel_gap: float = 1e-6,
    log: bool = False,
    cut_path_nodes: int = MAX_PATH_NODES,
) -> Bound:
    """HiGHS' dual bound of the (partly) discrete program after at most ``time_limit_s``.

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        time_limit_s: Time budget of the branch and bound.
        discrete_stages: Stages whose instructions keep their discrete options (default: all);
            the others use their hulls.
        start: A plan meeting the deadline, the first incumbent (all-discrete only).
        mip_rel_gap: Stop when the gap is this small.
        log: Let HiGHS print its log.
        cut_path_nodes: Add the path cuts (:mod:`.cuts`) of paths up to this many discrete
            instructions (0: none); on GPT-3/A40 8 x 24 they raise the relaxation from
            11.20 % to 11.17 % saving and let the search find better plans sooner.
    """
    began = time.perf_counter()
    hull_nodes = None
    method = "milp+cuts" if cut_path_nodes >= 2 else "milp"
    if discrete_stages is not None:
        keep = np.isin(problem.dag.stage, np.asarray(list(discrete_stages)))
        hull_nodes = np.flatnonzero(~keep)
        method += f"(stages {','.join(str(s) for s in discrete_stages)})"
    result = solve_milp_result(
        problem,
        deadline_s,
        hull_nodes=hull_nodes,
        time_limit_s=time_limit_s,
        mip_rel_gap=mip_rel_gap,
        start=start,
        log=log,
        cut_path_nodes=cut_path_nodes,
    )
    bound = Bound(
        deadline_s=deadline_s,
        energy_j=result.bound_j,
        method=method,
        seconds=time.perf_counter() - began,
    )
    if hull_nodes is None and result.choices is not None:
        times, energies = simulate_choices(problem, result.choices[None, :])
        if times[0] <= deadline_s * (1 + 1e-9):
            bound.plan, bound.plan_energy_j = result.choices, float(energies[0])
        bound.optimal = result.optimal
    return bound
