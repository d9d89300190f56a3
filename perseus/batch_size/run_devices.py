"""A recurring job's GPUs in this process during one run, and their power limit.

:class:`RunDevices` is what :class:`~perseus.batch_size.recurring.RecurringJob` holds of the
hardware: it opens this process's GPU (or takes the ones given), reads the clock and their
energy after queued work finished, marks forward and backward passes for the emulated GPU, runs
the power-limit optimizer (:class:`~perseus.power_limit.optimizer.PowerLimitOptimizer`) around
every epoch and step, measures each epoch over every rank and prices it at the power limit
chosen for the batch size, and at the end puts the power limit back and closes what it opened.

Power-limit problems (no permission, a GPU owned by another controller) never stop training:
one warning, and the run goes on at the GPU's current limit.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from perseus.config import GPUConfig, PowerLimitConfig
from perseus.errors import ConfigError, PerseusError
from perseus.gpu.base import GPU
from perseus.power_limit import aggregate
from perseus.power_limit.optimizer import DONE, PowerLimitOptimizer

log = logging.getLogger(__name__)
T = TypeVar("T")


class RunDevices:
    """One run's GPUs in this process: opened or given, read, marked, power-limited, closed.

    Args:
        gpu_cfg: How to open this process's GPU (used when ``gpus`` is None).
        gpus: Already opened GPUs of this process (not closed here).
        clock: Wall clock in seconds.
        synchronize: Waits for queued GPU work before time and energy are read.
    """

    def __init__(
        self,
        gpu_cfg: GPUConfig,
        gpus: Optional[Sequence[GPU]],
        clock: Callable[[], float],
        synchronize: Callable[[], None],
    ) -> None:
        self.gpu_cfg = gpu_cfg
        self._given_gpus = gpus
        self.gpus: List[GPU] = list(gpus or [])
        self._owned_gpus: Any = None
        self._clock = clock
        self._synchronize = synchronize
        self.power_limit: Optional[PowerLimitOptimizer] = None
        self._epoch_start: Optional[tuple] = None
        self._done_at: Optional[tuple] = None
        # Epochs that ended while power limits were still being profiled: (time, energy, steps).
        self._profiling_epochs: List[aggregate.WindowTotals] = []
        self._profiling_steps = 0
        self._epoch_steps = 0

    def open(self) -> None:
        """Open this process's GPU (``LOCAL_RANK``'s), unless GPUs were given."""
        if self._given_gpus is None:
            from perseus.gpu import GPUs

            local_index = _local_device_index()
            self._owned_gpus = GPUs.open(self.gpu_cfg, indices=[local_index])
            self.gpus = list(self._owned_gpus)

    def max_power_w(self, world_size: int) -> float:
        """The maximum power of all the job's GPUs (W), taking every rank's to be like ours."""
        local = sum(gpu.power_limit_constraints_mw()[1] for gpu in self.gpus) / 1000.0
        return local * world_size

    def start_power_limit(
        self, cfg: PowerLimitConfig, eta: float, *, job_id: str, batch_size: int
    ) -> None:
        """Take the GPUs with a power-limit optimizer for ``batch_size`` (one warning if not)."""
        state_dir = Path(self.gpu_cfg.state_dir) if self.gpu_cfg.state_dir else None
        try:
            self.power_limit = PowerLimitOptimizer.for_gpus(
                self.gpus,
                cfg,
                eta,
                state_dir=state_dir,
                job_id=job_id,
                batch_size=batch_size,
                clock=self._clock,
                synchronize=self._synchronize,
            )
        except PerseusError as exc:
            self._drop_power_limit(exc)

    # -- epochs and steps ------------------------------------------------------------------------
    def begin_epoch(self) -> None:
        """A new epoch starts: its first reading."""
        self._epoch_steps = 0
        self._done_at = None
        self._epoch_start = self.read()

    def steps(self, iterable: Iterable[T]) -> Iterator[T]:
        """One epoch of a data loader, with the power-limit optimizer around each step."""
        self._call_power_limit("on_epoch_begin")
        try:
            for item in iterable:
                self._call_power_limit("on_step_begin")
                yield item
                self._epoch_steps += 1
                was_done = self.power_limit is None or self.power_limit.state == DONE
                self._call_power_limit("on_step_end")
                plo = self.power_limit
                if not was_done and plo is not None and plo.state == DONE:
                    self._done_at = (*self.read(), self._epoch_steps)
        finally:
            self._call_power_limit("on_epoch_end")

    def end_epoch(self) -> Tuple[aggregate.WindowTotals, tuple]:
        """The epoch's time and energy over every rank: as measured, and at the chosen limit."""
        assert self._epoch_start is not None
        end_s, end_j = self.read()
        start_s, start_j = self._epoch_start
        local = aggregate.WindowTotals(end_s - start_s, end_j - start_j)
        total = aggregate.torch_distributed(local)
        return total, self._steady(total, end_s, end_j)

    @contextmanager
    def instruction(self, name: str) -> Iterator[None]:
        """Mark a forward or backward pass (``name``) on every GPU (the emulated one uses it)."""
        for gpu in self.gpus:
            gpu.instruction_begin(0, name)
        try:
            yield
        finally:
            for gpu in self.gpus:
                gpu.instruction_end(name)

    def read(self) -> tuple:
        """``(time_s, energy_j)`` of this process's GPUs, after their queued work."""
        self._synchronize()
        return self._clock(), sum(gpu.total_energy_mj() for gpu in self.gpus) / 1000.0

    def close(self) -> None:
        """Put the power limit back, then close the GPUs opened here."""
        if self.power_limit is not None:
            try:
                self.power_limit.close()
            finally:
                self.power_limit = None
        if self._owned_gpus is not None:
            owned, self._owned_gpus = self._owned_gpus, None
            owned.close()

    # -- internals -------------------------------------------------------------------------------
    def _call_power_limit(self, name: str) -> None:
        if self.power_limit is None:
            return
        try:
            getattr(self.power_limit, name)()
        except PerseusError as exc:
            self._drop_power_limit(exc)

    def _drop_power_limit(self, exc: Exception) -> None:
        log.warning(
            "power-limit optimization is off for this run (%s); training goes on at the GPU's "
            "current power limit",
            exc,
        )
        if self.power_limit is not None:
            try:
                self.power_limit.close()
            except PerseusError as close_exc:
                log.warning("restoring the power limit failed: %s", close_exc)
            self.power_limit = None

    def _steady(self, total: aggregate.WindowTotals, end_s: float, end_j: float) -> tuple:
        """The epoch at the chosen limit.

        The steps spent profiling are priced at the chosen limit's measured per-step time and
        energy, the rest of the epoch is as measured. Epochs that ended before the choice was
        made were reported as measured; the epoch in which it is made takes their correction.
        """
        plo = self.power_limit
        done_s, done_j, steps = self._done_at or (end_s, end_j, 0)
        # Every rank takes part in the reduction, whatever its own state.
        after = aggregate.torch_distributed(aggregate.WindowTotals(end_s - done_s, end_j - done_j))
        if plo is None or plo.state != DONE or self._done_at is None:
            if plo is not None and plo.state != DONE:
                self._profiling_epochs.append(total)
                self._profiling_steps += self._epoch_steps
            return total.time_s, total.energy_j
        chosen = plo.chosen_measurement
        assert chosen is not None
        steps += self._profiling_steps
        earlier_s = sum(e.time_s for e in self._profiling_epochs)
        earlier_j = sum(e.energy_j for e in self._profiling_epochs)
        self._profiling_epochs, self._profiling_steps = [], 0
        return (
            after.time_s + steps * chosen.time_per_step_s - earlier_s,
            after.energy_j + steps * chosen.energy_per_step_j - earlier_j,
        )


def _local_device_index() -> int:
    """The index of this process's GPU.

    ``LOCAL_RANK`` under torchrun, ``SLURM_LOCALID`` in a task ``srun`` started, else 0.
    """
    key = next((k for k in ("LOCAL_RANK", "SLURM_LOCALID") if os.environ.get(k)), None)
    value = os.environ.get(key, "0") if key else "0"
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{key}={value!r}: not an integer") from exc
