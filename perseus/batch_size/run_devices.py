"""A recurring job's GPUs in this process during one run, and their power limit.

:class:`RunDevices` is what :class:`~perseus.batch_size.recurring.RecurringJob` holds of the
hardware: it opens this process's GPU (or takes the ones given) and their energy samplers (one
per GPU, off the training thread: :class:`~perseus.gpu.energy.meter.EnergyMeter`), stamps
epoch edges after queued work finished, marks forward and backward passes for the emulated GPU,
runs the power-limit optimizer
(:class:`~perseus.power_limit.optimizer.PowerLimitOptimizer`, on the same samplers)
around every epoch and step, measures each epoch over every rank and prices it at the power
limit chosen for the batch size, and at the end puts the power limit back and
closes what it opened.

An epoch's energy is known once the counters updated after its end: the epoch's end waits for
that, a few update periods at most. A counter that stopped is warned about once, and the
epoch's energy is then extrapolated from what was covered (or from the power reading).

Power-limit problems (no permission, a GPU owned by another controller) never stop training:
one warning, and the run goes on at the GPU's current limit.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from perseus.batch_size.power_shape import limits_prior
from perseus.config.schema import GPUConfig, PowerLimitConfig
from perseus.errors import ConfigError, PerseusError
from perseus.gpu.base import GPU
from perseus.gpu.energy.meter import EnergyMeter
from perseus.power_limit import aggregate
from perseus.power_limit.optimizer import DONE, PowerLimitOptimizer

log = logging.getLogger(__name__)
T = TypeVar("T")


class RunDevices:
    """One run's GPUs in this process: opened or given, read, marked, power-limited, closed.

    Args:
        gpu_cfg: How to open this process's GPU (used when ``gpus`` is None).
        gpus: Already opened GPUs of this process (not closed here).
        clock: Wall clock in seconds (the samplers' time base).
        synchronize: Waits for queued GPU work before an epoch's edge is stamped.
        energy: The GPUs' energy samplers (default: started when the GPUs are opened).

    Attributes:
        meter: The GPUs' energy (``None`` before :meth:`open`).
    """

    def __init__(
        self,
        gpu_cfg: GPUConfig,
        gpus: Optional[Sequence[GPU]],
        clock: Callable[[], float],
        synchronize: Callable[[], None],
        energy: Optional[EnergyMeter] = None,
    ) -> None:
        self.gpu_cfg = gpu_cfg
        self._given_gpus = gpus
        self.gpus: List[GPU] = list(gpus or [])
        self._owned_gpus: Any = None
        self._clock = clock
        self._synchronize = synchronize
        self.meter = energy
        self._own_meter = False
        self._warned_energy = False
        self.power_limit: Optional[PowerLimitOptimizer] = None
        self._epoch_start_s = 0.0
        self._done_at: Optional[Tuple[float, int]] = None  # (when, steps into the epoch)
        # Epochs that ended while power limits were still being profiled: (time, energy, steps).
        self._profiling_epochs: List[aggregate.WindowTotals] = []
        self._profiling_steps = 0
        self._epoch_steps = 0

    def open(self) -> None:
        """Open this process's GPU (``LOCAL_RANK``'s) unless GPUs were given, and the samplers."""
        if self._given_gpus is None:
            from perseus.gpu import GPUs

            local_index = _local_device_index()
            self._owned_gpus = GPUs.open(self.gpu_cfg, indices=[local_index])
            self.gpus = list(self._owned_gpus)
        if self.meter is None:
            if self._owned_gpus is not None:  # the collection stops its samplers itself
                self.meter = self._owned_gpus.energy_meter(self._clock)
            else:
                self.meter = EnergyMeter.start(self.gpus, self._clock, name="run")
                self._own_meter = True
        self.meter.ready()  # before the first epoch: its start must follow an update

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
                energy=self.meter,
                limits_prior=limits_prior(batch_size),
            )
        except PerseusError as exc:
            self._drop_power_limit(exc)

    # -- epochs and steps ------------------------------------------------------------------------
    def begin_epoch(self) -> None:
        """A new epoch starts: stamp its start."""
        self._epoch_steps = 0
        self._done_at = None
        self._epoch_start_s = self._stamp()

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
                    self._done_at = (self._stamp(), self._epoch_steps)
        finally:
            self._call_power_limit("on_epoch_end")

    def epoch_price(self, num_steps: int) -> Optional[Tuple[float, float]]:
        """``(time_s, energy_j)`` of an epoch of ``num_steps`` steps at the chosen power limit.

        From the power-limit profile's per-step measurement of the chosen limit (this process's
        GPUs); None while no limit is chosen (profiling, or power-limit optimization off).
        """
        plo = self.power_limit
        if plo is None or plo.state != DONE:
            return None
        chosen = plo.chosen_measurement
        if chosen is None:
            return None
        return num_steps * chosen.time_per_step_s, num_steps * chosen.energy_per_step_j

    def end_epoch(self) -> Tuple[aggregate.WindowTotals, tuple]:
        """The epoch's time and energy over every rank: as measured, and at the chosen limit.

        Waits (a few counter update periods at most) until the counters cover the epoch's end.
        """
        start_s, end_s = self._epoch_start_s, self._stamp()
        done_s = self._done_at[0] if self._done_at is not None else end_s
        energy_j = self._energy_j(start_s, end_s)
        after_j = self._energy_j(done_s, end_s) if self._done_at is not None else 0.0
        local = aggregate.WindowTotals(end_s - start_s, energy_j)
        total = aggregate.torch_distributed(local)
        return total, self._steady(total, aggregate.WindowTotals(end_s - done_s, after_j))

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

    def close(self) -> None:
        """Put the power limit back, stop the samplers, then close the GPUs opened here."""
        if self.power_limit is not None:
            try:
                self.power_limit.close()
            finally:
                self.power_limit = None
        if self._own_meter and self.meter is not None:
            self.meter.close()
            self._own_meter = False
        if self._owned_gpus is not None:
            owned, self._owned_gpus = self._owned_gpus, None
            owned.close()

    # -- internals -------------------------------------------------------------------------------
    def _stamp(self) -> float:
        """The time now, after the GPUs' queued work."""
        self._synchronize()
        return self._clock()

    def _energy_j(self, t0_s: float, t1_s: float) -> float:
        """The energy of this process's GPUs from ``t0_s`` to ``t1_s`` (J), from their samplers.

        Where a counter does not cover ``t1_s`` within the wait, the part it covered is
        extrapolated to the whole span (or, with nothing covered, the power reading is), with
        one warning.
        """
        meter = self.meter
        assert meter is not None
        meter.wait_until_covered(t1_s)
        energy_j = meter.energy_j_between(t0_s, t1_s)
        if energy_j is not None:
            return energy_j
        if not self._warned_energy:
            self._warned_energy = True
            log.warning(
                "the GPUs' energy counter did not cover the end of an epoch; its energy is "
                "extrapolated from the part it covered (or from the power reading)"
            )
        covered_s = min((s.series.last_time_s or t0_s for s in meter.samplers), default=t0_s)
        covered_j = meter.energy_j_between(t0_s, covered_s) if covered_s > t0_s else None
        if covered_j is not None:
            return covered_j * (t1_s - t0_s) / (covered_s - t0_s)
        return sum(gpu.power_mw() for gpu in self.gpus) / 1000.0 * (t1_s - t0_s)

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

    def _steady(self, total: aggregate.WindowTotals, after_local: aggregate.WindowTotals) -> tuple:
        """The epoch at the chosen limit.

        The steps spent profiling are priced at the chosen limit's measured per-step time and
        energy, the rest of the epoch (``after_local``: after the choice) is as measured. Epochs
        that ended before the choice was made were reported as measured; the epoch in which it
        is made takes their correction.
        """
        plo = self.power_limit
        steps = self._done_at[1] if self._done_at is not None else 0
        # Every rank takes part in the reduction, whatever its own state.
        after = aggregate.torch_distributed(after_local)
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
