"""The energy of one or more GPUs between two instants, from their energy samplers.

Every consumer besides the hooks (the power-limit optimizer, the batch-size runs, a collection
of GPUs, ``perseus-doctor``) asks one question: how much energy did these GPUs use between
``t0`` and ``t1``? None of them may read the counter to answer it: a read blocks the caller
~3 ms on a real GPU, and the counter moves only every ~100 ms, so a read at an instant is up to
one update old. :class:`EnergyMeter` answers from the GPUs'
:class:`~perseus.gpu.energy.sampler.EnergySampler` series (energy between instants interpolated
between observed updates, :meth:`~perseus.records.energy.EnergySeries.energy_j_between`): the
samplers a rank's device already runs where there is one (one sampler per GPU), else samplers
the meter starts and stops itself.

An instant's energy is known once the counter updated after it. A caller that needs it now (the
end of a measurement window) waits for that update with :meth:`EnergyMeter.wait_until_covered`,
at most the time it gives (a few update periods): a counter that stopped, or a GPU without
one, never holds the training thread longer.

Runs on Python 3.9 (the training process).
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

from perseus.errors import GPUNotSupportedError
from perseus.gpu.base import GPU
from perseus.gpu.energy.sampler import EnergySampler

# How often a bounded wait looks whether the counter moved.
WAIT_STEP_S = 0.002
# A bounded wait lasts at most this many update periods (and at least MIN_WAIT_S).
WAIT_PERIODS = 3.0
MIN_WAIT_S = 0.5
# The update period assumed before one was measured (a real GPU's).
DEFAULT_PERIOD_S = 0.1


class EnergyMeter:
    """The summed energy of some GPUs between instants (see the module docstring).

    Args:
        samplers: One per GPU; their series are summed.
        clock: The samplers' time base: every instant asked about is on it.
        owned: Stop the samplers when the meter closes (the meter started them).
        poll_in_waits: The samplers have no thread of their own (a virtual clock's test, a
            caller that polls them): :meth:`wait_until_covered` then polls them itself.
        sleeper: How a wait pauses (a virtual clock's ``sleep`` in tests).
    """

    def __init__(
        self,
        samplers: Sequence[EnergySampler],
        clock: Callable[[], float],
        *,
        owned: bool = False,
        poll_in_waits: bool = False,
        sleeper: Callable[[float], None] = time.sleep,
    ) -> None:
        self.samplers: List[EnergySampler] = list(samplers)
        self.now_s = clock
        self._owned = owned
        self._poll_in_waits = poll_in_waits
        self._sleep = sleeper

    @classmethod
    def start(
        cls,
        gpus: Sequence[GPU],
        clock: Optional[Callable[[], float]] = None,
        *,
        threads: bool = True,
        sleeper: Callable[[float], None] = time.sleep,
        name: str = "meter",
    ) -> EnergyMeter:
        """Start a sampler per GPU (stopped when the meter closes).

        Args:
            gpus: The GPUs.
            clock: The time base (default: the first GPU's ``now_s``, the hooks' clock).
            threads: Poll from a thread per GPU. ``False``: the caller polls (:meth:`poll`),
                and so do waits — for GPUs on a virtual clock.
            sleeper: How a wait pauses.
            name: Suffix of the samplers' thread names.
        """
        if clock is None:
            clock = gpus[0].now_s if gpus else time.perf_counter
        samplers = [
            EnergySampler(gpu.total_energy_mj, clock, name=f"{gpu.index}-{name}") for gpu in gpus
        ]
        if threads:
            for sampler in samplers:
                sampler.start()
        return cls(samplers, clock, owned=True, poll_in_waits=not threads, sleeper=sleeper)

    # -- answers --------------------------------------------------------------------------------
    def covers(self, t_s: float) -> bool:
        """Whether every GPU's counter updated at or after ``t_s``."""
        return bool(self.samplers) and all(s.series.covers(t_s) for s in self.samplers)

    def energy_j_between(self, t0_s: float, t1_s: float) -> Optional[float]:
        """The GPUs' energy from ``t0_s`` to ``t1_s`` (J); ``None`` where one is not covered."""
        total = 0.0
        for sampler in self.samplers:
            energy_j = sampler.series.energy_j_between(t0_s, t1_s)
            if energy_j is None:
                return None
            total += energy_j
        return total if self.samplers else None

    @property
    def update_period_s(self) -> Optional[float]:
        """The slowest measured update period among the GPUs (``None``: none measured yet)."""
        periods = [s.period.median_s for s in self.samplers if s.period is not None]
        return max(periods) if periods else None

    @property
    def available(self) -> bool:
        """Whether every GPU's counter can still be read."""
        return all(s.available for s in self.samplers)

    def wait_bound_s(self) -> float:
        """How long a wait for the next update may last: a few update periods."""
        period_s = self.update_period_s or DEFAULT_PERIOD_S
        return max(MIN_WAIT_S, WAIT_PERIODS * period_s)

    def wait_until_covered(self, t_s: float, timeout_s: Optional[float] = None) -> bool:
        """Wait until every counter updated after ``t_s``, at most ``timeout_s``.

        Args:
            t_s: The instant whose energy is wanted.
            timeout_s: The longest wait (default :meth:`wait_bound_s`).

        Returns:
            Whether the counters cover ``t_s`` now.
        """
        deadline_s = self.now_s() + (self.wait_bound_s() if timeout_s is None else timeout_s)
        while True:
            if self._poll_in_waits:
                self.poll()
            if self.covers(t_s):
                return True
            if self.now_s() >= deadline_s or not self.available:
                return False
            self._sleep(WAIT_STEP_S)

    def ready(self, timeout_s: Optional[float] = None) -> bool:
        """Wait until every counter updated after now (a measurement can then begin).

        Energy is known only between observed updates: a window that begins before a GPU's
        first one has no start. Call it before the first window, not on the training path
        (it waits up to ``timeout_s``, default :meth:`wait_bound_s`).
        """
        return self.wait_until_covered(self.now_s(), timeout_s)

    # -- polling and lifetime -------------------------------------------------------------------
    def poll(self) -> None:
        """Read every counter once (for samplers without a thread; see ``poll_in_waits``)."""
        for sampler in self.samplers:
            if sampler.available:
                try:
                    sampler.poll_once()
                except GPUNotSupportedError:  # no counter: no energy, never a crash
                    sampler.available = False

    def close(self) -> None:
        """Stop the samplers the meter started (idempotent)."""
        if self._owned:
            for sampler in self.samplers:
                sampler.close()
