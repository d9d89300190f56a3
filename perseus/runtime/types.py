"""Types shared by the hook runtime, the adapters and the online profiler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol


@dataclass(frozen=True)
class RankInfo:
    """Where one training process sits in the job.

    Attributes:
        stage: Pipeline stage of this rank (0-based).
        num_stages: Number of pipeline stages.
        dp_rank: Data-parallel rank (which pipeline replica).
        tp_rank: Tensor-parallel rank within the stage.
        rank: Global rank in the process group.
        world_size: Number of processes in the job.
        local_gpu_index: Index of this rank's GPU as the process sees it.
        num_model_chunks: Model chunks per stage (interleaved schedule), 1 otherwise.
    """

    stage: int = 0
    num_stages: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    rank: int = 0
    world_size: int = 1
    local_gpu_index: int = 0
    num_model_chunks: int = 1


class Hooks(Protocol):
    """The one hook contract adapters call, and nothing else."""

    def on_step_begin(self) -> None:
        """A training iteration (one optimizer step over all microbatches) starts."""

    def on_step_end(self) -> None:
        """The training iteration ended."""

    def on_instruction_begin(self, name: str) -> None:
        """A ``forward`` or ``backward`` of one microbatch starts on this stage."""

    def on_instruction_end(self, name: str) -> None:
        """That instruction ended (adapters call this in ``finally``)."""


class WaitHooks(Hooks, Protocol):
    """Hooks that can also leave a wait inside an instruction out of its measurement.

    Optional: an adapter calls these only between ``on_instruction_begin`` and
    ``on_instruction_end``, where an engine blocks in the middle of an instruction (Merak's
    ``RecomputeRecvGrad`` recomputes, then waits for the gradient), and only on hook objects
    that have them. Like the other hooks, an implementation synchronizes the device before it
    stamps the wait's begin and end (see ``docs/design.md``, "Hook contract").
    """

    def on_wait_begin(self) -> None:
        """The running instruction blocks on another stage until :meth:`on_wait_end`."""

    def on_wait_end(self) -> None:
        """The wait is over; what follows is the instruction's work again."""


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


class FrequencySource(Protocol):
    """Decides the SM frequency of every instruction (a plan, a profiler sweep, max speed).

    The optimizer asks once per instruction; ``None`` means "leave the GPU at default
    clocks". Implementations must be cheap: this runs on the training critical path.
    """

    wants_energy: bool
    """When true, the optimizer reads the energy counter at every instruction boundary."""

    def begin_step(self, step: int) -> None:
        """Iteration ``step`` starts."""

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """Frequency for the ``position``-th instruction of iteration ``step`` on this stage."""

    def end_step(self, record: StepRecord) -> None:
        """Iteration ended; ``record`` has what happened (for profilers and watchers)."""
