"""Polish: improve the best plan at one deadline with MILPs over windows of the schedule.

Rounding an LP optimum instruction by instruction loses energy where the LP ran an
instruction between two frequencies and its neighbours have no slack to absorb either end.
A mixed-integer program over every instruction decides that exactly but is far too large.
:func:`polish` solves it piece by piece (large-neighbourhood search): all instructions keep
their frequency except those of a window of consecutive microbatches (every stage), which
choose among all their candidates; HiGHS starts from the current plan, so the plan only
gets cheaper while it meets the deadline. Windows slide over the iteration with overlap.

Each MILP is limited by branch-and-bound nodes (not seconds), so the result is the same on
any machine.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.base import Progress, report
from perseus.planner.solvers.lp.milp import solve_milp

#: Microbatches per window, and the step between windows.
WINDOW_MICROBATCHES = 6
WINDOW_STEP = 3
#: Safety net in seconds for one window MILP (the node limit normally ends it first).
WINDOW_TIME_S = 120.0


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


def windows(problem: PlanningProblem, size: int, step: int) -> List[np.ndarray]:
    """Node sets of consecutive-microbatch windows, all stages, sliding by ``step``."""
    microbatch = problem.dag.microbatch
    last = problem.num_microbatches
    out = []
    for first in range(0, max(1, last - size + step), step):
        nodes = np.flatnonzero((microbatch >= first) & (microbatch < first + size))
        if len(nodes):
            out.append(nodes)
    return out


def polish(
    problem: PlanningProblem,
    plans: Sequence[np.ndarray],
    deadline_s: float,
    max_nodes: int = 200,
    window: int = WINDOW_MICROBATCHES,
    step: int = WINDOW_STEP,
    passes: int = 1,
    progress: Optional[Progress] = None,
) -> List[np.ndarray]:
    """Improved plans at ``deadline_s``, starting from the best of ``plans``.

    Args:
        problem: The planning problem.
        plans: Candidate plans (option index per node); the best meeting the deadline starts.
        deadline_s: Iteration-time budget (s).
        max_nodes: Branch-and-bound nodes of each window MILP.
        window: Microbatches per window.
        step: Microbatches between window starts.
        passes: Sweeps over all windows.
        progress: Progress callback.

    Returns:
        Every improvement found (possibly none), the best last.
    """
    incumbent = best_within(problem, plans, deadline_s)
    if incumbent is None:
        return []
    groups = problem.node_group
    free_sets = windows(problem, window, step)
    out: List[np.ndarray] = []
    _, energy = simulate_choices(problem, incumbent[None, :])
    best_j = float(energy[0])
    total = passes * len(free_sets)
    for k in range(total):
        free = free_sets[k % len(free_sets)]
        report(progress, f"polishing window {k + 1}/{total}", k / max(1, total))
        allowed = [np.array([c]) for c in incumbent.tolist()]
        for v in free.tolist():
            allowed[v] = problem.candidates[int(groups[v])]
        found = solve_milp(
            problem,
            deadline_s,
            allowed,
            time_limit_s=WINDOW_TIME_S,
            start=incumbent,
            max_nodes=max_nodes,
        )
        if found is None:
            continue
        t, e = simulate_choices(problem, found[None, :])
        if t[0] <= deadline_s * (1 + 1e-9) and e[0] < best_j * (1 - 1e-12):
            incumbent, best_j = found, float(e[0])
            out.append(found)
    return out
