"""Polish: improve one deadline's best plan with small MILPs over windows of the schedule.

Rounding an LP optimum instruction by instruction loses energy where the LP ran an
instruction between two frequencies and the instructions around it have no slack to absorb
either end; a mixed-integer program over every instruction decides that exactly but is far
too large. :func:`polish` solves it piece by piece (large-neighbourhood search):

1. Every instruction outside the window is *held*: it keeps its frequency and a fixed start
   time from a feasible schedule of the current plan (a blend of its earliest and latest
   schedule). That gives each window instruction a release time (its predecessors outside are
   done) and a due time (its successors outside start, or the iteration ends).
2. The window -- instructions that run at about the same time on every stage, consecutive in
   the current plan's start times -- chooses among all options that fit its windows: a small
   MILP (binaries per option, a start time per instruction, the window's own dependencies),
   started from the current choices, limited by branch-and-bound nodes.
3. Whatever it returns keeps the deadline by construction; it is re-simulated and kept when it
   saves energy. Windows slide by half their size; each pass blends the held schedule
   differently (halfway, latest, earliest).

All limits are counts, so the result is the same on any machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import earliest_finish, latest_finish, simulate_choices
from perseus.planner.solvers.base import Progress, report
from perseus.planner.solvers.lp.model import set_light_search, set_matrix

if TYPE_CHECKING:
    from highspy import Highs

#: Instructions per window, and the blends of the held schedule (weight of the earliest).
WINDOW_NODES = 48
BLENDS = (0.5, 0.0, 1.0)
_EPS = 1e-12


def best_within(
    problem: PlanningProblem, plans: Sequence[np.ndarray], deadline_s: float
) -> Optional[np.ndarray]:
    """The least-energy plan of ``plans`` with iteration time <= ``deadline_s`` (None: none)."""
    if not len(plans):
        return None
    rows = np.unique(np.vstack(plans), axis=0)
    times, energies = simulate_choices(problem, rows)
    fitting = np.flatnonzero(times <= deadline_s * (1 + 1e-9))
    if not len(fitting):
        return None
    return rows[fitting[np.argmin(energies[fitting])]]


def polish(
    problem: PlanningProblem,
    plans: Sequence[np.ndarray],
    deadline_s: float,
    max_nodes: int = 10,
    window: int = WINDOW_NODES,
    passes: int = 2,
    progress: Optional[Progress] = None,
    reference_j: Optional[np.ndarray] = None,
    max_windows: Optional[int] = None,
    light: bool = False,
) -> List[np.ndarray]:
    """Improved plans at ``deadline_s``, starting from the best of ``plans``.

    Args:
        problem: The planning problem.
        plans: Candidate plans (option index per node); the best meeting the deadline starts.
        deadline_s: Iteration-time budget (s).
        max_nodes: Branch-and-bound nodes of each window MILP.
        window: Instructions per window.
        passes: Sweeps over the windows.
        progress: Progress callback.
        reference_j: Per node, an effective energy to compare with (e.g. the LP optimum's):
            windows are then visited by how much the plan loses against it, most first.
        max_windows: Windows per sweep (default: all).
        light: Window MILPs with a lighter branch and bound
            (:func:`.model.set_light_search`).

    Returns:
        The improved plan (empty when nothing improved).
    """
    groups = problem.node_group

    def rank(current: np.ndarray, order: np.ndarray, starts: List[int]) -> List[int]:
        if reference_j is not None:
            loss = problem.opt_effective[groups, current] - reference_j
            score = [float(loss[order[s : s + window]].sum()) for s in starts]
            starts = [starts[i] for i in np.argsort(score)[::-1].tolist()]
        return starts[:max_windows]

    def solve(current: np.ndarray, nodes: np.ndarray, sweep: int) -> Optional[np.ndarray]:
        blend = BLENDS[sweep % len(BLENDS)]
        return _window_milp(problem, current, nodes, deadline_s, blend, max_nodes, light)

    return window_search(
        problem, plans, deadline_s, window, passes, solve, "polishing", progress, rank
    )


WindowSolve = Callable[[np.ndarray, np.ndarray, int], Optional[np.ndarray]]
WindowRank = Callable[[np.ndarray, np.ndarray, List[int]], List[int]]


def window_search(
    problem: PlanningProblem,
    plans: Sequence[np.ndarray],
    deadline_s: float,
    window: int,
    sweeps: int,
    solve: WindowSolve,
    label: str,
    progress: Optional[Progress] = None,
    rank: Optional[WindowRank] = None,
) -> List[np.ndarray]:
    """Large-neighbourhood search over windows of the schedule, from the best of ``plans``.

    Each sweep orders the instructions by the current plan's earliest start times and slides
    a window of ``window`` of them by half its size; ``solve(current, nodes, sweep)`` returns
    a plan changing only ``nodes`` (or None), kept when it meets the deadline and saves
    energy. ``rank(current, order, starts)`` may re-order or drop windows.

    Returns:
        The improved plan (empty when nothing improved).
    """
    current = best_within(problem, plans, deadline_s)
    if current is None:
        return []
    groups = problem.node_group
    best_j = float(simulate_choices(problem, current[None, :])[1][0])
    improved = False
    step = max(1, window // 2)
    for sweep in range(sweeps):
        times = problem.opt_time[groups, current]
        order = np.argsort(earliest_finish(problem, times[None, :])[0] - times, kind="stable")
        starts = list(range(0, max(1, len(order) - step), step))
        if rank is not None:
            starts = rank(current, order, starts)
        for k, first in enumerate(starts):
            report(
                progress,
                f"{label} T <= {deadline_s:.4f} s: sweep {sweep + 1}/{sweeps}, window "
                f"{k + 1}/{len(starts)}",
                (sweep * len(starts) + k) / max(1, sweeps * len(starts)),
            )
            found = solve(current, np.sort(order[first : first + window]), sweep)
            if found is None:
                continue
            t, e = simulate_choices(problem, found[None, :])
            if t[0] <= deadline_s * (1 + 1e-9) and e[0] < best_j * (1 - 1e-12):
                current, best_j, improved = found, float(e[0]), True
    return [current] if improved else []


def _window_milp(
    problem: PlanningProblem,
    current: np.ndarray,
    nodes: np.ndarray,
    deadline_s: float,
    blend: float,
    max_nodes: int,
    light: bool = False,
) -> Optional[np.ndarray]:
    """The window's least-energy choices with everything else held (see the module)."""
    import highspy
    from scipy.sparse import coo_matrix

    dag = problem.dag
    groups = problem.node_group
    times = problem.opt_time[groups, current]
    early = earliest_finish(problem, times[None, :])[0] - times
    late = latest_finish(problem, times[None, :], np.array([deadline_s]))[0] - times
    start = blend * early + (1 - blend) * late
    local = np.full(problem.num_nodes + 1, -1)
    local[nodes] = np.arange(len(nodes))
    n = len(nodes)
    release = np.zeros(n)
    due = np.full(n, deadline_s)
    edges = []
    for i, v in enumerate(nodes.tolist()):
        for u in (int(dag.stage_pred[v]), int(dag.flow_pred[v])):
            if u < 0:
                continue
            if local[u] >= 0:
                edges.append((int(local[u]), i))
            else:
                release[i] = max(release[i], start[u] + times[u])
    succ_out = _outside_successors(problem, nodes, local)
    for i, w in succ_out:
        due[i] = min(due[i], start[w])
    due = due * (1 + _EPS) + _EPS
    # Options per window node: those fitting its own window.
    opts = []
    for i, v in enumerate(nodes.tolist()):
        cand = problem.candidates[int(groups[v])]
        fits = cand[problem.opt_time[groups[v], cand] <= due[i] - release[i]]
        if not len(fits):
            return None
        opts.append(fits)
    counts = np.array([len(o) for o in opts])
    z0 = n + np.concatenate([[0], np.cumsum(counts)])
    num_z = int(counts.sum())
    flat = np.concatenate(opts)
    owner = np.repeat(np.arange(n), counts)
    z_t = problem.opt_time[groups[nodes][owner], flat]
    z_c = problem.opt_effective[groups[nodes][owner], flat]
    rows, cols, vals = [], [], []
    lower, upper = [], []
    r = 0
    for a, b in edges:  # x_b - x_a - dur_a >= 0
        span = np.arange(z0[a], z0[a + 1])
        rows += [r, r] + [r] * len(span)
        cols += [n_b for n_b in (b, a)] + span.tolist()
        vals += [1.0, -1.0, *(-z_t[span - n]).tolist()]
        lower.append(0.0)
        upper.append(highspy.kHighsInf)
        r += 1
    for i in range(n):  # x_i + dur_i <= due_i; sum z = 1
        span = np.arange(z0[i], z0[i + 1])
        rows += [r] * (1 + len(span)) + [r + 1] * len(span)
        cols += [i, *span.tolist(), *span.tolist()]
        vals += [1.0] + z_t[span - n].tolist() + [1.0] * len(span)
        lower += [-highspy.kHighsInf, 1.0]
        upper += [float(due[i]), 1.0]
        r += 2
    matrix = coo_matrix((vals, (rows, cols)), shape=(r, n + num_z)).tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n + num_z, r
    lp.col_cost_ = np.concatenate([np.zeros(n), z_c])
    lp.col_lower_ = np.concatenate([release, np.zeros(num_z)])
    lp.col_upper_ = np.concatenate([np.full(n, highspy.kHighsInf), np.ones(num_z)])
    lp.row_lower_ = np.array(lower)
    lp.row_upper_ = np.array(upper)
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * n + [
        highspy.HighsVarType.kInteger
    ] * num_z
    set_matrix(lp, matrix)
    h: Highs = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_max_nodes", int(max_nodes))
    # The start is good and the window small: the root's heuristics only cost time.
    h.setOptionValue("mip_heuristic_effort", 0.0)
    h.setOptionValue("time_limit", 60.0)
    # A root restart re-runs presolve, which can spin far past time_limit on these windows
    # (seen in HPresolve::strengthenInequalities with HiGHS 1.16); a window needs none.
    h.setOptionValue("mip_allow_restart", False)
    if light:
        set_light_search(h)
    h.passModel(lp)
    # The current choices with the held start times are a feasible start.
    x_start = np.zeros(n + num_z)
    x_start[:n] = np.maximum(start[nodes], release)
    for i, v in enumerate(nodes.tolist()):
        hit = np.flatnonzero(opts[i] == current[v])
        if len(hit):
            x_start[z0[i] + hit[0]] = 1.0
    guess = highspy.HighsSolution()
    guess.col_value = x_start.tolist()
    guess.value_valid = True
    h.setSolution(guess)
    h.run()
    solution = h.getSolution()
    if not solution.value_valid:
        return None
    z = np.asarray(solution.col_value)[n:]
    out = current.copy()
    for i, v in enumerate(nodes.tolist()):
        out[v] = opts[i][int(np.argmax(z[z0[i] - n : z0[i + 1] - n]))]
    return out


def _outside_successors(
    problem: PlanningProblem, nodes: np.ndarray, local: np.ndarray
) -> List[tuple]:
    """``(window position, successor)`` for every successor of a window node outside it."""
    dag = problem.dag
    out = []
    inside = local[: problem.num_nodes] >= 0
    for pred in (dag.stage_pred, dag.flow_pred):
        has = (pred >= 0) & ~inside
        succs = np.flatnonzero(has)
        preds = pred[succs]
        mask = inside[preds]
        out += list(zip(local[preds[mask]].tolist(), succs[mask].tolist()))
    return out
