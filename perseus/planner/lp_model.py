"""The convex-hull linear program: least effective energy with iteration time <= T.

Variables: a start time ``x_v >= 0`` per instruction and, per hull segment ``k`` of its
group, ``0 <= delta_vk <= length_k``. The duration is ``d_v = t0_v + sum_k delta_vk`` and the
effective energy ``c0_v + sum_k slope_k delta_vk``; slopes increase along the hull, so the
cheapest way to fill a duration uses segments in order and no epigraph rows are needed.

Rows: one per dependency ``u -> v`` (``x_v - x_u - sum_k delta_uk >= t0_u``) and one per sink
(``x_v + sum_k delta_vk <= T - t0_v``). A deadline change only moves the sink rows' bounds, so
HiGHS re-solves from the previous basis (dual simplex) in a fraction of a cold solve.

Total energy of the LP solution: ``sum(effective) + T * sum(P_block)``; its optimum is a
lower bound on the energy of any real plan with iteration time <= T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np

from perseus.errors import SolverError
from perseus.planner.hull import GroupHull
from perseus.planner.problem import PlanningProblem


@dataclass
class LPSolution:
    """One LP optimum.

    Attributes:
        deadline_s: The iteration-time budget it was solved for.
        durations_s: Duration of every node (on its hull).
        finish_s: Finish time of every node in the LP's schedule.
        energy_j: Total energy of the LP optimum (a lower bound for real plans).
        fill: Per segment column, how much of the segment is used (0..1).
    """

    deadline_s: float
    durations_s: np.ndarray
    finish_s: np.ndarray
    energy_j: float
    fill: np.ndarray


class HullLP:
    """The LP of one problem, re-solvable for many deadlines."""

    def __init__(
        self,
        problem: PlanningProblem,
        hulls: List[GroupHull],
        node_hull: Optional[np.ndarray] = None,
    ) -> None:
        """Build the sparse model and hand it to HiGHS (one thread, quiet).

        Args:
            problem: The planning problem.
            hulls: Hulls to draw from; by default ``hulls[g]`` is group ``g``'s hull.
            node_hull: Per node, the index in ``hulls`` of its hull (default: its group).
        """
        import highspy

        self._highspy = highspy
        self.problem = problem
        dag = problem.dag
        num_nodes = dag.num_nodes
        groups = problem.node_group if node_hull is None else np.asarray(node_hull)
        num_seg = np.array([len(h.lengths_s) for h in hulls])[groups]
        self.t0 = np.array([h.time_s[0] for h in hulls])[groups]
        self.c0 = np.array([h.cost_j[0] for h in hulls])[groups]
        # Segment columns follow the V start columns; node v owns seg_start[v]:seg_start[v+1].
        seg_start = np.zeros(num_nodes + 1, dtype=np.int64)
        seg_start[1:] = np.cumsum(num_seg)
        num_cols = num_nodes + int(seg_start[-1])
        seg_node = np.repeat(np.arange(num_nodes), num_seg)
        seg_rank = np.arange(int(seg_start[-1])) - seg_start[seg_node]
        seg_len = np.empty(int(seg_start[-1]))
        seg_slope = np.empty(int(seg_start[-1]))
        seg_upper = np.empty(int(seg_start[-1]))
        seg_hull = groups[seg_node]
        for g in np.unique(seg_hull).tolist():
            hull = hulls[g]
            mask = seg_hull == g
            seg_len[mask] = hull.lengths_s[seg_rank[mask]]
            seg_slope[mask] = hull.slopes[seg_rank[mask]]
            # Locked trailing segments (see GroupHull.locked_tail) start closed.
            open_segments = len(hull.lengths_s) - hull.locked_tail
            seg_upper[mask] = np.where(seg_rank[mask] < open_segments, seg_len[mask], 0.0)
        self.seg_upper = seg_upper
        self.seg_start, self.seg_node, self.seg_len = seg_start, seg_node, seg_len
        self.seg_rank = seg_rank
        self._fixed_cols = np.zeros(0, dtype=np.int64)
        self.num_nodes = num_nodes

        edge_u, edge_v = dag.edges()
        rows_e = np.arange(len(edge_u))
        sinks = dag.sinks
        rows_s = len(edge_u) + np.arange(len(sinks))
        # Triplets: +x_v, -x_u, -delta_u* on edge rows; +x_s, +delta_s* on sink rows.
        seg_of = [np.arange(seg_start[u], seg_start[u + 1]) for u in range(num_nodes)]
        e_seg_cols = np.concatenate([seg_of[u] for u in edge_u.tolist()] or [np.zeros(0, int)])
        e_seg_rows = np.repeat(rows_e, num_seg[edge_u])
        s_seg_cols = np.concatenate([seg_of[s] for s in sinks.tolist()] or [np.zeros(0, int)])
        s_seg_rows = np.repeat(rows_s, num_seg[sinks])
        rows = np.concatenate([rows_e, rows_e, e_seg_rows, rows_s, s_seg_rows])
        cols = np.concatenate(
            [edge_v, edge_u, num_nodes + e_seg_cols, sinks, num_nodes + s_seg_cols]
        )
        vals = np.concatenate(
            [
                np.ones(len(rows_e)),
                -np.ones(len(rows_e)),
                -np.ones(len(e_seg_rows)),
                np.ones(len(rows_s)),
                np.ones(len(s_seg_rows)),
            ]
        )
        num_rows = len(edge_u) + len(sinks)
        self._sink_rows = rows_s.astype(np.int32)
        self._sink_t0 = self.t0[sinks]
        row_lower = np.concatenate([self.t0[edge_u], np.full(len(sinks), -np.inf)])
        row_upper = np.full(num_rows, np.inf)
        col_cost = np.concatenate([np.zeros(num_nodes), seg_slope])
        col_lower = np.zeros(num_cols)
        col_upper = np.concatenate([np.full(num_nodes, np.inf), seg_upper])
        self._highs: Any = self._make_model(
            num_rows,
            num_cols,
            rows,
            cols,
            vals,
            row_lower,
            row_upper,
            col_cost,
            col_lower,
            col_upper,
        )
        self.constant_j = float(self.c0.sum())
        self.total_power_w = float(sum(problem.p2p_power_w))
        self.deadline_s = float("inf")
        self._dive: Any = None

    def _make_model(
        self,
        num_rows: int,
        num_cols: int,
        rows: np.ndarray,
        cols: np.ndarray,
        vals: np.ndarray,
        row_lower: np.ndarray,
        row_upper: np.ndarray,
        col_cost: np.ndarray,
        col_lower: np.ndarray,
        col_upper: np.ndarray,
    ) -> Any:
        from scipy.sparse import coo_matrix

        hs = self._highspy
        inf = hs.kHighsInf
        matrix = coo_matrix((vals, (rows, cols)), shape=(num_rows, num_cols)).tocsc()
        lp = hs.HighsLp()
        lp.num_col_, lp.num_row_ = num_cols, num_rows
        lp.col_cost_ = col_cost
        lp.col_lower_ = col_lower
        lp.col_upper_ = np.where(np.isinf(col_upper), inf, col_upper)
        lp.row_lower_ = np.where(np.isinf(row_lower), -inf, row_lower)
        lp.row_upper_ = np.where(np.isinf(row_upper), inf, row_upper)
        lp.a_matrix_.format_ = hs.MatrixFormat.kColwise
        lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
        lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
        lp.a_matrix_.value_ = matrix.data
        self._lp = lp
        return self._new_instance()

    def _new_instance(self) -> Any:
        h = self._highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        # Re-solves start from the previous basis; presolve would only get in the way.
        h.setOptionValue("presolve", "off")
        h.passModel(self._lp)
        return h

    def solve(self, deadline_s: float) -> LPSolution:
        """Solve for iteration time <= ``deadline_s``: durations, finish times and energy.

        Raises:
            SolverError: if HiGHS does not reach an optimum (e.g. T below the fastest plan).
        """
        self._set_deadline(self._highs, deadline_s)
        self.deadline_s = deadline_s
        solution = self._run(self._highs)
        if solution is None:
            status = self._highs.modelStatusToString(self._highs.getModelStatus())
            raise SolverError(
                f"LP for iteration time <= {deadline_s:.6f} s ended with status {status}; "
                "the deadline may be below the fastest possible plan"
            )
        return solution

    def try_solve(self) -> Optional[LPSolution]:
        """Re-solve the main model at the current deadline (after :meth:`pin`).

        Returns:
            The optimum, or None if there is none (e.g. pins make the deadline infeasible).
        """
        return self._run(self._highs)

    def start_dive(self) -> None:
        """Copy the last :meth:`solve` (deadline and basis) into the dive model.

        Pinning nodes (:meth:`fix`) happens on a second HiGHS model so the sweep's basis stays
        optimal for the next deadline.
        """
        if self._dive is None:
            self._dive = self._new_instance()
        self._release(self._dive)
        self._set_deadline(self._dive, self.deadline_s)
        self._dive.setBasis(self._highs.getBasis())

    def resolve(self) -> Optional[LPSolution]:
        """Re-solve the dive model with its pinned nodes; None if infeasible."""
        if self._dive is None:
            raise SolverError("HullLP.resolve() before start_dive()")
        return self._run(self._dive)

    def _set_deadline(self, h: Any, deadline_s: float) -> None:
        upper = deadline_s - self._sink_t0
        lower = np.full(len(upper), -self._highspy.kHighsInf)
        h.changeRowsBounds(len(upper), self._sink_rows, lower, upper)

    def _run(self, h: Any) -> Optional[LPSolution]:
        h.run()
        if h.getModelStatus() != self._highspy.HighsModelStatus.kOptimal:
            return None
        values = np.asarray(h.getSolution().col_value)
        deltas = values[self.num_nodes :]
        sums = np.add.reduceat(np.concatenate([deltas, [0.0]]), self.seg_start[:-1])
        durations = self.t0 + sums * (self.seg_start[1:] > self.seg_start[:-1])
        objective = float(h.getInfo().objective_function_value)
        return LPSolution(
            deadline_s=self.deadline_s,
            durations_s=durations,
            finish_s=values[: self.num_nodes] + durations,
            energy_j=objective + self.constant_j + self.deadline_s * self.total_power_w,
            fill=deltas / np.where(self.seg_len > 0, self.seg_len, 1.0),
        )

    def fix(self, nodes: np.ndarray, durations_s: np.ndarray) -> None:
        """Pin nodes' durations (within their hulls' range) in the dive model."""
        if self._dive is None:
            raise SolverError("HullLP.fix() before start_dive()")
        cols, value = self._pinned_values(nodes, durations_s)
        if not len(cols):
            return
        self._set_segment_bounds(self._dive, cols, value, value)
        self._fixed_cols = np.union1d(self._fixed_cols, cols)

    def pin(self, nodes: np.ndarray, durations_s: np.ndarray) -> None:
        """Pin nodes' durations in the main model (locked segments may open); see unpin."""
        cols, value = self._pinned_values(nodes, durations_s)
        if len(cols):
            self._set_segment_bounds(self._highs, cols, value, value)

    def unpin(self, nodes: np.ndarray) -> None:
        """Give pinned nodes of the main model their default segment bounds back."""
        cols = self._node_cols(nodes)
        if len(cols):
            self._set_segment_bounds(self._highs, cols, np.zeros(len(cols)), self.seg_upper[cols])

    def _node_cols(self, nodes: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [np.arange(self.seg_start[v], self.seg_start[v + 1]) for v in nodes.tolist()]
            or [np.zeros(0, dtype=np.int64)]
        )

    def _pinned_values(
        self, nodes: np.ndarray, durations_s: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Segment columns of ``nodes`` and their values for the given durations."""
        counts = self.seg_start[nodes + 1] - self.seg_start[nodes]
        cols = self._node_cols(nodes)
        if not len(cols):
            return cols, np.zeros(0)
        # Fill segments in order: segment k gets min(L_k, remaining after segments < k).
        extra = np.repeat(durations_s - self.t0[nodes], counts)
        before = np.cumsum(self.seg_len[cols]) - self.seg_len[cols]
        offsets = np.repeat(np.cumsum(counts) - counts, counts)
        before -= (np.cumsum(self.seg_len[cols]) - self.seg_len[cols])[offsets]
        return cols, np.clip(extra - before, 0.0, self.seg_len[cols])

    def _release(self, h: Any) -> None:
        cols = self._fixed_cols
        if len(cols):
            self._set_segment_bounds(h, cols, np.zeros(len(cols)), self.seg_upper[cols])
        self._fixed_cols = np.zeros(0, dtype=np.int64)

    def _set_segment_bounds(
        self, h: Any, cols: np.ndarray, lower: np.ndarray, upper: np.ndarray
    ) -> None:
        h.changeColsBounds(len(cols), (self.num_nodes + cols).astype(np.int32), lower, upper)


def fractional_nodes(model: HullLP, solution: LPSolution) -> Tuple[np.ndarray, np.ndarray]:
    """Nodes whose LP duration lies strictly inside a hull segment, and that segment's start.

    Returns:
        ``(nodes, lower_s)``: the nodes and, per node, the faster end of its segment (s).
    """
    fill = solution.fill
    inside = np.flatnonzero((fill > 1e-6) & (fill < 1 - 1e-6))
    nodes, first = np.unique(model.seg_node[inside], return_index=True)
    cols = inside[first]
    # Duration at the segment's start: t0 plus the full segments before it.
    before = np.cumsum(model.seg_len) - model.seg_len
    lower = model.t0[nodes] + before[cols] - before[model.seg_start[nodes]]
    return nodes, lower
