"""The stop rule of a high-to-low frequency sweep."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple


class EnergyRiseStop:
    """Stop lowering the frequency once energy rose ``patience`` times in a row.

    Energies arrive in sweep order (highest frequency first). A "rise" is a frequency whose
    energy is above the lowest energy seen so far; a new minimum resets the count. Comparing
    against the running minimum (not just the previous frequency) keeps one noisy reading
    from either stopping the sweep or restarting it.

    Args:
        patience: Consecutive rises that end the sweep (``profiler.energy_rise_patience``).
    """

    def __init__(self, patience: int) -> None:
        if patience < 1:
            raise ValueError(f"patience={patience}: must be >= 1")
        self.patience = patience
        self._history: List[Tuple[int, float]] = []

    def reset(self) -> None:
        """Forget everything observed."""
        self._history.clear()

    def evaluate(self, energies_j: List[Tuple[int, float]]) -> Optional[int]:
        """Re-evaluate on the full sweep so far; returns the frequency where it stopped.

        Args:
            energies_j: ``(frequency_mhz, energy_j)`` in sweep order (highest first). Estimates
                may change as data accumulates, so the rule is re-run on the whole list.

        Returns:
            The frequency at which the rule triggered, or ``None`` while the sweep goes on.
        """
        self._history = list(energies_j)
        best = math.inf
        rises = 0
        for freq_mhz, energy_j in self._history:
            if energy_j < best:
                best = energy_j
                rises = 0
            else:
                rises += 1
                if rises >= self.patience:
                    return freq_mhz
        return None
