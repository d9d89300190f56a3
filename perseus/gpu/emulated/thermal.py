"""The emulated GPU's temperature, and the leakage power that rises with it.

A GPU's static (leakage) power grows with its die temperature (exponentially over 20-85 °C, close
to linearly over the tens of degrees a card moves between idle and load; see
``docs/design.md``, "Thermal drift", for the coefficient and its source). So the same
instruction at the same clock costs more energy on a warm card than on a cold one, and
back-to-back trials at different clocks are biased by how warm the card already is.

:class:`ThermalModel` is a first-order (one thermal resistance, one time constant) model of the
die temperature ``T`` under a power ``P``, with leakage linear in ``T`` around the temperature the
device profile was measured at (``reference_c``)::

    P_total = P + k (T - T_ref)                   (k: leakage_w_per_c)
    tau dT/dt = T_ambient + R P_total - T          (R: resistance_c_per_w, tau: time_constant_s)

Both are linear in ``T``, so a stretch of constant ``P`` has an exact solution: ``T`` approaches
``T_inf = (T_ambient + R (P - k T_ref)) / (1 - R k)`` with the time constant
``tau / (1 - R k)`` (leakage feeding back makes it a little slower and a little hotter; ``R k < 1``
or the card has no steady temperature). :meth:`ThermalModel.advance` gives the temperature at the
stretch's end and its energy, exactly; the emulated GPU's power trace
(:class:`~perseus.gpu.emulated.counter.PowerTrace`) integrates its power schedule with it.

:meth:`ThermalModel.for_power_limit` gives the defaults for a card of a given maximum power
limit: the die ~45 °C above a 30 °C inlet at that power (~38 °C at idle), one minute's time
constant, leakage 0.25 % of that power per °C, the profile measured at the steady temperature of
that power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

from perseus.errors import GPUValueError

# Defaults of ThermalModel.for_power_limit (see the module docstring and docs/design.md).
AMBIENT_C = 30.0
RISE_AT_LIMIT_C = 45.0
TIME_CONSTANT_S = 60.0
LEAKAGE_SHARE_PER_C = 0.0025


@dataclass(frozen=True)
class ThermalModel:
    """First-order die temperature with leakage linear in it (see the module docstring).

    Attributes:
        ambient_c: The temperature the card cools toward with no power (inlet air, °C).
        resistance_c_per_w: Degrees above ambient per watt, in steady state without leakage.
        time_constant_s: How fast the temperature follows a change of power.
        leakage_w_per_c: Extra power per degree above ``reference_c`` (less below it).
        reference_c: The temperature the device profile's powers were measured at.
    """

    ambient_c: float
    resistance_c_per_w: float
    time_constant_s: float
    leakage_w_per_c: float
    reference_c: float

    def __post_init__(self) -> None:
        problems = []
        if not self.time_constant_s > 0:
            problems.append(f"time_constant_s={self.time_constant_s} must be > 0")
        if self.resistance_c_per_w < 0:
            problems.append(f"resistance_c_per_w={self.resistance_c_per_w} must be >= 0")
        if self.leakage_w_per_c < 0:
            problems.append(f"leakage_w_per_c={self.leakage_w_per_c} must be >= 0")
        if self.resistance_c_per_w * self.leakage_w_per_c >= 1.0:
            problems.append(
                "resistance_c_per_w * leakage_w_per_c must be < 1 (otherwise leakage heats the "
                "card faster than it cools: no steady temperature)"
            )
        if problems:
            raise GPUValueError("emulated thermal model: " + "; ".join(problems))

    @classmethod
    def for_power_limit(cls, power_limit_w: float) -> ThermalModel:
        """The defaults for a card whose highest power limit is ``power_limit_w``."""
        resistance = RISE_AT_LIMIT_C / power_limit_w
        return cls(
            ambient_c=AMBIENT_C,
            resistance_c_per_w=resistance,
            time_constant_s=TIME_CONSTANT_S,
            leakage_w_per_c=LEAKAGE_SHARE_PER_C * power_limit_w,
            reference_c=AMBIENT_C + resistance * power_limit_w,
        )

    @property
    def _feedback(self) -> float:
        return 1.0 - self.resistance_c_per_w * self.leakage_w_per_c

    def steady_c(self, power_w: float) -> float:
        """The temperature the card settles at under ``power_w`` (before leakage)."""
        k, r = self.leakage_w_per_c, self.resistance_c_per_w
        return (self.ambient_c + r * (power_w - k * self.reference_c)) / self._feedback

    def leakage_w(self, temperature_c: float) -> float:
        """The power leakage adds at ``temperature_c`` (negative below ``reference_c``)."""
        return self.leakage_w_per_c * (temperature_c - self.reference_c)

    def advance(self, temperature_c: float, power_w: float, dt_s: float) -> Tuple[float, float]:
        """``dt_s`` at ``power_w`` (before leakage) from ``temperature_c``.

        Returns:
            The temperature at the end (°C) and the energy used, leakage included (J).
        """
        if dt_s <= 0.0:
            return temperature_c, 0.0
        tau_s = self.time_constant_s / self._feedback
        steady = self.steady_c(power_w)
        decay = math.exp(-dt_s / tau_s)
        end_c = steady + (temperature_c - steady) * decay
        mean_c = steady + (temperature_c - steady) * tau_s * (1.0 - decay) / dt_s
        return end_c, (power_w + self.leakage_w(mean_c)) * dt_s
