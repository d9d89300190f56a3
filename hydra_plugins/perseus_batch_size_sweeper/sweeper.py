"""The batch-size sweeper: ``-m hydra/sweeper=perseus_batch_size`` runs a recurring job N times.

Each of ``num_runs`` jobs gets the batch size :class:`perseus.batch_size.BatchSizeOptimizer`
chooses (pruning, then Gaussian Thompson sampling; state in the SQLite file ``db_path``, so
successive multiruns — on this machine or others sharing the file — continue one search). The
batch size reaches the job as the override ``<batch_size_key>=<b>``.

A job reports its run in one of two ways:

* **Per epoch** (allows early stopping): ``run = perseus.batch_size.current_run()`` inside the
  job (the sweeper sets ``PERSEUS_BSO_*`` environment variables), then ``run.report_epoch(...)``,
  ``run.should_stop()`` and ``run.report_run()``.
* **At the end**: the task function returns a mapping with ``time_s``, ``energy_j`` and
  ``reached_target`` (bool) or ``metric``; the sweeper reports it.

A job that raises counts as a failed run. Runs are launched one at a time: each choice depends
on the previous outcome. Works with the in-process launcher; remote launchers (e.g. submitit)
get the override, and the job must report by its return value. A job using
:class:`perseus.batch_size.RecurringJob` reports by itself (and profiles the power limit per
batch size).

When every batch size of a pruning round has failed, the sweep stops with an error that says
which failed and why; ``hydra.sweeper.retry_failed=true`` (after fixing the cause) or
``hydra.sweeper.reset=true`` goes on.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from perseus.batch_size.env import run_environment
from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.batch_size.reporting import REASON_ERROR
from perseus.batch_size.store import RUNNING
from perseus.errors import ConfigError

log = logging.getLogger(__name__)


class BatchSizeSweeper(Sweeper):
    """Run the job ``num_runs`` times with the batch size the optimizer picks each time."""

    def __init__(
        self,
        db_path: str,
        job_id: str,
        batch_size_key: str,
        batch_sizes: Sequence[int],
        default_batch_size: Optional[int],
        num_runs: int,
        reset: bool = False,
        retry_failed: bool = False,
        **optimizer_args: Any,
    ) -> None:
        if not batch_sizes or default_batch_size is None:
            raise ConfigError(
                "hydra/sweeper=perseus_batch_size needs hydra.sweeper.batch_sizes=[...] and "
                "hydra.sweeper.default_batch_size=<one of them>"
            )
        if num_runs < 1:
            raise ConfigError(f"hydra.sweeper.num_runs={num_runs}: must be >= 1")
        self.db_path = os.path.abspath(db_path)
        self.job_id = job_id
        self.batch_size_key = batch_size_key
        self.batch_sizes = [int(b) for b in batch_sizes]
        self.default_batch_size = int(default_batch_size)
        self.num_runs = num_runs
        self.reset = reset
        self.retry_failed = retry_failed
        self.optimizer_args = optimizer_args
        self.launcher: Optional[Launcher] = None
        self.hydra_context: Optional[HydraContext] = None
        self.config: Optional[DictConfig] = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Instantiate the configured launcher."""
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> List[Dict[str, Any]]:
        """Launch the runs; returns one summary per run (batch size, cost, outcome)."""
        assert self.launcher is not None
        _reject_sweeps(arguments)
        opt = BatchSizeOptimizer(
            self.db_path,
            self.job_id,
            self.batch_sizes,
            self.default_batch_size,
            **self.optimizer_args,
        )
        results = []
        try:
            if self.reset:
                opt.reset()
            if self.retry_failed:
                opt.retry_failed()
            for index in range(self.num_runs):
                batch_size = opt.next_batch_size()
                assert opt.run_id is not None
                overrides = [*arguments, f"{self.batch_size_key}={batch_size}"]
                self.validate_batch_is_legal([overrides])
                job = self._launch(opt, overrides, index)
                results.append(self._record(opt, job))
                log.info("run %d: %s", index, results[-1])
            log.info("best batch size so far: %s", opt.best_batch_size())
        finally:
            opt.close()
        return results

    def _launch(self, opt: BatchSizeOptimizer, overrides: List[str], index: int) -> JobReturn:
        assert self.launcher is not None and opt.run_id is not None
        env = run_environment(self.db_path, self.job_id, opt.run_id, opt.run_options())
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return self.launcher.launch([overrides], initial_job_idx=index)[0]
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _record(self, opt: BatchSizeOptimizer, job: JobReturn) -> Dict[str, Any]:
        assert opt.run_id is not None
        run = opt.store.run(opt.run_id)
        if run.status != RUNNING:  # the job reported its run itself
            opt.run_id = None
            return {
                "run_id": run.run_id,
                "batch_size": run.batch_size,
                "status": run.status,
                "cost": run.cost,
                "phase": run.phase,
            }
        if job.status != JobStatus.COMPLETED:
            log.warning(
                "run %d (batch size %d) failed: %s", run.run_id, run.batch_size, job._return_value
            )
            return opt.report_run(reached_target=False, reason=REASON_ERROR)
        value = job.return_value
        if not isinstance(value, dict) and not hasattr(value, "get"):
            return opt.report_run()
        reached = value.get("reached_target")
        if reached is None and value.get("metric") is not None:
            reached = opt.metric_reaches_target(float(value["metric"]))
        return opt.report_run(
            time_s=_maybe_float(value.get("time_s")),
            energy_j=_maybe_float(value.get("energy_j")),
            reached_target=None if reached is None else bool(reached),
        )


def _maybe_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def _reject_sweeps(arguments: List[str]) -> None:
    parsed = OverridesParser.create().parse_overrides(arguments)
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(
            f"hydra/sweeper=perseus_batch_size runs one configuration: drop the sweep "
            f"override(s) {sweeps} (the sweeper sets the batch size itself)"
        )
