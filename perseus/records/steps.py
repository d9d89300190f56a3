"""What one rank's instructions and training iterations did (times, clocks, energy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class InstructionRecord:
    """What happened to one instruction in one iteration.

    ``energy_begin_mj`` / ``energy_end_mj`` are raw counter readings of this rank's GPU,
    present only when the frequency source asked for them (they cost a driver call each).
    """

    position: int
    instruction: str
    microbatch: int
    frequency_mhz: Optional[int]
    start_s: float
    end_s: float
    energy_begin_mj: Optional[float] = None
    energy_end_mj: Optional[float] = None


@dataclass
class StepRecord:
    """One training iteration as seen by one rank."""

    step: int
    stage: int
    start_s: float
    end_s: float
    energy_j: Optional[float]
    instructions: List[InstructionRecord] = field(default_factory=list)
    # The SM clock read back from the device at the end of each instruction (same order as
    # ``instructions``; None where no clock was locked). Read only while a trace is written:
    # a driver call each. Kept beside the instructions, off the server's wire format.
    applied_mhz: List[Optional[int]] = field(default_factory=list)

    @property
    def iteration_time_s(self) -> float:
        """Wall time of the iteration."""
        return self.end_s - self.start_s
