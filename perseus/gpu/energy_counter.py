"""Energy bookkeeping of the emulated GPU: true energy and a counter that reads like NVML's.

The true energy integrates a piecewise-constant power schedule ("``power_w`` until
``until_s``, then ``after_w``") plus instant deposits. The counter a caller reads moves only at
update ticks, every ``update_period_s`` from the start (real GPUs update theirs every few tens
of milliseconds), so very short windows read zero. Each tick adds the true energy since the
previous tick times ``max(0, 1 + noise * N(0, 1))``: monotonic, unbiased on average, and
deterministic for a seed because ticks are always produced in order from one random stream.

Not thread-safe by itself: the emulated GPU serializes calls.
"""

from __future__ import annotations

import math
import random
from typing import Optional


class EnergyCounter:
    """True energy over time and its quantized, noisy counter.

    Args:
        start_s: Clock time the counter starts at (tick ``k`` is at ``start_s + k * period``).
        update_period_s: Time between counter updates.
        noise: Relative standard deviation of each update's multiplicative noise.
        seed: Seed of the noise stream.
        power_w: Power from ``start_s`` on.
    """

    def __init__(
        self, start_s: float, update_period_s: float, noise: float, seed: int, power_w: float
    ) -> None:
        self.update_period_s = update_period_s
        self._noise = noise
        self._rng = random.Random(seed)
        self._start_s = start_s
        self._t_s = start_s  # true energy is settled up to here
        self._energy_j = 0.0
        self._power_w = power_w
        self._until_s: Optional[float] = None
        self._after_w = power_w
        self._ticks = 0
        self._tick_energy_j = 0.0  # true energy at the last tick
        self._counter_j = 0.0
        self._last_increment_j: Optional[float] = None

    # -- schedule ---------------------------------------------------------------------------
    def set_power(
        self,
        now_s: float,
        power_w: float,
        until_s: Optional[float] = None,
        after_w: Optional[float] = None,
    ) -> None:
        """From ``now_s``: ``power_w`` until ``until_s`` (None = on), then ``after_w``."""
        self.advance(now_s)
        self._power_w = power_w
        self._until_s = until_s
        self._after_w = power_w if after_w is None else after_w

    def deposit(self, now_s: float, energy_j: float) -> None:
        """Add ``energy_j`` at ``now_s`` at once."""
        self.advance(now_s)
        self._energy_j += energy_j

    def power_w(self, now_s: float) -> float:
        """The scheduled power at ``now_s`` (``now_s`` not before the last settle)."""
        if self._until_s is not None and now_s >= self._until_s:
            return self._after_w
        return self._power_w

    # -- readings ---------------------------------------------------------------------------
    def true_energy_j(self, now_s: float) -> float:
        """Energy consumed up to ``now_s`` (no quantization, no noise)."""
        self.advance(now_s)
        return self._energy_j

    def counter_j(self, now_s: float) -> float:
        """What the device's counter reads at ``now_s``."""
        self.advance(now_s)
        return self._counter_j

    def last_update_s(self, now_s: float) -> float:
        """Clock time of the counter's last update at or before ``now_s``."""
        self.advance(now_s)
        return self._tick_time(self._ticks)

    def average_power_w(self, now_s: float) -> float:
        """Power averaged over the last update period, as the counter saw it."""
        self.advance(now_s)
        if self._last_increment_j is None:
            return self.power_w(now_s)
        return self._last_increment_j / self.update_period_s

    # -- internals --------------------------------------------------------------------------
    def advance(self, now_s: float) -> None:
        """Produce every counter tick up to ``now_s``, then settle the true energy there."""
        if now_s <= self._t_s:
            return
        last_tick = math.floor((now_s - self._start_s) / self.update_period_s)
        if last_tick - 1 > self._ticks and self._noise == 0.0:
            self._ticks = last_tick - 1  # without noise only the last tick matters
            self._tick_energy_j = self._counter_j = self._energy_at(self._tick_time(last_tick - 1))
        while self._ticks < last_tick:
            self._ticks += 1
            energy_j = self._energy_at(self._tick_time(self._ticks))
            increment_j = energy_j - self._tick_energy_j
            factor = max(0.0, 1.0 + self._noise * self._rng.gauss(0.0, 1.0)) if self._noise else 1.0
            self._counter_j += increment_j * factor
            self._last_increment_j = increment_j * factor
            self._tick_energy_j = energy_j
        self._energy_j = self._energy_at(now_s)
        self._t_s = now_s

    def _tick_time(self, tick: int) -> float:
        return self._start_s + tick * self.update_period_s

    def _energy_at(self, t_s: float) -> float:
        """True energy at ``t_s >= self._t_s`` under the current schedule."""
        t_s = max(t_s, self._t_s)
        if self._until_s is None or t_s <= self._until_s:
            return self._energy_j + self._power_w * (t_s - self._t_s)
        first_s = max(0.0, self._until_s - self._t_s)
        return (
            self._energy_j
            + self._power_w * first_s
            + self._after_w * (t_s - max(self._until_s, self._t_s))
        )
