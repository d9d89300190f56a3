"""Energy from sampled power, for GPUs without an energy counter.

The NVML energy counter needs Volta or newer (and is missing on some vGPUs). Where it is
missing, energy is integrated from power samples, as the proven monitors do: every read of the
energy takes a power sample and adds the trapezoid since the previous one, and a background
thread samples every ``period_s`` so that long gaps between reads are still followed. The
result behaves like a counter (monotonic, mJ since the first sample) that moves at every read.

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, Tuple

logger = logging.getLogger(__name__)


class SampledEnergy:
    """A counter integrating ``read_power_mw()`` over ``clock()``.

    Args:
        read_power_mw: One power reading (mW), instant where the device has it.
        clock: Monotonic clock (s).
        period_s: Background sampling period; ``None`` or 0 samples only when read.
        name: For the sampler thread's name and log messages.
    """

    def __init__(
        self,
        read_power_mw: Callable[[], int],
        *,
        clock: Callable[[], float] = time.perf_counter,
        period_s: Optional[float] = 0.02,
        name: str = "gpu",
    ) -> None:
        self._read = read_power_mw
        self._clock = clock
        self.period_s = period_s
        self.name = name
        self._lock = threading.Lock()
        self._energy_mj = 0.0
        self._last: Optional[Tuple[float, float]] = None  # (time, power mW) of the last sample
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned = False

    def sample(self) -> float:
        """Take one power sample now; returns the energy integrated so far (mJ)."""
        with self._lock:
            power_mw = float(self._read())
            now = self._clock()
            last = self._last
            if last is None or now >= last[0]:
                if last is not None:
                    self._energy_mj += (last[1] + power_mw) / 2.0 * (now - last[0])
                self._last = (now, power_mw)
            return self._energy_mj

    def energy_mj(self) -> int:
        """Energy since the first sample (mJ); starts the background sampler on first use."""
        if self._thread is None and self.period_s:
            self._start()
        return round(self.sample())

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the background sampler (waits at most ``timeout_s`` for a blocked read)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"perseus-power-{self.name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        assert self.period_s
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception as exc:  # a failed sample only widens the next trapezoid
                if not self._warned:
                    self._warned = True
                    logger.warning("%s: power sample failed (%s); retrying", self.name, exc)
