"""Energy attribution: the power of what ran, from a counter's updates and the hooks' stamps.

A GPU's energy counter moves only at its updates (every ~100 ms, with jitter, on NVML). The
energy between two *consecutive updates* is exact; what ran in between is known from the stamps
(instruction segments, blocking gaps, the time between iterations). So every update interval is
one linear equation in the powers of the types of activity inside it::

    E(u_{i+1}) - E(u_i) = sum over types of P_type * seconds of type in [u_i, u_{i+1}]

An interval that touches activity of unknown type (before the first stamp, instructions at default
clocks, a long unexplained gap) gives no equation. The equations are solved together
(:func:`perseus.profiler.estimation.power_fit.fit_powers`): generalised least squares with the
update times' uncertainty as noise, every power within physical bounds, a standard error for every
power and for every energy predicted from them.

The counter also lags the load by a few milliseconds (5 ms on an H100); the lag is fitted
(:func:`attribute`) as the shift of the update times that explains the equations best.

Used by the profiler's per-GPU estimator (:mod:`perseus.profiler.estimation.estimate`) and by the
replay of recorded hardware (``scripts/replay_nvml_trace.py``): the same code for both.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from perseus.profiler.estimation.power_fit import Equation, PowerFit, Prior, chi2_of, fit_powers
from perseus.records.energy import EnergyUpdate

Key = Any  # any hashable type of activity

# Overlap with unknown activity an equation tolerates (s): rounding of stamps, not activity.
UNKNOWN_TOLERANCE_S = 1e-6
# Lags tried (s), and the improvement of chi2 per equation a lag must bring over no lag.
LAG_GRID_S = tuple(0.001 * i for i in range(0, 21))
MIN_LAG_GAIN = 0.02


@dataclass(frozen=True)
class Span:
    """A stretch of time of one type of activity (``key``; ``None``: unknown)."""

    start_s: float
    end_s: float
    key: Optional[Key]


class Timeline:
    """Non-overlapping spans sorted by time; answers "seconds of each type between t0 and t1".

    Args:
        spans: The activity, in any order. Overlaps are trimmed (the later span starts where
            the earlier ends).
        gap_key: Type of the time between two spans (``None``: unknown).
        max_gap_s: Gaps longer than this are unknown whatever ``gap_key``.
        bridge_s: Gaps up to this long are split between the spans on either side (host
            time between two stamps, not activity of its own).
    """

    def __init__(
        self,
        spans: Iterable[Span],
        gap_key: Optional[Key] = None,
        max_gap_s: float = math.inf,
        bridge_s: float = 0.0,
    ) -> None:
        ordered = sorted((s for s in spans if s.end_s > s.start_s), key=lambda s: s.start_s)
        out: List[Span] = []
        for span in ordered:
            start = span.start_s
            if out:
                prev = out[-1]
                if start < prev.end_s:
                    start = prev.end_s
                    if span.end_s <= start:
                        continue
                elif start - prev.end_s <= bridge_s:
                    middle = 0.5 * (prev.end_s + start)
                    out[-1] = Span(prev.start_s, middle, prev.key)
                    start = middle
                elif start > prev.end_s:
                    key = gap_key if start - prev.end_s <= max_gap_s else None
                    out.append(Span(prev.end_s, start, key))
            out.append(Span(start, span.end_s, span.key))
        self.spans = out
        self._ends = [s.end_s for s in out]

    @property
    def start_s(self) -> Optional[float]:
        """Start of the first span."""
        return self.spans[0].start_s if self.spans else None

    @property
    def end_s(self) -> Optional[float]:
        """End of the last span."""
        return self.spans[-1].end_s if self.spans else None

    def seconds_between(self, t0_s: float, t1_s: float) -> Optional[Dict[Key, float]]:
        """Seconds of each type in ``[t0_s, t1_s]``; ``None`` if any of it is unknown."""
        if not self.spans or t0_s < self.spans[0].start_s - UNKNOWN_TOLERANCE_S:
            return None
        if t1_s > self.spans[-1].end_s + UNKNOWN_TOLERANCE_S:
            return None
        out: Dict[Key, float] = {}
        i = bisect.bisect_right(self._ends, t0_s)
        while i < len(self.spans) and self.spans[i].start_s < t1_s:
            span = self.spans[i]
            overlap = min(span.end_s, t1_s) - max(span.start_s, t0_s)
            if overlap > 0:
                if span.key is None:
                    if overlap > UNKNOWN_TOLERANCE_S:
                        return None
                else:
                    out[span.key] = out.get(span.key, 0.0) + overlap
            i += 1
        return out

    def keys(self) -> List[Key]:
        """Every known type on the timeline."""
        return list(dict.fromkeys(s.key for s in self.spans if s.key is not None))


def equations(
    updates: Sequence[EnergyUpdate], timeline: Timeline, lag_s: float = 0.0
) -> List[Equation]:
    """One equation per pair of consecutive updates whose interval is all known activity.

    ``lag_s``: the counter shows energy up to ``lag_s`` before each update's time.
    """
    out: List[Equation] = []
    if timeline.start_s is None:
        return out
    first = bisect.bisect_left([u.time_s for u in updates], timeline.start_s + lag_s) - 1
    for i in range(max(0, first), len(updates) - 1):
        u0, u1 = updates[i], updates[i + 1]
        t0, t1 = u0.time_s - lag_s, u1.time_s - lag_s
        if t0 > (timeline.end_s or 0.0):
            break
        energy_j = (u1.energy_mj - u0.energy_mj) / 1000.0
        if t1 <= t0 or energy_j < 0:
            continue
        seconds = timeline.seconds_between(t0, t1)
        if not seconds:
            continue
        out.append(
            Equation(
                seconds=seconds,
                energy_j=energy_j,
                start_s=t0,
                end_s=t1,
                start_error_s=u0.time_error_s,
                end_error_s=u1.time_error_s,
                start_update=i,
            )
        )
    return out


def sustained_power_range_w(
    updates: Sequence[EnergyUpdate], min_window_s: float = 1.0
) -> Optional[Tuple[float, float]]:
    """Lowest and highest mean power over windows of consecutive updates ``>= min_window_s``.

    What the GPU was seen to draw, sustained: the highest is at most its power limit (the
    limit caps the average over about a second; an H100 drew 760 W for 0.4 s at the start of a
    load under a 700 W limit), the lowest at least its idle power. Windows whose ends' time
    uncertainty exceeds 5 % of the window are skipped. ``None``: no such window.
    """
    lowest, highest = math.inf, -math.inf
    j = 0
    for i, u0 in enumerate(updates):
        j = max(j, i + 1)
        while j < len(updates) and updates[j].time_s - u0.time_s < min_window_s:
            j += 1
        if j >= len(updates):
            break
        u1 = updates[j]
        span = u1.time_s - u0.time_s
        if u0.time_error_s + u1.time_error_s > 0.05 * span or u1.energy_mj < u0.energy_mj:
            continue
        power = (u1.energy_mj - u0.energy_mj) / 1000.0 / span
        lowest, highest = min(lowest, power), max(highest, power)
    if not math.isfinite(highest):
        return None
    return lowest, highest


def attribute(
    updates: Sequence[EnergyUpdate],
    timeline: Timeline,
    lower_w: Mapping[Key, float],
    upper_w: Mapping[Key, float],
    priors: Sequence[Prior] = (),
    *,
    keys: Optional[Sequence[Key]] = None,
    lag_s: Optional[float] = None,
) -> PowerFit:
    """Every type's power from the counter's updates over ``timeline``.

    Args:
        updates: The GPU's counter updates, oldest first, contiguous.
        timeline: What ran (see :class:`Timeline`).
        lower_w: Lowest possible power per type.
        upper_w: Highest possible power per type.
        priors: Extra soft knowledge.
        keys: The types to estimate (default: every type on the timeline).
        lag_s: The counter's lag; ``None``: fitted (see :func:`fit_lag`).
    """
    keys = list(keys) if keys is not None else timeline.keys()
    if lag_s is None:
        lag_s = fit_lag(updates, timeline, keys)
    eqs = equations(updates, timeline, lag_s)
    return fit_powers(eqs, keys, lower_w, upper_w, priors, lag_s=lag_s)


def fit_lag(
    updates: Sequence[EnergyUpdate],
    timeline: Timeline,
    keys: Sequence[Key],
    grid_s: Sequence[float] = LAG_GRID_S,
) -> float:
    """The counter lag (from ``grid_s``) whose equations fit best per equation.

    A lag is kept only when it lowers the whitened misfit per equation by more than
    :data:`MIN_LAG_GAIN` relative to no lag (flat data say nothing about the lag).
    """
    scores: List[Tuple[float, float]] = []
    for lag in grid_s:
        eqs = equations(updates, timeline, lag)
        chi2 = chi2_of(eqs, keys)
        if chi2 is not None:
            scores.append((chi2 / len(eqs), lag))
    if not scores:
        return 0.0
    base = next((s for s, lag in scores if lag == 0.0), None)
    best, lag = min(scores)
    if base is None or best < (1.0 - MIN_LAG_GAIN) * base:
        return lag
    return 0.0


def covering_updates(
    updates: Sequence[EnergyUpdate], t0_s: float, t1_s: float
) -> Optional[Tuple[int, int]]:
    """Indices of the first update at/after ``t0_s`` and the last at/before ``t1_s``."""
    times = [u.time_s for u in updates]
    i = bisect.bisect_left(times, t0_s)
    j = bisect.bisect_right(times, t1_s) - 1
    if i >= len(updates) or j < 0 or j <= i:
        return None
    return i, j


__all__ = [
    "Equation",
    "PowerFit",
    "Prior",
    "Span",
    "Timeline",
    "attribute",
    "covering_updates",
    "equations",
    "fit_lag",
    "sustained_power_range_w",
]
