"""The search at a refined deadline: from one LP optimum to the best plans found there.

The :class:`.solver.LPSolver` runs it at the no-slowdown deadline (``refine_deadlines``):

1. round the LP optimum and refine it (:mod:`.refine`: instructions on long hull segments
   decided one by one);
2. polish the best plan (:mod:`.polish`, problems up to ``polish_max_size``);
3. splice a steady-state pattern into long 1F1B plans (:mod:`.steady`), and polish the
   spliced plans' seams;
4. re-optimise with the whole MILP a window at a time (:mod:`.reoptimize`).

Steps 2-4 only run while the best plan is more than ``polish_gap`` (of the all-max energy)
above the LP relaxation with time windows (:func:`.bounds.lp_bound`, solved once, when first
needed); how hard each searches is the effort level's (:mod:`.effort`).
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.progress import WorkMeter
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.base import Progress, report
from perseus.planner.solvers.lp.effort import SearchSettings
from perseus.planner.solvers.lp.hull import GroupHull
from perseus.planner.solvers.lp.milp.bounds import lp_bound
from perseus.planner.solvers.lp.model import HullLP, LPSolution
from perseus.planner.solvers.lp.polish import best_within, polish
from perseus.planner.solvers.lp.refine import JumpRefiner
from perseus.planner.solvers.lp.reoptimize import reoptimize
from perseus.planner.solvers.lp.rounding import Rounder
from perseus.planner.solvers.lp.steady import splice as steady


def lp_node_energy(
    problem: PlanningProblem, hulls: List[GroupHull], solution: LPSolution
) -> np.ndarray:
    """Per node, the effective energy the LP optimum gives it (on its group's hull)."""
    out = np.empty(problem.num_nodes)
    for g, hull in enumerate(hulls):
        nodes = np.flatnonzero(problem.node_group == g)
        out[nodes] = np.interp(solution.durations_s[nodes], hull.time_s, hull.cost_j)
    return out


class DeadlineSearch:
    """The search at one refined deadline (see the module docstring).

    Args:
        problem: The planning problem.
        hulls: Its groups' convex hulls.
        settings: The effort level's search settings.
        polish_gap: Search only while the best plan is more than this fraction of the all-max
            energy above the LP bound with time windows.
        refine_trials: Pin-and-re-solve trials of one refinement round.
        reoptimize_max_size: Re-optimise only problems up to this many instructions.
    """

    def __init__(
        self,
        problem: PlanningProblem,
        hulls: List[GroupHull],
        settings: SearchSettings,
        polish_gap: float,
        refine_trials: int,
        reoptimize_max_size: int,
    ) -> None:
        self.problem = problem
        self.hulls = hulls
        self.settings = settings
        self.polish_gap = polish_gap
        self.refine_trials = refine_trials
        self.reoptimize_max_size = reoptimize_max_size

    def run(
        self,
        model: HullLP,
        rounder: Rounder,
        solution: LPSolution,
        meter: Optional[WorkMeter] = None,
        part: int = 0,
        parts: int = 1,
    ) -> List[np.ndarray]:
        """Refined, polished, spliced and re-optimised plans at ``solution``'s deadline.

        Args:
            model: The sweep's LP.
            rounder: The sweep's rounding.
            solution: The LP optimum at the deadline.
            meter: Gets each stage's progress (the stages of :data:`.cost.STAGES`).
            part: This is the search at the ``part``-th of ``parts`` deadlines (progress).
            parts: Deadlines searched in all.
        """
        problem, settings = self.problem, self.settings
        deadline = solution.deadline_s

        def stage(name: str) -> Optional[Progress]:
            return None if meter is None else meter.reporter(name, part, parts)

        refining = stage("refinement")
        report(refining, f"refining T <= {deadline:.4f} s", 0.0)
        refiner = JumpRefiner(problem, self.hulls, max_trials=self.refine_trials)
        plans = list(rounder.from_solutions([solution]))
        for refined, node_hull in refiner.refine(model, solution, refining):
            plans += list(rounder.from_own_hulls(refined, refiner.hulls, node_hull))
        # The windowed LP bound every gap test compares with: solved once, when first needed.
        bound_j = functools.lru_cache(maxsize=1)(lambda: lp_bound(problem, deadline).energy_j)
        worth = functools.partial(self._worth, deadline_s=deadline, bound_j=bound_j)
        reference_j = lp_node_energy(problem, self.hulls, solution)
        small = problem.num_nodes <= settings.polish_max_size
        if settings.polish_nodes > 0 and small and worth(plans):
            plans += self._polish(plans, deadline, reference_j, stage("polish"))
        long_1f1b = settings.steady_pattern and steady.applies(problem)
        if long_1f1b and (not settings.steady_gap_test or worth(plans)):
            light = settings.steady_light
            spliced = steady.improve(
                problem, plans, deadline, stage("steady pattern"), light, stage("splice")
            )
            plans += spliced
            # The spliced plans' seams get their own polish (up to the splice's size limit).
            if spliced and settings.polish_nodes > 0 and worth(plans):
                seams = stage("seam polish")
                plans += self._polish(spliced, deadline, reference_j, seams, steady.held_nodes)
        sweeps = settings.reoptimize_sweeps
        fits = problem.num_nodes <= self.reoptimize_max_size
        if sweeps > 0 and fits and worth(plans):
            optimising = stage("re-optimisation")
            plans += reoptimize(problem, plans, deadline, sweeps=sweeps, progress=optimising)
        return plans

    def _polish(
        self,
        plans: List[np.ndarray],
        deadline_s: float,
        reference_j: np.ndarray,
        progress: Optional[Progress],
        held: Optional[Callable[[PlanningProblem], np.ndarray]] = None,
    ) -> List[np.ndarray]:
        """The polish (:mod:`.polish`) of the best of ``plans`` at ``deadline_s``.

        Windows go where the plan loses most against the LP optimum (``reference_j``) first;
        nodes that ``held(problem)`` marks (a spliced pattern's interior) count as losing
        nothing, so a spliced plan's seams and ends come first.
        """
        problem, settings = self.problem, self.settings
        best = best_within(problem, plans, deadline_s)
        if held is not None and best is not None:
            inside = held(problem)
            reference_j = reference_j.copy()
            reference_j[inside] = problem.opt_effective[problem.node_group, best][inside]
        return polish(
            problem,
            plans,
            deadline_s,
            settings.polish_nodes,
            passes=settings.polish_passes,
            progress=progress,
            reference_j=reference_j,
            max_windows=settings.polish_windows,
            light=settings.polish_light,
        )

    def _worth(
        self, plans: List[np.ndarray], deadline_s: float, bound_j: Callable[[], float]
    ) -> bool:
        """Whether the best plan is over ``polish_gap`` (of the all-max energy) above the bound.

        Args:
            plans: Candidate plans; the best meeting ``deadline_s`` is tested.
            deadline_s: The deadline.
            bound_j: The LP relaxation with time windows at the deadline
                (:func:`.bounds.lp_bound`), asked for only when a plan meets the deadline.
        """
        problem = self.problem
        best = best_within(problem, plans, deadline_s)
        if best is None:
            return False
        energies = simulate_choices(problem, np.vstack([best, problem.allmax_choices()]))[1]
        return bool((energies[0] - bound_j()) / energies[1] > self.polish_gap)
