"""Jump refinement: hull segments that skip over a sharp energy drop, decided one by one.

Some profiles have a sharp energy drop between two neighbouring frequencies (e.g. GPT-3 on
A40: the backward pass at 960 MHz costs far less than at 1170 MHz for barely more time). The
convex hull then has a long segment jumping over many options, and the LP happily runs an
instruction "21 % of the way" along it. No real frequency does that, and in the pipeline's
steady state the extra time of the slow end rarely fits into one instruction's slack, so
rounding loses most of what the LP promised.

:class:`JumpRefiner` re-models every instruction (or class of instructions sharing a clock,
see :mod:`.layout`) the LP left inside such a *long* segment (longer than ``min_jump_rel`` of
its fastest time): its hull becomes the hull of the options faster than the segment's slow
end (which uses the skipped options), plus the slow end as a *locked* segment
(:attr:`.hull.GroupHull.locked_tail`). The LP of that model is solved, then the classes are
tried one at a time (largest LP fill first): pinned to the slow end, re-solved from the
previous basis, kept unless the LP's energy rises (a neutral pin still leaves one fractional
class fewer to round). The LP then finds where the extra time is best taken from (slack
shared along paths, cheaper instructions sped up), which single-instruction rounding cannot.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.progress import Progress
from perseus.planner.solvers.lp.hull import GroupHull, lower_hull
from perseus.planner.solvers.lp.model import HullLP, LPSolution


def hull_below(problem: PlanningProblem, group: int, slow_end_s: float) -> GroupHull:
    """Hull of a group's candidates faster than ``slow_end_s``, plus that end as a locked tail.

    Args:
        problem: The planning problem.
        group: Group index (``2 * stage + kind``).
        slow_end_s: Time of the candidate that becomes the locked last vertex.
    """
    cand = problem.candidates[group]
    times = problem.opt_time[group, cand]
    fast = cand[times < slow_end_s - 1e-12]
    end = cand[np.argmin(np.abs(times - slow_end_s))]
    t = problem.opt_time[group, fast]
    c = problem.opt_effective[group, fast]
    keep = fast[lower_hull(t, c)]
    options = np.append(keep, end)
    t = problem.opt_time[group, options]
    c = problem.opt_effective[group, options]
    lengths = np.diff(t)
    return GroupHull(
        time_s=t,
        cost_j=c,
        lengths_s=lengths,
        slopes=np.diff(c) / lengths,
        options=options,
        locked_tail=1,
    )


class JumpRefiner:
    """Decides long hull segments instruction by instruction (see the module docstring).

    Args:
        problem: The planning problem.
        hulls: The groups' hulls (index = group).
        min_jump_rel: A segment is long when longer than this fraction of the node's
            fastest time.
        max_trials: At most this many pin-and-re-solve trials per round (a count, never
            seconds: the refinement is the same on a busy machine).
        rounds: Re-modelling rounds (see :meth:`refine`).
    """

    def __init__(
        self,
        problem: PlanningProblem,
        hulls: List[GroupHull],
        min_jump_rel: float = 0.02,
        max_trials: int = 2000,
        rounds: int = 2,
    ) -> None:
        """Store the settings; hulls below a jump are built on demand and cached."""
        self.problem = problem
        self.hulls = list(hulls)
        self.min_jump_rel = min_jump_rel
        self.max_trials = max_trials
        self.rounds = rounds
        self._cache: Dict[Tuple[int, int], int] = {}
        self.trials = 0

    def long_segments(
        self, model: HullLP, solution: LPSolution
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Classes inside a long segment: ``(classes, segment columns, fills)``, fill descending."""
        fill = solution.fill
        cols = np.flatnonzero(
            (fill > 1e-6)
            & (fill < 1 - 1e-6)
            & (model.seg_len > self.min_jump_rel * model.t0[model.seg_class])
        )
        order = np.argsort(-fill[cols], kind="stable")
        cols = cols[order]
        return model.seg_class[cols], cols, fill[cols]

    def refine(
        self, model: HullLP, solution: LPSolution, progress: Optional[Progress] = None
    ) -> List[Tuple[LPSolution, np.ndarray]]:
        """LP solutions with long segments decided; empty when there is none to decide.

        Each round re-models the classes the last solution left inside a long segment of
        their group's hull, keeps the pins of earlier rounds and pins greedily again.

        Args:
            model: The group-hull LP ``solution`` came from (its hulls are ``self.hulls``).
            solution: Its optimum for some deadline.
            progress: Told the trials (the fraction: rounds and trials of this round done).

        Returns:
            Per round, ``(solution, node_hull)`` for the re-modelled LP's optimum before
            and (if a pin was kept) after the greedy pinning; ``node_hull`` maps every node
            to its hull in :attr:`hulls`.
        """
        layout = model.layout
        groups = layout.class_group
        class_hull = groups.copy()
        pinned: List[int] = []
        pinned_s: List[float] = []
        out: List[Tuple[LPSolution, np.ndarray]] = []
        current = solution
        for round_no in range(self.rounds):
            classes, cols, _ = self.long_segments(model, current)
            fresh = class_hull[classes] == groups[classes]
            classes, cols = classes[fresh], cols[fresh]
            if not len(classes):
                break
            class_hull = class_hull.copy()
            slow_end = np.empty(len(classes))
            for i, (c, col) in enumerate(zip(classes.tolist(), cols.tolist())):
                g = int(groups[c])
                slow_end[i] = self.hulls[g].time_s[int(model.seg_rank[col]) + 1]
                class_hull[c] = self._hull_index(g, float(slow_end[i]))
            model = HullLP(self.problem, self.hulls, class_hull, layout)
            model.pin(np.asarray(pinned, dtype=np.int64), np.asarray(pinned_s))
            current = model.solve(solution.deadline_s)
            node_hull = class_hull[layout.node_class]
            out.append((current, node_hull))
            tell = self._teller(progress, round_no, len(classes), solution.deadline_s)
            kept, current = self._greedy(model, current, classes, slow_end, tell)
            if kept:
                pinned += [int(classes[i]) for i in kept]
                pinned_s += [float(slow_end[i]) for i in kept]
                out.append((current, node_hull))
        return out

    def _greedy(
        self,
        model: HullLP,
        current: LPSolution,
        classes: np.ndarray,
        slow_end: np.ndarray,
        tell: Callable[[int], None],
    ) -> Tuple[List[int], LPSolution]:
        """Pin ``classes`` one by one (in order) at ``slow_end``; keep pins not raising energy.

        Returns:
            Positions in ``classes`` of the kept pins, and the optimum with them.
        """
        kept: List[int] = []
        for i in range(len(classes)):
            if i >= self.max_trials:
                break
            self.trials += 1
            tell(i)
            one = classes[i : i + 1]
            model.pin(one, slow_end[i : i + 1])
            trial = model.try_solve()
            if trial is not None and trial.energy_j <= current.energy_j * (1 + 1e-9):
                current = trial
                kept.append(i)
            else:
                model.unpin(one)
        return kept, current

    def _teller(
        self, progress: Optional[Progress], round_no: int, num_classes: int, deadline_s: float
    ) -> Callable[[int], None]:
        """``tell(trial)``: reports a round's trials to ``progress`` (every 16th)."""
        trials = max(1, min(num_classes, self.max_trials))

        def tell(trial: int) -> None:
            if progress is not None and trial % 16 == 0:
                progress(
                    f"refining T <= {deadline_s:.4f} s: round {round_no + 1}, trial "
                    f"{trial + 1}/{trials}",
                    (round_no + trial / trials) / self.rounds,
                )

        return tell

    def _hull_index(self, group: int, slow_end_s: float) -> int:
        """Index in ``self.hulls`` of the group's hull below ``slow_end_s`` (cached)."""
        key = (group, round(slow_end_s * 1e9))
        if key not in self._cache:
            self._cache[key] = len(self.hulls)
            self.hulls.append(hull_below(self.problem, group, slow_end_s))
        return self._cache[key]
