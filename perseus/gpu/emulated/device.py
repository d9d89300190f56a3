"""The emulated GPU: a device model for machines without a usable NVIDIA GPU.

It is driven by a *device profile* (a profile CSV: time and energy of every stage's forward
and backward at every SM frequency; by default the published GPT-3 175B / A100 one; a
backward's halves, where the profile lacks them, by the rule of
:func:`~perseus.formats.profile.split.split_backward`) plus the power it burns while blocked
(``blocking_power_w``) and while idle (``idle_power_w``).

Behaviour:

* **Instructions.** The runtime marks ``instruction_begin(stage, instruction)`` and
  ``instruction_end(instruction)``. The instruction runs at the clock in effect when it began
  and lasts the profiled time at that clock: ``instruction_end`` sleeps whatever the real CPU
  work left of it (if the CPU work took longer, it simply took longer: the overrun burns
  blocking power, as a real GPU idles while its host stalls inside a stamped instruction). Its
  energy is the profiled energy, spread evenly over the profiled time. Time outside
  instructions burns blocking power. With ``sleep=False`` nothing sleeps (hook benchmarks): each
  instruction deposits its profiled energy when it ends.
* **time_scale** multiplies every profiled time and energy (powers stay the same): 0.01 makes a
  demo 100x quicker.
* **Clocks and power limit** (:mod:`perseus.gpu.emulated.clocks`): instructions run at the
  profiled clock at or below the locked one, held down by the power limit. ``dry_run``: clock
  and power-limit changes are logged, not made.
* **Readings** (``counter``, :mod:`perseus.gpu.emulated.readings`). ``realistic`` (the
  configuration's default): the recorded H100's counter, updated every 100 ms and sampled with a
  lag; :meth:`EmulatedGPU.total_energy_mj` blocks its caller ~3 ms (up to ~35 ms) without
  holding the device (other threads keep driving it) and returns the counter as of an instant
  inside the call; an instant power field (:meth:`EmulatedGPU.instant_power_mw`, also
  ``power_mw()``) updated every ~100 ms from a lagging window; idle power before any work and
  after a long pause; the power limit enforced on a ~1 s average. ``ideal`` (the constructor's
  default): a counter exact at strictly periodic updates (``energy_update_period_s``, 20 ms),
  free to read, ``power_mw()`` averaged over the last update. Either counter takes
  multiplicative ``energy_noise`` per update, deterministic for a ``seed``
  (:mod:`perseus.gpu.emulated.counter`).
* **Asynchronous mode** (``asynchronous=True``, ``gpu.emulated.asynchronous``): like CUDA,
  ``instruction_begin`` queues the instruction's work and returns, ``instruction_end``
  returns at once, and the work runs on a virtual device timeline
  (:mod:`perseus.gpu.emulated.timeline`) at the clocks in force while it runs;
  :meth:`EmulatedGPU.synchronize` waits until the queue has drained. A runtime that stamps
  times or changes clocks without synchronizing first measures queueing and puts clocks on
  the wrong work — as it would on a real GPU. :attr:`EmulatedGPU.executed` lists what ran,
  when and at which clocks.
* **Temperature** (``thermal``, :mod:`perseus.gpu.emulated.thermal`; off by default): the die
  warms toward a steady temperature that rises with power (one time constant, ~1 min) and
  leakage power rises with temperature, so the same instruction costs more on a warm card;
  :meth:`EmulatedGPU.temperature_c` reads it as NVML does (whole °C).
* **Stage mapping** (:func:`~perseus.gpu.emulated.model.map_stage`): a pipeline with another
  number of stages than the profile keeps the profile's first and last stages.

Thread-safe: the runtime may change clocks from a controller thread.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Union

from perseus.config.enums import EmulatedCounter
from perseus.errors import GPUError, GPUValueError
from perseus.formats.profile.split import split_backward
from perseus.formats.profile.table import INSTRUCTIONS, Measurement, Profile
from perseus.gpu.emulated.meter import EmulatedMeter, counter_kind
from perseus.gpu.emulated.model import check_args, heaviest_power_w, map_stage
from perseus.gpu.emulated.profiles import (
    bundled_profile_names,
    bundled_profile_path,
    default_device_profile_path,
    load_device_profile,
)
from perseus.gpu.emulated.readings import (
    COUNTER_PERIOD_S,
    IDEAL_PERIOD_S,
    IDLE_SHARE,
    MIN_REALISTIC_PERIOD_S,
    Readings,
)
from perseus.gpu.emulated.thermal import ThermalModel
from perseus.gpu.emulated.timeline import Timeline, Work

__all__ = [
    "EmulatedGPU",
    "bundled_profile_names",
    "bundled_profile_path",
    "default_device_profile_path",
    "load_device_profile",
    "map_stage",
]

logger = logging.getLogger(__name__)

# The last stretch of an instruction is busy-waited: sleep() overshoots by ~0.1 ms, which
# would distort instructions that a small time_scale makes last a millisecond.
SPIN_S = 0.0005
# The ideal device's default highest power limit, unless an instruction draws more (the
# realistic one's: the heaviest instruction). A GPU never runs above its power limit.
IDEAL_POWER_LIMIT_MAX_W = 400.0


@dataclass
class _Running:
    stage: int
    instruction: str
    start_s: float
    measurement: Measurement


class EmulatedGPU(EmulatedMeter):
    """A GPU that behaves like its device profile (see the module docstring).

    Args:
        profile: Device profile.
        blocking_power_w: Power outside instructions (W).
        idle_power_w: Power before the first instruction and after a long pause (W); default
            realistic: 17.6 % of the highest power limit, at most ``blocking_power_w``; ideal:
            ``blocking_power_w`` (and never a pause).
        time_scale: Multiplies profiled times and energies.
        counter: ``realistic`` or ``ideal`` readings (see the module docstring).
        energy_update_period_s: Time between energy-counter updates; default 0.1 s
            (realistic) or 0.02 s (ideal).
        energy_noise: Relative noise of each counter update.
        seed: Seed of the noise (and of the realistic readings' randomness).
        sleep: Make instructions last their profiled time (off: deposit energy only).
        power_limit_max_w: Highest (and default) power limit; default realistic: the power of
            the profile's heaviest instruction (rounded up to a watt); ideal: 400 W, or that
            power where it is higher (the device profile is measured at the default limit: no
            instruction of it runs above the limit).
        power_limit_min_w: Lowest power limit.
        num_pipeline_stages: Stages of the pipeline being emulated (for stage mapping).
        index: Device index reported to callers.
        memory_clocks_mhz: Memory clocks to report (the profile has none).
        clock: Monotonic clock (tests inject a fake one).
        sleeper: ``sleep(seconds)`` matching ``clock`` (default: precise real sleep).
        asynchronous: Queue work like CUDA (see the module docstring); needs ``sleep``.
        dry_run: Log clock and power-limit changes instead of making them (``gpu.dry_run``).
        thermal: Model the die's temperature and the leakage power rising with it (``True``:
            :meth:`ThermalModel.for_power_limit` of the highest power limit; a model: that one;
            ``False``: neither, and :meth:`temperature_c` answers ``None``).
    """

    fast_clock_changes = True
    emulated = True

    def __init__(
        self,
        profile: Profile,
        *,
        blocking_power_w: float,
        idle_power_w: Optional[float] = None,
        time_scale: float = 1.0,
        counter: Union[str, EmulatedCounter] = EmulatedCounter.ideal,
        energy_update_period_s: Optional[float] = None,
        energy_noise: float = 0.0,
        seed: int = 0,
        sleep: bool = True,
        power_limit_max_w: Optional[float] = None,
        power_limit_min_w: float = 100.0,
        num_pipeline_stages: Optional[int] = None,
        index: int = 0,
        memory_clocks_mhz: Sequence[int] = (1215,),
        clock: Callable[[], float] = time.perf_counter,
        sleeper: Optional[Callable[[float], None]] = None,
        asynchronous: bool = False,
        dry_run: bool = False,
        thermal: Union[bool, ThermalModel] = False,
    ) -> None:
        realistic = counter_kind(counter) == EmulatedCounter.realistic
        if all(profile.has(s, "backward") for s in profile.stages()):
            profile = split_backward(profile)  # a backward's halves too (zero-bubble schedules)
        scaled = profile.scaled(time_scale, time_scale)
        if power_limit_max_w is None:
            heaviest_w = float(math.ceil(heaviest_power_w(profile)))  # time_scale keeps powers
            power_limit_max_w = (
                heaviest_w if realistic else max(IDEAL_POWER_LIMIT_MAX_W, heaviest_w)
            )
        if energy_update_period_s is None:
            energy_update_period_s = COUNTER_PERIOD_S if realistic else IDEAL_PERIOD_S
        check_args(
            time_scale,
            energy_update_period_s,
            energy_noise,
            blocking_power_w,
            power_limit_min_w,
            power_limit_max_w,
            MIN_REALISTIC_PERIOD_S if realistic else 0.0,
        )
        if asynchronous and not sleep:
            raise GPUValueError(
                "gpu.emulated.asynchronous=true needs gpu.emulated.sleep=true (the queued "
                "work takes its profiled time on the device timeline)"
            )
        super().__init__(
            scaled,
            power_limit_min_w=power_limit_min_w,
            power_limit_max_w=power_limit_max_w,
            memory_clocks_mhz=memory_clocks_mhz,
            num_pipeline_stages=num_pipeline_stages,
            dry_run=dry_run,
        )
        self.index = index
        self.name = f"emulated ({profile.source.rsplit('/', 1)[-1]})"
        self.time_scale = time_scale
        self.counter = EmulatedCounter.realistic if realistic else EmulatedCounter.ideal
        self.blocking_power_w = blocking_power_w
        if idle_power_w is None:
            idle_power_w = (
                min(IDLE_SHARE * power_limit_max_w, blocking_power_w)
                if realistic
                else blocking_power_w
            )
        self.idle_power_w = idle_power_w
        self.energy_update_period_s = energy_update_period_s
        self.sleep = sleep
        self._clock = clock
        self._sleeper = sleeper
        self._running: Optional[_Running] = None
        self._last_mhz: Optional[int] = None
        start_s = clock()
        if thermal is True:
            thermal = ThermalModel.for_power_limit(power_limit_max_w)
        self.thermal: Optional[ThermalModel] = thermal or None
        self._start_readings(
            Readings(
                realistic,
                start_s,
                energy_update_period_s,
                energy_noise,
                seed,
                idle_power_w,
                thermal=self.thermal,
            )
        )
        self.asynchronous = asynchronous
        self._timeline: Optional[Timeline] = None
        self._host_open: Optional[str] = None  # asynchronous: instruction being queued
        if asynchronous:
            self._timeline = Timeline(self._trace.set_power, self._rest, self._measure, start_s)

    # -- instructions -----------------------------------------------------------------------
    def instruction_begin(self, stage: int, instruction: str) -> None:
        """Start ``instruction`` of pipeline ``stage`` at the clock in effect now."""
        if instruction not in INSTRUCTIONS:
            raise GPUValueError(f"instruction {instruction!r} must be one of {INSTRUCTIONS}")
        if self._timeline is not None:
            self._queue(stage, instruction)
            return
        with self._lock:
            now = self._clock()
            if self._running is not None:
                logger.warning(
                    "instruction_begin(%s) while %s runs; ending that one now",
                    instruction,
                    self._running.instruction,
                )
                self._finish(self._running, now)
            profile_stage = self._profile_stage(stage)
            self._trace.advance(now)
            m = self._measurement(profile_stage, instruction, at_s=now)
            self._running = _Running(stage, instruction, now, m)
            self._last_mhz = m.frequency_mhz
            if self.sleep:
                self._trace.schedule(
                    now, [(now, m.energy_j / m.time_s), *self._rest_steps(now + m.time_s)]
                )
            else:  # its energy is deposited at its end; meanwhile the device is not idle
                self._rest(now)

    def instruction_end(self, instruction: str) -> None:
        """End the running instruction, sleeping until its profiled time has passed.

        Asynchronous mode: the host finished queueing it; returns at once.
        """
        if self._timeline is not None:
            with self._lock:
                self._check_end(self._host_open, instruction)
                self._host_open = None
            return
        with self._lock:
            running = self._running
            self._check_end(running.instruction if running else None, instruction)
            assert running is not None
            self._running = None
            if not self.sleep:
                self._finish(running, self._clock())
                return
        self._wait_until(running.start_s + running.measurement.time_s)

    def sm_clock_mhz(self) -> Optional[int]:
        """The clock of the instruction running now, else of the last one (its profile row)."""
        with self._lock:
            if self._timeline is not None:
                self._settle()
                return self._timeline.running_clock_mhz() or self._effective_cap_mhz()
            return self._last_mhz if self._last_mhz is not None else self._effective_cap_mhz()

    # -- time base --------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Asynchronous mode: wait until all queued work has run. Otherwise a no-op."""
        timeline = self._timeline
        if timeline is None:
            return
        while True:
            with self._lock:
                now = self._clock()
                drained_s = timeline.drained_at(now)
            if drained_s <= now:
                return
            self._wait_until(drained_s)  # a clock change meanwhile is seen on the next turn

    def now_s(self) -> float:
        """The device's clock (the injected one in tests)."""
        return self._clock()

    def temperature_c(self) -> Optional[float]:
        """The die's temperature in whole °C, as NVML reports it (``None``: thermal model off)."""
        if self.thermal is None:
            return None
        with self._lock:
            return float(round(self._trace.temperature_c(self._settle())))

    @property
    def executed(self) -> List[Work]:
        """Asynchronous mode: the work that ran (most recent last), with its clocks."""
        with self._lock:
            if self._timeline is None:
                return []
            self._settle()
            return list(self._timeline.executed)

    def close(self) -> None:
        """Finish a running instruction, if any (asynchronous: drop unfinished work)."""
        with self._lock:
            if self._timeline is not None:
                self._timeline.drop(self._clock())
            if self._running is not None:
                self._finish(self._running, self._clock())
                self._running = None

    def __repr__(self) -> str:
        return (
            f"EmulatedGPU(index={self.index}, profile={self.profile.source!r}, "
            f"time_scale={self.time_scale})"
        )

    # -- internals --------------------------------------------------------------------------
    def _settle(self) -> float:
        """Asynchronous mode: run the device timeline up to now. Returns now."""
        now = self._clock()
        if self._timeline is not None:
            self._timeline.advance(now)
        return now

    def _queue(self, stage: int, instruction: str) -> None:
        profile_stage = self._profile_stage(stage)
        with self._lock:
            if self._host_open is not None:
                logger.warning(
                    "instruction_begin(%s) while %s was being queued", instruction, self._host_open
                )
            self._host_open = instruction
            assert self._timeline is not None
            now = self._clock()
            self._timeline.enqueue(
                now,
                Work(
                    stage=stage, instruction=instruction, profile_stage=profile_stage, queued_s=now
                ),
            )

    def _measure(self, work: Work, at_s: Optional[float]) -> Measurement:
        """Time and energy of ``work`` at the clock and power limit in force (from ``at_s``)."""
        return self._measurement(work.profile_stage, work.instruction, at_s)

    @staticmethod
    def _check_end(running: Optional[str], instruction: str) -> None:
        if running != instruction:
            raise GPUError(
                f"instruction_end({instruction!r}) does not match the running instruction "
                f"({running or 'none'}); call instruction_begin/instruction_end in pairs"
            )

    def _finish(self, running: _Running, now: float) -> None:
        """Account an instruction that ends without sleeping (sleep=False or cut short)."""
        if self.sleep:  # cut short: blocking power from now on (a no-op past its end)
            if now < running.start_s + running.measurement.time_s:
                self._rest(now)
        else:
            self._trace.deposit(now, running.measurement.energy_j)

    def _wait_until(self, deadline_s: float) -> None:
        remaining = deadline_s - self._clock()
        if remaining <= 0:
            return
        if self._sleeper is not None:
            self._sleeper(remaining)
            return
        if remaining > SPIN_S:
            time.sleep(remaining - SPIN_S)
        while self._clock() < deadline_s:
            pass
