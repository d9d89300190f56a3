"""The emulated GPU's clocks and power limit, and the profiled measurement they select.

:class:`EmulatedClocks` is the base of :class:`~perseus.gpu.emulated.device.EmulatedGPU`; it owns
the clock and power-limit half of the :class:`~perseus.gpu.base.GPU` interface, and answers which
profiled measurement an instruction of a pipeline stage gets now (the stage mapped onto the
profile's, :func:`~perseus.gpu.emulated.model.map_stage`):

* **Clocks.** Supported SM clocks are the profile's frequencies, highest first; unlocked means
  the highest. A locked clock that is not profiled runs at the nearest profiled frequency at or
  below it (the lowest one if it is below all). Clock changes take effect at the next
  instruction (asynchronous mode: on the work running at that moment). Memory-clock locks are
  recorded only: the profile does not model memory clocks.
* **Power limit, realistic** (a :class:`~perseus.gpu.emulated.readings.PowerLimiter`): the limit
  holds for the average power over the last ~1 s, as on the recorded H100. While that average
  is over the limit, instructions run at the highest clock (at most the locked one) whose power
  fits under 80 % of it; otherwise at their clock, even when their own power is above the limit
  (short bursts over the cap, as a pipeline pattern's heavy instructions draw). The default
  limit is the power of the profile's heaviest instruction, so at default clocks it runs at the
  cap and nothing is held down in any pattern.
* **Power limit, ideal**: the profile was measured at the default (maximum) limit, so at that
  limit nothing is throttled. Below it, an instruction runs at the highest clock (at most the
  locked one) whose power — profiled energy / time at that clock — fits under the limit; the
  lowest clock if none does.
* **Dry run** (``dry_run=True``, ``gpu.dry_run``): every clock and power-limit change is logged
  and not made, as on a real GPU: instructions run at default clocks and the default limit.

Every change first settles the device's work up to now (:meth:`EmulatedClocks._settle`), so
what ran before the change ran at the clocks in force then.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import List, Optional, Sequence, Tuple

from perseus.errors import GPUValueError
from perseus.formats.profile.table import Measurement, Profile
from perseus.gpu.base import GPU
from perseus.gpu.emulated.model import (
    check_range,
    map_stage,
    measurement_at,
    power_limited,
    profile_frequencies_mhz,
)
from perseus.gpu.emulated.readings import PowerLimiter

logger = logging.getLogger(__name__)


class EmulatedClocks(GPU):
    """Clock locks and power limit of an emulated GPU (see the module docstring).

    The subclass runs the instructions: it implements :meth:`_settle` and holds ``_lock``
    while it reads the state kept here.

    Args:
        profile: The device profile (already time-scaled); its frequencies are the SM clocks.
        power_limit_min_w: Lowest power limit.
        power_limit_max_w: Highest (and default) power limit.
        memory_clocks_mhz: Memory clocks to report (the profile has none).
        num_pipeline_stages: Stages of the pipeline being emulated (for stage mapping).
        dry_run: Log clock and power-limit changes instead of making them.
    """

    # The realistic power limiter (set by the subclass); None: the ideal, per-instruction rule.
    _limiter: Optional[PowerLimiter] = None

    def __init__(
        self,
        profile: Profile,
        *,
        power_limit_min_w: float,
        power_limit_max_w: float,
        memory_clocks_mhz: Sequence[int],
        num_pipeline_stages: Optional[int],
        dry_run: bool = False,
    ) -> None:
        self.profile = profile
        self.dry_run = dry_run
        self.num_pipeline_stages = num_pipeline_stages
        self._lock = threading.Lock()
        self._sm_clocks = profile_frequencies_mhz(profile)
        self._mem_clocks = sorted((int(c) for c in memory_clocks_mhz), reverse=True)
        self._locked_sm: Optional[Tuple[int, int]] = None
        self._locked_mem: Optional[Tuple[int, int]] = None
        self._limit_range_mw = (int(power_limit_min_w * 1000), int(power_limit_max_w * 1000))
        self._limit_mw = self._limit_range_mw[1]

    @abc.abstractmethod
    def _settle(self) -> float:
        """Run the device's work up to now, before a change takes effect. Returns now."""

    # -- clocks -----------------------------------------------------------------------------
    def supported_sm_clocks_mhz(self) -> List[int]:
        """The profile's frequencies, highest first."""
        return list(self._sm_clocks)

    def supported_memory_clocks_mhz(self) -> List[int]:
        """The configured memory clocks, highest first."""
        return list(self._mem_clocks)

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock; instructions run at ``max_mhz`` (snapped to the profile)."""
        check_range(min_mhz, max_mhz, "SM clock")
        if self._dry(f"lock SM clocks to [{min_mhz}, {max_mhz}] MHz"):
            return
        with self._lock:
            self._settle()
            self._locked_sm = (min_mhz, max_mhz)

    def reset_sm_clocks(self) -> None:
        """Unlock the SM clock (instructions run at the highest frequency)."""
        if self._dry("reset SM clocks"):
            return
        with self._lock:
            self._settle()
            self._locked_sm = None

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Record a memory-clock lock (the profile does not model memory clocks)."""
        check_range(min_mhz, max_mhz, "memory clock")
        if self._dry(f"lock memory clocks to [{min_mhz}, {max_mhz}] MHz"):
            return
        with self._lock:
            self._locked_mem = (min_mhz, max_mhz)

    def reset_memory_clocks(self) -> None:
        """Undo :meth:`lock_memory_clocks_mhz`."""
        if self._dry("reset memory clocks"):
            return
        with self._lock:
            self._locked_mem = None

    @property
    def locked_sm_clocks_mhz(self) -> Optional[Tuple[int, int]]:
        """The SM lock in force, None when unlocked."""
        return self._locked_sm

    @property
    def locked_memory_clocks_mhz(self) -> Optional[Tuple[int, int]]:
        """The memory-clock lock in force, None when unlocked."""
        return self._locked_mem

    # -- power limit ------------------------------------------------------------------------
    def power_limit_mw(self) -> int:
        """The power limit in force (mW)."""
        return self._limit_mw

    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        """``(min_mw, max_mw)``."""
        return self._limit_range_mw

    def default_power_limit_mw(self) -> int:
        """The maximum power limit."""
        return self._limit_range_mw[1]

    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the power limit; it caps the clock of instructions begun afterwards."""
        lo, hi = self._limit_range_mw
        if not lo <= limit_mw <= hi:
            raise GPUValueError(
                f"power limit {limit_mw} mW is outside [{lo}, {hi}] mW of emulated GPU "
                f"{self.index}; pick a value in that range"
            )
        if self._dry(f"set power limit to {limit_mw} mW"):
            return
        with self._lock:
            self._settle()
            self._limit_mw = int(limit_mw)

    # -- what the clocks select -------------------------------------------------------------
    def current_frequency_mhz(self, stage: int, instruction: str) -> int:
        """The SM clock an instruction of ``stage`` would run at now."""
        profile_stage = self._profile_stage(stage)
        with self._lock:
            return self._measurement(profile_stage, instruction).frequency_mhz

    def true_measurement(self, stage: int, instruction: str, frequency_mhz: int) -> Measurement:
        """The scaled profiled time and energy of pipeline ``stage``'s instruction at a clock."""
        return measurement_at(self.profile, self._profile_stage(stage), instruction, frequency_mhz)

    def _profile_stage(self, stage: int) -> int:
        """The profile stage emulating pipeline ``stage``."""
        return map_stage(stage, self.num_pipeline_stages, self.profile.num_stages)

    def _effective_cap_mhz(self) -> int:  # callers hold _lock
        return self._locked_sm[1] if self._locked_sm is not None else self._sm_clocks[0]

    def _measurement(
        self, profile_stage: int, instruction: str, at_s: Optional[float] = None
    ) -> Measurement:
        """Time and energy of an instruction at the clock and power limit in force now.

        ``at_s``: the device runs it from then (the realistic limiter looks at the average power
        up to then and may hold the clock down); None: only asking. Callers hold ``_lock``.
        """
        m = measurement_at(self.profile, profile_stage, instruction, self._effective_cap_mhz())
        limit_w = self._limit_mw / 1000.0
        limiter = self._limiter
        if limiter is not None:
            held = limiter.update(at_s, limit_w) if at_s is not None else limiter.throttled
            if not held:
                return m
            return power_limited(
                self.profile, profile_stage, instruction, m, limiter.target_w(limit_w)
            )
        if self._limit_mw >= self._limit_range_mw[1]:
            return m  # the profile was measured at the default (maximum) limit
        return power_limited(self.profile, profile_stage, instruction, m, limit_w)

    def _dry(self, description: str) -> bool:
        """In a dry run, log the change instead of making it (returns True)."""
        if self.dry_run:
            self.log_dry_run(logger, f"emulated GPU {self.index}", description)
        return self.dry_run
