"""Measured power-limit table and the rules that pick one limit from it.

Every rule scores the per-step time and energy measured at each power limit (summed over all GPUs
of the job for energy, slowest rank for time):

* ``zeus_cost``: ``eta * E + (1 - eta) * P_max * T`` — energy and time in one unit (joules), with
  ``P_max`` the maximum power limit summed over the job's GPUs (``eta=1``: energy only,
  ``eta=0``: time only).
* ``energy``: least energy per step.
* ``time``: least time per step.
* ``max_slowdown``: least energy among limits no more than ``max_slowdown`` (a fraction) slower
  than the fastest measured limit.

Ties (equal scores up to floating-point noise) go to the higher power limit. A limit measured in
several windows (:class:`MeasuredWindow`) is scored by its mean over them: over its confirmation
windows when it has any (the search's descent window is then only a guide), else over all.
:class:`Criterion` is one rule with its settings, as the search scores limits with it. Standard
library only; runs on Python 3.9.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Sequence, Tuple

from perseus.errors import ConfigError

SELECTORS = ("zeus_cost", "energy", "time", "max_slowdown")
# Where a window was measured: going down the limits (one window each, a guide), or in a
# confirmation round against the highest limit (paired with its window of the same round).
SEARCH = "search"
CONFIRM = "confirm"
# Scores this close count as equal (floating-point noise), and the higher limit wins the tie.
_TIE_REL = 1e-9


@dataclass(frozen=True)
class MeasuredWindow:
    """One measurement window at one power limit, over all GPUs of the job.

    Attributes:
        pass_index: The confirmation round it belongs to (windows of one round are paired;
            0 for the descent's windows).
        time_s: Its wall time (the slowest rank's).
        energy_j: Its energy, summed over all GPUs.
        num_steps: Training steps in it.
        phase: :data:`SEARCH` (the descent) or :data:`CONFIRM` (a confirmation round; what
            tables saved before the search had: passes over every limit).
    """

    pass_index: int
    time_s: float
    energy_j: float
    num_steps: int
    phase: str = CONFIRM


@dataclass(frozen=True)
class PowerLimitMeasurement:
    """What one power limit cost per training step, over all GPUs of the job.

    Attributes:
        power_limit_mw: The power limit every GPU ran under (mW).
        time_per_step_s: Mean wall time of one step (the slowest rank's).
        energy_per_step_j: Mean energy of one step, summed over all GPUs.
        num_steps: Steps measured (over all its windows).
        windows: The windows behind the means (empty in tables saved before they were kept).
    """

    power_limit_mw: int
    time_per_step_s: float
    energy_per_step_j: float
    num_steps: int
    windows: Tuple[MeasuredWindow, ...] = ()

    @classmethod
    def of_windows(
        cls, power_limit_mw: int, windows: Sequence[MeasuredWindow]
    ) -> PowerLimitMeasurement:
        """The per-step means over ``windows`` (at least one), weighted by their steps.

        Only the confirmation windows count when there are any.
        """
        used = [w for w in windows if w.phase == CONFIRM] or list(windows)
        steps = sum(w.num_steps for w in used)
        return cls(
            power_limit_mw=power_limit_mw,
            time_per_step_s=sum(w.time_s for w in used) / steps,
            energy_per_step_j=sum(w.energy_j for w in used) / steps,
            num_steps=steps,
            windows=tuple(windows),
        )

    @property
    def confirmed(self) -> bool:
        """Whether it was measured in confirmation rounds."""
        return any(w.phase == CONFIRM for w in self.windows)

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, row: Dict[str, Any]) -> PowerLimitMeasurement:
        """Inverse of :meth:`to_dict`."""
        return cls(
            power_limit_mw=int(row["power_limit_mw"]),
            time_per_step_s=float(row["time_per_step_s"]),
            energy_per_step_j=float(row["energy_per_step_j"]),
            num_steps=int(row["num_steps"]),
            windows=tuple(
                MeasuredWindow(
                    pass_index=int(w["pass_index"]),
                    time_s=float(w["time_s"]),
                    energy_j=float(w["energy_j"]),
                    num_steps=int(w["num_steps"]),
                    phase=str(w.get("phase", CONFIRM)),
                )
                for w in row.get("windows") or ()
            ),
        )


def zeus_cost_j(time_s: float, energy_j: float, *, eta: float, max_power_w: float) -> float:
    """``eta * energy_j + (1 - eta) * max_power_w * time_s`` (joules)."""
    return eta * energy_j + (1.0 - eta) * max_power_w * time_s


@dataclass(frozen=True)
class Criterion:
    """One selector with its settings: what a power limit is judged by.

    Attributes:
        selector: One of :data:`SELECTORS`.
        eta: Weight of energy in the Zeus cost (``zeus_cost`` only), within [0, 1].
        max_power_w: ``P_max`` of the Zeus cost: the maximum power limit summed over all GPUs.
        max_slowdown: Allowed slowdown over the fastest limit (``max_slowdown`` only), >= 0.
    """

    selector: str
    eta: float = 0.5
    max_power_w: float = 0.0
    max_slowdown: float = 0.1

    def check(self) -> None:
        """Raise :class:`ConfigError` naming a setting out of range."""
        if self.selector not in SELECTORS:
            raise ConfigError(
                f"energy.power_limit.selector={self.selector!r}: choose one of {SELECTORS}"
            )
        if not 0.0 <= self.eta <= 1.0:
            raise ConfigError(f"energy.eta={self.eta}: must be within [0, 1]")
        if self.max_slowdown < 0:
            raise ConfigError(
                f"energy.power_limit.max_slowdown={self.max_slowdown}: must be >= 0 "
                "(0.1 = 10 % slower)"
            )

    def score(self, time_s: float, energy_j: float) -> float:
        """The score of one step's time and energy: lower is better."""
        if self.selector == "zeus_cost":
            return zeus_cost_j(time_s, energy_j, eta=self.eta, max_power_w=self.max_power_w)
        if self.selector == "time":
            return time_s
        return energy_j

    def searched_for(self) -> Dict[str, Any]:
        """What a search judged by it looked for (a saved table answers only that)."""
        return {"selector": self.selector, "eta": self.eta, "max_slowdown": self.max_slowdown}

    @property
    def bounds_time(self) -> bool:
        """Whether a limit must also keep within ``max_slowdown`` of the fastest."""
        return self.selector == "max_slowdown"

    @property
    def saves_energy(self) -> bool:
        """Whether leaving the highest limit must be paid for in energy (else in time)."""
        return not (self.selector == "time" or (self.selector == "zeus_cost" and self.eta == 0))


def select_power_limit(
    measurements: Sequence[PowerLimitMeasurement],
    selector: str,
    *,
    eta: float = 0.5,
    max_power_w: float,
    max_slowdown: float = 0.1,
) -> PowerLimitMeasurement:
    """Pick the best measured power limit under ``selector``.

    Args:
        measurements: One row per profiled power limit (at least one).
        selector: One of :data:`SELECTORS`.
        eta: Weight of energy in the Zeus cost (``zeus_cost`` only), within [0, 1].
        max_power_w: ``P_max`` of the Zeus cost: the maximum power limit summed over all GPUs.
        max_slowdown: Allowed slowdown over the fastest limit (``max_slowdown`` only), >= 0.

    Returns:
        The chosen row.

    Raises:
        ConfigError: On an unknown selector, an empty table or out-of-range arguments.
    """
    criterion = Criterion(selector, eta=eta, max_power_w=max_power_w, max_slowdown=max_slowdown)
    return select_by(measurements, criterion)


def select_by(
    measurements: Sequence[PowerLimitMeasurement], criterion: Criterion
) -> PowerLimitMeasurement:
    """Pick the best measured power limit under ``criterion`` (see :func:`select_power_limit`).

    Raises:
        ConfigError: On an unknown selector, an empty table or out-of-range settings.
    """
    if not measurements:
        raise ConfigError("no power limit was measured: profile at least one power limit")
    criterion.check()
    candidates: List[PowerLimitMeasurement] = list(measurements)
    if criterion.bounds_time:
        fastest_s = min(m.time_per_step_s for m in candidates)
        bound_s = fastest_s * (1.0 + criterion.max_slowdown) * (1.0 + 1e-9)
        candidates = [m for m in candidates if m.time_per_step_s <= bound_s]

    def score(m: PowerLimitMeasurement) -> float:
        return criterion.score(m.time_per_step_s, m.energy_per_step_j)

    best_score = min(score(m) for m in candidates)
    tied = [m for m in candidates if score(m) <= best_score + _TIE_REL * abs(best_score)]
    return max(tied, key=lambda m: m.power_limit_mw)


def table_rows(
    measurements: Sequence[PowerLimitMeasurement], *, eta: float, max_power_w: float
) -> List[Dict[str, Any]]:
    """The measured table in watts with each row's Zeus cost, highest limit first."""
    rows = []
    for m in sorted(measurements, key=lambda m: -m.power_limit_mw):
        rows.append(
            {
                "power_limit_w": m.power_limit_mw / 1000.0,
                "time_per_step_s": m.time_per_step_s,
                "energy_per_step_j": m.energy_per_step_j,
                "zeus_cost_j": zeus_cost_j(
                    m.time_per_step_s, m.energy_per_step_j, eta=eta, max_power_w=max_power_w
                ),
                "num_steps": m.num_steps,
                "num_windows": len(m.windows),
                "confirmed": m.confirmed,
                "windows": [asdict(w) for w in m.windows],
            }
        )
    return rows
