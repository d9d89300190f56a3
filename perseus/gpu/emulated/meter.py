"""The measurement half of the emulated GPU: its energy counter, power readings and rest power.

:class:`EmulatedMeter` sits between :class:`~perseus.gpu.emulated.clocks.EmulatedClocks` (clocks and
power limit) and :class:`~perseus.gpu.emulated.device.EmulatedGPU` (instructions); what the readings
show, realistic or ideal, is :mod:`perseus.gpu.emulated.readings`.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Tuple, Union

from perseus.config.enums import EmulatedCounter
from perseus.errors import GPUValueError
from perseus.gpu.emulated.clocks import EmulatedClocks
from perseus.gpu.emulated.readings import IDLE_AFTER_S, READ_AT_FRACTION, Readings


class EmulatedMeter(EmulatedClocks):
    """Readings of an emulated GPU.

    The subclass sets the attributes below, ``_clock`` and ``_sleeper``, and calls
    :meth:`_start_readings`.

    Attributes:
        blocking_power_w: Power outside instructions (W).
        idle_power_w: Power before any work and after a long pause (W; realistic).
    """

    blocking_power_w: float
    idle_power_w: float
    _clock: Callable[[], float]
    _sleeper: Optional[Callable[[float], None]]

    def _start_readings(self, readings: Readings) -> None:
        self._readings = readings
        self._trace = readings.trace
        self._counter = readings.counter
        self._limiter = readings.limiter
        self.power_source = (
            "instant field (emulated)"
            if readings.realistic
            else "averaged over the last counter update"
        )

    def total_energy_mj(self) -> int:
        """The energy counter (mJ), read as NVML reads it.

        Realistic: blocks the caller for a read latency drawn from the recorded ones (the
        device stays free for other threads meanwhile) and returns the counter as of an instant
        inside the call. Ideal: returns at once.
        """
        with self._lock:
            start_s = self._settle()
            latency_s = self._readings.read_latency_s(start_s)
            if latency_s <= 0.0:
                return int(self._counter.counter_j(start_s) * 1000.0)
        self._block_until(start_s + READ_AT_FRACTION * latency_s)
        with self._lock:
            value_mj = int(self._counter.counter_j(self._settle()) * 1000.0)
        self._block_until(start_s + latency_s)
        return value_mj

    def power_mw(self) -> int:
        """Power (mW): the instant field (realistic), the last update's average (ideal)."""
        with self._lock:
            return int(self._readings.power_w(self._settle()) * 1000.0)

    def instant_power_mw(self) -> Optional[int]:
        """The instant power field (realistic: lagging, ~100 ms updates; ideal: the power now)."""
        with self._lock:
            return int(self._readings.instant_w(self._settle()) * 1000.0)

    def energy_reading(self) -> Tuple[float, int]:
        """``(time of the counter's last update, counter in mJ)``, read together.

        Real GPUs do not say when their counter last moved; tests and calibration scripts use
        this to measure windows exactly aligned with updates.
        """
        with self._lock:
            now = self._settle()
            return self._counter.last_update_s(now), int(self._counter.counter_j(now) * 1000.0)

    def true_energy_j(self, at_s: Optional[float] = None) -> float:
        """Energy consumed up to now, without quantization or noise (for tests and reports).

        ``at_s``: up to that instant instead, at most a few seconds back.

        Raises:
            GPUValueError: ``at_s`` is further back than the device remembers.
        """
        with self._lock:
            now = self._settle()
            if at_s is not None and at_s < self._trace.kept_since_s:
                raise GPUValueError(
                    f"true_energy_j(at_s={at_s}): the emulated GPU keeps only the last "
                    f"{self._trace.keep_s} s of its power; ask for a later instant"
                )
            return self._trace.energy_j(now if at_s is None else min(at_s, now))

    def _rest_steps(self, t_s: float) -> List[Tuple[float, float]]:
        """The power outside instructions from ``t_s``: blocking, idle after a long pause."""
        steps = [(t_s, self.blocking_power_w)]
        if self._readings.realistic:
            steps.append((t_s + IDLE_AFTER_S, self.idle_power_w))
        return steps

    def _rest(self, t_s: float) -> None:
        self._trace.schedule(t_s, self._rest_steps(t_s))

    def _block_until(self, deadline_s: float) -> None:
        """Block the calling thread until ``deadline_s`` without spinning (an NVML call)."""
        remaining = deadline_s - self._clock()
        if remaining > 0:
            (self._sleeper or time.sleep)(remaining)


def counter_kind(counter: Union[str, EmulatedCounter]) -> EmulatedCounter:
    """``gpu.emulated.counter`` as the enum.

    Raises:
        GPUValueError: for a value that is neither realistic nor ideal.
    """
    try:
        return EmulatedCounter(counter)
    except ValueError:
        raise GPUValueError(
            f"gpu.emulated.counter={counter!r}: choose realistic or ideal"
        ) from None
