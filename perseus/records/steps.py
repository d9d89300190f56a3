"""What one rank's instructions and training iterations did (times, clocks, energy).

Times are stamped by the hooks after synchronizing the device, on the device's clock (the host's
``time.perf_counter`` unless the device has its own). Energy is never read by the hooks: it comes
from the GPU's energy sampler (:mod:`perseus.gpu.energy.sampler`), whose counter updates arrive
up to ~100 ms after the instant they cover. So a :class:`StepRecord` is handed on at once with
its times, the counter updates seen since the previous record and the energies of *earlier*
iterations that became known; its own ``energy_j`` is filled in once an update after its end has
been seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

from perseus.records.energy import EnergyUpdate


@dataclass
class InstructionRecord:
    """What happened to one instruction in one iteration (its times on the device's clock)."""

    position: int
    instruction: str
    microbatch: int
    frequency_mhz: Optional[int]
    start_s: float
    end_s: float


class StepEnergy(NamedTuple):
    """The energy of one earlier iteration, once the counter covered it (J)."""

    step: int
    energy_j: float


@dataclass
class StepRecord:
    """One training iteration as seen by one rank.

    Attributes:
        step, stage: Which iteration, on which stage.
        start_s, end_s: When it began and ended (the device's clock).
        energy_j: Its GPU energy, from the counter updates around it (``None`` until an update
            after ``end_s`` has been seen, or where the GPU has no energy counter).
        instructions: Every instruction, in execution order.
        applied_mhz: The SM clock read back at the end of each instruction (same order as
            ``instructions``; ``None`` where no clock was locked). Read only while a trace is
            written (a driver call each); kept off the server's wire format.
        energy_updates: The GPU's counter updates seen since the previous record (the
            profiler's raw data).
        earlier_energies: Earlier iterations whose energy became known since the previous
            record, oldest first.
        temperature_c: The GPU's last temperature reading when the iteration ended (°C; its
            sampler reads it, never a hook; ``None``: not read).
    """

    step: int
    stage: int
    start_s: float
    end_s: float
    energy_j: Optional[float] = None
    instructions: List[InstructionRecord] = field(default_factory=list)
    applied_mhz: List[Optional[int]] = field(default_factory=list)
    energy_updates: List[EnergyUpdate] = field(default_factory=list)
    earlier_energies: List[StepEnergy] = field(default_factory=list)
    temperature_c: Optional[float] = None

    @property
    def iteration_time_s(self) -> float:
        """Wall time of the iteration."""
        return self.end_s - self.start_s
