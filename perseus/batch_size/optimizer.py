"""Batch-size optimizer for recurring jobs: prune, then a multi-armed bandit across runs.

A recurring job (the same training, re-run on new data or code) is run many times. Each run asks
for a batch size, trains to a target metric and reports what it cost:
``cost = eta * E + (1 - eta) * P_max * T`` (joules; ``P_max`` the maximum power of all the
job's GPUs). The optimizer first prunes batch sizes that cannot reach the target
(:mod:`perseus.batch_size.pruning`), then picks among the rest with Gaussian Thompson sampling
(:mod:`perseus.batch_size.bandit`). A run is stopped early once its cost passes ``beta`` times the
cheapest successful run so far, or when it misses the target within ``max_epochs``.

Everything lives in a SQLite file (:mod:`perseus.batch_size.store`), so runs in different
processes or machines sharing the file continue one search::

    bso = BatchSizeOptimizer("bso.db", "nightly-resnet", [64, 128, 256, 512], 256)
    batch_size = bso.next_batch_size()
    for epoch in range(bso.max_epochs):
        metric, time_s, energy_j = train_one_epoch(batch_size)
        bso.report_epoch(metric, time_s, energy_j)
        if bso.should_stop():
            break
    bso.report_run()

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from perseus.batch_size import bandit
from perseus.batch_size.pruning import PRUNING, pruning_state
from perseus.batch_size.store import FAILED, REACHED, RunRow, Store, batch_sizes_key
from perseus.errors import BatchSizeError, ConfigError

log = logging.getLogger(__name__)

BANDIT = "bandit"
REASON_TARGET_MISSED = "target_missed"
REASON_COST = "cost_exceeded"


class BatchSizeOptimizer:
    """Choose the batch size of each run of a recurring job.

    Args:
        db_path: SQLite file shared by all runs of the job (created when missing).
        job_id: Name of the recurring job inside the file.
        batch_sizes: Candidate batch sizes.
        default_batch_size: Where pruning starts (the batch size the job used so far).
        eta: Weight of energy in the cost, within [0, 1].
        beta: Early-stop a run whose cost passes ``beta`` x the cheapest successful run (> 1).
        max_epochs: Epoch budget of one run; missing the target within it fails the run.
        target_metric: The metric value that counts as converged.
        higher_is_better: Whether metrics at or above the target converge (accuracy), else at
            or below (loss).
        max_power_w: ``P_max`` of the cost: maximum power of all the job's GPUs together (W).
        num_pruning_rounds: Rounds of the pruning stage (0 skips it: every batch size is an arm).
        num_exploration: Observations each arm gets before Thompson sampling starts.
        seed: Seeds the bandit's samples (decisions are reproducible from the database).
        stale_run_s: A run still unreported this long after it started is counted as failed
            (its process died); None keeps such runs pending forever.
    """

    def __init__(
        self,
        db_path: Union[str, Path],
        job_id: str,
        batch_sizes: Sequence[int],
        default_batch_size: int,
        *,
        eta: float = 0.5,
        beta: float = 2.0,
        max_epochs: int = 100,
        target_metric: float = 1.0,
        higher_is_better: bool = True,
        max_power_w: float = 300.0,
        num_pruning_rounds: int = 2,
        num_exploration: int = 2,
        seed: int = 0,
        stale_run_s: Optional[float] = 7 * 24 * 3600.0,
    ) -> None:
        self.batch_sizes = batch_sizes_key(batch_sizes)
        _check_args(self.batch_sizes, default_batch_size, eta, beta, max_epochs, max_power_w)
        self.job_id = job_id
        self.default_batch_size = int(default_batch_size)
        self.eta = eta
        self.beta = beta
        self.max_epochs = max_epochs
        self.target_metric = target_metric
        self.higher_is_better = higher_is_better
        self.max_power_w = max_power_w
        self.num_pruning_rounds = num_pruning_rounds
        self.num_exploration = num_exploration
        self.seed = seed
        self.stale_run_s = stale_run_s
        self.store = Store(Path(db_path))
        self.store.ensure_job(job_id, self._settings())
        self.run_id: Optional[int] = None

    @classmethod
    def from_db(cls, db_path: Union[str, Path], job_id: str, **kwargs: Any) -> BatchSizeOptimizer:
        """Open a job registered earlier, with the settings stored in the database."""
        store = Store(Path(db_path))
        try:
            settings = store.job_settings(job_id)
        finally:
            store.close()
        settings.update(kwargs)
        return cls(db_path, job_id, **settings)

    # -- choosing --------------------------------------------------------------------------------
    def next_batch_size(self) -> int:
        """Start a run of the job and return the batch size it should train with."""
        with self.store.transaction() as conn:
            if self.stale_run_s is not None:
                expired = self.store.expire_runs(conn, self.job_id, time.time() - self.stale_run_s)
                if expired:
                    log.warning(
                        "job %s: %d unreported run(s) counted as failed", self.job_id, expired
                    )
            runs = self.store.runs(conn, self.job_id)
            batch_size, phase, pruning_round = self._decide(runs)
            self.run_id = self.store.add_run(conn, self.job_id, batch_size, phase, pruning_round)
        log.info(
            "run %d of job %s: batch size %d (%s)", self.run_id, self.job_id, batch_size, phase
        )
        return batch_size

    def resume_run(self, run_id: int) -> int:
        """Attach to a run started elsewhere (e.g. by the Hydra sweeper); returns its batch size."""
        self.run_id = run_id
        return self.store.run(run_id).batch_size

    def best_batch_size(self) -> Optional[int]:
        """The batch size with the lowest mean cost so far among those still in the running."""
        runs = self.store.runs(None, self.job_id)
        arms = self._arms(runs)
        return bandit.best_arm(arms, self._observations(runs, arms))

    # -- reporting -------------------------------------------------------------------------------
    def report_epoch(self, metric: Optional[float], time_s: float, energy_j: float) -> None:
        """Record one finished epoch of the current run: its metric, wall time and energy."""
        run = self._current_run()
        cost = run.cost or 0.0
        cost += self.cost_j(time_s, energy_j)
        self.store.add_epoch(run.run_id, metric, time_s, energy_j, cost)

    def should_stop(self) -> bool:
        """True when the current run reached the target, costs too much, or ran out of epochs."""
        return self._stop_reason(self._current_run()) is not None

    def report_run(
        self,
        *,
        time_s: Optional[float] = None,
        energy_j: Optional[float] = None,
        reached_target: Optional[bool] = None,
    ) -> Dict[str, Any]:
        """End the current run; returns its summary.

        Without arguments the totals and the outcome come from :meth:`report_epoch` calls; a job
        that only knows its totals passes them (and whether it reached the target) here.
        """
        run = self._current_run()
        total_time_s = run.time_s if time_s is None else time_s
        total_energy_j = run.energy_j if energy_j is None else energy_j
        cost = self.cost_j(total_time_s, total_energy_j)
        if reached_target is None:
            reached_target = self.metric_reaches_target(run.last_metric)
        reason = None
        if not reached_target:
            reason = self._stop_reason(run) or REASON_TARGET_MISSED
            if reason == REACHED:
                reason = REASON_TARGET_MISSED
        status = REACHED if reached_target else FAILED
        self.store.finish_run(
            run.run_id,
            status=status,
            reason=reason,
            time_s=total_time_s,
            energy_j=total_energy_j,
            cost=cost,
        )
        self.run_id = None
        return {
            "run_id": run.run_id,
            "batch_size": run.batch_size,
            "phase": run.phase,
            "status": status,
            "reason": reason,
            "time_s": total_time_s,
            "energy_j": total_energy_j,
            "cost": cost,
        }

    def cost_j(self, time_s: float, energy_j: float) -> float:
        """``eta * energy_j + (1 - eta) * max_power_w * time_s``."""
        return self.eta * energy_j + (1.0 - self.eta) * self.max_power_w * time_s

    def summary(self) -> Dict[str, Any]:
        """The job's state: stage, arms, per batch size mean cost and runs, best so far."""
        runs = self.store.runs(None, self.job_id)
        arms = self._arms(runs)
        observations = self._observations(runs, arms)
        state = pruning_state(
            self.batch_sizes, self.default_batch_size, self.num_pruning_rounds, runs
        )
        return {
            "job_id": self.job_id,
            "stage": BANDIT if state.done else PRUNING,
            "arms": arms,
            "num_runs": len(runs),
            "mean_cost": {b: sum(c) / len(c) for b, c in observations.items() if c},
            "best_batch_size": bandit.best_arm(arms, observations),
        }

    def close(self) -> None:
        """Close the database."""
        self.store.close()

    # -- internals -------------------------------------------------------------------------------
    def run_options(self) -> Dict[str, Any]:
        """Settings that may differ between runs (not stored with the job)."""
        return {
            "beta": self.beta,
            "max_epochs": self.max_epochs,
            "num_exploration": self.num_exploration,
            "seed": self.seed,
            "stale_run_s": self.stale_run_s,
        }

    def _settings(self) -> Dict[str, Any]:
        # What defines the job's search; beta, max_epochs, seed may change between runs.
        return {
            "batch_sizes": self.batch_sizes,
            "default_batch_size": self.default_batch_size,
            "eta": self.eta,
            "max_power_w": self.max_power_w,
            "num_pruning_rounds": self.num_pruning_rounds,
            "target_metric": self.target_metric,
            "higher_is_better": self.higher_is_better,
        }

    def _decide(self, runs: List[RunRow]) -> tuple:
        state = pruning_state(
            self.batch_sizes, self.default_batch_size, self.num_pruning_rounds, runs
        )
        if state.next_batch_size is not None:
            return state.next_batch_size, PRUNING, state.pruning_round
        arms = state.candidates
        rng = random.Random(f"{self.seed}:{self.job_id}:{len(runs)}")
        choice = bandit.thompson_choice(
            arms, self._observations(runs, arms), rng, num_exploration=self.num_exploration
        )
        return choice, BANDIT, None

    def _arms(self, runs: List[RunRow]) -> List[int]:
        state = pruning_state(
            self.batch_sizes, self.default_batch_size, self.num_pruning_rounds, runs
        )
        if state.done:
            return state.candidates
        return sorted({r.batch_size for r in runs if r.status == REACHED})

    @staticmethod
    def _observations(runs: List[RunRow], arms: Sequence[int]) -> Dict[int, List[float]]:
        observed: Dict[int, List[float]] = {b: [] for b in arms}
        for run in runs:
            if run.batch_size not in observed or run.cost is None:
                continue
            if run.status == REACHED or (run.status == FAILED and run.phase == BANDIT):
                observed[run.batch_size].append(run.cost)
        return observed

    def _current_run(self) -> RunRow:
        if self.run_id is None:
            raise BatchSizeError(
                f"job {self.job_id!r}: no run in progress; call next_batch_size() first"
            )
        return self.store.run(self.run_id)

    def metric_reaches_target(self, metric: Optional[float]) -> bool:
        """Whether ``metric`` meets the target (at or above it, or at or below for losses)."""
        if metric is None or math.isnan(metric):
            return False
        if self.higher_is_better:
            return metric >= self.target_metric
        return metric <= self.target_metric

    def _stop_reason(self, run: RunRow) -> Optional[str]:
        if self.metric_reaches_target(run.last_metric):
            return REACHED
        best = self._best_cost(exclude_run_id=run.run_id)
        if best is not None and (run.cost or 0.0) > self.beta * best:
            return REASON_COST
        if run.num_epochs >= self.max_epochs:
            return REASON_TARGET_MISSED
        return None

    def _best_cost(self, exclude_run_id: int) -> Optional[float]:
        costs = [
            r.cost
            for r in self.store.runs(None, self.job_id)
            if r.status == REACHED and r.cost is not None and r.run_id != exclude_run_id
        ]
        return min(costs) if costs else None


def _check_args(
    batch_sizes: List[int],
    default_batch_size: int,
    eta: float,
    beta: float,
    max_epochs: int,
    max_power_w: float,
) -> None:
    problems = []
    if not batch_sizes or batch_sizes[0] < 1:
        problems.append(f"batch_sizes={batch_sizes}: give at least one positive batch size")
    elif default_batch_size not in batch_sizes:
        problems.append(
            f"default_batch_size={default_batch_size}: must be one of batch_sizes {batch_sizes}"
        )
    if not 0.0 <= eta <= 1.0:
        problems.append(f"eta={eta}: must be within [0, 1]")
    if beta <= 1.0:
        problems.append(f"beta={beta}: must be > 1 (2.0 stops runs costing twice the best)")
    if max_epochs < 1:
        problems.append(f"max_epochs={max_epochs}: must be >= 1")
    if max_power_w <= 0:
        problems.append(f"max_power_w={max_power_w}: must be > 0 (watts of all GPUs)")
    if problems:
        raise ConfigError("invalid batch-size optimizer settings:\n  - " + "\n  - ".join(problems))
