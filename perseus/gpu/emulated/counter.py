"""The emulated GPU's energy: the true power over time, and the counter that reads like NVML's.

:class:`PowerTrace` is the truth: a piecewise-constant power schedule ("``p0`` from now, ``p1``
from ``t1``, ...") plus instant deposits, integrated exactly, with the recent past kept so the
energy between two past instants can be asked for (the instant power field and the power
limiter average over windows that ended a little earlier).

:class:`EnergyCounter` is what a caller reads. It moves only at update ticks, one every
``update_period_s`` from ``start_s + phase_s``; each tick takes the true energy as it was
``lag_s`` before the tick (sample and hold of a continuously integrated counter, as the
recorded H100's is: see :mod:`perseus.gpu.emulated.readings`) and adds the difference to the
previous tick times ``max(0, 1 + noise * N(0, 1))``: monotonic, unbiased on average and
deterministic for a seed (ticks are produced in order from one random stream). The ideal counter
is the same with no phase and no lag.

Not thread-safe by themselves: the emulated GPU serializes calls.
"""

from __future__ import annotations

import bisect
import math
import random
from typing import Callable, List, Optional, Sequence, Tuple

from perseus.errors import GPUValueError
from perseus.gpu.emulated.thermal import ThermalModel

# Schedule steps: (time the power takes effect, power in W).
Steps = Sequence[Tuple[float, float]]


class PowerTrace:
    """True power and energy over time (see the module docstring).

    With a thermal model the scheduled powers are before leakage: the trace follows the die's
    temperature under them and adds the leakage it causes, exactly
    (:mod:`perseus.gpu.emulated.thermal`).

    Args:
        start_s: Clock time the trace starts at; before it the power was ``power_w``.
        power_w: Power from ``start_s`` on, until the first schedule.
        keep_s: How much of the past is kept for :meth:`energy_j` (at least).
        thermal: The die's temperature and leakage (``None``: neither is modelled).
        start_c: The temperature at ``start_s`` (default: steady under ``power_w``).
    """

    def __init__(
        self,
        start_s: float,
        power_w: float,
        keep_s: float = 3.0,
        *,
        thermal: Optional[ThermalModel] = None,
        start_c: Optional[float] = None,
    ) -> None:
        self.start_s = start_s
        self.keep_s = keep_s
        self.thermal = thermal
        self._initial_w = power_w
        # Breakpoints: the time, the energy then (J), the power from then on (W) and, with a
        # thermal model, the temperature then (°C).
        self._times: List[float] = [start_s]
        self._energy: List[float] = [0.0]
        self._power: List[float] = [power_w]
        self._temp: List[float] = []
        if thermal is not None:
            self._temp.append(thermal.steady_c(power_w) if start_c is None else start_c)
        self._pending: List[Tuple[float, float]] = []  # scheduled changes after _t
        self._t = start_s  # settled up to here
        # Called with the new time at every advance, before the old past is forgotten.
        self._listeners: List[Callable[[float], None]] = []

    def add_listener(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(now_s)`` whenever the trace advances (while that past is still kept)."""
        self._listeners.append(listener)

    # -- schedule ---------------------------------------------------------------------------
    def schedule(self, now_s: float, steps: Steps) -> None:
        """From ``now_s`` the power follows ``steps`` (the first at ``now_s``), replacing the rest.

        Steps at or before ``now_s`` take effect at ``now_s``; the last one lasts.
        """
        self.advance(now_s)
        self._pending = []
        for t_s, power_w in steps:
            if t_s <= now_s:
                self._set(now_s, power_w)
            else:
                self._pending.append((t_s, power_w))

    def set_power(self, now_s: float, power_w: float) -> None:
        """``power_w`` from ``now_s`` on."""
        self.schedule(now_s, [(now_s, power_w)])

    def deposit(self, now_s: float, energy_j: float) -> None:
        """Add ``energy_j`` at ``now_s`` at once."""
        self.advance(now_s)
        self._append(now_s, self._energy_now() + energy_j, self._power[-1])

    def power_w(self, now_s: float) -> float:
        """The power at ``now_s`` (not before the last settle), leakage included."""
        self.advance(now_s)
        if self.thermal is None:
            return self._power[-1]
        return self._power[-1] + self.thermal.leakage_w(self.temperature_c(now_s))

    def temperature_c(self, t_s: float) -> float:
        """The die's temperature at ``t_s`` (in the kept past or later).

        Raises:
            GPUValueError: the trace has no thermal model.
        """
        if self.thermal is None:
            raise GPUValueError("the emulated GPU models no temperature (thermal model off)")
        if t_s > self._t:
            self.advance(t_s)
        i = max(0, bisect.bisect_right(self._times, t_s) - 1)
        return self._after(i, t_s)[1]

    # -- readings ---------------------------------------------------------------------------
    def advance(self, now_s: float) -> None:
        """Settle the schedule up to ``now_s``, tell the listeners, forget beyond ``keep_s``."""
        if now_s <= self._t:
            return
        while self._pending and self._pending[0][0] <= now_s:
            t_s, power_w = self._pending.pop(0)
            self._t = t_s
            self._set(t_s, power_w)
        self._t = now_s
        for listener in self._listeners:
            listener(now_s)
        cut = bisect.bisect_right(self._times, now_s - self.keep_s) - 1
        if cut > 64:  # drop in batches: keeps advance() amortized O(1)
            del self._times[:cut], self._energy[:cut], self._power[:cut]
            if self._temp:
                del self._temp[:cut]

    def energy_j(self, t_s: float) -> float:
        """Energy from ``start_s`` to ``t_s`` (J; before ``start_s`` negative, at the first power).

        ``t_s`` may lie in the kept past (:attr:`kept_since_s` on) or later; earlier than the
        kept past it is extrapolated with the oldest power known.
        """
        if t_s > self._t:
            self.advance(t_s)
        if t_s < self.start_s:
            return self._initial_w * (t_s - self.start_s)
        i = max(0, bisect.bisect_right(self._times, t_s) - 1)
        if self.thermal is None:
            return self._energy[i] + self._power[i] * (t_s - self._times[i])
        return self._after(i, t_s)[0]

    @property
    def kept_since_s(self) -> float:
        """The oldest instant whose energy is still known exactly."""
        return self._times[0] if self._times[0] > self.start_s else -math.inf

    def average_w(self, t0_s: float, t1_s: float) -> float:
        """Average power over ``[t0_s, t1_s]`` (W)."""
        if t1_s <= t0_s:
            return self._power_at(t1_s)
        return (self.energy_j(t1_s) - self.energy_j(t0_s)) / (t1_s - t0_s)

    # -- internals --------------------------------------------------------------------------
    def _power_at(self, t_s: float) -> float:
        return self._power[max(0, bisect.bisect_right(self._times, t_s) - 1)]

    def _after(self, i: int, t_s: float) -> Tuple[float, float]:
        """Energy (J) and temperature (°C) at ``t_s``, from breakpoint ``i`` (thermal model)."""
        thermal = self.thermal
        assert thermal is not None
        end_c, energy_j = thermal.advance(self._temp[i], self._power[i], t_s - self._times[i])
        return self._energy[i] + energy_j, end_c

    def _energy_now(self) -> float:
        if self.thermal is None:
            return self._energy[-1] + self._power[-1] * (self._t - self._times[-1])
        return self._after(len(self._times) - 1, self._t)[0]

    def _set(self, t_s: float, power_w: float) -> None:
        if self.thermal is None:
            energy_j = self._energy[-1] + self._power[-1] * (t_s - self._times[-1])
            self._append(t_s, energy_j, power_w)
            return
        energy_j, temp_c = self._after(len(self._times) - 1, t_s)
        self._append(t_s, energy_j, power_w, temp_c)

    def _append(
        self, t_s: float, energy_j: float, power_w: float, temp_c: Optional[float] = None
    ) -> None:
        if self.thermal is not None and temp_c is None:  # a deposit: the temperature goes on
            temp_c = self._after(len(self._times) - 1, t_s)[1]
        if self._times[-1] == t_s:
            self._energy[-1], self._power[-1] = energy_j, power_w
            if temp_c is not None:
                self._temp[-1] = temp_c
        else:
            self._times.append(t_s)
            self._energy.append(energy_j)
            self._power.append(power_w)
            if temp_c is not None:
                self._temp.append(temp_c)


class EnergyCounter:
    """The counter a caller reads: sample and hold of a :class:`PowerTrace` at update ticks.

    Args:
        trace: The true energy.
        update_period_s: Time between updates.
        noise: Relative standard deviation of each update's multiplicative noise.
        seed: Seed of the noise stream.
        phase_s: Time from ``trace.start_s`` to tick 0 (the first update is tick 1).
        lag_s: How long before its tick an update's energy was taken (``< update_period_s``).
    """

    def __init__(
        self,
        trace: PowerTrace,
        update_period_s: float,
        noise: float = 0.0,
        seed: int = 0,
        *,
        phase_s: float = 0.0,
        lag_s: float = 0.0,
    ) -> None:
        self.trace = trace
        self.update_period_s = update_period_s
        self.lag_s = lag_s
        self._first_s = trace.start_s + phase_s
        self._noise = noise
        self._rng = random.Random(seed)
        self._ticks = 0
        self._tick_energy_j = 0.0  # true energy sampled at the last tick
        self._counter_j = 0.0
        self._last_increment_j: Optional[float] = None
        trace.add_listener(self._catch_up)  # every update is taken while its past is kept

    def counter_j(self, now_s: float) -> float:
        """What the counter reads at ``now_s``."""
        self._advance(now_s)
        return self._counter_j

    def last_update_s(self, now_s: float) -> float:
        """Clock time of the counter's last update at or before ``now_s``.

        Before the first update: the start (the counter has read 0 since).
        """
        self._advance(now_s)
        return self.tick_s(self._ticks) if self._ticks > 0 else self.trace.start_s

    def tick_s(self, tick: int) -> float:
        """Clock time of update ``tick``."""
        return self._first_s + tick * self.update_period_s

    def phase(self, t_s: float) -> float:
        """Where ``t_s`` lies within its update period, as a fraction (0 = at an update)."""
        return ((t_s - self._first_s) / self.update_period_s) % 1.0

    def average_power_w(self, now_s: float) -> float:
        """Power averaged over the last update period, as the counter saw it."""
        self._advance(now_s)
        if self._last_increment_j is None:
            return self.trace.power_w(now_s)
        return self._last_increment_j / self.update_period_s

    def _sample_j(self, tick: int) -> float:
        return self.trace.energy_j(max(self.trace.start_s, self.tick_s(tick) - self.lag_s))

    def _advance(self, now_s: float) -> None:
        self.trace.advance(now_s)  # calls _catch_up

    def _catch_up(self, now_s: float) -> None:
        """Produce every update up to ``now_s``."""
        if now_s < self._first_s:
            return
        last_tick = math.floor((now_s - self._first_s) / self.update_period_s)
        if last_tick - 1 > self._ticks and self._noise == 0.0:
            self._ticks = last_tick - 1  # without noise only the last tick matters
            self._tick_energy_j = self._counter_j = self._sample_j(self._ticks)
        while self._ticks < last_tick:
            self._ticks += 1
            energy_j = self._sample_j(self._ticks)
            increment_j = energy_j - self._tick_energy_j
            factor = max(0.0, 1.0 + self._noise * self._rng.gauss(0.0, 1.0)) if self._noise else 1.0
            self._counter_j += increment_j * factor
            self._last_increment_j = increment_j * factor
            self._tick_energy_j = energy_j
