"""The convex-hull linear program: least effective energy with iteration time <= T.

Variables (see :mod:`.layout`): a start-time variable per explicit instruction or periodic
class, the period ``P`` of a periodic layout, and, per hull segment ``k`` of each class's
hull, ``0 <= delta_ck <= length_k``. A class's duration is ``t0_c + sum_k delta_ck`` and its
effective energy ``c0_c + sum_k slope_k delta_ck`` per instruction; slopes increase along the
hull, so the cheapest way to fill a duration uses segments in order and no epigraph rows are
needed.

Rows: one per distinct dependency ``u -> v`` (``start(v) - start(u) - sum_k delta_uk >= t0_u``)
and one per sink (``start(v) + sum_k delta_vk <= T - t0_v``). A deadline change only moves the
sink rows' bounds, so HiGHS re-solves from the previous basis (dual simplex) in a fraction of
a cold solve.

Total energy of the LP solution: ``sum(effective) + T * sum(P_block)``; with the identity
layout its optimum is a lower bound on the energy of any real plan with iteration time <= T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from perseus.errors import SolverError
from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.hull import GroupHull
from perseus.planner.solvers.lp.layout import Layout, identity_layout

if TYPE_CHECKING:
    from highspy import Highs, HighsLp
    from scipy.sparse import csc_matrix


@dataclass
class LPSolution:
    """One LP optimum.

    Attributes:
        deadline_s: The iteration-time budget it was solved for.
        durations_s: Duration of every node (its class's duration).
        finish_s: Finish time of every node in the LP's schedule.
        energy_j: Total energy of the LP optimum.
        fill: Per segment column, how much of the segment is used (0..1).
        class_durations_s: Duration of every class.
    """

    deadline_s: float
    durations_s: np.ndarray
    finish_s: np.ndarray
    energy_j: float
    fill: np.ndarray
    class_durations_s: np.ndarray


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, counts)])``, vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(counts) - counts), counts)
    return shift + np.arange(total, dtype=np.int64)


def set_matrix(lp: HighsLp, matrix: csc_matrix) -> None:
    """Make the column-wise sparse ``matrix`` the constraint matrix of ``lp``."""
    import highspy

    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data


def set_light_search(h: Highs) -> None:
    """A lighter branch and bound for a MILP started from a good plan.

    No root heuristics, no sub-MIP heuristics (RINS, RENS) and no strong branching: a polish
    window takes about a third of the time for a little less saving.
    """
    h.setOptionValue("mip_heuristic_effort", 0.0)
    h.setOptionValue("mip_heuristic_run_rins", False)
    h.setOptionValue("mip_heuristic_run_rens", False)
    h.setOptionValue("mip_pscost_minreliable", 0)


class HullLP:
    """The LP of one problem and layout, re-solvable for many deadlines.

    Attributes:
        layout: Which nodes share a duration (:mod:`.layout`).
        t0: Per class, the fastest hull time (s).
        c0: Per class, the effective energy at ``t0`` (J).
        seg_start: Per class, its first segment column (``seg_start[-1]`` = segments).
        seg_class: Per segment column, its class.
        seg_rank: Per segment column, its position in the class's hull.
        seg_len: Per segment column, its length (s).
        seg_upper: Per segment column, its default upper bound (0 for locked tails).
    """

    def __init__(
        self,
        problem: PlanningProblem,
        hulls: List[GroupHull],
        class_hull: Optional[np.ndarray] = None,
        layout: Optional[Layout] = None,
    ) -> None:
        """Build the sparse model and hand it to HiGHS (one thread, quiet).

        Args:
            problem: The planning problem.
            hulls: Hulls to draw from; by default ``hulls[g]`` is group ``g``'s hull.
            class_hull: Per class, the index in ``hulls`` of its hull (default: its group).
            layout: Which nodes share durations (default: none, the exact LP).
        """
        import highspy

        self._highspy = highspy
        self.problem = problem
        self.layout = layout if layout is not None else identity_layout(problem)
        lay = self.layout
        num_classes = lay.num_classes
        hull_of = lay.class_group if class_hull is None else np.asarray(class_hull)
        self.class_hull = hull_of
        num_seg = np.array([len(h.lengths_s) for h in hulls])[hull_of]
        self.t0 = np.array([h.time_s[0] for h in hulls])[hull_of]
        self.c0 = np.array([h.cost_j[0] for h in hulls])[hull_of]
        seg_start = np.zeros(num_classes + 1, dtype=np.int64)
        seg_start[1:] = np.cumsum(num_seg)
        num_segs = int(seg_start[-1])
        seg_class = np.repeat(np.arange(num_classes), num_seg)
        seg_rank = np.arange(num_segs) - seg_start[seg_class]
        seg_len = np.empty(num_segs)
        seg_slope = np.empty(num_segs)
        seg_upper = np.empty(num_segs)
        seg_hull = hull_of[seg_class]
        for h_index in np.unique(seg_hull).tolist():
            hull = hulls[h_index]
            mask = seg_hull == h_index
            seg_len[mask] = hull.lengths_s[seg_rank[mask]]
            seg_slope[mask] = hull.slopes[seg_rank[mask]]
            # Locked trailing segments (see GroupHull.locked_tail) start closed.
            open_segments = len(hull.lengths_s) - hull.locked_tail
            seg_upper[mask] = np.where(seg_rank[mask] < open_segments, seg_len[mask], 0.0)
        self.seg_start, self.seg_class, self.seg_len = seg_start, seg_class, seg_len
        self.seg_rank, self.seg_upper = seg_rank, seg_upper
        # Columns: time variables, then P (periodic layouts), then segments.
        self.num_time_cols = lay.num_time_vars + (1 if lay.periodic else 0)
        self._fixed_cols = np.zeros(0, dtype=np.int64)
        self._build(num_seg, seg_slope)
        self.constant_j = float((lay.class_count * self.c0).sum())
        self.total_power_w = float(sum(problem.p2p_power_w))
        self.deadline_s = float("inf")
        self._dive: Optional[Highs] = None

    # -- building ---------------------------------------------------------------------------
    def _build(self, num_seg: np.ndarray, seg_slope: np.ndarray) -> None:
        from scipy.sparse import coo_matrix

        lay = self.layout
        dag = self.problem.dag
        edge_u, edge_v = dag.edges()
        cls_u = lay.node_class[edge_u]
        # A row is fixed by (time var of v, time var of u, period multiple, class of u).
        keys = np.stack(
            [
                lay.time_var[edge_v],
                lay.time_var[edge_u],
                lay.period_mult[edge_v] - lay.period_mult[edge_u],
                cls_u,
            ],
            axis=1,
        )
        keys = np.unique(keys, axis=0)
        sinks = dag.sinks
        sink_keys = np.unique(
            np.stack([lay.time_var[sinks], lay.period_mult[sinks], lay.node_class[sinks]], 1),
            axis=0,
        )
        num_e, num_s = len(keys), len(sink_keys)
        rows_e = np.arange(num_e)
        rows_s = num_e + np.arange(num_s)
        p_col = lay.num_time_vars
        seg0 = self.num_time_cols
        e_cls, s_cls = keys[:, 3], sink_keys[:, 2]
        e_seg = ranges(self.seg_start[e_cls], num_seg[e_cls])
        s_seg = ranges(self.seg_start[s_cls], num_seg[s_cls])
        parts = [
            (rows_e, keys[:, 0], np.ones(num_e)),
            (rows_e, keys[:, 1], -np.ones(num_e)),
            (np.repeat(rows_e, num_seg[e_cls]), seg0 + e_seg, -np.ones(len(e_seg))),
            (rows_s, sink_keys[:, 0], np.ones(num_s)),
            (np.repeat(rows_s, num_seg[s_cls]), seg0 + s_seg, np.ones(len(s_seg))),
        ]
        if lay.periodic:
            parts.append((rows_e, np.full(num_e, p_col), keys[:, 2].astype(float)))
            parts.append((rows_s, np.full(num_s, p_col), sink_keys[:, 1].astype(float)))
        rows = np.concatenate([p[0] for p in parts])
        cols = np.concatenate([p[1] for p in parts])
        vals = np.concatenate([p[2] for p in parts])
        num_rows = num_e + num_s
        num_cols = seg0 + len(self.seg_len)
        # Summing duplicates cancels +1/-1 on rows whose u and v share a time variable.
        matrix = coo_matrix((vals, (rows, cols)), shape=(num_rows, num_cols)).tocsc()
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        self._sink_rows = rows_s.astype(np.int32)
        self._sink_t0 = self.t0[s_cls]
        inf = self._highspy.kHighsInf
        lp = self._highspy.HighsLp()
        lp.num_col_, lp.num_row_ = num_cols, num_rows
        cost = np.concatenate([np.zeros(seg0), seg_slope * self.layout.class_count[self.seg_class]])
        lp.col_cost_ = cost
        lp.col_lower_ = np.zeros(num_cols)
        lp.col_upper_ = np.concatenate([np.full(seg0, inf), self.seg_upper])
        lp.row_lower_ = np.concatenate([self.t0[e_cls], np.full(num_s, -inf)])
        lp.row_upper_ = np.full(num_rows, inf)
        set_matrix(lp, matrix)
        self._lp = lp
        self.num_rows = num_rows
        self._highs = self._new_instance()

    def _new_instance(self) -> Highs:
        h = self._highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        # Re-solves start from the previous basis; presolve would only get in the way.
        h.setOptionValue("presolve", "off")
        h.passModel(self._lp)
        return h

    # -- solving ----------------------------------------------------------------------------
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

    def solve_cold(self, deadline_s: float) -> Optional[LPSolution]:
        """Solve for ``deadline_s`` on a fresh HiGHS model (this one's basis is left alone).

        Returns:
            The optimum, or None if there is none.
        """
        h = self._new_instance()
        self._set_deadline(h, deadline_s)
        return self._run(h, deadline_s)

    def try_solve(self) -> Optional[LPSolution]:
        """Re-solve the main model at the current deadline (after :meth:`pin`).

        Returns:
            The optimum, or None if there is none (e.g. pins make the deadline infeasible).
        """
        return self._run(self._highs)

    def start_dive(self) -> None:
        """Copy the last :meth:`solve` (deadline and basis) into the dive model.

        Pinning classes (:meth:`fix`) happens on a second HiGHS model so the sweep's basis
        stays optimal for the next deadline.
        """
        if self._dive is None:
            self._dive = self._new_instance()
        self._release(self._dive)
        self._set_deadline(self._dive, self.deadline_s)
        self._dive.setBasis(self._highs.getBasis())

    def resolve(self) -> Optional[LPSolution]:
        """Re-solve the dive model with its pinned classes; None if infeasible."""
        if self._dive is None:
            raise SolverError("HullLP.resolve() before start_dive()")
        return self._run(self._dive)

    def _set_deadline(self, h: Highs, deadline_s: float) -> None:
        lower = -self._highspy.kHighsInf
        for row, t0 in zip(self._sink_rows.tolist(), self._sink_t0.tolist()):
            h.changeRowBounds(row, lower, deadline_s - t0)

    def _run(self, h: Highs, deadline_s: Optional[float] = None) -> Optional[LPSolution]:
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        h.run()
        if h.getModelStatus() != self._highspy.HighsModelStatus.kOptimal:
            return None
        values = np.asarray(h.getSolution().col_value)
        lay = self.layout
        deltas = values[self.num_time_cols :]
        sums = np.add.reduceat(np.concatenate([deltas, [0.0]]), self.seg_start[:-1])
        class_d = self.t0 + sums * (self.seg_start[1:] > self.seg_start[:-1])
        period = values[lay.num_time_vars] if lay.periodic else 0.0
        start = values[lay.time_var] + lay.period_mult * period
        durations = class_d[lay.node_class]
        objective = float(h.getInfo().objective_function_value)
        return LPSolution(
            deadline_s=deadline_s,
            durations_s=durations,
            finish_s=start + durations,
            energy_j=objective + self.constant_j + deadline_s * self.total_power_w,
            fill=deltas / np.where(self.seg_len > 0, self.seg_len, 1.0),
            class_durations_s=class_d,
        )

    # -- pinning ----------------------------------------------------------------------------
    def fix(self, classes: np.ndarray, durations_s: np.ndarray) -> None:
        """Pin classes' durations (within their hulls' range) in the dive model."""
        if self._dive is None:
            raise SolverError("HullLP.fix() before start_dive()")
        cols, value = self._pinned_values(classes, durations_s)
        if not len(cols):
            return
        self._set_segment_bounds(self._dive, cols, value, value)
        self._fixed_cols = np.union1d(self._fixed_cols, cols)

    def pin(self, classes: np.ndarray, durations_s: np.ndarray) -> None:
        """Pin classes' durations in the main model (locked segments may open); see unpin."""
        cols, value = self._pinned_values(classes, durations_s)
        if len(cols):
            self._set_segment_bounds(self._highs, cols, value, value)

    def unpin(self, classes: np.ndarray) -> None:
        """Give pinned classes of the main model their default segment bounds back."""
        cols = self._class_cols(classes)
        if len(cols):
            self._set_segment_bounds(self._highs, cols, np.zeros(len(cols)), self.seg_upper[cols])

    def _class_cols(self, classes: np.ndarray) -> np.ndarray:
        classes = np.asarray(classes, dtype=np.int64)
        return ranges(
            self.seg_start[classes], self.seg_start[classes + 1] - self.seg_start[classes]
        )

    def _pinned_values(
        self, classes: np.ndarray, durations_s: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Segment columns of ``classes`` and their values for the given durations."""
        classes = np.asarray(classes, dtype=np.int64)
        counts = self.seg_start[classes + 1] - self.seg_start[classes]
        cols = self._class_cols(classes)
        if not len(cols):
            return cols, np.zeros(0)
        # Fill segments in order: segment k gets min(L_k, remaining after segments < k).
        extra = np.repeat(np.asarray(durations_s) - self.t0[classes], counts)
        before = np.cumsum(self.seg_len[cols]) - self.seg_len[cols]
        offsets = np.repeat(np.cumsum(counts) - counts, counts)
        before -= before[offsets]
        return cols, np.clip(extra - before, 0.0, self.seg_len[cols])

    def _release(self, h: Highs) -> None:
        cols = self._fixed_cols
        if len(cols):
            self._set_segment_bounds(h, cols, np.zeros(len(cols)), self.seg_upper[cols])
        self._fixed_cols = np.zeros(0, dtype=np.int64)

    def _set_segment_bounds(
        self, h: Highs, cols: np.ndarray, lower: np.ndarray, upper: np.ndarray
    ) -> None:
        index = (self.num_time_cols + cols).astype(np.int32)
        h.changeColsBounds(len(cols), index, lower, upper)


def fractional_classes(model: HullLP, solution: LPSolution) -> Tuple[np.ndarray, np.ndarray]:
    """Classes whose LP duration lies strictly inside a hull segment, and that segment's start.

    Returns:
        ``(classes, lower_s)``: the classes and, per class, the faster end of its segment (s).
    """
    fill = solution.fill
    inside = np.flatnonzero((fill > 1e-6) & (fill < 1 - 1e-6))
    classes, first = np.unique(model.seg_class[inside], return_index=True)
    cols = inside[first]
    # Duration at the segment's start: t0 plus the full segments before it.
    before = np.cumsum(model.seg_len) - model.seg_len
    lower = model.t0[classes] + before[cols] - before[model.seg_start[classes]]
    return classes, lower
