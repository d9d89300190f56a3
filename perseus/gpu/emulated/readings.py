"""What the emulated GPU's readings do: the recorded H100's (``realistic``) or an ideal meter.

The ``realistic`` figures come from recordings of one H100 80GB SXM (driver 580, 700 W limit)
polled back to back under known load (``tests/data/h100-nvml``; ``scripts/fit_emulated_gpu.py``
derives every number below from them and prints how well each fits):

* **Counter updates** every 100 ms on a strict grid (the grid explains every update of the four
  recordings, 714 intervals); a read returns the counter as of 60 % into the call, and each update
  holds the true energy as of :data:`COUNTER_LAG_S` before it (the busy/idle model of probe1 fits
  best there: 1.97 J RMS per update). The jitter a reader sees (90-109 ms between the updates it
  detects) comes from when its reads can look, not from the counter: reading the emulated counter
  the same way shows the same spread.
* **Read latency** (``nvmlDeviceGetTotalEnergyConsumption`` blocks its caller): drawn from the
  recorded latencies of reads that started at the same phase of the update period
  (``perseus/data/h100_nvml/read_latency.csv``): ~2.5 ms in most of the period, ~3.2 ms and ~5.5
  ms in the driver's 20 ms housekeeping windows, 15-35 ms for reads that start just after an
  update.
* **Instant power field** (``NVML_FI_DEV_POWER_INSTANT``): updated on its own timer every ~102 ms
  (recorded intervals), showing the average power over :data:`FIELD_WINDOW_S` ending
  :data:`FIELD_LAG_S` before the update; about 1 % of updates are skipped (the field then shows
  the previous value for ~200 ms, as once right after a 660 W load began).
* **Idle power**: :data:`IDLE_SHARE` of the card's maximum power limit (123 W of 700 W).
* **Power limit**: enforced on the average power over the last :data:`LIMITER_WINDOW_S`; past the
  limit the clock drops until the power is :data:`LIMITER_THROTTLE_SHARE` of it, and comes back
  once the average falls below :data:`LIMITER_RELEASE_SHARE` of it. Back-to-back forwards that
  draw ~720-750 W alone thus average the 700 W cap in a sawtooth (20-29 W RMS per 100 ms against
  the recordings), while the same forwards inside a pipeline pattern whose average stays under
  the cap run unthrottled, above it.

The ``ideal`` meter: a counter exact at its strictly periodic updates and free to read, power as
averaged over the last update, no limiter dynamics (:mod:`perseus.gpu.emulated.clocks`).
"""

from __future__ import annotations

import bisect
import csv
import random
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from perseus.gpu.emulated.counter import EnergyCounter, PowerTrace
from perseus.gpu.emulated.thermal import ThermalModel

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "h100_nvml"

COUNTER_PERIOD_S = 0.1
IDEAL_PERIOD_S = 0.02
# The shortest update period the realistic counter accepts (its reads take up to ~35 ms).
MIN_REALISTIC_PERIOD_S = 0.02
READ_AT_FRACTION = 0.6
COUNTER_LAG_S = 0.011
IDLE_SHARE = 0.176
# No instruction for this long: the GPU is idle, not waiting on communication (a pause
# between jobs or phases; pipeline bubbles are shorter).
IDLE_AFTER_S = 5.0
FIELD_WINDOW_S = 0.035
FIELD_LAG_S = 0.005
FIELD_SKIP_P = 0.0094
# Quantiles 0, 5, ..., 100 % of the recorded intervals between instant-field updates (s).
FIELD_INTERVAL_QUANTILES_S = (
    0.0831, 0.0926, 0.0956, 0.0969, 0.0989, 0.0999, 0.1001, 0.1004, 0.1007, 0.1011, 0.1015,
    0.1019, 0.1025, 0.1030, 0.1039, 0.1046, 0.1059, 0.1075, 0.1092, 0.1124, 0.1342,
)  # fmt: skip
LIMITER_WINDOW_S = 0.9
LIMITER_THROTTLE_SHARE = 0.85
LIMITER_RELEASE_SHARE = 0.99


def draw_quantiles(quantiles: Sequence[float], u: float) -> float:
    """The value at probability ``u`` of a distribution given by equally spaced quantiles."""
    x = u * (len(quantiles) - 1)
    i = min(int(x), len(quantiles) - 2)
    return quantiles[i] + (quantiles[i + 1] - quantiles[i]) * (x - i)


@lru_cache(maxsize=1)
def read_latency_table() -> Tuple[List[float], List[Tuple[float, ...]]]:
    """``(phase starts, latency quantiles per phase)`` of the recorded counter reads."""
    starts: List[float] = []
    rows: List[Tuple[float, ...]] = []
    with open(DATA_DIR / "read_latency.csv", newline="") as f:
        for row in csv.DictReader(f):
            starts.append(float(row.pop("phase_lo")))
            row.pop("phase_hi")
            rows.append(tuple(float(v) for v in row.values()))
    return starts, rows


class InstantField:
    """The instant power field of the realistic GPU (see the module docstring).

    Args:
        trace: The true power.
        rng: Its own random stream (update timer and skips).
        start_s: When the device starts; the field shows ``power_w`` until its first update.
        power_w: Power before the first update.
    """

    def __init__(self, trace: PowerTrace, rng: random.Random, start_s: float, power_w: float):
        self._trace = trace
        self._rng = rng
        self._value_w = power_w
        self.next_update_s = start_s + rng.random() * FIELD_INTERVAL_QUANTILES_S[10]

    def read_w(self, now_s: float) -> float:
        """What the field shows at ``now_s``."""
        shown: Optional[float] = None
        while self.next_update_s <= now_s:
            if self._rng.random() >= FIELD_SKIP_P:
                shown = self.next_update_s
            self.next_update_s += draw_quantiles(FIELD_INTERVAL_QUANTILES_S, self._rng.random())
        if shown is not None:
            end_s = shown - FIELD_LAG_S
            self._value_w = self._trace.average_w(end_s - FIELD_WINDOW_S, end_s)
        return self._value_w


class PowerLimiter:
    """The realistic GPU's power-limit controller (see the module docstring).

    Args:
        trace: The true power it averages.
    """

    def __init__(self, trace: PowerTrace) -> None:
        self._trace = trace
        self.throttled = False

    def update(self, at_s: float, limit_w: float) -> bool:
        """Look at the average power up to ``at_s``; returns whether the clock is held down."""
        avg_w = self._trace.average_w(at_s - LIMITER_WINDOW_S, at_s)
        if self.throttled:
            self.throttled = avg_w > LIMITER_RELEASE_SHARE * limit_w
        else:
            self.throttled = avg_w > limit_w * (1.0 + 1e-9)
        return self.throttled

    @staticmethod
    def target_w(limit_w: float) -> float:
        """The power a held-down clock must fit under."""
        return LIMITER_THROTTLE_SHARE * limit_w


class Readings:
    """The emulated GPU's true energy and what its readings show (realistic or ideal).

    Args:
        realistic: The recorded H100's behaviour, else the ideal meter.
        start_s: When the device starts.
        period_s: Counter update period.
        noise: Relative noise of each counter update.
        seed: Seeds every random stream (counter noise, grid phase, latencies, field timer).
        power_w: Power from ``start_s`` (idle).
        thermal: The die's temperature and leakage (``None``: not modelled); the card starts
            at its steady temperature under ``power_w``.
    """

    def __init__(
        self,
        realistic: bool,
        start_s: float,
        period_s: float,
        noise: float,
        seed: int,
        power_w: float,
        thermal: Optional[ThermalModel] = None,
    ) -> None:
        self.realistic = realistic
        self.trace = PowerTrace(start_s, power_w, thermal=thermal)
        phase_s = random.Random(f"{seed}:phase").random() * period_s if realistic else 0.0
        lag_s = COUNTER_LAG_S if realistic else 0.0
        self.counter = EnergyCounter(
            self.trace, period_s, noise, seed, phase_s=phase_s, lag_s=lag_s
        )
        self._latency_rng = random.Random(f"{seed}:latency")
        self.field: Optional[InstantField] = None
        self.limiter: Optional[PowerLimiter] = None
        if realistic:
            self.field = InstantField(self.trace, random.Random(f"{seed}:field"), start_s, power_w)
            self.limiter = PowerLimiter(self.trace)

    def read_latency_s(self, start_s: float) -> float:
        """How long a counter read started at ``start_s`` blocks (0: the ideal meter)."""
        if not self.realistic:
            return 0.0
        starts, rows = read_latency_table()
        row = rows[max(0, bisect.bisect_right(starts, self.counter.phase(start_s)) - 1)]
        return draw_quantiles(row, self._latency_rng.random())

    def instant_w(self, now_s: float) -> float:
        """The instant power field (realistic) or the power right now (ideal)."""
        if self.field is None:
            return self.trace.power_w(now_s)
        self.trace.advance(now_s)
        return self.field.read_w(now_s)

    def power_w(self, now_s: float) -> float:
        """``power_mw()``: the instant field (realistic), the last update's average (ideal)."""
        if self.field is not None:
            return self.instant_w(now_s)
        return self.counter.average_power_w(now_s)
