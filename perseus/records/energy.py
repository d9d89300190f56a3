"""What a GPU's energy counter showed (updates, energy between instants, period); its temperature.

A real GPU's cumulative energy counter (NVML's ``nvmlDeviceGetTotalEnergyConsumption``) does not
move continuously: it is updated every ~100 ms (with jitter), and a read returns the energy up to
the last update. Between two *updates* the difference is exact (the counter integrates power
continuously); between two arbitrary instants it is not. So Perseus keeps the updates themselves
(:class:`EnergyUpdate`: when the counter moved and to what), collected off the training thread by
the GPU's sampler (:mod:`perseus.gpu.energy.sampler`), and derives everything else from them:

* the energy between two instants (:meth:`EnergySeries.energy_j_between`): the counter's values
  interpolated linearly between the updates around each instant. Over windows of many updates the
  error is a small part of one update at each end, and sums over consecutive windows telescope;
* the exact equations of the profiler (the energy between consecutive updates, against what ran
  between them: :mod:`perseus.profiler.estimation.attribution`);
* the counter's update period and jitter (:func:`estimate_update_period`), the one estimator the
  sampler, ``perseus-doctor``, the profiler and the server use.

The same sampler reads the GPU's temperature every second or so (:class:`TemperatureSeries`):
leakage power rises with temperature, so measurements taken while the card still warms up are
biased. :func:`thermal_verdict` is the one criterion of "thermally settled" that the phases which
measure (the server's baseline and profiling) wait for (``docs/design.md``, "Thermal drift").

Plain data and arithmetic, standard library only; thread-safe where it says so.
"""

from __future__ import annotations

import bisect
import statistics
import threading
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
)


@dataclass(frozen=True)
class EnergyUpdate:
    """One observed update of a GPU's cumulative energy counter.

    Attributes:
        time_s: When the counter moved, as best known (the host clock the hooks stamp with:
            ``time.perf_counter`` unless the device has its own).
        energy_mj: The counter's value from then on (mJ).
        time_error_s: Half-width of the window the move is known to lie in (the reads before
            and after it); ``0`` where the time is exact (the emulated device's own record).
    """

    time_s: float
    energy_mj: float
    time_error_s: float = 0.0


@dataclass(frozen=True)
class UpdatePeriod:
    """How often a counter updates, measured from its updates.

    Attributes:
        median_s: The typical time between updates.
        min_s: The shortest interval seen (outliers of a missed update excluded).
        max_s: The longest interval seen (likewise).
        num_intervals: Intervals measured.
        time_error_s: The median uncertainty of the update times behind the figures.
    """

    median_s: float
    min_s: float
    max_s: float
    num_intervals: int
    time_error_s: float

    @property
    def jitter_s(self) -> float:
        """Spread of the intervals (``max_s - min_s``)."""
        return self.max_s - self.min_s


# Intervals longer than this many typical periods are counted as missed updates, not jitter.
MISSED_UPDATE_FACTOR = 1.6


def estimate_update_period(
    updates: Sequence[EnergyUpdate], min_intervals: int = 5
) -> Optional[UpdatePeriod]:
    """The counter's update period from consecutive updates (``None``: too few to tell).

    Intervals whose ends are uncertain by more than a quarter of the typical interval are left
    out, and so are intervals that span a missed update (longer than
    :data:`MISSED_UPDATE_FACTOR` typical ones) or split one (shorter than a third of it).
    """
    intervals: List[float] = []
    errors: List[float] = []
    for a, b in zip(updates, updates[1:]):
        if b.time_s > a.time_s:
            intervals.append(b.time_s - a.time_s)
            errors.append(max(a.time_error_s, b.time_error_s))
    if len(intervals) < min_intervals:
        return None
    typical = statistics.median(intervals)
    kept = [
        (i, e)
        for i, e in zip(intervals, errors)
        if typical / 3.0 <= i <= MISSED_UPDATE_FACTOR * typical and e <= typical / 4.0
    ]
    if len(kept) < min_intervals:
        return None
    values = [i for i, _ in kept]
    return UpdatePeriod(
        median_s=statistics.median(values),
        min_s=min(values),
        max_s=max(values),
        num_intervals=len(values),
        time_error_s=statistics.median(e for _, e in kept),
    )


class _Timed(Protocol):
    @property
    def time_s(self) -> float:
        """When it happened."""


_Item = TypeVar("_Item", bound=_Timed)


class _TimedSeries(Generic[_Item]):
    """Items with a ``time_s``, oldest first, thread-safe, dropping the oldest half when full.

    Cursors (:meth:`since`) count every item ever added, so a reader that fell behind only
    loses what was dropped.
    """

    def __init__(self, max_items: int) -> None:
        self._lock = threading.Lock()
        self._max = max(4, max_items)
        self._items: List[_Item] = []
        self._times: List[float] = []
        self._dropped = 0

    def add(self, item: _Item) -> None:
        """Append an item (later than the last one; an earlier one is ignored)."""
        with self._lock:
            if self._times and item.time_s <= self._times[-1]:
                return
            if len(self._items) >= self._max:
                half = len(self._items) // 2
                del self._items[:half]
                del self._times[:half]
                self._dropped += half
            self._items.append(item)
            self._times.append(item.time_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def between(self, t0_s: float, t1_s: float) -> List[_Item]:
        """The items at times within ``[t0_s, t1_s]``, oldest first."""
        with self._lock:
            lo = bisect.bisect_left(self._times, t0_s)
            hi = bisect.bisect_right(self._times, t1_s)
            return self._items[lo:hi]

    def since(self, cursor: int) -> Tuple[List[_Item], int]:
        """The items added after ``cursor`` (a count of items ever added) and the new cursor.

        Start with cursor 0; pass the returned cursor next time.
        """
        with self._lock:
            total = self._dropped + len(self._items)
            first = max(cursor, self._dropped) - self._dropped
            return self._items[first:], total

    def snapshot(self) -> List[_Item]:
        """Every item kept, oldest first."""
        with self._lock:
            return list(self._items)

    @property
    def latest(self) -> Optional[_Item]:
        """The newest item (``None``: none yet)."""
        with self._lock:
            return self._items[-1] if self._items else None


class EnergySeries(_TimedSeries[EnergyUpdate]):
    """The updates of one GPU's counter, oldest first, and the energy between instants.

    Thread-safe: the sampler adds updates from its thread while the training thread (or a
    reporter) reads; every read is a binary search (microseconds). Beyond ``max_updates`` the
    oldest half is dropped (at ~10 updates a second the default keeps at least half a day);
    cursors (:meth:`since`) count every update ever added, so a reader that fell behind only
    loses what was dropped.

    Args:
        max_updates: Updates kept at most.
    """

    def __init__(self, max_updates: int = 1_000_000) -> None:
        super().__init__(max_updates)

    @property
    def last_time_s(self) -> Optional[float]:
        """When the newest update happened (``None``: none yet)."""
        newest = self.latest
        return None if newest is None else newest.time_s

    def covers(self, t_s: float) -> bool:
        """Whether the counter has moved at or after ``t_s`` (so energy up to ``t_s`` is known)."""
        with self._lock:
            return bool(self._times) and self._times[-1] >= t_s

    def energy_mj_at(self, t_s: float) -> Optional[float]:
        """The counter's value interpolated to ``t_s`` (mJ); ``None`` outside the updates.

        Linear between the updates just before and just after ``t_s``: the energy at an instant
        between two updates is not known exactly; the counter integrates power, so the
        interpolation errs by at most what the power's changes within that interval move.
        """
        with self._lock:
            return self._at(t_s)

    def energy_j_between(self, t0_s: float, t1_s: float) -> Optional[float]:
        """Energy from ``t0_s`` to ``t1_s`` (J), interpolated; ``None`` where not covered yet."""
        with self._lock:
            e0, e1 = self._at(t0_s), self._at(t1_s)
        if e0 is None or e1 is None:
            return None
        return max(0.0, (e1 - e0) / 1000.0)

    def updates_between(self, t0_s: float, t1_s: float) -> List[EnergyUpdate]:
        """The updates at times within ``[t0_s, t1_s]``, oldest first."""
        return self.between(t0_s, t1_s)

    def _at(self, t_s: float) -> Optional[float]:
        times = self._times
        if not times or t_s < times[0] or t_s > times[-1]:
            return None
        i = bisect.bisect_left(times, t_s)
        after = self._items[i]
        if times[i] == t_s or i == 0:
            return after.energy_mj
        before = self._items[i - 1]
        span = after.time_s - before.time_s
        return before.energy_mj + (after.energy_mj - before.energy_mj) * (
            (t_s - before.time_s) / span
        )


# -- temperature --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemperatureReading:
    """One reading of a GPU's temperature sensor (NVML's ``NVML_TEMPERATURE_GPU``: whole °C).

    Attributes:
        time_s: When it was read (the clock the hooks stamp with).
        temperature_c: The reading (°C).
    """

    time_s: float
    temperature_c: float


class TemperatureSeries(_TimedSeries[TemperatureReading]):
    """One GPU's temperature readings, oldest first (its sampler reads them beside the counter).

    Thread-safe: the sampler adds from its thread while others read. Beyond ``max_readings`` the
    oldest half is dropped (a reading a second keeps more than a day).

    Args:
        max_readings: Readings kept at most.
    """

    def __init__(self, max_readings: int = 100_000) -> None:
        super().__init__(max_readings)


@dataclass(frozen=True)
class ThermalCriterion:
    """When a GPU counts as thermally settled (``docs/design.md``, "Thermal drift").

    Settled: over the last ``window_s`` of readings (at least ``min_readings`` of them, spanning
    at least ``window_s``) the temperature's least-squares slope is within
    ``max_slope_c_per_min``. With a first-order approach to the steady temperature (time
    constant ``tau``), that slope means at most ``max_slope_c_per_min * tau / 60`` °C are left
    to go. A card that has not settled after ``max_wait_s`` is taken as it is (said so); a card
    whose temperature is not known does not hold anything up.

    Attributes:
        window_s: Span of readings the slope is fitted over.
        max_slope_c_per_min: Largest slope (°C per minute, either sign) that counts as settled.
        max_wait_s: Longest wait for it, from the first reading.
        min_readings: Fewest readings the slope is fitted from.
    """

    window_s: float = 60.0
    max_slope_c_per_min: float = 0.5
    max_wait_s: float = 600.0
    min_readings: int = 5


@dataclass(frozen=True)
class ThermalVerdict:
    """Whether measuring may start, and why.

    Attributes:
        ready: Start now: settled, waited ``max_wait_s`` already, or no temperature known.
        reason: ``settled``, ``timeout`` (not settled after the longest wait), ``unknown`` (no
            readings), or ``warming`` (not ready: the temperature still moves).
        slope_c_per_min: The fitted slope (``None``: too few readings yet).
        temperature_c: The last reading (``None``: none).
    """

    ready: bool
    reason: str
    slope_c_per_min: Optional[float]
    temperature_c: Optional[float]


def temperature_slope_c_per_min(
    readings: Sequence[TemperatureReading], window_s: float, min_readings: int = 5
) -> Optional[float]:
    """Least-squares slope (°C per minute) of the readings in the last ``window_s``.

    ``None`` when fewer than ``min_readings`` readings lie in that window or they span less
    than ``window_s`` (the series is too young to tell).
    """
    if not readings:
        return None
    end_s = readings[-1].time_s
    start = bisect.bisect_left([r.time_s for r in readings], end_s - window_s)
    recent = readings[start:]
    if start > 0:  # the reading just before the window makes the span whole
        recent = readings[start - 1 :]
    if len(recent) < max(2, min_readings) or end_s - recent[0].time_s < window_s:
        return None
    n = len(recent)
    mean_t = sum(r.time_s for r in recent) / n
    mean_c = sum(r.temperature_c for r in recent) / n
    var = sum((r.time_s - mean_t) ** 2 for r in recent)
    if var <= 0.0:
        return None
    cov = sum((r.time_s - mean_t) * (r.temperature_c - mean_c) for r in recent)
    return 60.0 * cov / var


def thermal_verdict(
    readings: Sequence[TemperatureReading],
    criterion: Optional[ThermalCriterion] = None,
    since_s: Optional[float] = None,
) -> ThermalVerdict:
    """Whether a GPU whose readings are ``readings`` (oldest first) may start measuring now.

    The wait is counted from ``since_s`` (default: the first reading), on the readings' own
    clock; ``criterion``: :class:`ThermalCriterion`'s defaults unless given.
    """
    criterion = criterion or ThermalCriterion()
    if not readings:
        return ThermalVerdict(True, "unknown", None, None)
    last = readings[-1]
    slope = temperature_slope_c_per_min(readings, criterion.window_s, criterion.min_readings)
    if slope is not None and abs(slope) <= criterion.max_slope_c_per_min:
        return ThermalVerdict(True, "settled", slope, last.temperature_c)
    start_s = readings[0].time_s if since_s is None else since_s
    if last.time_s - start_s >= criterion.max_wait_s:
        return ThermalVerdict(True, "timeout", slope, last.temperature_c)
    return ThermalVerdict(False, "warming", slope, last.temperature_c)


class ThermalWatch:
    """One GPU's (or stage's) temperature readings as they arrive, and whether it has settled.

    Keeps what :func:`thermal_verdict` needs and no more: when the first reading came (the
    wait counts from it) and the readings of the last ``criterion.window_s``, at most one per
    ``min_interval_s`` (an iteration's report carries the sampler's last reading, which moves
    about once a second). Not thread-safe (one phase of one job feeds it). The server's baseline
    waits on one per stage; the profiling phase may call :meth:`verdict` on the same to start
    (or go on) only when settled.

    Args:
        criterion: When it counts as settled (default: :class:`ThermalCriterion`'s).
        min_interval_s: Readings closer than this to the last one kept are skipped.
    """

    def __init__(
        self, criterion: Optional[ThermalCriterion] = None, min_interval_s: float = 1.0
    ) -> None:
        self.criterion = criterion or ThermalCriterion()
        self.min_interval_s = min_interval_s
        self.since_s: Optional[float] = None
        self._readings: List[TemperatureReading] = []
        self._verdict: Optional[ThermalVerdict] = None

    def add(self, time_s: float, temperature_c: float) -> None:
        """A reading (at least ``min_interval_s`` after the last one kept, else skipped)."""
        readings = self._readings
        if readings and time_s < readings[-1].time_s + self.min_interval_s:
            return
        if self.since_s is None:
            self.since_s = time_s
        readings.append(TemperatureReading(time_s, temperature_c))
        self._verdict = None
        # Keep one reading older than the window (it makes the window's span whole).
        cut = bisect.bisect_left([r.time_s for r in readings], time_s - self.criterion.window_s)
        if cut > 1:
            del readings[: cut - 1]

    def verdict(self) -> ThermalVerdict:
        """Whether measuring may start now (see :func:`thermal_verdict`)."""
        if self._verdict is None:
            self._verdict = thermal_verdict(self._readings, self.criterion, self.since_s)
        return self._verdict

    @property
    def readings(self) -> List[TemperatureReading]:
        """The readings kept (the last window's), oldest first."""
        return list(self._readings)

    def to_state(self) -> Dict[str, Any]:
        """What :meth:`from_state` needs (JSON-ready)."""
        return {
            "since_s": self.since_s,
            "readings": [[r.time_s, r.temperature_c] for r in self._readings],
        }

    @classmethod
    def from_state(
        cls, state: Dict[str, Any], criterion: Optional[ThermalCriterion] = None
    ) -> ThermalWatch:
        """The watch :meth:`to_state` described."""
        watch = cls(criterion)
        watch._readings = [TemperatureReading(float(t), float(c)) for t, c in state["readings"]]
        since = state.get("since_s")
        watch.since_s = None if since is None else float(since)
        return watch


def stages_settled(watches: Mapping[int, ThermalWatch]) -> Tuple[bool, Dict[int, ThermalVerdict]]:
    """Whether every stage's GPU may start measuring, and each one's verdict.

    The one call a phase that measures makes (the server's baseline; profiling, to hold a
    window after a pause let the cards cool): ``watches`` maps each reporting rank (a stage
    leader, whose GPU stands for its stage) to the :class:`ThermalWatch` its reports feed; a
    stage without one holds nothing up.
    """
    verdicts = {stage: watch.verdict() for stage, watch in sorted(watches.items())}
    return all(v.ready for v in verdicts.values()), verdicts
