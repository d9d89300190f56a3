"""Mixed-integer program over discrete frequency choices (HiGHS branch and bound).

Variables: a start time ``x_v >= 0`` per instruction and a binary ``z_vk`` per allowed option
``k`` of instruction ``v`` (``sum_k z_vk = 1``). Rows: ``x_v - x_u - sum_k t_uk z_uk >= 0`` per
dependency and ``x_s + sum_k t_sk z_sk <= T`` per sink. Objective: effective energy
``sum (e_vk - P_block t_vk) z_vk``. A plan's energy is that plus ``T_plan * sum(P_block)``, so
the optimum is the least-energy plan among those whose iteration time is exactly ``T``, and
no plan with time ``<= T`` has less effective energy.

Exact for tiny problems (the ``exact`` solver); with each instruction restricted to a few
options around an LP solution it is also a polishing step for large ones.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from perseus.planner.problem import PlanningProblem


def solve_milp(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Optional[List[np.ndarray]] = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    start: Optional[np.ndarray] = None,
    max_nodes: Optional[int] = None,
) -> Optional[np.ndarray]:
    """Least effective energy plan with iteration time <= ``deadline_s``.

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        allowed: Per node, the option indices it may use (default: its group's candidates).
        time_limit_s: HiGHS time limit; the best plan found so far is returned.
        mip_rel_gap: Relative optimality gap at which HiGHS stops.
        start: A plan (option index per node) meeting the deadline, handed to HiGHS as the
            first incumbent; it must use allowed options only.
        max_nodes: Stop after this many branch-and-bound nodes (a limit on work that, unlike
            the time limit, gives the same plan on a busy machine).

    Returns:
        Option index per node, or None when no plan meets the deadline (or none was found in
        time).
    """
    import highspy
    from scipy.sparse import coo_matrix

    dag = problem.dag
    num_nodes = dag.num_nodes
    groups = problem.node_group
    if allowed is None:
        allowed = [problem.candidates[g] for g in groups.tolist()]
    counts = np.array([len(a) for a in allowed])
    z_start = num_nodes + np.concatenate([[0], np.cumsum(counts)])
    opt = np.concatenate(allowed)
    z_node = np.repeat(np.arange(num_nodes), counts)
    z_time = problem.opt_time[groups[z_node], opt]
    z_cost = problem.opt_effective[groups[z_node], opt]
    num_z = len(opt)
    num_cols = num_nodes + num_z

    edge_u, edge_v = dag.edges()
    sinks = dag.sinks
    num_e, num_s = len(edge_u), len(sinks)
    r_edge = np.arange(num_e)
    r_sink = num_e + np.arange(num_s)
    r_one = num_e + num_s + np.arange(num_nodes)
    z_of = [np.arange(z_start[v], z_start[v + 1]) for v in range(num_nodes)]
    e_z = np.concatenate([z_of[u] for u in edge_u.tolist()] or [np.zeros(0, int)])
    s_z = np.concatenate([z_of[s] for s in sinks.tolist()] or [np.zeros(0, int)])
    rows = np.concatenate(
        [
            r_edge,
            r_edge,
            np.repeat(r_edge, counts[edge_u]),
            r_sink,
            np.repeat(r_sink, counts[sinks]),
            r_one[z_node],
        ]
    )
    cols = np.concatenate([edge_v, edge_u, e_z, sinks, s_z, num_nodes + np.arange(num_z)])
    vals = np.concatenate(
        [
            np.ones(num_e),
            -np.ones(num_e),
            -z_time[e_z - num_nodes],
            np.ones(num_s),
            z_time[s_z - num_nodes],
            np.ones(num_z),
        ]
    )
    num_rows = num_e + num_s + num_nodes
    matrix = coo_matrix((vals, (rows, cols)), shape=(num_rows, num_cols)).tocsc()
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = num_cols, num_rows
    lp.col_cost_ = np.concatenate([np.zeros(num_nodes), z_cost])
    lp.col_lower_ = np.zeros(num_cols)
    lp.col_upper_ = np.concatenate([np.full(num_nodes, inf), np.ones(num_z)])
    lp.row_lower_ = np.concatenate([np.zeros(num_e), np.full(num_s, -inf), np.ones(num_nodes)])
    lp.row_upper_ = np.concatenate(
        [np.full(num_e, inf), np.full(num_s, deadline_s), np.ones(num_nodes)]
    )
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * num_nodes + [
        highspy.HighsVarType.kInteger
    ] * num_z
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data
    h: Any = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    h.passModel(lp)
    if start is not None:
        h.setSolution(_start_vector(problem, start, opt, z_start, num_nodes))
    h.run()
    solution = h.getSolution()
    if not solution.value_valid:
        return None
    z = np.asarray(solution.col_value)[num_nodes:]
    picked = np.zeros(num_nodes, dtype=np.int64)
    for v in range(num_nodes):
        picked[v] = opt[z_start[v] - num_nodes + int(np.argmax(z[z_of[v] - num_nodes]))]
    return picked


def _start_vector(
    problem: PlanningProblem,
    start: np.ndarray,
    opt: np.ndarray,
    z_start: np.ndarray,
    num_nodes: int,
) -> Any:
    """A full MILP point (start times and binaries) for a given plan."""
    import highspy

    from perseus.planner.simulate import earliest_finish

    times = problem.opt_time[problem.node_group, start]
    begin = earliest_finish(problem, times[None, :])[0] - times
    z = np.zeros(len(opt))
    for v in range(num_nodes):
        local = np.flatnonzero(opt[z_start[v] - num_nodes : z_start[v + 1] - num_nodes] == start[v])
        if len(local):
            z[z_start[v] - num_nodes + local[0]] = 1.0
    solution = highspy.HighsSolution()
    solution.col_value = np.concatenate([begin, z]).tolist()
    solution.value_valid = True
    return solution
