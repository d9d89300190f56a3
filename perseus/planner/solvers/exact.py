"""The ``exact`` solver: the true frontier of small problems (for validation).

* When the number of plans (product of every instruction's candidate count) is at most
  ``max_plans``, every plan is enumerated and re-simulated; the Pareto-optimal ones are exact.
* Otherwise a mixed-integer program (:mod:`perseus.planner.solvers.lp.milp.program`) is solved for a
  sweep of deadlines; each answer is optimal for its deadline (within ``mip_rel_gap``).

Both grow exponentially; use it on a few stages and microbatches.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from perseus.errors import SolverError
from perseus.planner.frontier import pareto_rows
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time, simulate_choices
from perseus.planner.solvers import register_solver
from perseus.planner.solvers.base import ChoiceSolver, Progress, report
from perseus.planner.solvers.lp.milp.program import solve_milp

_BATCH = 20000


@register_solver("exact")
class ExactSolver(ChoiceSolver):
    """Exhaustive enumeration (small) or a MILP per deadline (larger).

    Args:
        max_plans: Enumerate when there are at most this many plans.
        num_deadlines: Deadlines of the MILP sweep.
        time_limit_s: HiGHS time limit per MILP.
        mip_rel_gap: MILP optimality gap.
    """

    def __init__(
        self,
        max_plans: int = 2_000_000,
        num_deadlines: int = 40,
        time_limit_s: float = 60.0,
        mip_rel_gap: float = 1e-7,
    ) -> None:
        """Store the settings."""
        self.max_plans = max_plans
        self.num_deadlines = num_deadlines
        self.time_limit_s = time_limit_s
        self.mip_rel_gap = mip_rel_gap

    def solve_choices(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[np.ndarray]:
        """Every Pareto-optimal plan (enumeration) or one per deadline (MILP), as option indices."""
        counts = np.array([len(problem.candidates[g]) for g in problem.node_group])
        if float(np.prod(counts.astype(float))) <= self.max_plans:
            return self._enumerate(problem, counts, progress)
        return self._milp_sweep(problem, progress)

    def _enumerate(
        self, problem: PlanningProblem, counts: np.ndarray, progress: Optional[Progress]
    ) -> List[np.ndarray]:
        total = int(np.prod(counts))
        cand = [problem.candidates[g] for g in problem.node_group]
        best: List[np.ndarray] = []
        for lo in range(0, total, _BATCH):
            index = np.arange(lo, min(lo + _BATCH, total))
            digits = np.empty((len(index), len(counts)), dtype=np.int64)
            for v, n in enumerate(counts.tolist()):
                digits[:, v] = index % n
                index = index // n
            choices = np.stack([cand[v][digits[:, v]] for v in range(len(cand))], axis=1)
            pool = np.vstack([choices, *best]) if best else choices
            times, energies = simulate_choices(problem, pool)
            best = [pool[pareto_rows(times, energies)]]
            report(progress, f"enumerated {lo + len(choices)} of {total} plans", lo / total)
        return list(best[0])

    def _milp_sweep(
        self, problem: PlanningProblem, progress: Optional[Progress]
    ) -> List[np.ndarray]:
        groups = problem.node_group
        fastest = np.array([problem.opt_time[g, c[0]] for g, c in enumerate(problem.candidates)])
        slowest = np.array([problem.opt_time[g, c[-1]] for g, c in enumerate(problem.candidates)])
        t_lo = iteration_time(problem, fastest[groups])
        t_hi = iteration_time(problem, slowest[groups])
        plans = []
        for i, deadline in enumerate(np.linspace(t_lo, t_hi, self.num_deadlines)):
            found = solve_milp(
                problem,
                float(deadline),
                time_limit_s=self.time_limit_s,
                mip_rel_gap=self.mip_rel_gap,
            )
            if found is None:
                raise SolverError(
                    f"exact solver: no MILP solution for T <= {deadline:.6f} s within "
                    f"{self.time_limit_s} s; the problem is too large for the exact solver"
                )
            plans.append(found)
            report(progress, f"MILP deadline {i + 1}", (i + 1) / self.num_deadlines)
        return plans
