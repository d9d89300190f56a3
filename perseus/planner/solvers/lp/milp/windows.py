"""Time windows: what no plan meeting a deadline can do, used to shrink the MILP.

With every instruction at its fastest option, ``ES_v`` (earliest start) and ``LF_v`` (latest
finish for the deadline) bound the earliest schedule of *every* plan meeting the deadline: its
instructions never start before ``ES_v`` (they can only be slower) and never finish after
``LF_v`` (what follows them takes at least its fastest time). So ``ES_v <= x_v <= LF_v - t_fast``
holds, and an option longer than ``LF_v - ES_v`` is never used. At no slowdown this pins the
bottleneck stage and keeps the stages next to it from the long, cheap options that the LP
relaxation would otherwise mix in.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.hull import GroupHull, lower_hull


def option_hulls(
    problem: PlanningProblem, nodes: np.ndarray, allowed: Sequence[np.ndarray]
) -> Dict[int, GroupHull]:
    """Per node, the lower convex hull of its allowed options (shared between equal sets)."""
    cache: Dict[Tuple[int, Tuple[int, ...]], GroupHull] = {}
    out: Dict[int, GroupHull] = {}
    for v in nodes.tolist():
        g = int(problem.node_group[v])
        options = np.asarray(allowed[v])
        key = (g, tuple(options.tolist()))
        if key not in cache:
            times = problem.opt_time[g, options]
            order = np.lexsort((problem.opt_effective[g, options], times))
            options = options[order]
            cost = problem.opt_effective[g, options]
            # Lower-left options only (cost falling with time), then their hull.
            options = options[cost < np.minimum.accumulate(np.r_[np.inf, cost[:-1]])]
            kept = options[
                lower_hull(problem.opt_time[g, options], problem.opt_effective[g, options])
            ]
            t = problem.opt_time[g, kept]
            c = problem.opt_effective[g, kept]
            lengths = np.diff(t)
            slopes = np.diff(c) / lengths if len(t) > 1 else np.zeros(0)
            cache[key] = GroupHull(
                time_s=t, cost_j=c, lengths_s=lengths, slopes=slopes, options=kept
            )
        out[v] = cache[key]
    return out


def time_windows(problem: PlanningProblem, deadline_s: float) -> Tuple[np.ndarray, np.ndarray]:
    """Per node, the earliest start and the latest finish with every node at its fastest."""
    from perseus.planner.simulate import earliest_finish, latest_finish

    fastest = np.array([problem.opt_time[g, c[0]] for g, c in enumerate(problem.candidates)])
    times = fastest[problem.node_group][None, :]
    start = earliest_finish(problem, times)[0] - times[0]
    finish = latest_finish(problem, times, np.array([deadline_s]))[0]
    return start, finish


def windowed(
    problem: PlanningProblem, deadline_s: float, allowed: Optional[Sequence[np.ndarray]]
) -> List[np.ndarray]:
    """``allowed`` (default: all candidates) without options too long for their window.

    An instruction keeps at least its fastest allowed option (then the deadline may be
    infeasible, which the MILP reports).
    """
    groups = problem.node_group.tolist()
    if allowed is None:
        allowed = [problem.candidates[g] for g in groups]
    start, finish = time_windows(problem, deadline_s)
    room = (finish - start) * (1 + 1e-9) + 1e-12
    out = []
    for v, g in enumerate(groups):
        options = np.asarray(allowed[v])
        fits = options[problem.opt_time[g, options] <= room[v]]
        out.append(fits if len(fits) else options[np.argsort(problem.opt_time[g, options])[:1]])
    return out
