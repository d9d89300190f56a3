"""The ``lp`` solver: convex-hull LP sweep with rounding and slack filling (the default).

For a sweep of deadlines ``T`` from the fastest plan up to the least-energy one (or only the
deadlines given in ``deadlines_s``, e.g. the one an energy policy asks for):

1. Solve the convex-hull LP (:mod:`.model`) for ``T``, warm-started from the previous
   deadline's basis. Up to ``max_exact_nodes`` instructions the LP is exact (its optimum is a
   lower bound on any plan's energy at ``T``); above, the 1F1B steady state shares clocks and
   follows a periodic schedule (:mod:`.layout`), which keeps the LP's size independent of
   the number of microbatches.
2. Dive (``dive_rounds``): pin every class whose LP duration lies inside a hull segment to
   the segment's faster end and re-solve (on a second HiGHS model, so the sweep keeps its
   basis). The LP then re-distributes time around the pinned instructions.
3. Turn every LP optimum into real plans (:mod:`.rounding`), all deadlines in one batch:
   in topological order every instruction takes the cheapest profiled frequency that still
   finishes by its LP finish time, once among all candidates and once among hull vertices
   only; then leftover slack is filled.
4. Refine (``refine_deadlines``, by default only the no-slowdown deadline ``T_allmax``):
   instructions the LP put inside a long hull segment are re-modelled and decided one by one
   (:mod:`.refine`), then rounded among their own hull's vertices.
5. Search (:mod:`.search`) at the refine deadlines: polish the best plan with small
   mixed-integer programs over windows of the schedule (:mod:`.polish`), splice a
   steady-state clock pattern into long 1F1B pipelines (:mod:`.steady`) and polish its
   seams, re-optimise with the whole MILP a window at a time (:mod:`.reoptimize`). How hard
   each searches is the effort level's (``planner.effort``, :mod:`.effort`): ``balanced`` by
   default, ``thorough`` for the last tenths of a percent, ``fast`` for no MILP at all.
6. Fill gaps (:mod:`.gaps`): where neighbouring Pareto-optimal plans are more than
   ``max_gap_rel`` (0.5 %) apart in iteration time, solve the LP and small MILPs inside
   (as many as the effort level allows).

Every plan goes to the frontier, which re-simulates them and keeps the Pareto-optimal ones.

Deadlines are spaced geometrically (``relative_step``, 0.4 % by default) so every iteration
time in the range has a plan close to it; the sweep stops once the LP's energy has risen for
``patience`` deadlines in a row (past the least-energy point the energy only grows).
:attr:`LPSolver.bounds` keeps ``(T, LP energy)`` of the last solve for reporting.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from perseus.planner.frontier import build_frontier, density_gaps
from perseus.planner.problem import PlanningProblem
from perseus.planner.progress import WorkMeter, announce
from perseus.planner.simulate import iteration_time
from perseus.planner.solvers import register_solver
from perseus.planner.solvers.base import ChoiceSolver, Progress, report
from perseus.planner.solvers.lp import cost
from perseus.planner.solvers.lp.effort import DEFAULT_EFFORT, effort_settings
from perseus.planner.solvers.lp.gaps import (
    MAX_GAP_REL,
    fill_gaps,
    gap_deadlines,
    prove_empty,
    times,
)
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.layout import default_layout
from perseus.planner.solvers.lp.model import HullLP, LPSolution, fractional_classes
from perseus.planner.solvers.lp.polish import WINDOW_NODES
from perseus.planner.solvers.lp.reoptimize import MAX_SIZE
from perseus.planner.solvers.lp.rounding import Rounder
from perseus.planner.solvers.lp.search import DeadlineSearch
from perseus.planner.solvers.lp.steady.splice import applies as steady_applies

#: Up to this many instructions the LP is exact (no shared clocks).
MAX_EXACT_NODES = 2048
#: Frontier steps tried per solve by the emptiness proof.
MAX_PROOFS = 4
#: Polish only plans this far (fraction of the all-max energy) above the LP bound.
POLISH_GAP = 0.0015
#: LP solutions rounded together (bounds the memory of one rounding batch).
_ROUND_BATCH = 64


def time_range(problem: PlanningProblem) -> Tuple[float, float, float]:
    """Iteration times of the fastest, the all-max and the slowest-candidate plans (s)."""
    groups = problem.node_group
    fastest = np.array([problem.opt_time[g, c[0]] for g, c in enumerate(problem.candidates)])
    slowest = np.array([problem.opt_time[g, c[-1]] for g, c in enumerate(problem.candidates)])
    allmax_t = problem.opt_time[groups, problem.allmax_choices()]
    return (
        iteration_time(problem, fastest[groups]),
        iteration_time(problem, allmax_t),
        iteration_time(problem, slowest[groups]),
    )


@register_solver("lp")
class LPSolver(ChoiceSolver):
    """Convex-hull LP over a sweep of deadlines, each solution made a real plan.

    Args:
        relative_step: Ratio between consecutive deadlines, minus one.
        patience: Stop after the LP energy rose this many deadlines in a row.
        max_deadlines: Hard cap on the number of deadlines.
        dive_rounds: Per deadline, how many times fractional classes are pinned to their
            faster hull vertex and the LP re-solved (each round adds plans).
        refine_deadlines: Run the jump refinement (:mod:`.refine`) and the polish on this
            many deadlines, starting at the all-max plan's time (the no-slowdown policy's
            deadline) and going up; 0 turns both off.
        refine_trials: Pin-and-re-solve trials of one refinement round.
        polish_gap: Search (polish, splice, re-optimise) only while the best plan's energy
            is more than this fraction of the all-max energy above the LP bound with time
            windows (otherwise it gains little).
        reoptimize_max_size: Re-optimise only problems of at most this many instructions
            (a sweep takes about 40 s at 384 instructions on one core, growing with the
            square of the size).
        max_gap_rel: Largest allowed relative iteration-time step between neighbouring
            frontier plans; wider gaps are filled afterwards.
        max_exact_nodes: Largest problem (instructions) solved with the exact LP; larger
            1F1B problems share clocks in the steady state (:mod:`.layout`).
        prove_gaps: Try to prove steps the gap filling left open empty (exact LP only);
            :attr:`empty_gaps` lists the proven ones.
        deadlines_s: Solve only at these deadlines (e.g. the one an energy policy asks for)
            instead of sweeping; no gap filling then. A deadline below the fastest plan's
            iteration time is solved at that time.
        effort: ``planner.effort``: ``fast``, ``balanced`` (default) or ``thorough``, the
            search settings of :mod:`.effort`.
        **search: Single search settings instead of the effort level's (the fields of
            :class:`.effort.SearchSettings`, e.g. ``polish_nodes=0``); the gap-filling MILPs
            only run for problems solved with the exact LP (MILPs over tens of thousands of
            instructions take minutes each).
    """

    def __init__(
        self,
        relative_step: float = 0.004,
        patience: int = 3,
        max_deadlines: int = 2000,
        dive_rounds: int = 1,
        refine_deadlines: int = 1,
        refine_trials: int = 400,
        polish_gap: float = POLISH_GAP,
        reoptimize_max_size: int = MAX_SIZE,
        max_gap_rel: float = MAX_GAP_REL,
        max_exact_nodes: int = MAX_EXACT_NODES,
        prove_gaps: bool = True,
        deadlines_s: Optional[Sequence[float]] = None,
        effort: str = DEFAULT_EFFORT,
        **search: Any,
    ) -> None:
        """Store the sweep settings.

        Raises:
            ConfigError: an unknown effort level. TypeError: an unknown search setting.
        """
        self.relative_step = relative_step
        self.patience = patience
        self.max_deadlines = max_deadlines
        self.dive_rounds = dive_rounds
        self.refine_deadlines = refine_deadlines
        self.refine_trials = refine_trials
        self.polish_gap = polish_gap
        self.reoptimize_max_size = reoptimize_max_size
        self.effort = str(effort)
        self.settings = dataclasses.replace(effort_settings(effort), **search)
        self.max_gap_rel = max_gap_rel
        self.max_exact_nodes = max_exact_nodes
        self.deadlines_s = None if deadlines_s is None else [float(d) for d in deadlines_s]
        self.prove_gaps = prove_gaps
        self.empty_gaps: List[Tuple[float, float, str]] = []
        self.bounds: List[Tuple[float, float]] = []
        self.exact_bounds = True
        self.elapsed_s = 0.0

    def solve_choices(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[np.ndarray]:
        """Candidate plans along the frontier as option indices (see the module docstring).

        ``progress`` gets the fraction of the expected work done (:mod:`.cost`,
        :class:`perseus.planner.progress.WorkMeter`); one that has an ``expect`` method is
        told the stages and their expected seconds first (:func:`.progress.announce`).
        """
        began = time.perf_counter()
        report(progress, "building the LP", 0.0)
        hulls = group_hulls(problem)
        layout = default_layout(problem, self.max_exact_nodes)
        self.exact_bounds = layout.is_identity
        model = HullLP(problem, hulls, layout=layout)
        rounder = Rounder(problem, hulls)
        deadlines, refine_at = self._deadlines(problem)
        meter = WorkMeter(self._forecast(problem, model, rounder, deadlines, refine_at), progress)
        announce(progress, meter.stages)
        plans, at_refine = self._sweep(model, rounder, deadlines, refine_at, meter)
        if self._fills_gaps():
            self._resize_gaps(problem, plans, layout.is_identity, meter)
        search = DeadlineSearch(
            problem,
            hulls,
            self.settings,
            self.polish_gap,
            self.refine_trials,
            self.reoptimize_max_size,
        )
        for k, solution in enumerate(at_refine):
            plans += search.run(model, rounder, solution, meter, k, len(at_refine))
        if self._fills_gaps():
            meter.update("gap filling", 0.0, "filling gaps between neighbouring plans")
            frontier = build_frontier(problem, plans)
            plans = [frontier.choices(p) for p in frontier.points]
            plans += fill_gaps(
                problem,
                frontier,
                model.solve,
                lambda solution: list(rounder.from_solutions([solution])),
                max_gap_rel=self.max_gap_rel,
                max_milps=self.settings.gap_milps if layout.is_identity else 0,
                progress=meter.reporter("gap filling"),
                light=self.settings.gap_light,
            )
            if layout.is_identity and self.prove_gaps:
                self.empty_gaps = self._prove_gaps(problem, plans, meter)
        self.elapsed_s = time.perf_counter() - began
        meter.finish(cost.STAGES[-1])
        report(progress, f"{len(plans)} candidate plans in {self.elapsed_s:.1f} s", 1.0)
        return plans

    def _fills_gaps(self) -> bool:
        return self.deadlines_s is None and self.max_gap_rel > 0

    def _forecast(
        self,
        problem: PlanningProblem,
        model: HullLP,
        rounder: Rounder,
        deadlines: List[float],
        refine_at: List[float],
    ) -> List[Tuple[str, float]]:
        """Expected seconds of every stage (:mod:`.cost`; probed at the first refined deadline)."""
        settings = self.settings
        probed = cost.Probe(rounding_loss=0.0, long_classes=0)
        if refine_at:
            probed = cost.probe(problem, model, rounder, refine_at[0])
        window_step = max(1, WINDOW_NODES // 2)
        shape = cost.SolveShape(
            num_nodes=problem.num_nodes,
            lp_size=model.layout.num_classes,
            num_deadlines=len(deadlines),
            sweeps=self.deadlines_s is None,
            num_refine=len(refine_at),
            exact=model.layout.is_identity,
            fill_gaps=self._fills_gaps(),
            polish_windows=len(range(0, max(1, problem.num_nodes - window_step), window_step)),
            steady=steady_applies(problem),
        )
        return cost.solve_stages(
            shape,
            settings,
            probed,
            self.polish_gap,
            self.reoptimize_max_size,
            self.refine_trials,
        )

    def _sweep(
        self,
        model: HullLP,
        rounder: Rounder,
        deadlines: List[float],
        refine_at: List[float],
        meter: WorkMeter,
    ) -> Tuple[List[np.ndarray], List[LPSolution]]:
        """The LP sweep: rounded plans, and the LP optima at the deadlines to refine."""
        plans: List[np.ndarray] = []
        pending: List[LPSolution] = []
        at_refine: List[LPSolution] = []
        self.bounds = []
        rises = 0
        # A frontier's sweep stops when the LP's energy rises: expect the forecast's share.
        per_deadline_s = meter.stage("LP sweep").expected_s / max(1, len(deadlines))
        expected = len(deadlines)
        if self.deadlines_s is None:
            expected = min(len(deadlines), max(1, math.ceil(cost.SWEEP_SHARE * len(deadlines))))
            per_deadline_s = meter.stage("LP sweep").expected_s / expected
        for i, deadline in enumerate(deadlines):
            solution = model.solve(deadline)
            pending += [solution, *self._dive(model, solution)]
            if deadline in refine_at:
                at_refine.append(solution)
            if len(pending) >= _ROUND_BATCH:
                plans += list(rounder.from_solutions(pending))
                pending = []
            rising = bool(self.bounds) and solution.energy_j > self.bounds[-1][1]
            self.bounds.append((deadline, solution.energy_j))
            rises = rises + 1 if rising else 0
            if i + 1 >= expected and i + 1 < len(deadlines):
                # Longer than forecast: at least the rises still to come.
                expected = min(len(deadlines), i + 1 + self.patience - rises)
                meter.resize("LP sweep", expected * per_deadline_s)
            meter.update("LP sweep", (i + 1) / expected, f"LP sweep: deadline {i + 1}/{expected}")
            if rises >= self.patience and self.deadlines_s is None:
                break
        plans += list(rounder.from_solutions(pending))
        meter.resize("LP sweep", len(self.bounds) * per_deadline_s)
        meter.finish("LP sweep")
        return plans, at_refine

    def _resize_gaps(
        self, problem: PlanningProblem, plans: List[np.ndarray], exact: bool, meter: WorkMeter
    ) -> None:
        """The gap filling's and the proofs' expected seconds for the gaps the sweep left.

        The gap MILPs (exact LP only) fill the gaps' deadlines up to the effort's count; the
        proofs try the gaps that stay open (as many as there are now, at most
        :data:`MAX_PROOFS`).
        """
        frontier = build_frontier(problem, plans)
        gaps = density_gaps(frontier, self.max_gap_rel)
        if exact and self.settings.gap_milps > 0:
            count = sum(len(gap_deadlines(*times(a, b), self.max_gap_rel)) for a, b in gaps)
            milps_s = cost.gap_milps_s(problem.num_nodes, min(count, self.settings.gap_milps))
            meter.resize("gap filling", meter.stage("gap filling").expected_s + milps_s)
        if exact and self.prove_gaps:
            proofs = min(len(gaps), MAX_PROOFS)
            meter.resize("gap proofs", cost.proofs_s(problem.num_nodes, proofs))

    def _prove_gaps(
        self, problem: PlanningProblem, plans: List[np.ndarray], meter: WorkMeter
    ) -> List[Tuple[float, float, str]]:
        """Steps still over ``max_gap_rel`` that hold no Pareto-optimal plan (see gaps)."""
        frontier = build_frontier(problem, plans)
        out = []
        gaps = density_gaps(frontier, self.max_gap_rel)[:MAX_PROOFS]
        meter.resize("gap proofs", cost.proofs_s(problem.num_nodes, len(gaps)))
        for k, (a, b) in enumerate(gaps):
            meter.update("gap proofs", k / len(gaps), f"proving gap {k + 1} empty")
            how = prove_empty(problem, a, b, self.settings.proof_milp_nodes)
            if how is not None:
                out.append((a.iteration_time_s, b.iteration_time_s, how))
        return out

    def _dive(self, model: HullLP, solution: LPSolution) -> List[LPSolution]:
        """LP optima with fractional classes pinned to their faster hull vertex."""
        out: List[LPSolution] = []
        if self.dive_rounds:
            model.start_dive()
        for _ in range(self.dive_rounds):
            classes, lower = fractional_classes(model, solution)
            if not len(classes):
                break
            model.fix(classes, lower)
            pinned = model.resolve()
            if pinned is None:  # cannot happen (shorter durations keep the old optimum valid)
                break
            solution = pinned
            out.append(solution)
        return out

    def _deadlines(self, problem: PlanningProblem) -> Tuple[List[float], List[float]]:
        """The deadlines to solve and the ones to refine (see ``refine_deadlines``)."""
        t_fast, t_allmax, t_slow = time_range(problem)
        self.t_allmax_s = t_allmax
        if self.deadlines_s is not None:
            # No plan is faster than the fastest candidates: solve there instead.
            out = sorted({max(t_fast, d) for d in self.deadlines_s})
            return out, out[: max(0, self.refine_deadlines) and len(out)]
        # Geometric from the fastest plan up, with the all-max time itself always included
        # (the no-slowdown policy's deadline).
        ratio = 1.0 + self.relative_step
        t_top = max(t_slow, t_fast)
        count = max(1, math.ceil(math.log(t_top / t_fast) / math.log(ratio)))
        grid = [t_fast * ratio**k for k in range(count)] + [t_top]
        near = [t for t in grid if abs(t / t_allmax - 1) > self.relative_step / 4]
        out = sorted(set(near) | {t_allmax})[: self.max_deadlines]
        first = out.index(t_allmax) if t_allmax in out else len(out)
        return out, out[first : first + self.refine_deadlines]
