"""Lower convex hulls of each instruction's (time, effective energy) options.

Replacing an instruction's discrete options by their lower convex hull turns "least energy
with iteration time <= T" into a linear program (:mod:`.model`). The hull is stored as a start
point and segments of increasing (less negative) slope, so the LP needs only bounded segment
variables and no extra rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np

from perseus.planner.problem import PlanningProblem


@dataclass
class GroupHull:
    """Hull of one (stage, instruction) group.

    Attributes:
        time_s: Hull vertices' times, ascending (the first is the fastest option).
        cost_j: Hull vertices' effective energies, descending.
        lengths_s: Segment lengths (``diff(time_s)``).
        slopes: Segment slopes (J/s), negative and increasing.
        options: The vertices' option indices in the problem's tables.
        locked_tail: Trailing segments the LP may not use unless a node is pinned
            (:meth:`perseus.planner.solvers.lp.model.HullLP.pin`); they need not be convex.
    """

    time_s: np.ndarray
    cost_j: np.ndarray
    lengths_s: np.ndarray
    slopes: np.ndarray
    options: np.ndarray
    locked_tail: int = 0


def lower_hull(time_s: np.ndarray, cost_j: np.ndarray) -> np.ndarray:
    """Indices of the decreasing lower convex hull of points sorted by time, cost descending."""
    keep: List[int] = []
    for k in range(len(time_s)):
        while len(keep) >= 2:
            a, b = keep[-2], keep[-1]
            # Drop b if it lies on or above the segment a -> k.
            cross = (time_s[b] - time_s[a]) * (cost_j[k] - cost_j[a]) - (cost_j[b] - cost_j[a]) * (
                time_s[k] - time_s[a]
            )
            if cross <= 0:
                keep.pop()
            else:
                break
        keep.append(k)
    return np.asarray(keep, dtype=np.int64)


def group_hulls(problem: PlanningProblem) -> List[GroupHull]:
    """The hull of every group's candidates (see :class:`PlanningProblem`)."""
    hulls = []
    for g, cand in enumerate(problem.candidates):
        t = problem.opt_time[g, cand]
        c = problem.opt_effective[g, cand]
        idx = lower_hull(t, c)
        t, c = t[idx], c[idx]
        lengths = np.diff(t)
        slopes = np.diff(c) / lengths if len(t) > 1 else np.zeros(0)
        hulls.append(
            GroupHull(time_s=t, cost_j=c, lengths_s=lengths, slopes=slopes, options=cand[idx])
        )
    return hulls
