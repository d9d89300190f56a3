"""The solver interface: a solver proposes candidate frequency plans for a problem.

A solver returns per-stage frequency assignments; it does not have to prune them. The
frontier (:mod:`perseus.planner.frontier`) re-simulates every candidate with the measured
profile, drops duplicates and dominated plans and always adds the all-max plan, so a solver's
own time/energy estimates never reach the user.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List, Optional

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.progress import Progress

__all__ = ["ChoiceSolver", "Progress", "Solver", "report"]


class Solver(ABC):
    """Proposes candidate plans along the iteration-time / energy trade-off."""

    #: Registry name (``planner.solver``).
    name: str = ""

    @abstractmethod
    def solve(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[List[List[int]]]:
        """Candidate plans, each per stage one frequency (MHz) per instruction in order.

        Args:
            problem: The planning problem.
            progress: Called now and then with a message and the fraction done.
        """


class ChoiceSolver(Solver):
    """A solver that works on per-node option indices (cheaper for the frontier to take)."""

    def solve(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[List[List[int]]]:
        """The plans of :meth:`solve_choices` as per-stage frequencies."""
        return [problem.choices_to_freqs(c) for c in self.solve_choices(problem, progress)]

    @abstractmethod
    def solve_choices(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[np.ndarray]:
        """Candidate plans as option indices per node (``problem.candidates`` order).

        Args:
            problem: The planning problem.
            progress: Called now and then with a message and the fraction done.
        """


def report(progress: Optional[Progress], message: str, fraction: float) -> None:
    """Call ``progress`` if given, clamping the fraction to [0, 1]."""
    if progress is not None:
        progress(message, min(1.0, max(0.0, fraction)))
