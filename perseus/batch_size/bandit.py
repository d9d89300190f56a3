"""Thompson sampling over batch sizes, with what is known about a run's cost built in.

A run's cost is ``epochs to reach the target x cost of one epoch``. The cost of one epoch at a
batch size (at its chosen power limit) is measured every epoch and hardly varies; what varies
from run to run is how many epochs it takes. Each arm's log epochs are modelled by
:class:`~perseus.batch_size.posterior.CostPosterior`: run-to-run noise pooled over the
arms (with a weak prior, so a few identical counts do not make an arm look certain), and
neighbouring batch sizes' mean epochs correlated (an arm seen once borrows strength from its
neighbours; when they converge in similar numbers of epochs the choice rests on the epoch costs,
which are known).

Every decision draws one joint sample of the arms' mean log epochs and takes the arm with the
lowest expected cost ``epoch cost x exp(mu_b + noise / 2)``. Before any arm has been run twice
the arm with the lowest observed cost is taken (run again), which gives the first repeat. Arms
without epoch costs (runs reported as totals only) are modelled on their total cost. Standard
library only.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from perseus.batch_size.posterior import ArmRuns, CostPosterior
from perseus.batch_size.store import FAILED, REACHED, RunRow

BANDIT = "bandit"


@dataclass(frozen=True)
class Arm:
    """What is known about one batch size.

    Attributes:
        batch_size: The batch size.
        costs: Cost of each run counted for it.
        epoch_cost: Mean cost of one of its epochs; None when unknown (totals-only reports).
    """

    batch_size: int
    costs: Sequence[float]
    epoch_cost: Optional[float] = None

    @property
    def unit(self) -> float:
        """The cost the runs are measured in (an epoch's, or 1)."""
        return self.epoch_cost if self.epoch_cost and self.epoch_cost > 0 else 1.0

    def log_units(self) -> List[float]:
        """``log(cost / unit)`` of each run (log epochs when the epoch cost is known)."""
        return [math.log(max(c, 1e-300) / self.unit) for c in self.costs]

    def runs(self) -> ArmRuns:
        """Its runs as the posterior takes them."""
        # Runs reported as totals only (no epoch cost) are off the neighbour model.
        on_chain = bool(self.epoch_cost and self.epoch_cost > 0) or not self.costs
        return ArmRuns(self.batch_size, tuple(self.log_units()), on_chain)


def arms_from_runs(
    runs: Sequence[RunRow], batch_sizes: Sequence[int], *, with_failures: bool
) -> List[Arm]:
    """The arms ``batch_sizes`` with the costs of their converged runs (and epoch costs).

    With ``with_failures``, a run the bandit chose that failed counts too: as its own cost plus
    the expected cost of a run of the cheapest batch size (the job still had to be trained).
    """
    converged: Dict[int, List[float]] = {b: [] for b in batch_sizes}
    epoch_costs: Dict[int, List[float]] = {b: [] for b in batch_sizes}
    for run in runs:
        if run.batch_size not in converged or run.cost is None:
            continue
        if run.epoch_cost is not None:
            epoch_costs[run.batch_size].append(run.epoch_cost)
        if run.status == REACHED:
            converged[run.batch_size].append(run.cost)
    costs = {b: list(c) for b, c in converged.items()}
    if with_failures:
        retry = min((statistics.fmean(c) for c in converged.values() if c), default=0.0)
        for run in runs:
            if run.batch_size in costs and run.status == FAILED and run.phase == BANDIT:
                costs[run.batch_size].append((run.cost or 0.0) + retry)
    return [
        Arm(b, costs[b], statistics.fmean(epoch_costs[b]) if epoch_costs[b] else None)
        for b in batch_sizes
    ]


def thompson_choice(
    arms: Sequence[Arm],
    rng: random.Random,
    posterior: Optional[CostPosterior] = None,
) -> int:
    """The batch size to run next among ``arms`` (each with at least one observation).

    Args:
        arms: Candidates and their observed costs.
        rng: Source of the samples (seed it for reproducible choices).
        posterior: The job's posterior (every batch size, the arms among them); default: one
            from ``arms`` alone.
    """
    if not arms:
        raise ValueError("thompson_choice needs at least one arm")
    observed = [a for a in arms if a.costs]
    if len(observed) < len(arms):
        raise ValueError("every arm needs an observation; explore the others first")
    if all(len(a.costs) < 2 for a in arms):
        # Nothing repeated yet: the noise is unknown; run the cheapest again.
        cheapest = min(arms, key=lambda a: (statistics.fmean(a.costs), a.batch_size))
        return cheapest.batch_size
    if posterior is None:
        units = {a.batch_size: a.epoch_cost for a in arms if a.epoch_cost}
        posterior = CostPosterior([a.runs() for a in arms], units)
    draw = posterior.sample(rng)
    scores = {
        a.batch_size: math.log(a.unit) + draw[a.batch_size] + posterior.noise(a.batch_size) / 2
        for a in arms
    }
    return min(scores, key=lambda b: (scores[b], b))


def best_arm(arms: Sequence[Arm]) -> Optional[int]:
    """The batch size with the lowest mean observed cost (None when none has an observation)."""
    scored = [(statistics.fmean(a.costs), a.batch_size) for a in arms if a.costs]
    return min(scored)[1] if scored else None
