"""The job's messages: ``POST /jobs`` (the spec and its settings) and the imposed iteration time.

Part of :mod:`perseus.wire` (see there). The client builds these (the runtime builds the spec and
its settings from the configuration: :mod:`perseus.runtime.online.job_spec`), so they check their
bounds on construction (:class:`~perseus.config.checked.Checked`). Their numeric bounds are those of
:mod:`perseus.config.bounds`, the configuration's too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional, Union

from perseus.config.bounds import (
    ENERGY_SETTINGS,
    P2P_POWER_W,
    PROFILER_SETTINGS,
    SOLVER_NAME_PATTERN,
)
from perseus.config.checked import Bound, Checked
from perseus.config.enums import EnergyPolicy, ProfilerMode
from perseus.pipeline_order import PipelineOrder
from perseus.wire.fields import (
    FORBID_EXTRA,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_STAGES,
    JobId,
    Mhz,
)


@dataclass(frozen=True)
class EnergySettings(Checked):
    """The job's energy policy (``energy.*`` of the configuration, without the power limit)."""

    __pydantic_config__ = FORBID_EXTRA

    policy: EnergyPolicy = EnergyPolicy.no_slowdown
    max_slowdown: Optional[Annotated[float, Bound.of(ENERGY_SETTINGS["max_slowdown"])]] = None
    iteration_time_s: Optional[Annotated[float, Bound.of(ENERGY_SETTINGS["iteration_time_s"])]] = (
        None
    )
    eta: Annotated[float, Bound.of(ENERGY_SETTINGS["eta"])] = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy == EnergyPolicy.power_limit:
            raise ValueError(
                "energy=power_limit does not choose a pipeline plan; the coordination server "
                "serves pipeline policies only"
            )
        if self.policy == EnergyPolicy.slowdown and self.max_slowdown is None:
            raise ValueError(
                "energy=slowdown needs energy.max_slowdown (a fraction, e.g. 0.05 for 5 %)"
            )
        if self.policy == EnergyPolicy.deadline and self.iteration_time_s is None:
            raise ValueError("energy=deadline needs energy.iteration_time_s (seconds > 0)")


@dataclass(frozen=True)
class ProfilerSettings(Checked):
    """Online profiler settings (``profiler.*`` of the configuration, same key names)."""

    __pydantic_config__ = FORBID_EXTRA

    enabled: bool = True
    mode: ProfilerMode = ProfilerMode.fast
    energy_rise_patience: Annotated[int, Bound.of(PROFILER_SETTINGS["energy_rise_patience"])] = 5
    warmup_instructions: Annotated[int, Bound.of(PROFILER_SETTINGS["warmup_instructions"])] = 2
    min_window_s: Annotated[float, Bound.of(PROFILER_SETTINGS["min_window_s"])] = 0.1
    max_iterations: Annotated[int, Bound.of(PROFILER_SETTINGS["max_iterations"])] = 40
    max_iterations_fraction: Optional[
        Annotated[float, Bound.of(PROFILER_SETTINGS["max_iterations_fraction"])]
    ] = None
    job_iterations: Optional[Annotated[int, Bound.of(PROFILER_SETTINGS["job_iterations"])]] = None
    max_minutes: Optional[Annotated[float, Bound.of(PROFILER_SETTINGS["max_minutes"])]] = None
    frequency_step: Annotated[int, Bound.of(PROFILER_SETTINGS["frequency_step"])] = 1
    min_frequency_mhz: Optional[Mhz] = None
    baseline_steps: Annotated[int, Bound.of(PROFILER_SETTINGS["baseline_steps"])] = 3
    settle_steps: Annotated[int, Bound.of(PROFILER_SETTINGS["settle_steps"])] = 1
    measure_steps: Annotated[int, Bound.of(PROFILER_SETTINGS["measure_steps"])] = 5


@dataclass(frozen=True)
class JobSpec(Checked):
    """``POST /jobs``: a job, as every one of its ranks registers it (identical is idempotent).

    ``schedule`` is a schedule Perseus generates (``1f1b``, ``gpipe``) or the engine's own
    order (:class:`~perseus.pipeline_order.PipelineOrder`: ``{"name": ..., "ranks": [...]}``,
    each rank's actions ``"0F0,0F1,0I0,..."``); :func:`perseus.schedule.stage_order` gives each
    stage's ``(instruction, microbatch)`` sequence of either.
    """

    __pydantic_config__ = FORBID_EXTRA

    num_stages: Annotated[int, Bound(ge=1, le=MAX_STAGES)]
    num_microbatches: Annotated[int, Bound(ge=1, le=MAX_MICROBATCHES)]
    job_id: Optional[JobId] = None
    schedule: Union[Literal["1f1b", "gpipe"], PipelineOrder] = "1f1b"
    dp: Annotated[int, Bound(ge=1, le=MAX_RANKS)] = 1
    tp: Annotated[int, Bound(ge=1, le=MAX_RANKS)] = 1
    energy: EnergySettings = field(default_factory=EnergySettings)
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    solver: Annotated[str, Bound(pattern=SOLVER_NAME_PATTERN)] = "lp"
    # Blocking power used where the profiler could not measure it (W).
    p2p_power_w: Annotated[float, Bound.of(P2P_POWER_W)] = 83.64

    def __post_init__(self) -> None:
        super().__post_init__()
        order = self.schedule
        if isinstance(order, PipelineOrder):
            shape = (order.num_ranks, order.num_microbatches)
            if shape != (self.num_stages, self.num_microbatches):
                raise ValueError(
                    f"JobSpec: the schedule's order ({order.name}) has {order.num_ranks} rank(s) "
                    f"and {order.num_microbatches} microbatch(es), the job {self.num_stages} "
                    f"stage(s) and {self.num_microbatches}"
                )
            order.check()


@dataclass(frozen=True)
class JobCreated:
    """Answer to ``POST /jobs``."""

    job_id: str
    created: bool


@dataclass(frozen=True)
class IterationTime(Checked):
    """``PUT /jobs/{job_id}/iteration_time``: a time imposed from outside (a straggler)."""

    __pydantic_config__ = FORBID_EXTRA

    iteration_time_s: Annotated[float, Bound(gt=0.0, le=1e6, allow_inf_nan=False)]
