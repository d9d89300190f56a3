"""Re-optimise: improve one deadline's best plan with the whole MILP, a window at a time.

Polish (:mod:`.polish`) holds every instruction outside its window at a fixed start time,
so a window can only use the slack that schedule leaves it. Discrete frequencies make the
best plans trade time between stages far apart (a stage takes a slower, cheaper option
where a neighbour leaves room, and the neighbour gets it back elsewhere), which held start
times rule out. Here each window is the MILP of the whole problem (:mod:`.milp`) where:

* the window's instructions -- ``window`` instructions that run at about the same time on
  every stage, consecutive in the current plan's start times -- choose among all options
  that fit their time windows;
* every other instruction keeps its option (a constant duration) but its start time is
  free, so the whole schedule can move to make room.

HiGHS starts from the current plan and stops after ``max_nodes`` branch-and-bound nodes;
whatever it returns meets the deadline by construction, is re-simulated, and is kept when it
saves energy. Windows slide by half their size; each sweep re-orders them by the improved
plan's schedule. All limits are counts, so the result is the same on any machine.

On GPT-3/A40 8 x 24 at no slowdown two sweeps take the polished plan from 10.88 % to 11.01 %
saving (the 15-min MILP's own best plan: 10.99 %).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.base import Progress
from perseus.planner.solvers.lp.milp.program import solve_milp_result
from perseus.planner.solvers.lp.polish import window_search

#: Instructions per window, and branch-and-bound nodes per window.
WINDOW_NODES = 96
MAX_NODES = 30
#: Sweeps over the windows.
SWEEPS = 2
#: Largest problem (instructions) re-optimised by default. Every window solves the whole
#: problem's LP, so a sweep grows with the square of its size: about 40 s per sweep at 384
#: instructions on one core, 140 s at 768 (where two sweeps gained only 0.02 pp on
#: GPT-3/A40 8 x 48).
MAX_SIZE = 400


def reoptimize(
    problem: PlanningProblem,
    plans: Sequence[np.ndarray],
    deadline_s: float,
    window: int = WINDOW_NODES,
    max_nodes: int = MAX_NODES,
    sweeps: int = SWEEPS,
    progress: Optional[Progress] = None,
) -> List[np.ndarray]:
    """Improved plans at ``deadline_s``, starting from the best of ``plans``.

    Args:
        problem: The planning problem.
        plans: Candidate plans (option index per node); the best meeting the deadline starts.
        deadline_s: Iteration-time budget (s).
        window: Instructions that choose their options per window.
        max_nodes: Branch-and-bound nodes per window.
        sweeps: Sweeps over the windows.
        progress: Progress callback.

    Returns:
        The improved plan (empty when nothing improved).
    """

    def solve(current: np.ndarray, nodes: np.ndarray, sweep: int) -> Optional[np.ndarray]:
        return _window(problem, current, nodes, deadline_s, max_nodes)

    return window_search(
        problem, plans, deadline_s, window, sweeps, solve, "re-optimising", progress
    )


def _window(
    problem: PlanningProblem,
    current: np.ndarray,
    nodes: np.ndarray,
    deadline_s: float,
    max_nodes: int,
) -> Optional[np.ndarray]:
    """The best plan HiGHS finds with only ``nodes`` free to change their options."""
    allowed = [current[v : v + 1] for v in range(problem.num_nodes)]
    for v in nodes.tolist():
        allowed[v] = problem.candidates[int(problem.node_group[v])]
    result = solve_milp_result(
        problem,
        deadline_s,
        allowed=allowed,
        start=current,
        max_nodes=max_nodes,
        # A safety net only: the node limit ends a window in seconds.
        time_limit_s=120.0,
        # The start is good and the neighbourhood small: the root's heuristics only cost time.
        heuristic_effort=0.0,
    )
    return result.choices
