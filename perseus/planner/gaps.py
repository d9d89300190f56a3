"""Frontier density: find iteration-time gaps between neighbouring plans and fill them.

The frontier must offer, for any deadline between the all-max plan and the least-energy plan,
a plan within ``max_gap_rel`` (0.5 %) of it: consecutive plans in that range may be at most
that far apart in iteration time. A deadline sweep with a finer step nearly guarantees it, but
near the least-energy end the energy curve is flat and rounding the LP at a deadline inside a
gap can give only plans that a faster one dominates; the gap then stays although Pareto-optimal
plans exist inside it.

:func:`fill_gaps` closes such gaps. For a gap between the plans ``A`` (faster) and ``B``
it takes deadlines splitting the gap and tries, cheapest first: the LP rounded as in the
sweep; the plans on the way from ``A`` to ``B`` (instructions switched to ``B``'s choice in
the order the LP prefers); a small mixed-integer program in which every instruction keeps
its choice where ``A`` and ``B`` agree and chooses between theirs elsewhere (time-limited).
Whatever comes out goes to the frontier like every other candidate, so a gap is only closed
by a plan that is really Pareto-optimal; a gap in which no such plan is found within the
budget stays (then none may exist, and a deadline inside it is best served by the faster
neighbour; on GPT-3/A100 a MILP over all choices for 25 s found none in the 0.57 % step the
24-microbatch frontier keeps, while it found plans in the 0.8-2.4 % steps the sweep alone
left on the 12-96-microbatch frontiers).
"""

from __future__ import annotations

import math
import time
from typing import Callable, List, Optional, Set, Tuple

import numpy as np

from perseus.planner.frontier import Frontier, FrontierPoint, build_frontier, pareto_rows
from perseus.planner.lp_model import LPSolution
from perseus.planner.milp import solve_milp
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices

#: Largest allowed relative iteration-time step between neighbouring frontier plans.
MAX_GAP_REL = 0.005
#: Upper clip of one gap MILP's time limit (s).
MAX_MILP_S = 8.0

Gap = Tuple[FrontierPoint, FrontierPoint]


def density_gaps(frontier: Frontier, max_gap_rel: float = MAX_GAP_REL) -> List[Gap]:
    """Neighbouring plans between the all-max and the least-energy plan that are too far apart.

    Args:
        frontier: A frontier.
        max_gap_rel: Largest allowed ``T_next / T - 1``.

    Returns:
        ``(faster, slower)`` pairs whose iteration times differ by more than ``max_gap_rel``.
    """
    t_allmax = frontier.allmax.iteration_time_s
    t_least = min(frontier.points, key=lambda p: p.energy_j).iteration_time_s
    inside = [
        p
        for p in frontier.points
        if t_allmax * (1 - 1e-9) <= p.iteration_time_s <= t_least * (1 + 1e-9)
    ]
    return [
        (a, b)
        for a, b in zip(inside, inside[1:])
        if b.iteration_time_s / a.iteration_time_s - 1 > max_gap_rel
    ]


def max_gap_rel(frontier: Frontier) -> float:
    """Largest relative iteration-time step between neighbouring plans (all-max..least energy)."""
    gaps = density_gaps(frontier, 0.0)
    return max((b.iteration_time_s / a.iteration_time_s - 1 for a, b in gaps), default=0.0)


def between_options(problem: PlanningProblem, fast: np.ndarray, slow: np.ndarray) -> List:
    """Per node, the candidates between its options in two plans (one where they agree)."""
    out = []
    for v, g in enumerate(problem.node_group.tolist()):
        cands = problem.candidates[g]
        if fast[v] == slow[v]:
            out.append(cands[cands == fast[v]] if fast[v] in cands else np.array([fast[v]]))
            continue
        pos_a, pos_b = np.flatnonzero(cands == fast[v]), np.flatnonzero(cands == slow[v])
        lo = int(pos_a[0]) if len(pos_a) else 0
        hi = int(pos_b[0]) if len(pos_b) else len(cands) - 1
        allowed = cands[min(lo, hi) : max(lo, hi) + 1]
        out.append(np.union1d(allowed, [fast[v], slow[v]]))
    return out


def gap_deadlines(fast_s: float, slow_s: float, max_gap_rel: float) -> List[float]:
    """Deadlines splitting ``(fast_s, slow_s)`` geometrically into steps below ``max_gap_rel``."""
    steps = math.ceil(math.log(slow_s / fast_s) / math.log(1 + 0.8 * max_gap_rel))
    ratio = (slow_s / fast_s) ** (1.0 / steps)
    return [fast_s * ratio**k for k in range(1, steps)]


def relink(
    fast: np.ndarray, slow: np.ndarray, diff: np.ndarray, preference: np.ndarray
) -> np.ndarray:
    """Plans on the way between two plans: ``slow``'s choices taken node by node.

    Args:
        fast: The faster plan (option index per node).
        slow: The slower plan.
        diff: Nodes where they differ.
        preference: Per node of ``diff``, how much it wants ``slow``'s (longer) option; the
            most eager switch first.

    Returns:
        ``len(diff)`` plans (rows): row ``k`` has the ``k + 1`` most eager nodes switched.
    """
    order = diff[np.argsort(-preference, kind="stable")]
    rows = np.tile(fast, (len(order), 1))
    switched = np.tril(np.ones((len(order), len(order)), dtype=bool))
    rows[:, order] = np.where(switched, slow[order][None, :], fast[order][None, :])
    return rows


def fill_gaps(
    problem: PlanningProblem,
    plans: List[np.ndarray],
    lp_at: Callable[[float], LPSolution],
    round_at: Callable[[LPSolution], List[np.ndarray]],
    max_gap_rel: float = MAX_GAP_REL,
    milp_s_per_node: float = 0.008,
    budget_s: float = 20.0,
    rounds: int = 3,
    milp_max_nodes: Optional[int] = None,
) -> List[np.ndarray]:
    """New candidate plans inside the frontier's gaps (see the module docstring).

    Per gap ``(A, B)``, deadlines split it into steps below ``max_gap_rel``. At each the LP
    is solved and rounded (``round_at``), and the plans from ``A`` to ``B`` are walked
    (:func:`relink`), switching first the instructions the LP runs longest relative to
    their times in ``A`` and ``B``. Gaps still open then get, at the same deadlines, a MILP in
    which the instructions where ``A`` and ``B`` agree keep that choice and the others choose
    between theirs; it starts from ``A``, then from the previous deadline's plan.

    Args:
        problem: The planning problem.
        plans: Candidate plans so far (option index per node).
        lp_at: The convex-hull LP's optimum at a deadline.
        round_at: Real plans from an LP optimum (the sweep's rounding).
        max_gap_rel: Largest allowed relative step between neighbouring plans.
        milp_s_per_node: HiGHS time limit of one MILP per instruction that ``A`` and ``B``
            disagree on (clipped to 0.5 s..``MAX_MILP_S``).
        budget_s: Stop trying after this much time in total.
        rounds: Passes over the gaps still open (a new plan can leave two smaller gaps).
        milp_max_nodes: Also stop each MILP after this many branch-and-bound nodes (with a
            large ``milp_s_per_node`` the result then no longer depends on the machine's load).

    Returns:
        The added candidates (possibly none).
    """
    began = time.perf_counter()
    added: List[np.ndarray] = []
    tried: Set[Tuple[float, float]] = set()
    for _ in range(rounds):
        gaps = [
            (a, b)
            for a, b in density_gaps(build_frontier(problem, plans + added), max_gap_rel)
            if (a.iteration_time_s, b.iteration_time_s) not in tried
        ]
        tried.update((a.iteration_time_s, b.iteration_time_s) for a, b in gaps)
        for a, b in gaps:
            if time.perf_counter() - began >= budget_s:
                return added
            added += _walks(problem, a, b, lp_at, round_at, max_gap_rel)
        gaps = density_gaps(build_frontier(problem, plans + added), max_gap_rel)
        for a, b in gaps:
            remaining_s = budget_s - (time.perf_counter() - began)
            if remaining_s <= 0:
                return added
            added += _milps(
                problem, a, b, max_gap_rel, (milp_s_per_node, milp_max_nodes), remaining_s
            )
        if not gaps:
            break
    return added


def _walks(
    problem: PlanningProblem,
    a: FrontierPoint,
    b: FrontierPoint,
    lp_at: Callable[[float], LPSolution],
    round_at: Callable[[LPSolution], List[np.ndarray]],
    max_gap_rel: float,
) -> List[np.ndarray]:
    """Rounded LP optima and LP-guided walks from ``a`` to ``b`` at deadlines inside the gap."""
    groups = problem.node_group
    fast, slow = problem.freqs_to_choices(a.freqs), problem.freqs_to_choices(b.freqs)
    diff = np.flatnonzero(fast != slow)
    t_fast = problem.opt_time[groups[diff], fast[diff]]
    t_slow = problem.opt_time[groups[diff], slow[diff]]
    out: List[np.ndarray] = []
    for deadline_s in gap_deadlines(a.iteration_time_s, b.iteration_time_s, max_gap_rel):
        solution = lp_at(deadline_s)
        out += round_at(solution)
        eager = (solution.durations_s[diff] - t_fast) / (t_slow - t_fast)
        walk = relink(fast, slow, diff, eager)
        times_s, energies_j = simulate_choices(problem, walk)
        out += list(walk[pareto_rows(times_s, energies_j)])  # keeps memory small
    return out


def _milps(
    problem: PlanningProblem,
    a: FrontierPoint,
    b: FrontierPoint,
    max_gap_rel: float,
    limits: Tuple[float, Optional[int]],
    budget_s: float,
) -> List[np.ndarray]:
    """MILP plans at deadlines inside the gap, choosing only where ``a`` and ``b`` differ."""
    began = time.perf_counter()
    milp_s_per_node, max_nodes = limits
    fast, slow = problem.freqs_to_choices(a.freqs), problem.freqs_to_choices(b.freqs)
    allowed = between_options(problem, fast, slow)
    limit_s = min(MAX_MILP_S, max(0.5, milp_s_per_node * int(np.sum(fast != slow))))
    incumbent = fast
    out: List[np.ndarray] = []
    for deadline_s in gap_deadlines(a.iteration_time_s, b.iteration_time_s, max_gap_rel):
        left_s = budget_s - (time.perf_counter() - began)
        if left_s <= 0:
            break
        found = solve_milp(
            problem,
            deadline_s,
            allowed,
            time_limit_s=min(limit_s, left_s),
            start=incumbent,
            max_nodes=max_nodes,
        )
        if found is not None:
            out.append(found)
            incumbent = found
    return out
