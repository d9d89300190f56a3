"""Path cuts: valid inequalities that make the MILP's relaxation see discrete frequencies.

The relaxation of the MILP (:mod:`.milp`) lets every instruction run between two of its
options, so where a few instructions must share a fixed stretch of time it spends that time
exactly, which discrete options rarely can. A path cut states what they can:

For a path ``v_1 -> ... -> v_m`` of the dependency graph, the instructions run one after the
other, and by the time windows (:mod:`.windows`) ``v_1`` starts no earlier than ``ES(v_1)``
and ``v_m`` finishes no later than ``LF(v_m)`` in any plan meeting the deadline. So their
durations sum to at most ``W = LF(v_m) - ES(v_1)``, and their effective energy is at least

    ``K(W) = min sum_j e_j(k_j)  over options k_j with  sum_j t_j(k_j) <= W``,

a multiple-choice knapsack solved exactly here by merging the paths' (time, energy) Pareto
fronts. The row ``sum_j sum_k e_jk z_jk >= K(W)`` holds for every plan meeting the deadline,
so adding it keeps every bound valid; it cuts off relaxed points that fill ``W`` with
fractions of options.

It bites where ``W`` is tight: next to the bottleneck stage at no slowdown, a stage's
backward and the next forward must fit between two fixed events of its neighbour. Only cuts
the relaxation can violate are kept (``K(W)`` above the hulls' least energy for ``W``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.hull import GroupHull
from perseus.planner.solvers.lp.milp.windows import option_hulls, time_windows

#: Path lengths (instructions) cut by default: two and three gain nearly all (longer paths
#: have wider windows, which the relaxation fills as well as discrete options).
MAX_PATH_NODES = 3
#: A cut is kept when it lies this far (J) above the relaxation's least energy.
_MIN_VIOLATION_J = 1e-6


@dataclass(frozen=True)
class PathCut:
    """``sum over nodes of effective energy >= bound_j`` for every plan meeting the deadline.

    Attributes:
        nodes: The path's instructions, in dependency order.
        window_s: Time the path has at most (``LF(last) - ES(first)``).
        bound_j: Least effective energy of the path's options within ``window_s``.
    """

    nodes: Tuple[int, ...]
    window_s: float
    bound_j: float


def least_energy_within(options: Sequence[Tuple[np.ndarray, np.ndarray]], window_s: float) -> float:
    """Least total energy picking one option per item with total time <= ``window_s``.

    Args:
        options: Per item, its options' ``(times, energies)``.
        window_s: The time budget.

    Returns:
        The least energy (inf when even the fastest options exceed the budget).
    """
    front_t = np.zeros(1)
    front_e = np.zeros(1)
    for times, energies in options:
        t = (front_t[:, None] + times[None, :]).ravel()
        e = (front_e[:, None] + energies[None, :]).ravel()
        fits = t <= window_s
        if not fits.any():
            return float("inf")
        t, e = t[fits], e[fits]
        order = np.lexsort((e, t))
        t, e = t[order], e[order]
        # Pareto front: keep a point only if it is cheaper than every faster one.
        keep = e < np.minimum.accumulate(np.r_[np.inf, e[:-1]])
        front_t, front_e = t[keep], e[keep]
    return float(front_e.min())


def path_cuts(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Sequence[np.ndarray],
    max_path_nodes: int = MAX_PATH_NODES,
    nodes: Optional[np.ndarray] = None,
) -> List[PathCut]:
    """Every path cut of up to ``max_path_nodes`` instructions the relaxation can violate.

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        allowed: Per node, the options it may use (those fitting its window).
        max_path_nodes: Longest path (instructions) cut.
        nodes: Only paths through these nodes alone (default: every node).
    """
    start, finish = time_windows(problem, deadline_s)
    dag = problem.dag
    groups = problem.node_group
    inside = np.ones(problem.num_nodes, dtype=bool)
    if nodes is not None:
        inside[:] = False
        inside[nodes] = True
    successors: List[List[int]] = [[] for _ in range(problem.num_nodes)]
    for pred in (dag.stage_pred, dag.flow_pred):
        for v in np.flatnonzero((pred >= 0) & inside).tolist():
            if inside[pred[v]]:
                successors[int(pred[v])].append(v)
    hulls = option_hulls(problem, np.flatnonzero(inside), allowed)
    cache: Dict[Tuple[Tuple[int, Tuple[int, ...]], ...], float] = {}
    out: List[PathCut] = []

    def visit(path: List[int]) -> None:
        if len(path) >= 2:
            cut = _cut(problem, path, start, finish, allowed, hulls, groups, cache)
            if cut is not None:
                out.append(cut)
        if len(path) < max_path_nodes:
            for w in successors[path[-1]]:
                visit([*path, w])

    for v in np.flatnonzero(inside).tolist():
        visit([v])
    return out


def _cut(
    problem: PlanningProblem,
    path: List[int],
    start: np.ndarray,
    finish: np.ndarray,
    allowed: Sequence[np.ndarray],
    hulls: Dict[int, GroupHull],
    groups: np.ndarray,
    cache: Dict[Tuple[Tuple[int, Tuple[int, ...]], ...], float],
) -> Optional[PathCut]:
    """The path's cut, or None when the relaxation cannot violate it."""
    window = float(finish[path[-1]] - start[path[0]]) * (1 + 1e-9) + 1e-12
    key = tuple((int(groups[v]), tuple(np.asarray(allowed[v]).tolist())) for v in path)
    key = (*key, (round(window * 1e12), ()))
    if key not in cache:
        items = []
        for v in path:
            options = np.asarray(allowed[v])
            g = int(groups[v])
            items.append((problem.opt_time[g, options], problem.opt_effective[g, options]))
        bound = least_energy_within(items, window)
        relaxed = _hull_least_energy([hulls[v] for v in path], window)
        # Only cuts the relaxation can violate are worth a row.
        cache[key] = bound if bound > relaxed + _MIN_VIOLATION_J else float("nan")
    bound = cache[key]
    if not np.isfinite(bound):
        return None
    # A hair below the exact knapsack value: rounding must never cut off a real plan.
    return PathCut(tuple(path), window, bound - 1e-9 * abs(bound) - 1e-9)


def _hull_least_energy(hulls: Sequence[GroupHull], window_s: float) -> float:
    """Least energy of the hulls' continuous points with total time <= ``window_s``."""
    energy = float(sum(h.cost_j[0] for h in hulls))
    room = window_s - float(sum(h.time_s[0] for h in hulls))
    segments = sorted((float(s), float(n)) for h in hulls for s, n in zip(h.slopes, h.lengths_s))
    for slope, length in segments:
        if slope >= 0 or room <= 0:
            break
        used = min(length, room)
        energy += slope * used
        room -= used
    return energy
