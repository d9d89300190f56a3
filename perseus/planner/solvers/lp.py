"""The ``lp`` solver: convex-hull LP sweep with rounding and slack filling (the default).

For a sweep of deadlines ``T`` from the fastest plan up to the least-energy one:

1. Solve the convex-hull LP (:mod:`perseus.planner.lp_model`) for ``T``, warm-started from
   the previous deadline's basis. Its optimum is a lower bound on any plan's energy at ``T``.
2. Turn the LP optimum into real plans (:mod:`perseus.planner.rounding`): in topological
   order every instruction takes the cheapest profiled frequency that still finishes by its
   LP finish time (so the plan meets ``T``; time saved upstream is offered downstream), once
   among all candidates and once among hull vertices only; then leftover slack is filled.
3. Dive (``dive_rounds``): pin every instruction whose LP duration lies inside a hull segment
   to the segment's faster end, re-solve (on a second HiGHS model, so the sweep keeps its
   basis) and round again. The LP then re-distributes time around the pinned instructions,
   which often gives a cheaper real plan.
4. Refine (``refine_deadlines``, by default only the no-slowdown deadline ``T_allmax``):
   instructions the LP put inside a long hull segment (a sharp energy drop between
   neighbouring frequencies) are re-modelled and decided one by one
   (:mod:`perseus.planner.refine`), then rounded among their own hull's vertices.
5. Fill gaps (:mod:`perseus.planner.gaps`): where neighbouring Pareto-optimal plans between
   the all-max and the least-energy plan are more than ``max_gap_rel`` (0.5 %) apart in
   iteration time (rounding inside a flat stretch of the curve gave only dominated plans),
   solve the LP and a small MILP at the gap's middle until plans close it.

Every plan goes to the frontier, which re-simulates them and keeps the Pareto-optimal ones.

Deadlines are spaced geometrically (``relative_step``, 0.4 % by default) so every iteration
time in the range has a plan close to it; the sweep stops once the LP's energy has risen for
``patience`` deadlines in a row (past the least-energy point the energy only grows).
:attr:`LPSolver.bounds` keeps ``(T, LP energy)`` of the last solve for reporting.
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Tuple

import numpy as np

from perseus.planner.gaps import MAX_GAP_REL, fill_gaps
from perseus.planner.hull import group_hulls
from perseus.planner.lp_model import HullLP, LPSolution, fractional_nodes
from perseus.planner.problem import PlanningProblem
from perseus.planner.refine import JumpRefiner
from perseus.planner.rounding import Rounder
from perseus.planner.simulate import iteration_time
from perseus.planner.solvers import register_solver
from perseus.planner.solvers.base import ChoiceSolver, Progress, report


@register_solver("lp")
class LPSolver(ChoiceSolver):
    """Convex-hull LP over a sweep of deadlines, each solution made a real plan.

    Args:
        relative_step: Ratio between consecutive deadlines, minus one.
        patience: Stop after the LP energy rose this many deadlines in a row.
        max_deadlines: Hard cap on the number of deadlines.
        dive_rounds: Per deadline, how many times fractional nodes are pinned to their
            faster hull vertex and the LP re-solved (each round adds a plan).
        refine_deadlines: Run the jump refinement (:mod:`perseus.planner.refine`) on this
            many deadlines, starting at the all-max plan's time (the no-slowdown policy's
            deadline) and going up; 0 turns it off.
        refine_time_s: Time budget of one refinement.
        max_gap_rel: Largest allowed relative iteration-time step between neighbouring
            frontier plans (all-max .. least energy); wider gaps are filled afterwards.
        gap_time_s: Time budget of the gap filling (0 turns it off).
    """

    def __init__(
        self,
        relative_step: float = 0.004,
        patience: int = 3,
        max_deadlines: int = 2000,
        dive_rounds: int = 1,
        refine_deadlines: int = 1,
        refine_time_s: float = 10.0,
        max_gap_rel: float = MAX_GAP_REL,
        gap_time_s: float = 10.0,
    ) -> None:
        """Store the sweep settings."""
        self.max_gap_rel = max_gap_rel
        self.gap_time_s = gap_time_s
        self.dive_rounds = dive_rounds
        self.refine_deadlines = refine_deadlines
        self.refine_time_s = refine_time_s
        self.relative_step = relative_step
        self.patience = patience
        self.max_deadlines = max_deadlines
        self.bounds: List[Tuple[float, float]] = []
        self.elapsed_s = 0.0
        self._t_allmax = 0.0

    def solve_choices(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[np.ndarray]:
        """Candidate plans along the frontier as option indices (see the module docstring)."""
        began = time.perf_counter()
        report(progress, "building the LP", 0.0)
        hulls = group_hulls(problem)
        model = HullLP(problem, hulls)
        tables = Rounder(problem, hulls)
        deadlines = self._deadlines(problem)
        refiner = JumpRefiner(problem, hulls, time_budget_s=self.refine_time_s)
        first = deadlines.index(self._t_allmax) if self._t_allmax in deadlines else len(deadlines)
        refine_at = set(deadlines[first : first + self.refine_deadlines])
        plans: List[np.ndarray] = []
        self.bounds = []
        rises = 0
        for i, deadline in enumerate(deadlines):
            solution = model.solve(deadline)
            lp_energy = solution.energy_j
            plans += self._plans_at(model, tables, solution)
            if deadline in refine_at:
                report(progress, f"refining T <= {deadline:.4f} s", i / len(deadlines))
                for refined, node_hull in refiner.refine(model, solution):
                    plans += tables.from_node_hulls(refined, refiner.hulls, node_hull)
            rising = bool(self.bounds) and lp_energy > self.bounds[-1][1]
            self.bounds.append((deadline, lp_energy))
            rises = rises + 1 if rising else 0
            report(progress, f"deadline {i + 1}: T <= {deadline:.4f} s", (i + 1) / len(deadlines))
            if rises >= self.patience:
                break
        if self.gap_time_s > 0:
            report(progress, "filling gaps between neighbouring plans", 1.0)
            plans += fill_gaps(
                problem,
                plans,
                model.solve,
                lambda solution: self._plans_at(model, tables, solution),
                max_gap_rel=self.max_gap_rel,
                budget_s=self.gap_time_s,
            )
        self.elapsed_s = time.perf_counter() - began
        report(progress, f"{len(plans)} LP solves in {self.elapsed_s:.1f} s", 1.0)
        return plans

    def _plans_at(self, model: HullLP, tables: Rounder, solution: LPSolution) -> List[np.ndarray]:
        """Plans from the LP optimum and from a short dive that pins fractional nodes."""
        plans = tables.from_lp(solution)
        if self.dive_rounds:
            model.start_dive()
        for _ in range(self.dive_rounds):
            nodes, lower = fractional_nodes(model, solution)
            if not len(nodes):
                break
            model.fix(nodes, lower)
            pinned = model.resolve()
            if pinned is None:  # cannot happen (shorter durations keep the old optimum valid)
                break
            solution = pinned
            plans += tables.from_lp(solution)
        return plans

    def _deadlines(self, problem: PlanningProblem) -> List[float]:
        groups = problem.node_group
        fastest = np.array([problem.opt_time[g, c[0]] for g, c in enumerate(problem.candidates)])
        slowest = np.array([problem.opt_time[g, c[-1]] for g, c in enumerate(problem.candidates)])
        allmax_t = problem.opt_time[groups, problem.allmax_choices()]
        t_fast = iteration_time(problem, fastest[groups])
        t_allmax = iteration_time(problem, allmax_t)
        t_slow = iteration_time(problem, slowest[groups])
        self._t_allmax = t_allmax
        # Geometric from the fastest plan up, with the all-max time itself always included
        # (the no-slowdown policy's deadline).
        ratio = 1.0 + self.relative_step
        count = max(1, math.ceil(math.log(max(t_slow, t_fast) / t_fast) / math.log(ratio)))
        grid = [t_fast * ratio**k for k in range(count)] + [max(t_slow, t_fast)]
        near = [t for t in grid if abs(t / t_allmax - 1) > self.relative_step / 4]
        out = sorted(set(near) | {t_allmax})
        return out[: self.max_deadlines]
