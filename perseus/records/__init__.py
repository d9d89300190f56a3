"""The records every layer shares.

Where a rank sits, what its instructions and iterations did, and what its GPU's energy counter
showed (and its temperature).

The bottom of the package (``docs/design.md``, "Layers"): plain data, standard library only,
imported by the file formats, the wire, the GPU layer, the runtime, the profiler and the server
alike, and importing nothing of Perseus itself.
"""

from __future__ import annotations

from perseus.records.energy import (
    EnergySeries,
    EnergyUpdate,
    TemperatureReading,
    TemperatureSeries,
    ThermalCriterion,
    ThermalVerdict,
    ThermalWatch,
    UpdatePeriod,
    stages_settled,
    thermal_verdict,
)
from perseus.records.ranks import RankInfo
from perseus.records.steps import InstructionRecord, StepEnergy, StepRecord

__all__ = [
    "EnergySeries",
    "EnergyUpdate",
    "InstructionRecord",
    "RankInfo",
    "StepEnergy",
    "StepRecord",
    "TemperatureReading",
    "TemperatureSeries",
    "ThermalCriterion",
    "ThermalVerdict",
    "ThermalWatch",
    "UpdatePeriod",
    "stages_settled",
    "thermal_verdict",
]
