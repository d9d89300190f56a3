"""One object for a recurring training job: batch size, power limit, epochs, early stopping.

For single-GPU jobs and single-node data-parallel jobs (one process per GPU)::

    from perseus.batch_size import RecurringJob

    with RecurringJob("nightly-resnet", [64, 128, 256, 512], 256, target_metric=0.75) as job:
        loader = job.data_loader(train_set, shuffle=True)    # job.local_batch_size per rank
        for epoch in job.epochs():                           # ends at the target or early
            for inputs, labels in job.steps(loader):         # power-limit profiling per step
                train_step(inputs, labels)
            job.report_metric(evaluate(model))               # once per epoch
    print(job.result)

On entering, the job's batch size for this run is chosen (:class:`BatchSizeOptimizer`, state
in the SQLite file ``db_path``; under the Hydra sweeper, the run the sweeper started), and the
power-limit optimizer takes this process's GPU: the first run of each batch size profiles the
power limits inside its first steps, and every later run of that batch size starts at the
limit chosen then (the profile file is keyed by job, batch size, GPU model and GPU count).
Every epoch is measured (time, and energy of all GPUs of the job from their energy samplers,
never a counter read on the training thread) and reported with what it would
have cost at the chosen limit, so the batch size is judged at its best power limit; the loop
ends when the metric reaches the target, when the next epoch would cost more than ``beta`` x the
cheapest converged run, or after ``max_epochs``. Leaving the ``with`` block reports the run
(a run that raised counts as failed) and puts the GPU's power limit back.

Under ``torch.distributed`` (initialised before entering) every rank creates the object: rank 0
chooses the batch size and decides when to stop, and the others follow; batch sizes are global
(``local_batch_size = batch_size // world_size``); epochs count the energy of every rank's GPU
and the time of the slowest.

Power-limit problems (no permission, a GPU owned by another controller) never stop training:
one warning, and the run goes on at the GPU's current limit.

This module owns the job's training-loop interface and its batch size across ranks; the GPUs,
their readings and their power limit are held by :class:`~perseus.batch_size.run_devices.RunDevices`
and the search by :class:`~perseus.batch_size.optimizer.BatchSizeOptimizer`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, TypeVar, Union

from perseus.batch_size.elimination import RULE_OUT_PROBABILITY
from perseus.batch_size.env import current_run
from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.batch_size.reporting import REASON_ERROR
from perseus.batch_size.run_devices import RunDevices
from perseus.config.schema import GPUConfig, PowerLimitConfig
from perseus.errors import ConfigError, PerseusError
from perseus.gpu.base import GPU
from perseus.gpu.energy.meter import EnergyMeter
from perseus.power_limit import aggregate
from perseus.power_limit.optimizer import PowerLimitOptimizer

log = logging.getLogger(__name__)
T = TypeVar("T")


class RecurringJob:
    """A recurring job's batch size, power limit and epochs, driven from the training loop.

    Args:
        job_id: Name of the recurring job (the key of its state and power-limit profiles).
        batch_sizes: Candidate (global) batch sizes.
        default_batch_size: The batch size the job used so far (where the search starts).
        target_metric: Validation metric that counts as converged.
        higher_is_better: Metrics at or above the target converge (accuracy), else at or below.
        max_epochs: Epoch budget of one run.
        eta: Weight of energy in the cost ``eta * E + (1 - eta) * P_max * T``.
        beta: Stop a run whose next epoch would take it past ``beta`` x the cheapest run.
        db_path: SQLite file of the batch-size search (shared by all runs of the job).
        power_limit: Power-limit optimizer settings; its ``profile_path`` defaults to
            ``<database>.power_limits.json`` (next to the sweeper's database under the sweeper).
        optimize_power_limit: False keeps the GPUs at their current power limit.
        gpu: How to open this process's GPU (default: ``gpu.backend=auto``).
        gpus: Already opened GPUs of this process (then ``gpu`` is not used; not closed here).
        seed: Seeds the batch-size search.
        rule_out_probability: A batch size less likely than this to be cheaper than the best is
            ruled out, and runs stop early on that evidence (0: runs stop only at the target,
            ``max_epochs`` or ``beta``); see :class:`BatchSizeOptimizer`.
        clock: Wall clock in seconds (tests pass a virtual one).
        synchronize: Waits for queued GPU work before an epoch's edge is stamped (default:
            CUDA's, when this process uses CUDA).
        energy: The GPUs' energy samplers (default: one per GPU, started with the run; a
            virtual clock's caller passes samplers it polls).
    """

    def __init__(
        self,
        job_id: str,
        batch_sizes: Sequence[int],
        default_batch_size: int,
        *,
        target_metric: float,
        higher_is_better: bool = True,
        max_epochs: int = 100,
        eta: float = 0.5,
        beta: float = 2.0,
        db_path: Union[str, Path] = "perseus_batch_size.db",
        power_limit: Optional[PowerLimitConfig] = None,
        optimize_power_limit: bool = True,
        gpu: Optional[GPUConfig] = None,
        gpus: Optional[Sequence[GPU]] = None,
        seed: int = 0,
        rule_out_probability: float = RULE_OUT_PROBABILITY,
        clock: Callable[[], float] = time.monotonic,
        synchronize: Callable[[], None] = aggregate.synchronize_devices,
        energy: Optional[EnergyMeter] = None,
    ) -> None:
        self.job_id = job_id
        self.batch_sizes = [int(b) for b in batch_sizes]
        self.default_batch_size = int(default_batch_size)
        self.target_metric = target_metric
        self.higher_is_better = higher_is_better
        self.max_epochs = max_epochs
        self.eta = eta
        self.beta = beta
        self.db_path = Path(db_path)
        self.power_limit_cfg = dataclasses.replace(power_limit or PowerLimitConfig())
        self.optimize_power_limit = optimize_power_limit
        self.gpu_cfg = gpu or GPUConfig()
        self.seed = seed
        self.rule_out_probability = rule_out_probability
        self._devices = RunDevices(self.gpu_cfg, gpus, clock, synchronize, energy)
        self.rank, self.world_size = 0, 1
        self.batch_size = 0
        self.local_batch_size = 0
        self.optimizer: Optional[BatchSizeOptimizer] = None
        self.result: Optional[Dict[str, Any]] = None
        self._metric: Optional[float] = None
        self._epoch = 0
        self._started = False
        self._warned_metric = False
        # Whether this run's first epoch is still to be priced, and whether its price stopped it.
        self._price_pending = False
        self._stopped_on_price = False
        self._partial: Optional[aggregate.WindowTotals] = None

    @property
    def gpus(self) -> List[GPU]:
        """The GPUs of this process (opened by :meth:`start` unless given)."""
        return self._devices.gpus

    @property
    def power_limit(self) -> Optional[PowerLimitOptimizer]:
        """The run's power-limit optimizer (None: off, or dropped after a problem)."""
        return self._devices.power_limit

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> RecurringJob:
        self.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(failed=exc_type is not None)

    def start(self) -> int:
        """Choose this run's batch size, take the GPU(s); returns the batch size.

        Raises:
            BatchSizeError: When the search is exhausted (every batch size failed; the message
                says how to go on).
            ConfigError: When the batch size does not split over the data-parallel ranks.
        """
        if self._started:
            return self.batch_size
        self.rank, self.world_size = aggregate.rank_and_world()
        self._devices.open()
        try:
            self._choose_batch_size()
            if self.optimize_power_limit:
                self._devices.start_power_limit(
                    self.power_limit_cfg, self.eta, job_id=self.job_id, batch_size=self.batch_size
                )
        except BaseException:
            self.close(failed=True)
            raise
        self._started = True
        self._price_pending = self.world_size == 1 and self.optimizer is not None
        log.info(
            "job %s: batch size %d (%d per rank), power limit %s",
            self.job_id,
            self.batch_size,
            self.local_batch_size,
            "profiled/applied" if self.power_limit is not None else "unchanged",
        )
        return self.batch_size

    def close(self, *, failed: bool = False) -> None:
        """End the run, restore the power limit, release the GPUs and the database.

        A run still open is reported now: as failed (``error``) when ``failed``.
        """
        if self.optimizer is not None and self.optimizer.run_id is not None:
            self._finish(reason=REASON_ERROR if failed else None)
        self._devices.close()
        if self.optimizer is not None:
            self.optimizer.close()
            self.optimizer = None

    # -- the training loop -----------------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        """Epoch numbers (1, 2, ...) until the run ends; call :meth:`report_metric` in each.

        When the loop ends, :attr:`result` holds what was recorded for the run (on every rank).
        """
        self.start()
        for epoch in range(1, self.max_epochs + 1):
            self._epoch = epoch
            self._metric = None
            self._devices.begin_epoch()
            yield epoch
            if self._end_epoch():
                break
        if self.optimizer is not None and self.optimizer.run_id is not None:
            self._finish()
        self.result = aggregate.broadcast_object(self.result)  # type: ignore[assignment]

    def steps(self, iterable: Iterable[T]) -> Iterator[T]:
        """One epoch of a data loader, with the power-limit optimizer around each step.

        In a run's first epoch, once the power-limit profile chose a limit, the epoch is priced
        (the chosen limit's per-step time and energy x the loader's length) and the search
        judges the run on that price: a run it stops (a batch size ruled out by its price, left
        for the walk's other side, or whose one epoch passes the early-stop bound) ends here,
        before paying the rest of the epoch. Single-process jobs with a sized loader only;
        others are judged at their first epoch's end.
        """
        num_steps = _length(iterable) if self._price_pending and self._epoch == 1 else None
        for item in self._devices.steps(iterable):
            yield item
            if num_steps is not None and self._stop_on_price(num_steps):
                return

    def report_metric(self, metric: float) -> None:
        """The validation metric after this epoch (every rank may call it; rank 0's counts)."""
        self._metric = float(metric)

    @contextmanager
    def instruction(self, name: str) -> Iterator[None]:
        """Mark a forward or backward pass (``name``) for the emulated GPU; real GPUs ignore it.

        The emulated device only spends time and energy inside such marks; training on a real
        GPU does not need them.
        """
        with self._devices.instruction(name):
            yield

    def data_loader(self, dataset: Any, **kwargs: Any) -> Any:
        """A ``torch.utils.data.DataLoader`` at this rank's batch size (sharded under DDP)."""
        from torch.utils.data import DataLoader

        self.start()
        if self.world_size > 1 and "sampler" not in kwargs:
            from torch.utils.data.distributed import DistributedSampler

            shuffle = bool(kwargs.pop("shuffle", False))
            kwargs["sampler"] = DistributedSampler(dataset, shuffle=shuffle)
        return DataLoader(dataset, batch_size=self.local_batch_size, **kwargs)

    # -- internals -------------------------------------------------------------------------------
    def _choose_batch_size(self) -> None:
        choice: Dict[str, Any] = {}
        if self.rank == 0:
            try:
                choice["batch_size"] = self._open_run()
                assert self.optimizer is not None
                choice["db_path"] = str(self.optimizer.store.path)
            except PerseusError as exc:
                choice["error"] = exc
        choice = dict(aggregate.broadcast_object(choice))  # type: ignore[call-overload]
        if "error" in choice:
            raise choice["error"]
        self.batch_size = int(choice["batch_size"])
        if self.power_limit_cfg.profile_path is None:
            self.power_limit_cfg.profile_path = f"{choice['db_path']}.power_limits.json"
        if self.batch_size % self.world_size:
            raise ConfigError(
                f"batch size {self.batch_size} does not split over {self.world_size} ranks; "
                f"use batch sizes divisible by {self.world_size}"
            )
        self.local_batch_size = self.batch_size // self.world_size

    def _open_run(self) -> int:
        run = current_run()
        if run is not None:  # launched by the Hydra sweeper: its run, its job
            self.optimizer = run
            if run.job_id != self.job_id:
                log.info("using the sweeper's job %r (not %r)", run.job_id, self.job_id)
                self.job_id = run.job_id
            assert run.run_id is not None
            return run.store.run(run.run_id).batch_size
        self.optimizer = BatchSizeOptimizer(
            self.db_path,
            self.job_id,
            self.batch_sizes,
            self.default_batch_size,
            eta=self.eta,
            beta=self.beta,
            max_epochs=self.max_epochs,
            target_metric=self.target_metric,
            higher_is_better=self.higher_is_better,
            max_power_w=self._devices.max_power_w(self.world_size),
            seed=self.seed,
            rule_out_probability=self.rule_out_probability,
        )
        return self.optimizer.next_batch_size()

    def _stop_on_price(self, num_steps: int) -> bool:
        """Price the first epoch once a limit is chosen; whether the search stops the run."""
        price = self._devices.epoch_price(num_steps)
        if price is None or price[0] <= 0.0:
            return False
        self._price_pending = False
        assert self.optimizer is not None
        self.optimizer.report_epoch_cost(*price)
        if not self.optimizer.should_stop():
            return False
        self._stopped_on_price = True
        log.info(
            "job %s: batch size %d stops in its first epoch, on its price (%.4g s, %.4g J an "
            "epoch at the chosen power limit)",
            self.job_id,
            self.batch_size,
            *price,
        )
        return True

    def _end_epoch(self) -> bool:
        """Measure and report the epoch; returns whether the run stops (same on every rank)."""
        total, steady = self._devices.end_epoch()
        if self._stopped_on_price:
            self._partial = total
            return True
        stop = False
        if self.rank == 0 and self.optimizer is not None and self.optimizer.run_id is not None:
            if self._metric is None and not self._warned_metric:
                self._warned_metric = True
                log.warning(
                    "epoch %d ended without report_metric(...): the run cannot reach the target "
                    "(call it once per epoch)",
                    self._epoch,
                )
            self.optimizer.report_epoch(
                self._metric,
                total.time_s,
                total.energy_j,
                steady_time_s=steady[0],
                steady_energy_j=steady[1],
            )
            stop = self.optimizer.should_stop()
        return bool(aggregate.broadcast_object(stop))

    def _finish(self, reason: Optional[str] = None) -> None:
        assert self.optimizer is not None
        partial = self._partial
        if partial is not None:  # stopped on its price: no whole epoch, what it spent
            summary = self.optimizer.report_run(
                time_s=partial.time_s,
                energy_j=partial.energy_j,
                reached_target=False,
                reason=reason,
            )
        else:
            summary = self.optimizer.report_run(reason=reason)
        if self.power_limit is not None:
            summary["power_limit"] = self.power_limit.report()
        self.result = summary
        log.info("job %s: run %s", self.job_id, summary)


def _length(iterable: Iterable[Any]) -> Optional[int]:
    """The number of items of a sized iterable (a data loader: its steps); None otherwise."""
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None
