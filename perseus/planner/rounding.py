"""From continuous durations to real plans: rounding and slack filling.

* :meth:`Rounder.from_lp` rounds in topological order so that every instruction still
  finishes by its finish time in the LP's schedule (the plan meets the deadline by
  construction); time saved by rounding one instruction down is offered to its successors
  (error diffusion along the DAG). It does so twice: once choosing among all candidates, once
  among the hull vertices only (which diffuses more time and often ends cheaper), each
  followed by :meth:`Rounder.fill_slack`.
* :meth:`Rounder.from_node_hulls` does the same for an LP whose nodes have their own hulls
  (:mod:`perseus.planner.refine`), rounding each node among its own hull's vertices.
* :meth:`Rounder.fill_slack` walks the DAG backwards (reverse topological order) and gives
  every instruction the cheapest candidate that fits between its earliest start and the
  latest finish its (already placed) successors allow. Every instruction only uses time no
  one else needs, so the deadline still holds, and time the rounding left unused is spent.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import List, Optional

import numpy as np

from perseus.planner.hull import GroupHull
from perseus.planner.lp_model import LPSolution
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import earliest_finish

_EPS = 1e-12


class Rounder:
    """Turns LP solutions into plans; per group, candidate and hull-vertex tables as lists."""

    def __init__(self, problem: PlanningProblem, hulls: List[GroupHull]) -> None:
        """Precompute the lists once per problem."""
        self.problem = problem
        self.times: List[List[float]] = [
            problem.opt_time[g, c].tolist() for g, c in enumerate(problem.candidates)
        ]
        self.options: List[List[int]] = [c.tolist() for c in problem.candidates]
        self.hull_times: List[List[float]] = [h.time_s.tolist() for h in hulls]
        self.hull_options: List[List[int]] = [h.options.tolist() for h in hulls]

    def from_lp(self, solution: LPSolution) -> List[np.ndarray]:
        """Real plans meeting ``solution.deadline_s`` close to the LP optimum (see module)."""
        return [
            self.fill_slack(self._diffuse(solution, times, options), solution.deadline_s)
            for times, options in (
                (self.times, self.options),
                (self.hull_times, self.hull_options),
            )
        ]

    def from_node_hulls(
        self, solution: LPSolution, hulls: List[GroupHull], node_hull: np.ndarray
    ) -> List[np.ndarray]:
        """Like :meth:`from_lp`, rounding every node among the vertices of its own hull.

        Args:
            solution: An optimum of an LP whose node ``v`` used ``hulls[node_hull[v]]``.
            hulls: The hulls.
            node_hull: Per node, its hull's index.
        """
        times = [h.time_s.tolist() for h in hulls]
        options = [h.options.tolist() for h in hulls]
        plan = self._diffuse(solution, times, options, node_hull.tolist())
        return [self.fill_slack(plan, solution.deadline_s), *self.from_lp(solution)]

    def _diffuse(
        self,
        solution: LPSolution,
        times: List[List[float]],
        options: List[List[int]],
        table_of: Optional[List[int]] = None,
    ) -> np.ndarray:
        """Topological pass: the cheapest option still finishing by the LP finish time."""
        problem = self.problem
        dag = problem.dag
        fin = np.minimum(solution.finish_s, solution.deadline_s).tolist()
        done = [0.0] * (problem.num_nodes + 1)
        stage_pred = dag.stage_pred.tolist()
        flow_pred = dag.flow_pred.tolist()
        group_list = problem.node_group.tolist() if table_of is None else table_of
        out = [0] * problem.num_nodes
        for v in dag.topo.tolist():
            a, b = done[stage_pred[v]], done[flow_pred[v]]
            start = a if a > b else b
            g = group_list[v]
            cand_times = times[g]
            pos = max(bisect_right(cand_times, fin[v] - start + _EPS) - 1, 0)
            out[v] = options[g][pos]
            done[v] = start + cand_times[pos]
        return np.asarray(out, dtype=np.int64)

    def fill_slack(self, choices: np.ndarray, deadline_s: float) -> np.ndarray:
        """Slow instructions down into free time without exceeding ``deadline_s``.

        Args:
            choices: Option index per node; the plan must already meet the deadline.
            deadline_s: Iteration-time budget (s).

        Returns:
            New option indices (the input is not modified).
        """
        problem = self.problem
        dag = problem.dag
        groups = problem.node_group
        times = problem.opt_time[groups, choices]
        start = (earliest_finish(problem, times[None, :])[0] - times).tolist()
        latest_finish = [deadline_s * (1 + 1e-12)] * (problem.num_nodes + 1)
        stage_pred = dag.stage_pred.tolist()
        flow_pred = dag.flow_pred.tolist()
        group_list = groups.tolist()
        out = choices.tolist()
        cur_time = times.tolist()
        for v in reversed(dag.topo.tolist()):
            g = group_list[v]
            window = latest_finish[v] - start[v]
            cand_times = self.times[g]
            pos = bisect_right(cand_times, window) - 1
            if pos >= 0 and cand_times[pos] > cur_time[v]:
                out[v] = self.options[g][pos]
                cur_time[v] = cand_times[pos]
            late_start = latest_finish[v] - cur_time[v]
            # Index -1 (no predecessor) writes the spare last slot.
            p = stage_pred[v]
            if late_start < latest_finish[p]:
                latest_finish[p] = late_start
            p = flow_pred[v]
            if late_start < latest_finish[p]:
                latest_finish[p] = late_start
        return np.asarray(out, dtype=np.int64)
