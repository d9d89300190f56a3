"""Mixed-integer program over discrete frequency choices (HiGHS branch and bound).

Variables: a start time ``x_v >= 0`` per instruction, the iteration time ``tau <= T``, and

* per *discrete* instruction, a binary ``z_vk`` per allowed option ``k`` (``sum_k z_vk = 1``);
  an instruction with a single allowed option is a constant;
* per *hull* instruction (optional), continuous segment variables of the lower convex hull of
  its allowed options as in the LP (:mod:`.model`): a relaxation of that instruction's choice.

Rows: ``x_v - x_u - dur_u >= 0`` per dependency and ``x_s + dur_s <= tau`` per sink.

Objective: effective energy ``sum (e_vk - P_block t_vk) z_vk`` (plus the hulls' effective
energy) plus ``sum(P_block) * tau`` -- the plan's energy (blocking included), since at the
optimum ``tau`` is the plan's iteration time. With every instruction discrete, the optimum is
the least-energy plan with iteration time <= T; with some on hulls it is a lower bound on it,
and so is HiGHS' dual bound whenever the search stops early.

Time windows (:mod:`.windows`) tighten it without losing any plan: options too long for an
instruction's window are dropped and start times are bounded.

Exact for tiny problems (the ``exact`` solver); restricted to a few options per instruction
it fills frontier gaps (:mod:`.gaps`); relaxed, or stopped early, it proves bounds
(:mod:`.bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.model import ranges
from perseus.planner.solvers.lp.windows import option_hulls, time_windows, windowed

if TYPE_CHECKING:
    from highspy import Highs


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


def solve_milp_result(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Optional[Sequence[np.ndarray]] = None,
    hull_nodes: Optional[np.ndarray] = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    start: Optional[np.ndarray] = None,
    max_nodes: Optional[int] = None,
    log: bool = False,
    relax: bool = False,
    tau_lower_s: float = 0.0,
) -> MILPResult:
    """Least-energy plan with iteration time <= ``deadline_s`` (see the module docstring).

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        allowed: Per node, the option indices it may use (default: its group's candidates).
        hull_nodes: Nodes relaxed to the hull of their allowed options; the result is then a
            lower bound, not a plan.
        time_limit_s: HiGHS time limit; the best solution found so far is returned.
        mip_rel_gap: Relative optimality gap at which HiGHS stops.
        start: A plan (option index per node) meeting the deadline, handed to HiGHS as the
            first incumbent; it must use allowed options only (ignored with hull nodes).
        max_nodes: Stop after this many branch-and-bound nodes (a limit on work that, unlike
            the time limit, gives the same plan on a busy machine).
        log: Let HiGHS print its log.
        relax: Solve the LP relaxation (every binary continuous in [0, 1]): a lower bound,
            with each instruction on the convex hull of its options that fit its window.
        tau_lower_s: Lower bound of ``tau``: a plan faster than this is charged blocking
            energy as if it took ``tau_lower_s``, so the optimum bounds the energy of every
            plan with iteration time in ``[tau_lower_s, deadline_s]`` (used to prove a
            frontier gap empty).
    """
    import highspy

    model = _Model(problem, deadline_s, windowed(problem, deadline_s, allowed), hull_nodes)
    model.lp.col_lower_[problem.num_nodes] = float(tau_lower_s)
    h: Highs = highspy.Highs()
    h.setOptionValue("output_flag", bool(log))
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
        # Node-limited searches (gap filling, emptiness proofs): no root restart, whose
        # presolve can run far past time_limit.
        h.setOptionValue("mip_allow_restart", False)
    if relax:
        model.lp.integrality_ = [highspy.HighsVarType.kContinuous] * model.num_cols
    h.passModel(model.lp)
    if start is not None and not relax and not len(model.hull_nodes):
        solution = highspy.HighsSolution()
        solution.col_value = model.start_vector(start).tolist()
        solution.value_valid = True
        h.setSolution(solution)
    h.run()
    info = h.getInfo()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return MILPResult(None, None, None, float("inf"), float("inf"), True)
    # Without binaries HiGHS solves an LP and keeps no MIP dual bound.
    as_lp = relax or model.num_binaries == 0
    dual = info.objective_function_value if as_lp else info.mip_dual_bound
    bound_j = float(dual) + model.constant_j
    result = h.getSolution()
    if not result.value_valid:
        return MILPResult(None, None, None, float("inf"), bound_j, optimal)
    return model.result(np.asarray(result.col_value), bound_j, optimal)


def solve_milp(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Optional[Sequence[np.ndarray]] = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    start: Optional[np.ndarray] = None,
    max_nodes: Optional[int] = None,
) -> Optional[np.ndarray]:
    """The least-energy plan's option indices, or None when none was found (see above)."""
    return solve_milp_result(
        problem,
        deadline_s,
        allowed,
        time_limit_s=time_limit_s,
        mip_rel_gap=mip_rel_gap,
        start=start,
        max_nodes=max_nodes,
    ).choices


class _Model:
    """The HiGHS model of :func:`solve_milp_result` and its column layout."""

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
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
        lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
        lp.a_matrix_.value_ = matrix.data
        self.lp = lp
        self.num_cols = num_cols
        self.num_binaries = num_z

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
