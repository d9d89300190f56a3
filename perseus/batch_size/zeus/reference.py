"""Reference: the optimizers of Zeus's NSDI'23 evaluation, written from the paper's method.

Used only to replay Zeus's traces side by side with Perseus's optimizers (the same runs, the
same costs). What it does, as published:

* **Pruning**, two rounds. Round 1 starts at the default batch size and walks down (the default,
  then smaller ones) until a batch size fails, then up from the next larger one until one
  fails. Round 2 does the same over the batch sizes that reached the target in round 1,
  starting from the cheapest of them. A failure is a run that did not reach the target.
* **Gaussian Thompson sampling** over the survivors: every observation of an arm (its runs'
  costs, failed ones included) gives a Gaussian posterior with mean = the observations' mean
  and precision = count / variance (the variance of the observations; zero variance: the mean
  is sampled exactly). Arms with fewer than two observations are tried first, in random order.
* **Just-in-time power limit**: the first run of a batch size spends its first epoch profiling
  every power limit (its time and energy are those of the limits in turn), and that batch size
  then always runs at the limit with the lowest ``(eta * P + (1 - eta) * MAXPOWER) * T`` per
  epoch.
* **Early stopping**: a run stops before the epoch that would take its cost past ``beta`` x the
  lowest cost of a recurrence so far (a recurrence's cost includes its failed runs); when not
  even one epoch fits, the run does not start and the batch size is charged
  ``100 x beta x`` that lowest cost.
* A recurrence repeats runs until one reaches the target (at most 20); the first recurrence,
  at the default batch size, must reach it.

Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Dict, List, Optional, Tuple

from perseus.batch_size.zeus.trace import EpochCost, Workload

NAME = "zeus-nsdi23"


class ReferenceBroken(RuntimeError):
    """The published method cannot go on (it stopped with an error)."""


class ZeusReference:
    """The published method driven by :func:`perseus.batch_size.zeus.replay.replay`.

    Args:
        workload: The job and its traces.
        eta: Weight of energy in the cost.
        beta: Early-stop factor.
        seed: Seeds the Thompson samples and the exploration order.
        num_pruning_rounds: Rounds of pruning (2 as published).
    """

    name = NAME

    def __init__(
        self,
        workload: Workload,
        *,
        eta: float = 0.5,
        beta: float = 2.0,
        seed: int = 1,
        num_pruning_rounds: int = 2,
    ) -> None:
        self.workload = workload
        self.eta = eta
        self.beta = beta
        self.rng = random.Random(seed)
        self.history: Dict[int, List[float]] = {b: [] for b in workload.batch_sizes}
        self.limits: Dict[int, int] = {}
        self.min_cost = math.inf
        self.num_recurrences = 0
        # Pruning: rounds left, this round's candidates and start, the walk's queue.
        self._rounds_left = num_pruning_rounds
        self._candidates = list(workload.batch_sizes)
        self._start = workload.default_batch_size
        self._queue: List[List[int]] = []
        self._good: List[int] = []
        self._round_costs: Dict[int, float] = {}
        self._arms: Optional[List[int]] = None
        # The run in progress: (batch size, epochs allowed, epochs done).
        self._run: Optional[Tuple[int, int, int]] = None
        self._begin_round()

    # -- the replay's interface ------------------------------------------------------------------
    def next_batch_size(self) -> int:
        """The batch size of the next run."""
        if self._arms is None:
            return self._queue[0][0]
        order = list(self._arms)
        self.rng.shuffle(order)
        for arm in order:
            if len(self.history[arm]) < 2:
                return arm
        best, best_cost = order[0], math.inf
        for arm in self._arms:
            costs = self.history[arm]
            mean = statistics.fmean(costs)
            var = statistics.pvariance(costs)
            sample = mean if var == 0 else self.rng.gauss(mean, math.sqrt(var / len(costs)))
            if sample < best_cost:
                best, best_cost = arm, sample
        return best

    def power_limit(self, batch_size: int) -> Tuple[int, bool]:
        """``(limit_w, profiled in this run)``: the JIT choice for the batch size."""
        if batch_size in self.limits:
            return self.limits[batch_size], False
        table = self.workload.epochs[batch_size]
        top = max(table)
        best = min(
            sorted(table, reverse=True),
            key=lambda p: (
                (self.eta * table[p].energy_j / table[p].time_s + (1 - self.eta) * top)
                * table[p].time_s
            ),
        )
        self.limits[batch_size] = best
        return best, True

    def profiled_limits_w(self, batch_size: int) -> List[int]:
        """Every limit of the batch size's table (the published method profiles them all)."""
        return sorted(self.workload.epochs[batch_size], reverse=True)

    def starts(self, batch_size: int, steady: EpochCost) -> bool:
        """Whether the run starts (False: not even one epoch fits under the bound)."""
        epoch_cost = self.workload.cost_j(steady, self.eta)
        allowed = self.workload.job.max_epochs
        if not math.isinf(self.min_cost):
            allowed = min(int(self.beta * self.min_cost // epoch_cost), allowed)
        if allowed == 0:
            self._observe(batch_size, 100 * self.beta * self.min_cost, False)
            return False
        self._run = (batch_size, allowed, 0)
        return True

    def report_epoch(self, reached: bool, measured: EpochCost, steady: EpochCost) -> None:
        """One epoch of the current run."""
        assert self._run is not None
        batch_size, allowed, done = self._run
        self._run = (batch_size, allowed, done + 1)

    def should_stop(self) -> bool:
        """Whether the run stops now (its epoch allowance is used up)."""
        assert self._run is not None
        return self._run[2] >= self._run[1]

    def report_run(self, reached: bool, cost: float) -> bool:
        """The run ended; returns whether it counts as converged."""
        assert self._run is not None
        batch_size = self._run[0]
        self._run = None
        if not reached and self.num_recurrences == 0:
            raise ReferenceBroken(
                f"the default batch size {batch_size} did not reach the target in the first "
                "recurrence"
            )
        self._observe(batch_size, cost, reached)
        return reached

    def report_recurrence(self, cost: float) -> None:
        """A recurrence reached the target at ``cost`` (its failed runs included)."""
        self.num_recurrences += 1
        self.min_cost = min(self.min_cost, cost)

    # -- internals -------------------------------------------------------------------------------
    def _begin_round(self) -> None:
        if self._rounds_left == 0:
            if not self._candidates:
                raise ReferenceBroken("every batch size was pruned")
            self._arms = sorted(self._candidates)
            return
        if not self._candidates or self._start not in self._candidates:
            raise ReferenceBroken("every batch size was pruned")
        self._rounds_left -= 1
        ordered = sorted(self._candidates)
        i = ordered.index(self._start)
        self._queue = [list(reversed(ordered[: i + 1])), ordered[i + 1 :]]
        self._queue = [d for d in self._queue if d]
        self._good = []
        self._round_costs = {}

    def _observe(self, batch_size: int, cost: float, reached: bool) -> None:
        self.history[batch_size].append(cost)
        if self._arms is not None:
            return
        direction = self._queue[0]
        assert direction[0] == batch_size, "pruning runs must report in order"
        direction.pop(0)
        if reached:
            self._good.append(batch_size)
            self._round_costs[batch_size] = cost
        if not reached or not direction:
            self._queue.pop(0)
        if not self._queue:
            self._candidates = sorted(self._good)
            if self._good:
                self._start = min(self._good, key=lambda b: (self._round_costs[b], b))
            self._begin_round()
