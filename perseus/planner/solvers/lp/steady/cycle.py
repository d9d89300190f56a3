"""The cyclic problem of the 1F1B steady state: ``k`` pairs per stage that repeat forever.

Node ``(2 * s + kind) * k + j`` is stage ``s``'s forward (kind 0) or backward (kind 1) of
pair ``j`` (:func:`.layout.steady_pair`). The steady state's dependencies, with pair indices
taken modulo ``k``:

* on a stage, ``B(j)`` after ``F(j)`` and ``F(j)`` after ``B(j - 1)``;
* ``F(j)`` on stage ``s`` after ``F(j - 1)`` on stage ``s - 1`` (the same microbatch: stage
  ``s - 1`` has one warm-up forward more);
* ``B(j)`` on stage ``s`` after ``B(j)`` on stage ``s + 1``.

A dependency whose predecessor's pair index wrapped below 0 belongs to the previous
repetition, which started ``k`` periods earlier. A solution keeping period ``P`` thus runs
any number of pairs at ``P`` per pair without falling behind. The objective is the effective
energy of the ``k`` pairs (blocking power included, see :mod:`perseus.planner.problem`), so
*saved per pair* is the energy a long plan saves per microbatch against all-max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from perseus.errors import SolverError
from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.model import set_matrix

if TYPE_CHECKING:
    from scipy.sparse import csc_matrix

#: Safety nets of the small cyclic programs (their optimum takes well under a second).
MAX_NODES = 20_000
TIME_LIMIT_S = 60.0


@dataclass
class CyclePattern:
    """A clock pattern of the steady state repeating every ``num_pairs`` pairs.

    Attributes:
        choices: Option index per group (``2 * stage + kind``) and pair ``j % num_pairs``.
        period_s: Time per pair it keeps (s).
        energy_j: Effective energy of one repetition.
        allmax_j: Effective energy of one pair at all-max.
    """

    choices: np.ndarray
    period_s: float
    energy_j: float
    allmax_j: float

    @property
    def num_pairs(self) -> int:
        """Pairs per repetition."""
        return int(self.choices.shape[1])

    @property
    def saved_per_pair_j(self) -> float:
        """Effective energy saved per pair against all-max (J)."""
        return self.allmax_j - self.energy_j / self.num_pairs


def cycle_edges(num_stages: int, num_pairs: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dependencies ``(v, u, wraps)``: ``v`` starts after ``u`` of ``wraps`` repetitions ago."""
    k = num_pairs
    out = []
    for s in range(num_stages):
        for j in range(k):
            pairs = [((s, 1, j), (s, 0, j)), ((s, 0, j), (s, 1, j - 1))]
            if s > 0:
                pairs.append(((s, 0, j), (s - 1, 0, j - 1)))
            if s < num_stages - 1:
                pairs.append(((s, 1, j), (s + 1, 1, j)))
            for (sv, kv, jv), (su, ku, ju) in pairs:
                out.append(((2 * sv + kv) * k + jv, (2 * su + ku) * k + ju % k, int(ju < 0)))
    arr = np.array(out, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def cycle_period_s(problem: PlanningProblem, choices: np.ndarray) -> float:
    """Time per pair of a repeating pattern: the largest cycle mean of its dependencies."""
    from scipy.sparse import coo_matrix

    k = choices.shape[1]
    num_nodes = choices.size
    v, u, wraps = cycle_edges(problem.num_stages, k)
    group = np.repeat(np.arange(2 * problem.num_stages), k)
    duration = problem.opt_time[group, choices.reshape(-1)]
    # Columns: start per node, then the time R of one repetition; x_v - x_u + wraps R >= d_u.
    rows = np.tile(np.arange(len(v)), 3)
    cols = np.concatenate([v, u, np.full(len(v), num_nodes)])
    vals = np.concatenate([np.ones(len(v)), -np.ones(len(v)), wraps.astype(float)])
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(v), num_nodes + 1)).tocsc()
    cost = np.zeros(num_nodes + 1)
    cost[-1] = 1.0
    lower = np.full(num_nodes + 1, -np.inf)
    upper = np.full(num_nodes + 1, np.inf)
    lower[0] = upper[0] = 0.0
    solved = _solve(matrix, cost, (lower, upper), (duration[u], None), None)
    if solved is None:  # cannot happen: every cycle holds at least one wrap
        raise SolverError("the steady state's cycle LP found no period")
    return float(solved[1][-1]) / k


def allmax_period_s(problem: PlanningProblem) -> float:
    """Time per pair of the all-max plan's steady state."""
    return cycle_period_s(problem, problem.max_option[:, None])


def relaxed_durations_s(problem: PlanningProblem, period_s: float) -> np.ndarray:
    """Per group, the duration in the cyclic LP relaxation (one pair, hull of the options)."""
    start = problem.max_option[:, None]
    free = np.ones(start.shape, dtype=bool)
    solved = _cycle_program(problem, period_s, start, free, relax=True)
    if solved is None:
        raise SolverError(f"no steady state keeps {period_s:.6f} s per pair")
    return solved[1]


def solve_cycle(
    problem: PlanningProblem, period_s: float, start: np.ndarray, free: np.ndarray
) -> Optional[CyclePattern]:
    """The least-energy pattern where the ``free`` entries of ``start`` may change.

    Args:
        problem: A 1F1B problem.
        period_s: Time per pair to keep.
        start: Option per group and pair (its shape sets ``k``).
        free: Same shape: which entries choose among their group's candidates (the others
            keep ``start``'s option).

    Returns:
        The pattern, or None when no choice of the free entries keeps the period.
    """
    solved = _cycle_program(problem, period_s, start, free, relax=False)
    if solved is None:
        return None
    energy_j, choices = solved
    num_groups = 2 * problem.num_stages
    allmax_j = float(problem.opt_effective[np.arange(num_groups), problem.max_option].sum())
    return CyclePattern(
        choices=choices.reshape(start.shape).astype(np.int64),
        period_s=float(period_s),
        energy_j=float(energy_j),
        allmax_j=allmax_j,
    )


def _cycle_program(
    problem: PlanningProblem, period_s: float, start: np.ndarray, free: np.ndarray, relax: bool
) -> Optional[Tuple[float, np.ndarray]]:
    """Solve the cyclic MILP (or its relaxation).

    Returns:
        ``(energy, option per node)``, or with ``relax`` ``(energy, duration per group)``
        (only meaningful for one pair); None when infeasible.
    """
    from scipy.sparse import coo_matrix

    k = start.shape[1]
    num_nodes = start.size
    group = np.repeat(np.arange(2 * problem.num_stages), k)
    flat, is_free = start.reshape(-1), free.reshape(-1)
    cands = [
        problem.candidates[int(g)] if is_free[i] else flat[i : i + 1]
        for i, g in enumerate(group.tolist())
    ]
    counts = np.array([len(c) for c in cands])
    z_first = num_nodes + np.concatenate([[0], np.cumsum(counts)[:-1]])
    num_z = int(counts.sum())
    z_node = np.repeat(np.arange(num_nodes), counts)
    z_opt = np.concatenate(cands).astype(np.int64)
    z_time = problem.opt_time[group[z_node], z_opt]
    z_cost = problem.opt_effective[group[z_node], z_opt]
    v, u, wraps = cycle_edges(problem.num_stages, k)
    num_e = len(v)
    # Precedence rows: x_v - x_u - sum_o t_uo z_uo >= -wraps * k * P; then one option each.
    z_of_u = [np.arange(z_first[w], z_first[w] + counts[w]) for w in u.tolist()]
    rows: List[np.ndarray] = [np.arange(num_e), np.arange(num_e)]
    rows += [np.full(len(z), e) for e, z in enumerate(z_of_u)]
    rows.append(num_e + z_node)
    cols: List[np.ndarray] = [v, u, *z_of_u, num_nodes + np.arange(num_z)]
    vals: List[np.ndarray] = [np.ones(num_e), -np.ones(num_e)]
    vals += [-z_time[z - num_nodes] for z in z_of_u]
    vals.append(np.ones(num_z))
    matrix = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(num_e + num_nodes, num_nodes + num_z),
    ).tocsc()
    cost = np.concatenate([np.zeros(num_nodes), z_cost])
    lower = np.concatenate([np.full(num_nodes, -np.inf), np.zeros(num_z)])
    upper = np.concatenate([np.full(num_nodes, np.inf), np.ones(num_z)])
    lower[0] = upper[0] = 0.0
    row_lower = np.concatenate([-wraps * k * period_s, np.ones(num_nodes)])
    row_upper = np.concatenate([np.full(num_e, np.inf), np.ones(num_nodes)])
    hint = np.flatnonzero(z_opt == flat[z_node])
    integer = None if relax else (np.arange(num_nodes, num_nodes + num_z), hint)
    solved = _solve(matrix, cost, (lower, upper), (row_lower, row_upper), integer)
    if solved is None:
        return None
    energy_j, values = solved
    z = values[num_nodes:]
    if relax:
        durations = np.bincount(z_node, weights=z * z_time, minlength=num_nodes)
        return energy_j, durations
    chosen = z > 0.5
    choices = np.empty(num_nodes, dtype=np.int64)
    choices[z_node[chosen]] = z_opt[chosen]
    return float(z_cost[chosen].sum()), choices


def _solve(
    matrix: csc_matrix,
    cost: np.ndarray,
    col_bounds: Tuple[np.ndarray, np.ndarray],
    row_bounds: Tuple[np.ndarray, Optional[np.ndarray]],
    integer: Optional[Tuple[np.ndarray, np.ndarray]],
) -> Optional[Tuple[float, np.ndarray]]:
    """One small HiGHS program: ``(objective, column values)``, or None without solution.

    ``integer``: the binary columns and the ones set in the start handed to HiGHS (the
    start need not be feasible).
    """
    import highspy

    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), matrix.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = np.nan_to_num(col_bounds[0], neginf=-inf)
    lp.col_upper_ = np.nan_to_num(col_bounds[1], posinf=inf)
    row_lower, row_upper = row_bounds
    lp.row_lower_ = row_lower
    lp.row_upper_ = (
        np.full(len(row_lower), inf) if row_upper is None else np.nan_to_num(row_upper, posinf=inf)
    )
    set_matrix(lp, matrix)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", TIME_LIMIT_S)
    if integer is not None:
        kinds = [highspy.HighsVarType.kContinuous] * len(cost)
        for c in integer[0].tolist():
            kinds[c] = highspy.HighsVarType.kInteger
        lp.integrality_ = kinds
        h.setOptionValue("mip_max_nodes", MAX_NODES)
        h.setOptionValue("mip_allow_restart", False)
    h.passModel(lp)
    if integer is not None:
        columns = integer[0].astype(np.int32)
        h.setSolution(len(columns), columns, np.isin(integer[0], integer[1]).astype(float))
    h.run()
    solution = h.getSolution()
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible or not solution.value_valid:
        return None
    return float(h.getInfo().objective_function_value), np.asarray(solution.col_value)
