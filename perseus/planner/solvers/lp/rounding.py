"""From continuous durations to real plans: rounding and slack filling, many plans at once.

* :meth:`Rounder.diffuse` rounds in topological order so that every instruction still
  finishes by its finish time in the LP's schedule (the plan meets the deadline by
  construction); time saved by rounding one instruction down is offered to its successors
  (error diffusion along the DAG).
* :meth:`Rounder.fill_slack` walks the DAG backwards and gives every instruction the
  cheapest candidate that fits between its earliest start and the latest finish its
  (already placed) successors allow. Every instruction only uses time no one else needs, so
  the deadline still holds, and time the rounding left unused is spent.
* :meth:`Rounder.from_solutions` does both for a batch of LP solutions, once choosing among
  all candidates and once among hull vertices only (which diffuses more time and often ends
  cheaper). A node may also be rounded among the vertices of its own hull (refinement, see
  :mod:`.refine`).

Both passes go level by level through the DAG (:attr:`perseus.planner.dag.PipelineDAG.levels`)
with every plan of the batch in one array, so their cost is a few numpy calls per level
whatever the batch size.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import earliest_finish, latest_finish, scatter_min
from perseus.planner.solvers.lp.hull import GroupHull
from perseus.planner.solvers.lp.model import LPSolution

_EPS = 1e-12
#: Cells (plans x nodes) per batch of a rounding pass (bounds memory to ~100 MB per array).
_CELLS = 12_000_000


class OptionTables:
    """Per table, option times (ascending) and option indices, padded into 2-D arrays."""

    def __init__(self, times: Sequence[np.ndarray], options: Sequence[np.ndarray]) -> None:
        """Pad ``times`` with +inf and ``options`` with their last option."""
        width = max(len(t) for t in times)
        self.times = np.full((len(times), width), np.inf)
        self.options = np.zeros((len(times), width), dtype=np.int64)
        for k, (t, o) in enumerate(zip(times, options)):
            self.times[k, : len(t)] = t
            self.options[k, : len(o)] = o
            self.options[k, len(o) :] = o[-1]

    def fitting(self, table: np.ndarray, window_s: np.ndarray) -> np.ndarray:
        """Per cell, the position of the slowest option no longer than ``window_s`` (-1: none).

        Args:
            table: Table index per column of ``window_s``.
            window_s: (plans, columns) time available.
        """
        return (self.times[table][None, :, :] <= window_s[:, :, None]).sum(axis=2) - 1


class Rounder:
    """Turns LP solutions into plans."""

    def __init__(self, problem: PlanningProblem, hulls: List[GroupHull]) -> None:
        """Candidate and hull-vertex tables of every group."""
        self.problem = problem
        self.candidates = OptionTables(
            [problem.opt_time[g, c] for g, c in enumerate(problem.candidates)],
            problem.candidates,
        )
        self.hull_tables = OptionTables([h.time_s for h in hulls], [h.options for h in hulls])
        self.groups = problem.node_group.astype(np.int64)

    def from_solutions(self, solutions: Sequence[LPSolution]) -> np.ndarray:
        """Plans (rows of option indices) meeting each solution's deadline (see module)."""
        if not solutions:
            return np.zeros((0, self.problem.num_nodes), dtype=np.int64)
        finish, deadline = self._schedules(
            np.stack([s.finish_s for s in solutions]),
            np.stack([s.durations_s for s in solutions]),
            np.array([s.deadline_s for s in solutions]),
        )
        rows = [
            self.diffuse(finish, deadline, self.candidates, self.groups),
            self.diffuse(finish, deadline, self.hull_tables, self.groups),
        ]
        return self.fill_slack(np.vstack(rows), np.concatenate([deadline, deadline]))

    def from_schedule(
        self,
        finish_s: np.ndarray,
        durations_s: np.ndarray,
        deadline_s: float,
        allowed: Sequence[np.ndarray],
    ) -> np.ndarray:
        """Plans from one relaxed schedule, each node rounded among its ``allowed`` options.

        For a relaxation other than the hull LP's (e.g. the MILP's with some nodes held to
        one option, :mod:`.steady`): as :meth:`from_solutions` with every node's own options
        (a node allowed one option keeps it unless the slack filling finds it room), then
        the slack filled among all candidates.

        Args:
            finish_s: Finish time of every node in the relaxation's schedule.
            durations_s: Duration of every node in it.
            deadline_s: The deadline it meets.
            allowed: Per node, the options it may be rounded to (ascending time).
        """
        problem = self.problem
        own = OptionTables(
            [problem.opt_time[g, a] for g, a in zip(self.groups.tolist(), allowed)], allowed
        )
        finish, deadline = self._schedules(
            finish_s[None, :], durations_s[None, :], np.array([float(deadline_s)])
        )
        plans = self.diffuse(finish, deadline, own, np.arange(problem.num_nodes))
        return np.vstack([plans, self.fill_slack(plans, deadline)])

    def _schedules(
        self, lp_finish: np.ndarray, durations: np.ndarray, lp_deadline: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray]:
        """The LP's own schedule, and the earliest and the latest with the LP's durations."""
        finish = np.vstack(
            [
                lp_finish,
                earliest_finish(self.problem, durations),
                latest_finish(self.problem, durations, lp_deadline),
            ]
        )
        return finish, np.tile(lp_deadline, 3)

    def from_own_hulls(
        self, solution: LPSolution, hulls: List[GroupHull], node_hull: np.ndarray
    ) -> np.ndarray:
        """Plans from one solution, each node rounded among the vertices of its own hull.

        Args:
            solution: An optimum of an LP whose node ``v`` used ``hulls[node_hull[v]]``.
            hulls: The hulls.
            node_hull: Per node, its hull's index.
        """
        own = OptionTables([h.time_s for h in hulls], [h.options for h in hulls])
        deadline = np.array([solution.deadline_s])
        plan = self.diffuse(solution.finish_s[None, :], deadline, own, node_hull)
        return np.vstack([self.fill_slack(plan, deadline), self.from_solutions([solution])])

    def diffuse(
        self,
        finish_s: np.ndarray,
        deadline_s: np.ndarray,
        tables: OptionTables,
        node_table: np.ndarray,
    ) -> np.ndarray:
        """Topological pass: per plan, the slowest option still finishing by ``finish_s``.

        Args:
            finish_s: (plans, nodes) finish times to meet (the LP's schedule).
            deadline_s: Per plan, its deadline (finish times are clipped to it).
            tables: Options to choose from.
            node_table: Per node, its table in ``tables``.

        Returns:
            (plans, nodes) option indices.
        """
        dag = self.problem.dag
        num_plans, num_nodes = finish_s.shape
        out = np.empty((num_plans, num_nodes), dtype=np.int64)
        step = max(1, _CELLS // max(1, num_nodes))
        for lo in range(0, num_plans, step):
            fin = np.minimum(finish_s[lo : lo + step], deadline_s[lo : lo + step, None])
            done = np.zeros((fin.shape[0], num_nodes + 1))
            for level in dag.levels:
                start = np.maximum(done[:, dag.stage_pred[level]], done[:, dag.flow_pred[level]])
                table = node_table[level]
                pos = np.maximum(tables.fitting(table, fin[:, level] - start + _EPS), 0)
                out[lo : lo + step, level] = tables.options[table[None, :], pos]
                done[:, level] = start + tables.times[table[None, :], pos]
        return out

    def fill_slack(self, choices: np.ndarray, deadline_s: np.ndarray) -> np.ndarray:
        """Slow instructions down into free time without exceeding each plan's deadline.

        Args:
            choices: (plans, nodes) option indices; every plan must meet its deadline.
            deadline_s: Per plan, its iteration-time budget (s).

        Returns:
            New option indices (the input is not modified).
        """
        problem = self.problem
        dag = problem.dag
        groups = self.groups
        tables = self.candidates
        choices = np.atleast_2d(choices)
        num_plans, num_nodes = choices.shape
        out = choices.copy()
        step = max(1, _CELLS // max(1, num_nodes))
        for lo in range(0, num_plans, step):
            block = out[lo : lo + step]
            cur = problem.opt_time[groups[None, :], block]
            start = earliest_finish(problem, cur) - cur
            latest = np.repeat(
                (deadline_s[lo : lo + step] * (1 + 1e-12))[:, None], num_nodes + 1, axis=1
            )
            for level in reversed(dag.levels):
                table = groups[level]
                pos = tables.fitting(table, latest[:, level] - start[:, level])
                cand_t = tables.times[table[None, :], np.maximum(pos, 0)]
                slower = (pos >= 0) & (cand_t > cur[:, level])
                block[:, level] = np.where(
                    slower, tables.options[table[None, :], np.maximum(pos, 0)], block[:, level]
                )
                cur[:, level] = np.where(slower, cand_t, cur[:, level])
                late_start = latest[:, level] - cur[:, level]
                # Index -1 (no predecessor) writes the spare last column.
                for pred in (dag.stage_pred[level], dag.flow_pred[level]):
                    scatter_min(latest, pred, late_start)
        return out
