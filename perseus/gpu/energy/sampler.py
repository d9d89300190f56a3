"""The energy sampler: one thread per GPU that watches its energy counter, off the training thread.

Reading a real GPU's energy counter blocks the caller for ~3 ms (17-34 ms at worst), and the
counter itself moves only every ~100 ms, with jitter. So no hook reads it: the device's sampler
polls it from a thread of its own (NVML releases the interpreter while it blocks), records each
update it sees with the time it happened (:class:`~perseus.records.energy.EnergyUpdate`, from the
reads just before and just after it: :class:`UpdateDetector`), and keeps them in an
:class:`~perseus.records.energy.EnergySeries` that answers "energy between t0 and t1" for anyone:
the hooks' iteration energies, the profiler's equations, the power-limit and batch-size
optimizers, ``perseus-doctor``.

Polling adapts to the counter: back to back (``min_gap_s`` apart) until the update period is
known, then quiet for most of each period and back to back only from shortly before the next
update is due until it shows, so an update's time is known to about one read while the reads cost
a few per update instead of hundreds a second.

The same thread reads the GPU's temperature every ``temperature_period_s`` (NVML's
``nvmlDeviceGetTemperature``: microseconds, whole °C) into a
:class:`~perseus.records.energy.TemperatureSeries`: leakage power rises with temperature, so
the phases that measure wait until the card has settled (``docs/design.md``, "Thermal drift").
A GPU without a sensor (the read answers ``None`` or not supported) is simply not read again.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from typing import Callable, Deque, Iterable, List, Optional, Tuple

from perseus.errors import GPUNotSupportedError
from perseus.records.energy import (
    EnergySeries,
    EnergyUpdate,
    TemperatureReading,
    TemperatureSeries,
    UpdatePeriod,
    estimate_update_period,
)

logger = logging.getLogger(__name__)

# A poll: (host time before the read, host time after it, the counter read in mJ).
Poll = Tuple[float, float, float]

# Updates the period is estimated from (the most recent ones), and how often it is refreshed.
PERIOD_WINDOW = 64
PERIOD_REFRESH = 16
# After an update, polling resumes this fraction of the shortest interval seen later.
QUIET_FRACTION = 0.85
# Consecutive failed reads after which the sampler gives up (with one warning).
MAX_FAILURES = 50
# Time between temperature reads (s): the card's temperature moves over tens of seconds.
TEMPERATURE_PERIOD_S = 1.0
# Recent reads whose median latency the pause before the next read allows for.
LATENCY_WINDOW = 512


class UpdateDetector:
    """Turns successive reads of a counter into the updates they reveal.

    A read happens somewhere between the host times before and after the call. When a read
    shows a new value, the counter moved between the previous read and this one: its time is
    taken as the midpoint of the two reads' midpoints, uncertain by half the span from the
    start of the previous read to the end of this one. The first read shows a value but no
    update (when the counter last moved before it is unknown). A counter that goes backwards
    (a driver reload) starts over.
    """

    def __init__(self) -> None:
        self._prev: Optional[Poll] = None

    def poll(self, t0_s: float, t1_s: float, energy_mj: float) -> Optional[EnergyUpdate]:
        """Feed one read; returns the update it reveals, if any."""
        prev, self._prev = self._prev, (t0_s, t1_s, energy_mj)
        if prev is None or energy_mj == prev[2]:
            return None
        if energy_mj < prev[2]:
            logger.info(
                "the energy counter went back (%s -> %s mJ); starting over", prev[2], energy_mj
            )
            return None
        mid_prev = 0.5 * (prev[0] + prev[1])
        mid_now = 0.5 * (t0_s + t1_s)
        return EnergyUpdate(
            time_s=0.5 * (mid_prev + mid_now),
            energy_mj=float(energy_mj),
            time_error_s=0.5 * (t1_s - prev[0]),
        )


def updates_from_polls(polls: Iterable[Poll]) -> List[EnergyUpdate]:
    """Every update a sequence of reads reveals, in order (what the sampler would record)."""
    detector = UpdateDetector()
    out: List[EnergyUpdate] = []
    for t0_s, t1_s, energy_mj in polls:
        update = detector.poll(t0_s, t1_s, energy_mj)
        if update is not None:
            out.append(update)
    return out


def _median(sorted_values: List[float]) -> Optional[float]:
    """The median of values given in ascending order (None when there is none)."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n % 2:
        return sorted_values[n // 2]
    return (sorted_values[n // 2 - 1] + sorted_values[n // 2]) / 2


class EnergySampler:
    """Polls one GPU's energy counter from a thread of its own (see the module docstring).

    Args:
        read_mj: One read of the counter (mJ); may block (NVML: ~3 ms).
        clock: The host clock the hooks stamp with (the GPU's ``now_s``).
        name: Suffix of the thread's name (which GPU).
        min_gap_s: Pause between back-to-back reads (keeps a counter that answers at once
            from spinning a core).
        series: Where updates go (default: a new one).
        read_temperature_c: One read of the GPU's temperature (°C; ``None``: no sensor), or
            ``None``: temperature is not read.
        temperature_period_s: Time between temperature reads.

    Attributes:
        series: The updates seen so far.
        temperatures: The temperature readings so far (``None``: temperature is not read).
        period: The counter's update period, once enough updates were seen (``None`` before).
        available: ``False`` once the counter proved unreadable (no energy is measured).
    """

    def __init__(
        self,
        read_mj: Callable[[], float],
        clock: Callable[[], float] = time.perf_counter,
        *,
        name: str = "gpu",
        min_gap_s: float = 0.001,
        series: Optional[EnergySeries] = None,
        read_temperature_c: Optional[Callable[[], Optional[float]]] = None,
        temperature_period_s: float = TEMPERATURE_PERIOD_S,
    ) -> None:
        self._read = read_mj
        self._clock = clock
        self.name = name
        self.min_gap_s = max(0.0, min_gap_s)
        self.series = series if series is not None else EnergySeries()
        self._read_temperature = read_temperature_c
        self.temperature_period_s = max(0.0, temperature_period_s)
        self.temperatures: Optional[TemperatureSeries] = (
            TemperatureSeries() if read_temperature_c is not None else None
        )
        self._next_temperature_s = -float("inf")
        self._temperature_failures = 0
        self.period: Optional[UpdatePeriod] = None
        self.available = True
        self._detector = UpdateDetector()
        self._recent: Deque[EnergyUpdate] = deque(maxlen=PERIOD_WINDOW)
        self._since_estimate = 0
        # The recent reads' latencies, oldest first, and the same values sorted (each poll asks
        # for their median: kept sorted as they come, not sorted again on every read).
        self._latencies: Deque[float] = deque()
        self._sorted_latencies: List[float] = []
        self._max_latency_s = 0.0
        self._num_reads = 0
        self._failures = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    # -- polling --------------------------------------------------------------------------------
    def poll_once(self) -> Optional[EnergyUpdate]:
        """Read the counter once; record and return the update it reveals, if any.

        Raises:
            GPUNotSupportedError: the GPU has no energy counter (the sampler stops).
        """
        t0 = self._clock()
        value = self._read()
        t1 = self._clock()
        with self._lock:
            self._num_reads += 1
            self._record_latency(t1 - t0)
            self._max_latency_s = max(self._max_latency_s, t1 - t0)
            update = self._detector.poll(t0, t1, float(value))
            if update is None:
                return None
            self.series.add(update)
            self._recent.append(update)
            self._since_estimate += 1
            if self.period is None or self._since_estimate >= PERIOD_REFRESH:
                self._since_estimate = 0
                self.period = estimate_update_period(list(self._recent)) or self.period
            return update

    def poll_temperature_once(self) -> Optional[TemperatureReading]:
        """Read the temperature once and record it (``None``: not read, or no sensor).

        A GPU that answers ``None`` or not supported is not read again; other failures are
        retried, up to :data:`MAX_FAILURES` in a row.
        """
        read = self._read_temperature
        series = self.temperatures
        if read is None or series is None:
            return None
        t0 = self._clock()
        try:
            value = read()
        except GPUNotSupportedError as exc:
            self._stop_temperature(f"not supported ({exc})")
            return None
        except Exception as exc:  # a driver hiccup: try again later, not for ever
            self._temperature_failures += 1
            if self._temperature_failures >= MAX_FAILURES:
                self._stop_temperature(f"{self._temperature_failures} reads failed ({exc})")
            return None
        t1 = self._clock()
        self._temperature_failures = 0
        if value is None:
            self._stop_temperature("no temperature sensor")
            return None
        reading = TemperatureReading(time_s=0.5 * (t0 + t1), temperature_c=float(value))
        series.add(reading)
        self._next_temperature_s = t1 + self.temperature_period_s
        return reading

    def temperature_due(self, now_s: float) -> bool:
        """Whether a temperature read is due at ``now_s``."""
        return self._read_temperature is not None and now_s >= self._next_temperature_s

    def _stop_temperature(self, why: str) -> None:
        self._read_temperature = None
        logger.info("GPU %s: temperature not recorded (%s)", self.name, why)

    def read_latency_s(self) -> Tuple[Optional[float], float]:
        """``(median, max)`` time one read blocked its caller, over the recent reads."""
        with self._lock:
            return _median(self._sorted_latencies), self._max_latency_s

    def _record_latency(self, latency_s: float) -> None:
        """Add one read's latency to the recent ones (the oldest drops out past a window)."""
        if len(self._latencies) == LATENCY_WINDOW:
            oldest = self._latencies.popleft()
            del self._sorted_latencies[bisect.bisect_left(self._sorted_latencies, oldest)]
        self._latencies.append(latency_s)
        bisect.insort(self._sorted_latencies, latency_s)

    @property
    def num_reads(self) -> int:
        """Reads made so far."""
        with self._lock:
            return self._num_reads

    def next_read_in_s(self, now_s: float) -> float:
        """How long to pause before the next read (see the module docstring)."""
        period = self.period
        last = self.series.last_time_s
        if period is None or last is None:
            return self.min_gap_s
        median_latency, _ = self.read_latency_s()
        resume_s = last + QUIET_FRACTION * period.min_s - 2.0 * (median_latency or 0.0)
        return min(max(self.min_gap_s, resume_s - now_s), period.median_s)

    # -- thread ---------------------------------------------------------------------------------
    def start(self) -> EnergySampler:
        """Start polling in the background (idempotent); returns ``self``."""
        with self._lock:
            if self._thread is not None or not self.available:
                return self
            self._thread = threading.Thread(
                target=self._run, name=f"perseus-energy-{self.name}", daemon=True
            )
        self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop polling (waits at most ``timeout_s`` for a read in progress)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.temperature_due(self._clock()):
                self.poll_temperature_once()
            try:
                self.poll_once()
                self._failures = 0
            except GPUNotSupportedError as exc:
                self.available = False
                logger.warning(
                    "GPU %s has no energy counter (%s); energy not measured", self.name, exc
                )
                return
            except Exception as exc:  # a driver hiccup must not end measurement for good
                self._failures += 1
                if self._failures >= MAX_FAILURES:
                    self.available = False
                    logger.warning(
                        "the energy counter of GPU %s failed %d reads in a row (%s); energy "
                        "is no longer measured",
                        self.name,
                        self._failures,
                        exc,
                    )
                    return
                self._stop.wait(0.01 * self._failures)
                continue
            self._stop.wait(self.next_read_in_s(self._clock()))
