"""What one GPU spent on one (instruction, clock): time, power, and how well both are known."""

from __future__ import annotations

import math
from dataclasses import dataclass

# A profile row whose energy's standard error exceeds this fraction of it is uncertain.
MAX_RELATIVE_SE = 0.02
# The profiler re-measures a clock until its rows are this far inside the target: later data
# move a standard error by a few percent (the fit's misfit scale), which would put rows that
# just reached the target back above it.
REMEASURE_SHARE = 0.9


@dataclass(frozen=True)
class TypeEstimate:
    """What one GPU spent on one (instruction, frequency).

    Attributes:
        time_s: Typical duration of one instruction (warm-up instructions excluded).
        power_w: Average power while it runs (within [blocking power, power limit]).
        num_samples: Instructions whose duration was measured.
        power_se_w: Standard error of ``power_w`` (``inf``: no equation saw this type; its
            power was borrowed from neighbouring clocks).
        time_se_s: Standard error of ``time_s``.
        clamped: The estimate lay outside [blocking power, power limit] and was clamped.
    """

    time_s: float
    power_w: float
    num_samples: int
    power_se_w: float = 0.0
    time_se_s: float = 0.0
    clamped: bool = False

    @property
    def energy_j(self) -> float:
        """Energy of one instruction."""
        return self.time_s * self.power_w

    @property
    def energy_se_j(self) -> float:
        """Standard error of :attr:`energy_j` (power and time errors combined)."""
        return math.hypot(self.time_s * self.power_se_w, self.power_w * self.time_se_s)

    @property
    def relative_se(self) -> float:
        """:attr:`energy_se_j` relative to :attr:`energy_j`."""
        return self.energy_se_j / self.energy_j if self.energy_j > 0 else math.inf

    @property
    def uncertain(self) -> bool:
        """Known to worse than :data:`MAX_RELATIVE_SE`, or clamped."""
        return self.clamped or not self.relative_se <= MAX_RELATIVE_SE
