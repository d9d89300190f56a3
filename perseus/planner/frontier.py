"""The honest frontier: candidate plans re-simulated, deduplicated and Pareto-filtered.

Whatever a solver believes about its plans, every point here is the re-simulation of DESIGN §5
with the measured profile. The all-max plan is always a point (``Frontier.allmax``), even when
another plan is as fast and cheaper (then it is kept, marked, for the baseline). Points are
sorted by iteration time; ``plan_id`` is the position (the fastest plan is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from perseus.errors import SolverError
from perseus.formats.plan.document import Plan, PlanStep
from perseus.planner.problem import Freqs, PlanningProblem
from perseus.planner.simulate import simulate_choices

if TYPE_CHECKING:
    import pandas as pd

# Plans closer than this (relative) in both time and energy are the same point.
_REL_TOL = 1e-9
#: Largest allowed relative iteration-time step between neighbouring frontier plans.
MAX_GAP_REL = 0.005

Gap = Tuple["FrontierPoint", "FrontierPoint"]


@dataclass
class FrontierPoint:
    """One plan on the frontier.

    Attributes:
        plan_id: Index in :attr:`Frontier.points` (0 = fastest).
        iteration_time_s: Re-simulated iteration time.
        energy_j: Re-simulated energy.
        freqs: Per stage, one frequency (MHz) per instruction in execution order.
        is_allmax: This is the all-max-frequency plan.
        choices: The same plan as option indices per node (``problem.node_group`` order).
    """

    plan_id: int
    iteration_time_s: float
    energy_j: float
    freqs: Freqs
    is_allmax: bool = False
    choices: Optional[np.ndarray] = field(default=None, repr=False, compare=False)


class Frontier:
    """Pareto-optimal plans of one problem, fastest first.

    Attributes:
        problem: The planning problem.
        points: The plans, sorted by iteration time (energy then strictly decreases, except
            that the all-max plan is kept even when dominated).
        allmax: The all-max-frequency plan (also in ``points``).
        empty_gaps: Steps between neighbouring points proven to hold no Pareto-optimal plan:
            ``(faster time, slower time, how)`` (see :mod:`.solvers.lp.gaps`).
    """

    def __init__(self, problem: PlanningProblem, points: List[FrontierPoint]) -> None:
        """Wrap already-filtered points; use :func:`build_frontier`."""
        self.problem = problem
        self.points = points
        allmax = [p for p in points if p.is_allmax]
        if len(allmax) != 1:
            raise SolverError("a frontier needs exactly one all-max plan")
        self.allmax = allmax[0]
        self.empty_gaps: List[Tuple[float, float, str]] = []

    def __len__(self) -> int:
        return len(self.points)

    def saving(self, point: FrontierPoint) -> float:
        """Energy saved by ``point`` relative to the all-max plan (a fraction)."""
        return 1.0 - point.energy_j / self.allmax.energy_j

    def to_plan(self, point: FrontierPoint) -> Plan:
        """The point as a plan (:mod:`perseus.formats.plan.document`) with re-simulated figures."""
        problem = self.problem
        # A plan of an engine's order names each instruction's pipeline stage (model chunk).
        named = not problem.is_generated
        stages = [
            [
                PlanStep(name, mb, int(f), stage if named else None)
                for (name, mb, stage), f in zip(problem.pipeline_order.actions[s], point.freqs[s])
            ]
            for s in range(problem.num_stages)
        ]
        return Plan(
            schedule=problem.schedule,
            num_stages=problem.num_stages,
            num_microbatches=problem.num_microbatches,
            stages=stages,
            predicted_iteration_time_s=point.iteration_time_s,
            predicted_energy_j=point.energy_j,
            extra={"plan_id": point.plan_id},
        )

    def choices(self, point: FrontierPoint) -> np.ndarray:
        """The point's plan as option indices per node."""
        if point.choices is not None:
            return point.choices
        return self.problem.freqs_to_choices(point.freqs)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per point: plan_id, iteration_time_s, energy_j, saving, is_allmax, ..."""
        import pandas as pd

        rows: List[Dict[str, Any]] = [
            {
                "plan_id": p.plan_id,
                "iteration_time_s": p.iteration_time_s,
                "energy_j": p.energy_j,
                "slowdown": p.iteration_time_s / self.allmax.iteration_time_s - 1.0,
                "saving": self.saving(p),
                "is_allmax": p.is_allmax,
            }
            for p in self.points
        ]
        return pd.DataFrame(rows)


def build_frontier(
    problem: PlanningProblem, assignments: Sequence[Union[Freqs, np.ndarray]]
) -> Frontier:
    """Re-simulate candidate plans and keep the Pareto-optimal ones (plus the all-max plan).

    Args:
        problem: The planning problem.
        assignments: Candidate plans, as per-stage frequencies or per-node option indices.
    """
    allmax = problem.allmax_choices()
    rows = [allmax]
    for a in assignments:
        rows.append(a if isinstance(a, np.ndarray) else problem.freqs_to_choices(a))
    choices = np.unique(np.vstack(rows), axis=0)
    times, energies = simulate_choices(problem, choices)
    allmax_row = int(np.flatnonzero((choices == allmax).all(axis=1))[0])
    keep = pareto_rows(times, energies)
    if allmax_row not in keep:
        keep.append(allmax_row)
    keep.sort(key=lambda r: (times[r], energies[r]))
    points = [
        FrontierPoint(
            plan_id=i,
            iteration_time_s=float(times[r]),
            energy_j=float(energies[r]),
            freqs=problem.choices_to_freqs(choices[r]),
            is_allmax=r == allmax_row,
            choices=choices[r],
        )
        for i, r in enumerate(keep)
    ]
    return Frontier(problem, points)


def pareto_rows(times: np.ndarray, energies: np.ndarray) -> List[int]:
    """Rows not dominated in (time, energy); of near-identical points, the first is kept."""
    order = np.lexsort((energies, times))
    keep: List[int] = []
    best = np.inf
    for r in order.tolist():
        if energies[r] < best * (1 - _REL_TOL):
            keep.append(r)
            best = energies[r]
    return keep


def density_gaps(
    frontier: Frontier, max_gap_rel: float = MAX_GAP_REL, skip_proven: bool = True
) -> List[Gap]:
    """Neighbouring plans between the fastest and the least-energy plan too far apart.

    Args:
        frontier: A frontier.
        max_gap_rel: Largest allowed ``T_next / T - 1``.
        skip_proven: Leave out steps proven empty (:attr:`Frontier.empty_gaps`).

    Returns:
        ``(faster, slower)`` pairs whose iteration times differ by more than ``max_gap_rel``.
    """
    t_least = min(frontier.points, key=lambda p: p.energy_j).iteration_time_s
    inside = [p for p in frontier.points if p.iteration_time_s <= t_least * (1 + 1e-9)]
    proven = {(a, b) for a, b, _ in frontier.empty_gaps} if skip_proven else set()
    return [
        (a, b)
        for a, b in zip(inside, inside[1:])
        if b.iteration_time_s / a.iteration_time_s - 1 > max_gap_rel
        and (a.iteration_time_s, b.iteration_time_s) not in proven
    ]


def max_gap_rel(frontier: Frontier, skip_proven: bool = True) -> float:
    """Largest relative iteration-time step between neighbouring plans (fastest..least energy).

    Steps proven to hold no Pareto-optimal plan are left out unless ``skip_proven`` is False.
    """
    gaps = density_gaps(frontier, 0.0, skip_proven)
    return max((b.iteration_time_s / a.iteration_time_s - 1 for a, b in gaps), default=0.0)
