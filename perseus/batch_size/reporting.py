"""A run's side of the batch-size optimizer: its epochs, its cost, when it stops, how it ends.

This module owns the rules of one run: its cost (``eta * E + (1 - eta) * P_max * T``, at the
batch size's chosen power limit), its early stop (the next epoch, predicted from its epochs so
far or, before the first, from its price, would take it past ``beta`` x the cheapest converged
run; or ``max_epochs`` ran out; or its batch size is ruled out and finishing would cost more
than a fresh run of the best one, ``ruled_out``, judged by the optimizer:
:mod:`perseus.batch_size.elimination`), and its outcome (a run that reaches the target above
that bound counts as failed, ``cost_exceeded``).
:class:`RunReporting` is the base of :class:`~perseus.batch_size.optimizer.BatchSizeOptimizer`,
which sets the attributes it declares, owns the store and chooses the batch size each run trains
with.

Standard library only.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from perseus.batch_size.elimination import RULED_OUT, RunVerdict
from perseus.batch_size.pruning import DEFERRED
from perseus.batch_size.store import FAILED, REACHED, RunRow, Store
from perseus.errors import BatchSizeError

REASON_TARGET_MISSED = "target_missed"
REASON_COST = "cost_exceeded"
REASON_ERROR = "error"
# Relative slack when comparing a converged run's cost with the early-stop bound.
_BOUND_SLACK = 1e-9


class RunReporting:
    """Report the current run of a recurring job: its epochs, whether to stop, its end.

    A base class: :class:`~perseus.batch_size.optimizer.BatchSizeOptimizer` sets the
    attributes below (see its arguments).
    """

    store: Store
    job_id: str
    run_id: Optional[int]
    eta: float
    beta: float
    max_epochs: int
    target_metric: float
    higher_is_better: bool
    max_power_w: float

    def report_epoch(
        self,
        metric: Optional[float],
        time_s: float,
        energy_j: float,
        *,
        steady_time_s: Optional[float] = None,
        steady_energy_j: Optional[float] = None,
    ) -> None:
        """Record one finished epoch of the current run.

        Args:
            metric: The validation metric after the epoch (None: not evaluated).
            time_s: Its measured wall time.
            energy_j: Its measured energy (all GPUs of the job).
            steady_time_s: What it would have taken at the batch size's chosen power limit, when
                part of it profiled power limits (default: ``time_s``). The optimizer judges
                the batch size by these.
            steady_energy_j: Likewise for energy (default: ``energy_j``).
        """
        run = self._current_run()
        steady = (
            time_s if steady_time_s is None else steady_time_s,
            energy_j if steady_energy_j is None else steady_energy_j,
        )
        cost = (run.cost or 0.0) + self.cost_j(*steady)
        self.store.add_epoch(run.run_id, metric, (time_s, energy_j), steady, cost)

    def report_epoch_cost(self, time_s: float, energy_j: float) -> None:
        """Price one epoch of the current run before its first epoch ends.

        A job that knows what one epoch will take at the batch size's chosen power limit
        before running it (from the power-limit profile's steps, or its first steps, times the
        steps of an epoch) says so here; :meth:`should_stop` then judges the run on that
        price, so a batch size whose epochs alone rule it out (or that the walk had better
        leave for its other side first) stops before paying a whole epoch. Later epochs are
        judged on their measured cost, as before.

        Args:
            time_s: One epoch's wall time at the chosen power limit.
            energy_j: Its energy (all GPUs of the job).

        Raises:
            BatchSizeError: When no run is in progress, or the price is not positive.
        """
        run = self._current_run()
        cost = self.cost_j(time_s, energy_j)
        if not (math.isfinite(cost) and cost > 0.0):
            raise BatchSizeError(
                f"job {self.job_id!r}: an epoch priced at {time_s!r} s and {energy_j!r} J costs "
                "nothing; pass one epoch's measured time and energy (both positive)"
            )
        self.store.price_run(run.run_id, cost)

    def should_stop(self) -> bool:
        """True when the current run should end now.

        That is when it reached the target, ran out of epochs, its next epoch would take its
        cost past ``beta`` x the cheapest converged run, or its batch size is ruled out and
        finishing the run is expected to cost more than a fresh run of the best batch size.
        """
        return self._stop_reason(self._current_run()) is not None

    def report_run(
        self,
        *,
        time_s: Optional[float] = None,
        energy_j: Optional[float] = None,
        reached_target: Optional[bool] = None,
        steady_time_s: Optional[float] = None,
        steady_energy_j: Optional[float] = None,
        reason: Optional[str] = None,
    ) -> Dict[str, Any]:
        """End the current run; returns its summary.

        Without arguments the totals and the outcome come from :meth:`report_epoch` calls; a job
        that only knows its totals passes them (and whether it reached the target) here. A run
        that reached the target at a cost above ``beta`` x the cheapest converged run counts as
        failed (``cost_exceeded``). ``reason`` names why a run that did not reach the target
        ended (default: derived from its epochs).
        """
        run = self._current_run()
        if time_s is None and energy_j is None:
            measured = (run.time_s, run.energy_j)
            stored_steady = (run.steady_time_s, run.steady_energy_j)
        else:
            measured = (
                run.time_s if time_s is None else time_s,
                run.energy_j if energy_j is None else energy_j,
            )
            stored_steady = measured
        steady = (
            stored_steady[0] if steady_time_s is None else steady_time_s,
            stored_steady[1] if steady_energy_j is None else steady_energy_j,
        )
        cost = self.cost_j(*steady)
        if reached_target is None:
            reached_target = self.metric_reaches_target(run.last_metric)
        status, why, detail = REACHED, None, None
        if reached_target:
            bound = self._cost_bound(run.run_id)
            if bound is not None and cost > bound * (1.0 + _BOUND_SLACK):
                status, why = FAILED, REASON_COST
        else:
            status = FAILED
            why = reason or self._stop_reason(run) or REASON_TARGET_MISSED
            if why == REACHED:
                why = REASON_TARGET_MISSED
            if why in (RULED_OUT, DEFERRED):
                verdict = self._run_verdict(run)
                detail = verdict.describe() if verdict is not None else None
        self.store.finish_run(
            run.run_id,
            status=status,
            reason=why,
            measured=measured,
            steady=steady,
            cost=cost,
            why=detail,
        )
        self.run_id = None
        return {
            "run_id": run.run_id,
            "batch_size": run.batch_size,
            "phase": run.phase,
            "status": status,
            "reason": why,
            "time_s": measured[0],
            "energy_j": measured[1],
            "cost": cost,
            "measured_cost": self.cost_j(*measured),
        }

    def cost_j(self, time_s: float, energy_j: float) -> float:
        """``eta * energy_j + (1 - eta) * max_power_w * time_s``."""
        return self.eta * energy_j + (1.0 - self.eta) * self.max_power_w * time_s

    def metric_reaches_target(self, metric: Optional[float]) -> bool:
        """Whether ``metric`` meets the target (at or above it, or at or below for losses)."""
        if metric is None or math.isnan(metric):
            return False
        if self.higher_is_better:
            return metric >= self.target_metric
        return metric <= self.target_metric

    def _current_run(self) -> RunRow:
        if self.run_id is None:
            raise BatchSizeError(
                f"job {self.job_id!r}: no run in progress; call next_batch_size() first"
            )
        return self.store.run(self.run_id)

    def _stop_reason(self, run: RunRow) -> Optional[str]:
        if self.metric_reaches_target(run.last_metric):
            return REACHED
        bound = self._cost_bound(run.run_id)
        # Predict the next epoch from this run's epochs so far (or from its price).
        unit = run.epoch_cost
        if (
            bound is not None
            and unit is not None
            and (run.cost or 0.0) + unit > bound * (1.0 + _BOUND_SLACK)
        ):
            return REASON_COST
        if run.num_epochs >= self.max_epochs:
            return REASON_TARGET_MISSED
        verdict = self._run_verdict(run)
        if verdict is not None and verdict.stop:
            return verdict.action
        return None

    def _run_verdict(self, run: RunRow) -> Optional[RunVerdict]:
        """Whether ``run``'s batch size is ruled out and the run had better stop (None: no).

        The optimizer judges it from the other runs; nothing is ruled out here.
        """
        return None

    def _cost_bound(self, exclude_run_id: int) -> Optional[float]:
        costs = [
            r.cost
            for r in self.store.runs(None, self.job_id)
            if r.status == REACHED and r.cost is not None and r.run_id != exclude_run_id
        ]
        return self.beta * min(costs) if costs else None
