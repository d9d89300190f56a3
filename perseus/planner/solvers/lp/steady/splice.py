"""The 1F1B steady state: a clock pattern repeating every few pairs, spliced into a plan.

In the steady state of 1F1B every stage runs pairs ``F(w_s + j), B(j)``
(:func:`.layout.steady_pair`) at the pace of the slowest stage: at no slowdown one pair per
*period* of the all-max plan. The LP gives every interior instruction of a stage about the
same duration, which often lies between two profiled frequencies; the rounded plans then
repeat one discrete pattern every pair. A longer pattern does better: over ``k`` pairs a
stage runs one backward much slower and the others faster, so it averages the LP's duration
with discrete options -- provided the stages take turns (staggered), so the slack one takes
is the slack its neighbours leave.

The *cyclic problem* (:mod:`.cycle`) is the MILP of ``k`` pairs per stage on a cycle: any of
its solutions repeats forever without falling behind. :func:`find_pattern` builds a good one
in seconds: the cyclic LP gives every stage's forward and backward a duration; per
instruction kind the best multiset of ``k`` options within ``k`` times that duration is a
small knapsack; the multisets are arranged staggered (stage ``s`` shifted by ``a * s``
pairs, every ``a`` tried) and the last stages, where the staggering breaks, are re-chosen by
the cyclic MILP; bands of neighbouring stages are then re-chosen in turn until nothing
improves.

:func:`splice` puts the pattern into a plan: the interior pairs take it (each of its ``k``
phases tried), and the whole problem's MILP (:mod:`.milp`) re-chooses the warm-up, the
cool-down and a few pairs next to them with the interior fixed and every start time free --
so each result meets the deadline by construction; all are re-simulated by the frontier.

GPT-3/A40 at no slowdown: the pattern saves 85.9 J per pair against all-max where the LP's
rounding saves 84.4 J (9 s). The solver polishes the spliced plans' seams afterwards
(:mod:`.polish`): 8 x 48 goes from 10.08 to 10.17 % (250 s in all) and 8 x 96 from 9.59 to
9.77 % (260 s). All limits are counts: the same plans on any machine.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time
from perseus.planner.solvers.base import Progress, report
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.layout import steady_pair
from perseus.planner.solvers.lp.milp.program import solve_milp_result
from perseus.planner.solvers.lp.polish import best_within
from perseus.planner.solvers.lp.rounding import Rounder
from perseus.planner.solvers.lp.steady.cycle import (
    CyclePattern,
    allmax_period_s,
    cycle_period_s,
    relaxed_durations_s,
    solve_cycle,
)

#: Pairs per repetition of the pattern.
PATTERN_PAIRS = 4
#: Stages re-chosen together by each band search, and sweeps per band size.
BANDS = (2, 3)
BAND_SWEEPS = 4
#: The light search's bands (one sweep).
LIGHT_BANDS = (2,)
#: Pairs at each end of the steady state that keep the plan's own options, and the pairs
#: next to them the splice's MILP may change too.
MARGIN_PAIRS = 4
FREE_PAIRS = 4
#: Branch-and-bound nodes of each splice MILP.
SPLICE_NODES = 200
#: Splice only when at least this many pairs per stage take the pattern and stay fixed.
MIN_FIXED_PAIRS = 2 * PATTERN_PAIRS
#: Largest problem (instructions) spliced: every phase solves the whole problem's MILP.
MAX_SIZE = 2048


def applies_to(
    num_stages: int, num_microbatches: int, schedule: str = "1f1b", num_model_chunks: int = 1
) -> bool:
    """Whether a pipeline of this shape is 1F1B with enough steady pairs to splice into."""
    if schedule != "1f1b" or num_model_chunks != 1:
        return False
    if 2 * num_stages * num_microbatches > MAX_SIZE:
        return False
    pairs = num_microbatches - (num_stages - 1)
    return pairs - 2 * (MARGIN_PAIRS + FREE_PAIRS) >= MIN_FIXED_PAIRS


def applies(problem: PlanningProblem) -> bool:
    """Whether ``problem`` is 1F1B with enough steady pairs to splice a pattern into.

    Only Perseus's own 1F1B order (or an engine's order with the same actions): other
    schedules skip the steady-state phases.
    """
    return problem.is_generated_1f1b and applies_to(
        problem.num_stages, problem.num_microbatches, problem.schedule, problem.num_model_chunks
    )


def _multisets(problem: PlanningProblem, durations_s: np.ndarray, k: int) -> List[np.ndarray]:
    """Per group, the least-energy ``k`` options whose total time is within ``k * duration``.

    Sorted slowest first. The group's fastest option repeated ``k`` times always fits (the
    LP's durations are never below it).
    """
    out = []
    for g, duration in enumerate(durations_s.tolist()):
        cands = problem.candidates[g]
        combos = np.array(list(itertools.combinations_with_replacement(range(len(cands)), k)))
        opts = cands[combos]
        time_s = problem.opt_time[g, opts].sum(axis=1)
        energy = problem.opt_effective[g, opts].sum(axis=1)
        energy = np.where(time_s <= k * duration * (1 + 1e-12), energy, np.inf)
        chosen = opts[int(np.argmin(energy))]
        out.append(chosen[np.argsort(-problem.opt_time[g, chosen], kind="stable")])
    return out


def find_pattern(
    problem: PlanningProblem,
    period_s: float,
    num_pairs: int = PATTERN_PAIRS,
    bands: Sequence[int] = BANDS,
    band_sweeps: int = BAND_SWEEPS,
    progress: Optional[Progress] = None,
) -> Optional[CyclePattern]:
    """A good ``num_pairs``-pair pattern keeping ``period_s`` per pair (see the module).

    ``bands`` and ``band_sweeps``: the band search (``(2,)`` and one sweep find the same
    pattern as the default on the published 8 x 96 cases in a third of the time).
    ``progress``: told each band's cyclic MILP (the fraction: of the band search's most).

    Returns:
        The pattern, or None when no staggered start could be completed.
    """
    k, num_stages = num_pairs, problem.num_stages
    multisets = _multisets(problem, relaxed_durations_s(problem, period_s), k)
    # Staggered arrangements: stage s's multiset rotated by a * s (+ one offset per kind).
    best = None
    for a, off_f, off_b in itertools.product(range(k), repeat=3):
        choices = np.empty((2 * num_stages, k), dtype=np.int64)
        for s in range(num_stages):
            choices[2 * s] = np.roll(multisets[2 * s], a * s + off_f)
            choices[2 * s + 1] = np.roll(multisets[2 * s + 1], a * s + off_b)
        period = cycle_period_s(problem, choices)
        if best is None or period < best[0] - 1e-15:
            best = (period, choices)
    assert best is not None
    start = best[1]
    # Re-choose the last stages (where the staggering meets the rigid end) until it fits.
    pattern = None
    for num_free in range(num_stages + 1):
        free = np.zeros(start.shape, dtype=bool)
        free[2 * (num_stages - num_free) :] = True
        pattern = solve_cycle(problem, period_s, start, free)
        if pattern is not None:
            break
    if pattern is None:
        return None
    most = band_sweeps * sum(num_stages - band + 1 for band in bands)
    solved = 0
    for band in bands:
        for _ in range(band_sweeps):
            before = pattern.energy_j
            for first in range(num_stages - band + 1):
                report(
                    progress,
                    f"steady-state pattern: band of {band} from stage {first}",
                    solved / most,
                )
                solved += 1
                free = np.zeros(start.shape, dtype=bool)
                free[2 * first : 2 * (first + band)] = True
                better = solve_cycle(problem, period_s, pattern.choices, free)
                if better is not None and better.energy_j < pattern.energy_j - 1e-9:
                    pattern = better
            if pattern.energy_j >= before - 1e-9:
                break
    return pattern


def held_nodes(problem: PlanningProblem) -> np.ndarray:
    """Per node, whether the splice holds it to the pattern (the interior without seams)."""
    pair = steady_pair(problem)
    end = problem.num_microbatches - (problem.num_stages - 1) - MARGIN_PAIRS
    return (pair >= MARGIN_PAIRS + FREE_PAIRS) & (pair < end - FREE_PAIRS)


def splice(
    problem: PlanningProblem,
    base: np.ndarray,
    pattern: CyclePattern,
    deadline_s: float,
    max_nodes: int = SPLICE_NODES,
    relaxed: bool = False,
    progress: Optional[Progress] = None,
) -> List[np.ndarray]:
    """``base`` with ``pattern`` in its interior, once per phase, ends re-chosen by MILP.

    Args:
        problem: A 1F1B problem (:func:`applies`).
        base: The plan whose ends are kept (option index per node).
        pattern: The steady-state pattern.
        deadline_s: Iteration-time budget (s).
        max_nodes: Branch-and-bound nodes of each MILP.
        relaxed: Solve each MILP's LP relaxation instead and round its schedule
            (:meth:`.rounding.Rounder.from_schedule`): a fraction of a second per phase where
            the MILP takes half a minute, for about 0.05 pp less (GPT-3/A40 8 x 96).
        progress: Told each phase (with the fraction of the phases done).

    Returns:
        The plans found (each meets the deadline).
    """
    rounder = Rounder(problem, group_hulls(problem)) if relaxed else None
    pair = steady_pair(problem)
    first = MARGIN_PAIRS
    end = problem.num_microbatches - (problem.num_stages - 1) - MARGIN_PAIRS
    interior = np.flatnonzero((pair >= first) & (pair < end))
    fixed = held_nodes(problem)
    groups = problem.node_group
    out = []
    for phase in range(pattern.num_pairs):
        report(
            progress,
            f"splicing the pattern ({pattern.saved_per_pair_j:.1f} J per pair): phase "
            f"{phase + 1}/{pattern.num_pairs}",
            phase / pattern.num_pairs,
        )
        plan = base.copy()
        plan[interior] = pattern.choices[
            groups[interior], (pair[interior] - first + phase) % pattern.num_pairs
        ]
        allowed = [
            plan[v : v + 1] if fixed[v] else problem.candidates[int(groups[v])]
            for v in range(problem.num_nodes)
        ]
        if rounder is not None:
            relaxation = solve_milp_result(problem, deadline_s, allowed=allowed, relax=True)
            if relaxation.finish_s is not None and relaxation.durations_s is not None:
                out += list(
                    rounder.from_schedule(
                        relaxation.finish_s, relaxation.durations_s, deadline_s, allowed
                    )
                )
            continue
        result = solve_milp_result(
            problem, deadline_s, allowed=allowed, max_nodes=max_nodes, time_limit_s=300.0
        )
        if result.choices is not None:
            out.append(result.choices)
    return out


def improve(
    problem: PlanningProblem,
    plans: Sequence[np.ndarray],
    deadline_s: float,
    progress: Optional[Progress] = None,
    light: bool = False,
    splice_progress: Optional[Progress] = None,
) -> List[np.ndarray]:
    """Plans with a steady-state pattern spliced into the best of ``plans`` at ``deadline_s``.

    The pattern keeps the all-max period, stretched by ``deadline_s`` over the all-max
    plan's iteration time when the deadline is longer. ``light``: the band search of
    :data:`LIGHT_BANDS` once, and the splice's relaxations rounded (seconds instead of
    minutes at 8 x 96, for about 0.05 pp less on GPT-3/A40). ``progress`` is told the pattern
    search's steps, ``splice_progress`` (default: ``progress``) each phase of the splice.

    Returns:
        The spliced plans (empty when ``problem`` has too few pairs or nothing was found).
    """
    best = best_within(problem, plans, deadline_s)
    if best is None or not applies(problem):
        return []
    report(progress, f"steady-state pattern at T <= {deadline_s:.4f} s", 0.0)
    allmax_s = iteration_time(
        problem, problem.opt_time[problem.node_group, problem.allmax_choices()]
    )
    stretch = max(1.0, deadline_s / allmax_s)
    period_s = allmax_period_s(problem) * stretch
    if light:
        pattern = find_pattern(
            problem, period_s, bands=LIGHT_BANDS, band_sweeps=1, progress=progress
        )
    else:
        pattern = find_pattern(problem, period_s, progress=progress)
    if pattern is None:
        return []
    splicing = splice_progress or progress
    return splice(problem, best, pattern, deadline_s, relaxed=light, progress=splicing)
