"""Thompson sampling over batch sizes, with what is known about a run's cost built in.

A run's cost is ``epochs to reach the target x cost of one epoch``. The cost of one epoch at a
batch size (at its chosen power limit) is measured every epoch and hardly varies; what varies
from run to run is how many epochs it takes. So each arm is modelled as

    log(run cost / epoch cost of the arm) = log(epochs) ~ Normal(mu_b, sigma^2)

* ``sigma^2`` (run-to-run noise) is pooled over every arm's repeated runs, and is never taken
  below the spread a count of whole epochs hides (a run that took 7 epochs would have needed
  anything from 6.5 to 7.5: variance ``1 / (12 E^2)`` in log terms), so a few identical counts
  do not make an arm look certain.
* The arms' ``mu_b`` share a prior ``Normal(mu_0, tau^2)`` (partial pooling): when batch sizes
  converge in similar numbers of epochs, an arm seen once borrows strength from the others and
  the choice rests on the epoch costs, which are known; when they differ, each arm speaks for
  itself. ``tau`` is drawn from its posterior under a flat prior (on a grid), ``mu_0`` given
  ``tau``, then each ``mu_b``.

Every decision draws one set of samples and takes the arm with the lowest expected cost
``epoch cost x exp(mu_b + sigma^2 / 2)``. Before any arm has been run twice the noise cannot be
estimated, and the arm with the lowest observed cost is taken (run again), which gives the
first repeat. Arms without epoch costs (runs reported as totals only) are modelled on their
total cost. Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from perseus.batch_size.store import FAILED, REACHED, RunRow

BANDIT = "bandit"

# Grid points for the posterior of tau.
_TAU_GRID = 64
# Keeps variances strictly positive (all runs identical).
_MIN_VAR = 1e-12


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


def _quantization_var(arm: Arm, mean_log: float) -> float:
    # Epoch counts are whole numbers: +-0.5 epoch of uniform rounding error.
    if arm.epoch_cost is None:
        return 0.0
    return 1.0 / (12.0 * math.exp(2.0 * mean_log))


def thompson_choice(arms: Sequence[Arm], rng: random.Random) -> int:
    """The batch size to run next among ``arms`` (each with at least one observation).

    Args:
        arms: Candidates and their observed costs.
        rng: Source of the samples (seed it for reproducible choices).
    """
    if not arms:
        raise ValueError("thompson_choice needs at least one arm")
    observed = [a for a in arms if a.costs]
    if len(observed) < len(arms):
        raise ValueError("every arm needs an observation; explore the others first")
    y = {a.batch_size: a.log_units() for a in arms}
    mean = {b: statistics.fmean(v) for b, v in y.items()}
    count = {b: len(v) for b, v in y.items()}
    dof = sum(n - 1 for n in count.values())
    if dof == 0:
        cheapest = min(arms, key=lambda a: (a.unit * math.exp(mean[a.batch_size]), a.batch_size))
        return cheapest.batch_size
    sum_sq = sum(sum((v - mean[b]) ** 2 for v in ys) for b, ys in y.items())
    sigma2 = sum_sq / dof
    noise = {a.batch_size: max(sigma2, _quantization_var(a, mean[a.batch_size])) for a in arms}
    noise = {b: max(v, _MIN_VAR) for b, v in noise.items()}
    # Variance of each arm's sample mean.
    v = {b: noise[b] / count[b] for b in noise}
    samples = _sample_means(mean, v, rng)
    scores = {
        a.batch_size: math.log(a.unit) + samples[a.batch_size] + noise[a.batch_size] / 2
        for a in arms
    }
    return min(scores, key=lambda b: (scores[b], b))


def _sample_means(
    mean: Dict[int, float], var: Dict[int, float], rng: random.Random
) -> Dict[int, float]:
    """One posterior draw of every arm's ``mu_b`` under the partial-pooling model."""
    keys = sorted(mean)
    if len(keys) == 1:
        b = keys[0]
        return {b: rng.gauss(mean[b], math.sqrt(var[b]))}
    tau = _sample_tau(mean, var, rng)
    weights = {b: 1.0 / (var[b] + tau * tau) for b in keys}
    total = sum(weights.values())
    mu0 = rng.gauss(sum(weights[b] * mean[b] for b in keys) / total, math.sqrt(1.0 / total))
    if tau <= 0.0:
        return {b: mu0 for b in keys}
    out = {}
    for b in keys:
        precision = 1.0 / (tau * tau) + 1.0 / var[b]
        centre = (mu0 / (tau * tau) + mean[b] / var[b]) / precision
        out[b] = rng.gauss(centre, math.sqrt(1.0 / precision))
    return out


def _sample_tau(mean: Dict[int, float], var: Dict[int, float], rng: random.Random) -> float:
    """A draw of the between-arm spread ``tau`` from its grid posterior (flat prior)."""
    keys = sorted(mean)
    spread = statistics.variance([mean[b] for b in keys])
    top = 3.0 * math.sqrt(max(spread, max(var.values())))
    grid = [top * (i + 0.5) / _TAU_GRID for i in range(_TAU_GRID)]
    log_post = []
    for tau in grid:
        w = {b: 1.0 / (var[b] + tau * tau) for b in keys}
        total = sum(w.values())
        mu = sum(w[b] * mean[b] for b in keys) / total
        log_post.append(
            -0.5 * math.log(total)
            + sum(0.5 * math.log(w[b]) - 0.5 * w[b] * (mean[b] - mu) ** 2 for b in keys)
        )
    peak = max(log_post)
    return rng.choices(grid, weights=[math.exp(x - peak) for x in log_post])[0]


def best_arm(arms: Sequence[Arm]) -> Optional[int]:
    """The batch size with the lowest mean observed cost (None when none has an observation)."""
    scored = [(statistics.fmean(a.costs), a.batch_size) for a in arms if a.costs]
    return min(scored)[1] if scored else None
