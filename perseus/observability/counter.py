"""A GPU's energy and power from its energy counter's updates, as they are seen.

:class:`CounterTrack` takes the updates a GPU's energy sampler saw (in time order, on the clock
they were stamped with) and keeps the energy counted since the first one (a counter that went
back, e.g. after a driver reload, continues: never a negative step), the mean power over the
newest :data:`POWER_SAMPLE_S` or more of updates, and a bounded ring of those powers, stamped with
the caller's wall time, over the last ``history_s``. The coordination server keeps one per stage
leader's GPU (from the reports' counter updates); a rank without a server one for its own GPU.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterable, Optional, Tuple

# A power sample averages the counter updates of at least this long (s).
POWER_SAMPLE_S = 1.0
# Power samples kept at most (besides the history's time bound).
POWER_SAMPLES_KEPT = 3600


class CounterTrack:
    """One GPU's counted energy and recent power (not thread-safe: one owner feeds it).

    Attributes:
        energy_j: Energy counted since the first update seen (only grows).
        power_w: The newest power sample (``None``: less than :data:`POWER_SAMPLE_S` seen).
        samples: ``(wall time, W)`` of the power samples over the history.
    """

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.power_w: Optional[float] = None
        self.samples: Deque[Tuple[float, float]] = deque(maxlen=POWER_SAMPLES_KEPT)
        self._last_s: Optional[float] = None
        self._last_mj: Optional[float] = None
        self._sample_start_s: Optional[float] = None
        self._sample_j = 0.0

    def add(self, updates: Iterable[Any], now_s: float, history_s: float) -> None:
        """Take updates (``time_s``, ``energy_mj``; time order); ``now_s`` stamps a new sample."""
        for update in updates:
            t, mj = float(update.time_s), float(update.energy_mj)
            if self._last_s is not None and self._last_mj is not None:
                if t <= self._last_s:
                    continue  # seen already
                delta_j = (mj - self._last_mj) / 1000.0
                if delta_j >= 0:
                    self.energy_j += delta_j
                    self._sample_j += delta_j
            if self._sample_start_s is None:
                self._sample_start_s, self._sample_j = t, 0.0
            self._last_s, self._last_mj = t, mj
        start, last = self._sample_start_s, self._last_s
        if start is not None and last is not None and last - start >= POWER_SAMPLE_S:
            self.power_w = self._sample_j / (last - start)
            self.samples.append((now_s, self.power_w))
            self._sample_start_s, self._sample_j = last, 0.0
        horizon = now_s - history_s
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()
