"""Request and response bodies of the coordination server (pydantic v2, every size bounded)."""

from __future__ import annotations

from typing import Annotated, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
JobId = Annotated[str, Field(pattern=JOB_ID_PATTERN)]
MAX_STAGES = 512
MAX_MICROBATCHES = 4096
MAX_RANKS = 65536
MAX_CLOCKS = 1024
MAX_INSTRUCTIONS = 2 * MAX_MICROBATCHES * 8
Mhz = Annotated[int, Field(gt=0, le=100_000)]
Seconds = Annotated[float, Field(ge=0.0, le=1e7, allow_inf_nan=False)]
Joules = Annotated[float, Field(ge=0.0, le=1e15, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnergyPolicy(_Body):
    """The job's energy policy (``perseus.config.EnergyConfig`` without the power limit)."""

    policy: Literal[
        "no_slowdown", "slowdown", "deadline", "min_energy", "max_speed", "zeus_cost"
    ] = "no_slowdown"
    max_slowdown: Optional[Annotated[float, Field(ge=0.0, le=100.0)]] = None
    iteration_time_s: Optional[Annotated[float, Field(gt=0.0, le=1e6)]] = None
    eta: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5


class ProfilerSettings(_Body):
    """Online profiler settings (``perseus.config.ProfilerConfig``)."""

    enabled: bool = True
    mode: Literal["fast", "sweep"] = "fast"
    energy_rise_patience: Annotated[int, Field(ge=1, le=1000)] = 5
    warmup_instructions: Annotated[int, Field(ge=0, le=1000)] = 2
    min_window_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 0.1
    max_iterations: Annotated[int, Field(ge=1, le=100_000)] = 40
    frequency_step: Annotated[int, Field(ge=1, le=1000)] = 1
    min_frequency_mhz: Optional[Mhz] = None
    baseline_steps: Annotated[int, Field(ge=1, le=10_000)] = 3
    settle_steps: Annotated[int, Field(ge=0, le=10_000)] = 1
    measure_steps: Annotated[int, Field(ge=1, le=10_000)] = 5


class JobSpec(_Body):
    """A job, as every one of its ranks registers it (identical specs are idempotent)."""

    job_id: Optional[JobId] = None
    num_stages: Annotated[int, Field(ge=1, le=MAX_STAGES)]
    num_microbatches: Annotated[int, Field(ge=1, le=MAX_MICROBATCHES)]
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    dp: Annotated[int, Field(ge=1, le=MAX_RANKS)] = 1
    tp: Annotated[int, Field(ge=1, le=MAX_RANKS)] = 1
    energy: EnergyPolicy = EnergyPolicy()
    profiler: ProfilerSettings = ProfilerSettings()
    solver: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")] = "lp"
    # Blocking power used where the profiler could not measure it (W).
    p2p_power_w: Annotated[float, Field(ge=0.0, le=10_000.0)] = 83.64


class JobCreated(_Body):
    """Answer to a job registration."""

    job_id: str
    created: bool


class RankRegistration(_Body):
    """One training process joining its job."""

    rank: Annotated[int, Field(ge=0, lt=MAX_RANKS)]
    stage: Annotated[int, Field(ge=0, lt=MAX_STAGES)]
    dp_rank: Annotated[int, Field(ge=0, lt=MAX_RANKS)] = 0
    tp_rank: Annotated[int, Field(ge=0, lt=MAX_RANKS)] = 0
    supported_clocks_mhz: Annotated[List[Mhz], Field(min_length=1, max_length=MAX_CLOCKS)]
    energy_update_period_s: Optional[Annotated[float, Field(gt=0.0, le=10.0)]] = None


class Schedule(_Body):
    """The frequency of every instruction of one stage in one iteration."""

    step: int
    phase: str
    frequencies_mhz: List[Optional[int]]


class InstructionReport(_Body):
    """One instruction as the rank measured it (counter readings in mJ)."""

    position: Annotated[int, Field(ge=0, lt=MAX_INSTRUCTIONS)]
    instruction: Literal["forward", "backward"]
    microbatch: Annotated[int, Field(ge=0, lt=MAX_MICROBATCHES * 8)]
    frequency_mhz: Optional[Mhz] = None
    start_s: Annotated[float, Field(allow_inf_nan=False)]
    end_s: Annotated[float, Field(allow_inf_nan=False)]
    energy_begin_mj: Optional[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = None
    energy_end_mj: Optional[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = None


class StepReport(_Body):
    """What one rank measured in one iteration."""

    rank: Annotated[int, Field(ge=0, lt=MAX_RANKS)]
    step: Annotated[int, Field(ge=0, le=10**12)]
    iteration_time_s: Seconds
    # From the iteration's start to the end of its last instruction: without the final
    # gradient synchronization, so that a straggling replica shows in it.
    compute_time_s: Optional[Seconds] = None
    energy_j: Optional[Joules] = None
    instructions: Annotated[List[InstructionReport], Field(max_length=MAX_INSTRUCTIONS)] = []


class IterationTime(_Body):
    """An iteration time imposed on a job from outside (a straggler elsewhere)."""

    iteration_time_s: Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]


class Ack(_Body):
    """A plain acknowledgement."""

    ok: bool = True
    detail: Dict[str, str] = {}
