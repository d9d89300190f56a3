"""The MILP's HiGHS model (see :mod:`.milp` for the formulation) and its solutions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np

from perseus.errors import SolverError
from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.milp.cuts import PathCut
from perseus.planner.solvers.lp.milp.windows import option_hulls, time_windows
from perseus.planner.solvers.lp.model import ranges, set_matrix

if TYPE_CHECKING:
    from scipy.sparse import csc_matrix


@dataclass
class MILPResult:
    """Outcome of one MILP.

    Attributes:
        choices: Option index per node (-1 for hull nodes); None when no solution was found.
        durations_s: Duration of every node in the solution (None without solution).
        finish_s: Finish time of every node in the solution's schedule (None without one).
        energy_j: Objective of the solution (its energy when every node is discrete).
        bound_j: HiGHS' dual bound: no plan meeting the deadline uses less energy.
        optimal: The search closed the gap (to ``mip_rel_gap``).
    """

    choices: Optional[np.ndarray]
    durations_s: Optional[np.ndarray]
    finish_s: Optional[np.ndarray]
    energy_j: float
    bound_j: float
    optimal: bool


class MILPModel:
    """The HiGHS model of :func:`.milp.solve_milp_result` and its column layout."""

    def __init__(
        self,
        problem: PlanningProblem,
        deadline_s: float,
        allowed: Optional[Sequence[np.ndarray]],
        hull_nodes: Optional[np.ndarray],
    ) -> None:
        import highspy
        from scipy.sparse import coo_matrix

        self.problem = problem
        dag = problem.dag
        num_nodes = dag.num_nodes
        groups = problem.node_group
        if allowed is None:
            allowed = [problem.candidates[g] for g in groups.tolist()]
        self.hull_nodes = np.zeros(0, dtype=np.int64) if hull_nodes is None else hull_nodes
        is_hull = np.zeros(num_nodes, dtype=bool)
        is_hull[self.hull_nodes] = True
        counts = np.array([len(a) for a in allowed])
        counts[is_hull] = 0
        # Nodes with one option are constants; the others get binaries.
        single = (counts == 1) & ~is_hull
        counts[single] = 0
        opt_single = np.array([int(a[0]) for a in allowed])
        self.const_option = np.where(single, opt_single, -1)
        self.is_hull = is_hull
        # Hull nodes: segment columns of the hull of their allowed options.
        node_hulls = option_hulls(problem, self.hull_nodes, allowed)
        nseg = np.zeros(num_nodes, dtype=np.int64)
        t0 = np.zeros(num_nodes)
        c0 = np.zeros(num_nodes)
        for v, hull in node_hulls.items():
            nseg[v], t0[v], c0[v] = len(hull.lengths_s), hull.time_s[0], hull.cost_j[0]
        # Columns: x (num_nodes), tau, z (per discrete node), segments (per hull node).
        tau = num_nodes
        z_first = num_nodes + 1
        z_start = z_first + np.concatenate([[0], np.cumsum(counts)])
        num_z = int(counts.sum())
        s_start = z_first + num_z + np.concatenate([[0], np.cumsum(nseg)])
        num_s = int(nseg.sum())
        self.z_start, self.s_start, self.counts, self.nseg = z_start, s_start, counts, nseg
        multi = np.flatnonzero(counts > 0)
        self.opt = (
            np.concatenate([np.asarray(allowed[v]) for v in multi.tolist()])
            if len(multi)
            else np.zeros(0, dtype=np.int64)
        )
        z_node = np.repeat(np.arange(num_nodes), counts)
        z_time = problem.opt_time[groups[z_node], self.opt]
        z_cost = problem.opt_effective[groups[z_node], self.opt]
        seg_node = np.repeat(np.arange(num_nodes), nseg)
        seg_len = np.zeros(num_s)
        seg_slope = np.zeros(num_s)
        rank = np.arange(num_s) - (s_start[seg_node] - s_start[0])
        for k, v in enumerate(seg_node.tolist()):
            hull = node_hulls[v]
            seg_len[k], seg_slope[k] = hull.lengths_s[rank[k]], hull.slopes[rank[k]]
        self.seg_len = seg_len
        # Constant part of each node's duration (fixed option, or hull start).
        const_t = np.where(single, problem.opt_time[groups, np.maximum(opt_single, 0)], 0.0)
        const_t = np.where(is_hull, t0, const_t)
        const_c = np.where(single, problem.opt_effective[groups, np.maximum(opt_single, 0)], 0.0)
        const_c = np.where(is_hull, c0, const_c)
        self.const_t = const_t
        self.constant_j = float(const_c.sum())

        edge_u, edge_v = dag.edges()
        sinks = dag.sinks
        num_e, num_k = len(edge_u), len(sinks)
        r_edge = np.arange(num_e)
        r_sink = num_e + np.arange(num_k)
        r_one = num_e + num_k + np.arange(len(multi))
        one_of = np.full(num_nodes, -1)
        one_of[multi] = r_one

        def duration_terms(nodes: np.ndarray, rows: np.ndarray, sign: float) -> List[np.ndarray]:
            zc = ranges(z_start[nodes], counts[nodes])
            sc = ranges(s_start[nodes], nseg[nodes])
            return [
                np.concatenate([np.repeat(rows, counts[nodes]), np.repeat(rows, nseg[nodes])]),
                np.concatenate([zc, sc]),
                sign * np.concatenate([z_time[zc - z_first], np.ones(len(sc))]),
            ]

        e_terms = duration_terms(edge_u, r_edge, -1.0)
        s_terms = duration_terms(sinks, r_sink, 1.0)
        rows = np.concatenate(
            [r_edge, r_edge, e_terms[0], r_sink, r_sink, s_terms[0], one_of[z_node]]
        )
        cols = np.concatenate(
            [
                edge_v,
                edge_u,
                e_terms[1],
                sinks,
                np.full(num_k, tau),
                s_terms[1],
                z_first + np.arange(num_z),
            ]
        )
        vals = np.concatenate(
            [
                np.ones(num_e),
                -np.ones(num_e),
                e_terms[2],
                np.ones(num_k),
                -np.ones(num_k),
                s_terms[2],
                np.ones(num_z),
            ]
        )
        num_rows = num_e + num_k + len(multi)
        num_cols = z_first + num_z + num_s
        matrix = coo_matrix((vals, (rows, cols)), shape=(num_rows, num_cols)).tocsc()
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = num_cols, num_rows
        power = float(sum(problem.p2p_power_w))
        self.cost = np.concatenate([np.zeros(num_nodes), [power], z_cost, seg_slope])
        lp.col_cost_ = self.cost
        # Start times within their windows (see the module docstring).
        earliest, latest = time_windows(problem, deadline_s)
        fastest = np.array([problem.opt_time[g, c[0]] for g, c in enumerate(problem.candidates)])
        latest_start = np.maximum(earliest, latest - fastest[groups]) * (1 + 1e-9) + 1e-12
        lp.col_lower_ = np.concatenate(
            [np.maximum(earliest * (1 - 1e-9) - 1e-12, 0.0), np.zeros(1 + num_z + num_s)]
        )
        lp.col_upper_ = np.concatenate([latest_start, [float(deadline_s)], np.ones(num_z), seg_len])
        lp.row_lower_ = np.concatenate([const_t[edge_u], np.full(num_k, -inf), np.ones(len(multi))])
        lp.row_upper_ = np.concatenate([np.full(num_e, inf), -const_t[sinks], np.ones(len(multi))])
        lp.integrality_ = (
            [highspy.HighsVarType.kContinuous] * (num_nodes + 1)
            + [highspy.HighsVarType.kInteger] * num_z
            + [highspy.HighsVarType.kContinuous] * num_s
        )
        self.lp = lp
        self._set_matrix(matrix)
        self.num_cols = num_cols
        self.num_binaries = num_z

    def add_cuts(self, cuts: Sequence[PathCut]) -> None:
        """Append path-cut rows (every node of each cut must be discrete)."""
        import highspy
        from scipy.sparse import coo_matrix, vstack

        if not cuts:
            return
        problem = self.problem
        groups = problem.node_group
        z_first = int(self.z_start[0])
        rows, cols, vals, lower = [], [], [], []
        for r, cut in enumerate(cuts):
            constant = 0.0
            for v in cut.nodes:
                if self.is_hull[v]:
                    raise SolverError(
                        f"path cut through instruction {v}, which is on its hull: build cuts "
                        "over discrete instructions only (path_cuts(..., nodes=discrete))"
                    )
                if self.counts[v] == 0:
                    constant += float(problem.opt_effective[groups[v], self.const_option[v]])
                    continue
                span = np.arange(self.z_start[v], self.z_start[v] + self.counts[v])
                rows.append(np.full(len(span), r))
                cols.append(span)
                vals.append(problem.opt_effective[groups[v], self.opt[span - z_first]])
            lower.append(cut.bound_j - constant)
        if not rows:
            return
        extra = coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(len(cuts), self.num_cols),
        )
        lp = self.lp
        matrix = vstack([self._matrix, extra]).tocsc()
        lp.num_row_ = matrix.shape[0]
        lp.row_lower_ = np.concatenate([np.asarray(lp.row_lower_), lower])
        lp.row_upper_ = np.concatenate(
            [np.asarray(lp.row_upper_), np.full(len(cuts), highspy.kHighsInf)]
        )
        self._set_matrix(matrix)

    def durations(self, values: np.ndarray) -> np.ndarray:
        """Every node's duration in a solution vector."""
        problem = self.problem
        num_nodes = problem.num_nodes
        z = values[self.z_start[0] : self.z_start[-1]]
        z_node = np.repeat(np.arange(num_nodes), self.counts)
        z_time = problem.opt_time[problem.node_group[z_node], self.opt]
        out = self.const_t + np.bincount(z_node, weights=z * z_time, minlength=num_nodes)
        seg = values[self.s_start[0] : self.s_start[-1]]
        seg_node = np.repeat(np.arange(num_nodes), self.nseg)
        return out + np.bincount(seg_node, weights=seg, minlength=num_nodes)

    def result(self, values: np.ndarray, bound_j: float, optimal: bool) -> MILPResult:
        """The solution vector as a :class:`MILPResult`."""
        num_nodes = self.problem.num_nodes
        choices = self.const_option.copy()
        z = values[self.z_start[0] : self.z_start[-1]]
        for v in np.flatnonzero(self.counts > 0).tolist():
            lo = self.z_start[v] - self.z_start[0]
            local = z[lo : lo + self.counts[v]]
            choices[v] = self.opt[lo + int(np.argmax(local))]
        choices[self.is_hull] = -1
        durations = self.durations(values)
        energy = float(self.cost @ values) + self.constant_j
        return MILPResult(
            choices=choices,
            durations_s=durations,
            finish_s=values[:num_nodes] + durations,
            energy_j=energy,
            bound_j=bound_j,
            optimal=optimal,
        )

    def _set_matrix(self, matrix: csc_matrix) -> None:
        """Make ``matrix`` the model's constraint matrix."""
        self._matrix = matrix
        set_matrix(self.lp, matrix)

    def start_vector(self, start: np.ndarray) -> np.ndarray:
        """A full MILP point (start times, tau and binaries) for a given plan."""
        from perseus.planner.simulate import earliest_finish

        problem = self.problem
        times = problem.opt_time[problem.node_group, start]
        finish = earliest_finish(problem, times[None, :])[0]
        values = np.zeros(self.num_cols)
        values[: problem.num_nodes] = finish - times
        values[problem.num_nodes] = float(finish[problem.dag.sinks].max())
        for v in np.flatnonzero(self.counts > 0).tolist():
            lo = self.z_start[v]
            first = lo - self.z_start[0]
            local = np.flatnonzero(self.opt[first : first + self.counts[v]] == start[v])
            if len(local):
                values[lo + local[0]] = 1.0
        return values
