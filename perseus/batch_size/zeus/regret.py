"""Regret of replayed recurring jobs: per seed, and its spread over seeds.

The regret of one replay is its cumulative cost over the cost of always running the best fixed
(batch size, power limit), known in hindsight, for as many recurrences:
``cumulative cost / (N x best fixed cost per recurrence)`` (1.0: no regret). The best fixed
choice's cost is its *expected* cost per recurrence, so even that choice replayed on a seed's luck
has a regret somewhat above or below 1 (:class:`FixedChoice` replays it, to show the floor luck
sets). Over seeds, a regret is reported as its mean with a 95 % interval (Student's t over the
seeds) and its worst seed. Standard library only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence, Tuple

from perseus.batch_size.zeus.replay import ReplayResult
from perseus.batch_size.zeus.trace import EpochCost
from perseus.profiler.comparison import t975

FIXED = "best-fixed"


@dataclass(frozen=True)
class RegretSummary:
    """One policy's regret on one workload over seeds.

    Attributes:
        policy: The policy's name.
        seeds: The seeds, in order.
        regrets: The regret of each seed's replay (``inf`` for a replay that broke).
        num_broken: Replays that stopped early (the policy could not go on).
    """

    policy: str
    seeds: Tuple[int, ...]
    regrets: Tuple[float, ...]
    num_broken: int

    @property
    def mean(self) -> float:
        """Mean regret over the seeds."""
        return statistics.fmean(self.regrets)

    @property
    def ci95(self) -> Tuple[float, float]:
        """95 % interval of the mean (Student's t over the seeds; the mean twice for one seed)."""
        finite = [r for r in self.regrets if math.isfinite(r)]
        if len(finite) < 2 or len(finite) < len(self.regrets):
            return self.mean, self.mean
        half = t975(len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite))
        return self.mean - half, self.mean + half

    @property
    def worst(self) -> Tuple[float, int]:
        """``(regret, seed)`` of the worst seed."""
        return max(zip(self.regrets, self.seeds))


def regret(result: ReplayResult, best_per_recurrence: float) -> float:
    """``cumulative cost / (N x best_per_recurrence)`` of one replay (``inf`` when it broke)."""
    if result.broken is not None:
        return math.inf
    return result.total_cost / (result.num_recurrences * best_per_recurrence)


def summarize(results: Sequence[ReplayResult], best_per_recurrence: float) -> RegretSummary:
    """The regret of each replay of one policy (one per seed) and their spread."""
    if not results:
        raise ValueError("summarize needs at least one replay")
    return RegretSummary(
        policy=results[0].policy,
        seeds=tuple(r.seed for r in results),
        regrets=tuple(regret(r, best_per_recurrence) for r in results),
        num_broken=sum(r.broken is not None for r in results),
    )


def cost_ratios(
    results: Sequence[ReplayResult], others: Sequence[ReplayResult]
) -> Tuple[float, float]:
    """``(mean cost / other's mean cost, worst seed's cost / other's)`` on the same seeds."""
    mean = statistics.fmean(r.total_cost for r in results) / statistics.fmean(
        o.total_cost for o in others
    )
    worst = max(r.total_cost / o.total_cost for r, o in zip(results, others))
    return mean, worst


class FixedChoice:
    """Always one (batch size, power limit), never profiling: the best fixed choice replayed.

    Args:
        batch_size: The batch size of every run.
        power_limit_w: The power limit of every run.
    """

    name = FIXED

    def __init__(self, batch_size: int, power_limit_w: int) -> None:
        self.batch_size = batch_size
        self.power_limit_w = power_limit_w

    def next_batch_size(self) -> int:
        """The fixed batch size."""
        return self.batch_size

    def power_limit(self, batch_size: int) -> Tuple[int, bool]:
        """The fixed limit, known without profiling."""
        return self.power_limit_w, False

    def profiled_limits_w(self, batch_size: int) -> Tuple[int, ...]:
        """None: it never profiles."""
        return ()

    def starts(self, batch_size: int, steady: EpochCost) -> bool:
        """Every run starts."""
        return True

    def report_epoch(self, reached: bool, measured: EpochCost, steady: EpochCost) -> None:
        """Nothing to learn."""

    def should_stop(self) -> bool:
        """Runs go on until the target or the epoch budget."""
        return False

    def report_run(self, reached: bool, cost: float) -> bool:
        """A run converges when it reaches the target."""
        return reached

    def report_recurrence(self, cost: float) -> None:
        """Nothing to learn."""
