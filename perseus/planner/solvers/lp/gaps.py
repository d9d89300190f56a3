"""Frontier density: fill iteration-time gaps between neighbouring plans, or prove them empty.

The frontier must offer, for any deadline between the fastest and the least-energy plan, a
plan within ``max_gap_rel`` (0.5 %) of it: consecutive plans may be at most that far apart in
iteration time (:func:`perseus.planner.frontier.density_gaps`). A deadline sweep with a finer
step nearly guarantees it, but near the least-energy end the energy curve is flat and rounding
the LP at a deadline inside a gap can give only plans that a faster one dominates; the gap
then stays although Pareto-optimal plans may exist inside it.

:func:`fill_gaps` closes such gaps. For a gap between the plans ``A`` (faster) and ``B``
it takes deadlines splitting the gap and tries, cheapest first: the LP rounded as in the
sweep; the plans on the way from ``A`` to ``B`` (instructions switched to ``B``'s choice in
the order the LP prefers); a small mixed-integer program in which every instruction keeps
its choice where ``A`` and ``B`` agree and chooses between theirs elsewhere. Whatever comes
out goes to the frontier like every other candidate, so a gap is only closed by a plan that
is really Pareto-optimal.

A gap that stays may be empty: :func:`prove_empty` proves that no plan inside it saves energy
over ``A`` (then a deadline inside it is best served by ``A``). All limits are counts (LP
solves, MILPs, branch-and-bound nodes), never seconds, so the result does not depend on
the machine's load.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Set, Tuple

import numpy as np

from perseus.planner.frontier import (
    MAX_GAP_REL,
    Frontier,
    FrontierPoint,
    build_frontier,
    density_gaps,
    pareto_rows,
)
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.base import Progress, report
from perseus.planner.solvers.lp.milp.program import solve_milp, solve_milp_result
from perseus.planner.solvers.lp.model import LPSolution

__all__ = [
    "MAX_GAP_REL",
    "between_options",
    "fill_gaps",
    "gap_deadlines",
    "prove_empty",
    "relink",
]

#: Plans along one LP-guided walk (evenly spaced switch counts).
MAX_WALK_PLANS = 64
#: Branch-and-bound nodes of one gap MILP.
GAP_MILP_NODES = 20
#: Safety net in seconds for one gap MILP (the node limit normally ends it first).
GAP_MILP_TIME_S = 20.0
#: Branch-and-bound nodes and safety-net seconds of one emptiness proof.
PROOF_MILP_NODES = 20
PROOF_TIME_S = 30.0


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


def times(a: FrontierPoint, b: FrontierPoint) -> Tuple[float, float]:
    """The iteration times of two frontier points."""
    return a.iteration_time_s, b.iteration_time_s


def gap_deadlines(fast_s: float, slow_s: float, max_gap_rel: float) -> List[float]:
    """Deadlines splitting ``(fast_s, slow_s)`` geometrically into steps below ``max_gap_rel``."""
    steps = math.ceil(math.log(slow_s / fast_s) / math.log(1 + 0.8 * max_gap_rel))
    ratio = (slow_s / fast_s) ** (1.0 / steps)
    return [fast_s * ratio**k for k in range(1, steps)]


def relink(
    fast: np.ndarray,
    slow: np.ndarray,
    diff: np.ndarray,
    preference: np.ndarray,
    max_plans: Optional[int] = None,
) -> np.ndarray:
    """Plans on the way between two plans: ``slow``'s choices taken node by node.

    Args:
        fast: The faster plan (option index per node).
        slow: The slower plan.
        diff: Nodes where they differ.
        preference: Per node of ``diff``, how much it wants ``slow``'s (longer) option; the
            most eager switch first.
        max_plans: Keep at most this many plans (evenly spaced switch counts).

    Returns:
        Plans (rows): row ``k`` has the ``counts[k]`` most eager nodes switched, for switch
        counts ``1 .. len(diff)`` (all of them unless ``max_plans`` thins them out).
    """
    order = diff[np.argsort(-preference, kind="stable")]
    counts = np.arange(1, len(order) + 1)
    if max_plans is not None and len(counts) > max_plans:
        counts = np.unique(np.linspace(1, len(order), max_plans).round().astype(np.int64))
    rows = np.tile(fast, (len(counts), 1))
    switched = np.arange(len(order))[None, :] < counts[:, None]
    rows[:, order] = np.where(switched, slow[order][None, :], fast[order][None, :])
    return rows


def fill_gaps(
    problem: PlanningProblem,
    frontier: Frontier,
    lp_at: Callable[[float], LPSolution],
    round_at: Callable[[LPSolution], List[np.ndarray]],
    max_gap_rel: float = MAX_GAP_REL,
    max_milps: int = 40,
    milp_nodes: int = GAP_MILP_NODES,
    rounds: int = 3,
    progress: Optional[Progress] = None,
    light: bool = False,
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
        frontier: The frontier of the candidate plans so far.
        lp_at: The convex-hull LP's optimum at a deadline.
        round_at: Real plans from an LP optimum (the sweep's rounding).
        max_gap_rel: Largest allowed relative step between neighbouring plans.
        max_milps: MILPs to solve in all (0: walks only).
        milp_nodes: Branch-and-bound nodes of each MILP.
        rounds: Passes over the gaps still open (a new plan can leave two smaller gaps).
        progress: Progress callback.
        light: MILPs with a lighter branch and bound (:func:`.model.set_light_search`).

    Returns:
        The added candidates (possibly none).
    """
    added: List[np.ndarray] = []
    tried: Set[Tuple[float, float]] = set()
    milps_left = max_milps
    base = [frontier.choices(p) for p in frontier.points]
    current = frontier
    for round_no in range(rounds):
        gaps = [
            (a, b)
            for a, b in density_gaps(current, max_gap_rel)
            if (a.iteration_time_s, b.iteration_time_s) not in tried
        ]
        if not gaps:
            break
        tried.update((a.iteration_time_s, b.iteration_time_s) for a, b in gaps)
        # Done: the MILPs solved out of those still called for, plus one for what follows.
        solved = max_milps - milps_left
        for k, (a, b) in enumerate(gaps):
            message = f"gap filling round {round_no + 1}: walk {k + 1}/{len(gaps)}"
            report(progress, message, solved / (solved + milps_left + 1))
            added += _walks(problem, current, a, b, lp_at, round_at, max_gap_rel)
        current = build_frontier(problem, base + added)
        base = [current.choices(p) for p in current.points]
        added_before = len(added)
        open_gaps = density_gaps(current, max_gap_rel)
        wanted = sum(len(gap_deadlines(*times(a, b), max_gap_rel)) for a, b in open_gaps)
        planned = solved + min(milps_left, wanted) + 1
        for k, (a, b) in enumerate(open_gaps):
            if milps_left <= 0:
                break
            message = f"gap filling round {round_no + 1}: MILPs in gap {k + 1}/{len(open_gaps)}"
            report(progress, message, (max_milps - milps_left) / planned)
            found, used = _milps(problem, current, a, b, max_gap_rel, milps_left, milp_nodes, light)
            added += found
            milps_left -= used
        if len(added) > added_before:
            current = build_frontier(problem, base + added[added_before:])
            base = [current.choices(p) for p in current.points]
    return added


def prove_empty(
    problem: PlanningProblem,
    a: FrontierPoint,
    b: FrontierPoint,
    milp_nodes: int = PROOF_MILP_NODES,
) -> Optional[str]:
    """How the step from ``a`` to ``b`` was proven to hold no Pareto-optimal plan, or None.

    A plan strictly between them in iteration time is Pareto-optimal only if it uses less
    energy than ``a``. The MILP (:mod:`.milp`) with ``T_a <= tau <= T_b (1 - 1e-6)`` bounds the
    energy of every plan with iteration time in that range from below (a faster plan is charged
    blocking energy for ``T_a``); a bound of at least ``a``'s energy (to a relative 1e-7,
    the solver's precision) proves the step empty. Tried as LP relaxation first, then as MILP
    with ``milp_nodes`` branch-and-bound nodes (0: the relaxation only).
    """
    # Strictly below b, beyond the solver's feasibility tolerance (b itself would fit).
    deadline_s = b.iteration_time_s * (1 - 1e-6)
    tries = ((True, "LP relaxation"), (False, "MILP"))[: 2 if milp_nodes > 0 else 1]
    for relax, how in tries:
        result = solve_milp_result(
            problem,
            deadline_s,
            time_limit_s=PROOF_TIME_S,
            max_nodes=milp_nodes,
            relax=relax,
            tau_lower_s=a.iteration_time_s,
            mip_rel_gap=1e-9,
        )
        if result.bound_j >= a.energy_j * (1 - 1e-7):
            return f"{how} bound >= faster plan's energy"
    return None


def _walks(
    problem: PlanningProblem,
    frontier: Frontier,
    a: FrontierPoint,
    b: FrontierPoint,
    lp_at: Callable[[float], LPSolution],
    round_at: Callable[[LPSolution], List[np.ndarray]],
    max_gap_rel: float,
) -> List[np.ndarray]:
    """Rounded LP optima and walks from ``a`` to ``b``: LP-guided and crossovers in time.

    A crossover takes ``b``'s choices for the instructions of the last microbatches and
    ``a``'s for the others (or the reverse): near the least-energy end, where the energy
    curve is flat and both plans are equally good per microbatch, its iteration time and
    energy lie between theirs, so it is Pareto-optimal whenever it is cheaper than ``a``.
    """
    groups = problem.node_group
    fast, slow = frontier.choices(a), frontier.choices(b)
    diff = np.flatnonzero(fast != slow)
    t_fast = problem.opt_time[groups[diff], fast[diff]]
    t_slow = problem.opt_time[groups[diff], slow[diff]]
    span = np.where(t_slow != t_fast, t_slow - t_fast, 1.0)
    out: List[np.ndarray] = []
    if len(diff):
        late = problem.dag.microbatch[diff].astype(float)
        for preference in (late, -late):
            walk = relink(fast, slow, diff, preference, 4 * MAX_WALK_PLANS)
            times_s, energies_j = simulate_choices(problem, walk)
            out += list(walk[pareto_rows(times_s, energies_j)])
    for deadline_s in gap_deadlines(a.iteration_time_s, b.iteration_time_s, max_gap_rel):
        solution = lp_at(deadline_s)
        out += round_at(solution)
        if not len(diff):
            continue
        eager = (solution.durations_s[diff] - t_fast) / span
        walk = relink(fast, slow, diff, eager, MAX_WALK_PLANS)
        times_s, energies_j = simulate_choices(problem, walk)
        out += list(walk[pareto_rows(times_s, energies_j)])  # keeps memory small
    return out


def _milps(
    problem: PlanningProblem,
    frontier: Frontier,
    a: FrontierPoint,
    b: FrontierPoint,
    max_gap_rel: float,
    max_milps: int,
    milp_nodes: int,
    light: bool = False,
) -> Tuple[List[np.ndarray], int]:
    """MILP plans at deadlines inside the gap, choosing only where ``a`` and ``b`` differ.

    Returns:
        The plans found and the number of MILPs solved.
    """
    fast, slow = frontier.choices(a), frontier.choices(b)
    allowed = between_options(problem, fast, slow)
    incumbent = fast
    out: List[np.ndarray] = []
    deadlines = gap_deadlines(a.iteration_time_s, b.iteration_time_s, max_gap_rel)[:max_milps]
    for deadline_s in deadlines:
        found = solve_milp(
            problem,
            deadline_s,
            allowed,
            time_limit_s=GAP_MILP_TIME_S,
            start=incumbent,
            max_nodes=milp_nodes,
            light=light,
        )
        if found is not None:
            out.append(found)
            incumbent = found
    return out, len(deadlines)
