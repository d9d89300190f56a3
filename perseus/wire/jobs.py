"""The job's messages: ``POST /jobs`` (the spec and its settings) and the imposed iteration time.

Part of :mod:`perseus.wire` (see there). The client builds these (the spec and its settings
from the configuration, ``from_config``), so they check their bounds on construction
(:class:`~perseus.wire_bounds.Checked`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, Literal, Optional, Type

from perseus.config import (
    ETA_RANGE,
    SOLVER_NAME_PATTERN,
    EnergyConfig,
    EnergyPolicy,
    PerseusConfig,
    ProfilerConfig,
    ProfilerMode,
)
from perseus.wire.fields import (
    FORBID_EXTRA,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_STAGES,
    JobId,
    Mhz,
)
from perseus.wire_bounds import Bound, Checked


@dataclass(frozen=True)
class EnergySettings(Checked):
    """The job's energy policy (``energy.*`` of the configuration, without the power limit)."""

    __pydantic_config__ = FORBID_EXTRA

    policy: EnergyPolicy = EnergyPolicy.no_slowdown
    max_slowdown: Optional[Annotated[float, Bound(ge=0.0, le=100.0)]] = None
    iteration_time_s: Optional[Annotated[float, Bound(gt=0.0, le=1e6)]] = None
    eta: Annotated[float, Bound(ge=ETA_RANGE[0], le=ETA_RANGE[1])] = 0.5

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

    @classmethod
    def from_config(cls, energy: EnergyConfig) -> EnergySettings:
        """The settings of ``energy`` (same key names)."""
        return cls(**_same_named(cls, energy))


@dataclass(frozen=True)
class ProfilerSettings(Checked):
    """Online profiler settings (``profiler.*`` of the configuration, same key names)."""

    __pydantic_config__ = FORBID_EXTRA

    enabled: bool = True
    mode: ProfilerMode = ProfilerMode.fast
    energy_rise_patience: Annotated[int, Bound(ge=1, le=1000)] = 5
    warmup_instructions: Annotated[int, Bound(ge=0, le=1000)] = 2
    min_window_s: Annotated[float, Bound(ge=0.0, le=3600.0)] = 0.1
    max_iterations: Annotated[int, Bound(ge=1, le=100_000)] = 40
    frequency_step: Annotated[int, Bound(ge=1, le=1000)] = 1
    min_frequency_mhz: Optional[Mhz] = None
    baseline_steps: Annotated[int, Bound(ge=1, le=10_000)] = 3
    settle_steps: Annotated[int, Bound(ge=0, le=10_000)] = 1
    measure_steps: Annotated[int, Bound(ge=1, le=10_000)] = 5

    @classmethod
    def from_config(cls, profiler: ProfilerConfig) -> ProfilerSettings:
        """The settings of ``profiler`` (same key names)."""
        return cls(**_same_named(cls, profiler))


@dataclass(frozen=True)
class JobSpec(Checked):
    """``POST /jobs``: a job, as every one of its ranks registers it (identical is idempotent)."""

    __pydantic_config__ = FORBID_EXTRA

    num_stages: Annotated[int, Bound(ge=1, le=MAX_STAGES)]
    num_microbatches: Annotated[int, Bound(ge=1, le=MAX_MICROBATCHES)]
    job_id: Optional[JobId] = None
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    dp: Annotated[int, Bound(ge=1, le=MAX_RANKS)] = 1
    tp: Annotated[int, Bound(ge=1, le=MAX_RANKS)] = 1
    energy: EnergySettings = field(default_factory=EnergySettings)
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    solver: Annotated[str, Bound(pattern=SOLVER_NAME_PATTERN)] = "lp"
    # Blocking power used where the profiler could not measure it (W).
    p2p_power_w: Annotated[float, Bound(ge=0.0, le=10_000.0)] = 83.64

    @classmethod
    def from_config(cls, cfg: PerseusConfig, num_stages: int, job_id: Optional[str]) -> JobSpec:
        """The spec of the job ``cfg`` describes (``planner.p2p_power_w``: the mean if a list)."""
        par, p2p = cfg.parallelism, cfg.planner.p2p_power_w
        p2p_w = float(p2p) if isinstance(p2p, (int, float)) else sum(p2p) / max(1, len(p2p))
        return cls(
            job_id=job_id,
            num_stages=num_stages,
            num_microbatches=par.num_microbatches,
            schedule=par.schedule,  # type: ignore[arg-type]  # checked by the caller
            dp=par.dp,
            tp=par.tp,
            energy=EnergySettings.from_config(cfg.energy),
            profiler=ProfilerSettings.from_config(cfg.profiler),
            solver=cfg.planner.solver,
            p2p_power_w=float(p2p_w),
        )


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


def _same_named(model: Type[Any], section: Any) -> Dict[str, Any]:
    """The values of ``section`` (a config dataclass) for the fields ``model`` has."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(model)}
