"""The coordination protocol: route names, job phases, and one model per message.

Training ranks (the client, :mod:`perseus.runtime.online`) and the coordination server
(:mod:`perseus.server.app`) speak through these definitions only. The models are frozen standard
library dataclasses, so the client needs nothing beyond the standard library; every size and
value is bounded with :class:`Bound` annotations, which the server's validation (pydantic, via
FastAPI) enforces: a request outside them is answered 422 without being processed. The same
annotations appear in the server's OpenAPI schema (``GET /openapi.json``).

Every message and route is listed in ``docs/design.md`` ("HTTP API").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import (
    Annotated,
    Any,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from perseus.config import (
    ETA_RANGE,
    JOB_ID_PATTERN,
    SOLVER_NAME_PATTERN,
    ConfigChoice,
    EnergyConfig,
    EnergyPolicy,
    PerseusConfig,
    ProfilerConfig,
    ProfilerMode,
)
from perseus.wire_bounds import Bound, Checked


class Route:
    """The server's paths (``{job_id}`` and ``{rank}`` filled with :meth:`str.format`)."""

    HEALTHZ = "/healthz"
    JOBS = "/jobs"
    JOB = "/jobs/{job_id}"
    SUMMARY = "/jobs/{job_id}/summary"
    RANKS = "/jobs/{job_id}/ranks"
    RANK_FINISH = "/jobs/{job_id}/ranks/{rank}/finish"
    SCHEDULE = "/jobs/{job_id}/schedule"
    STEPS = "/jobs/{job_id}/steps"
    ITERATION_TIME = "/jobs/{job_id}/iteration_time"


class Phase(ConfigChoice):
    """Where a job is (see :mod:`perseus.server.job_phases` and ``docs/design.md``).

    ``baseline`` -> ``profiling`` -> ``planning`` -> ``running`` -> ``watching``; ``failed``
    means max speed for good.
    """

    baseline = "baseline"
    profiling = "profiling"
    planning = "planning"
    running = "running"
    watching = "watching"
    failed = "failed"

    @property
    def wants_energy(self) -> bool:
        """The server's profiler uses per-instruction energy readings in this phase."""
        return self in (Phase.baseline, Phase.profiling)

    @property
    def report_ready(self) -> bool:
        """The job measured its plan (or gave up): training is no longer needed for the report."""
        return self in (Phase.watching, Phase.failed)


MAX_STAGES = 512
MAX_MICROBATCHES = 4096
MAX_RANKS = 65536
MAX_CLOCKS = 1024
MAX_INSTRUCTIONS = 2 * MAX_MICROBATCHES * 8
MAX_STEP = 10**12
# A step sequence ("F0,F1,B0,..."): at most this many characters.
MAX_SEQUENCE_CHARS = MAX_INSTRUCTIONS * 8
SEQUENCE_PATTERN = r"^([FB][0-9]{1,6}(,[FB][0-9]{1,6})*)?$"

JobId = Annotated[str, Bound(pattern=JOB_ID_PATTERN)]
Mhz = Annotated[int, Bound(gt=0, le=100_000)]
Seconds = Annotated[float, Bound(ge=0.0, le=1e7, allow_inf_nan=False)]
Joules = Annotated[float, Bound(ge=0.0, le=1e15, allow_inf_nan=False)]
RankId = Annotated[int, Bound(ge=0, lt=MAX_RANKS)]
StepId = Annotated[int, Bound(ge=0, le=MAX_STEP)]
_FORBID_EXTRA = {"extra": "forbid"}  # read by pydantic: unknown keys are a 422

M = TypeVar("M")


@dataclass(frozen=True)
class EnergySettings(Checked):
    """The job's energy policy (``energy.*`` of the configuration, without the power limit)."""

    __pydantic_config__ = _FORBID_EXTRA

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

    __pydantic_config__ = _FORBID_EXTRA

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

    __pydantic_config__ = _FORBID_EXTRA

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
    def from_config(cls, cfg: PerseusConfig, num_stages: int, job_id: str) -> JobSpec:
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
class PeerRank(Checked):
    """A rank of the registering rank's stage that talks to the server only through it."""

    __pydantic_config__ = _FORBID_EXTRA

    rank: RankId
    dp_rank: RankId = 0
    tp_rank: RankId = 0


@dataclass(frozen=True)
class RankRegistration(Checked):
    """``POST /jobs/{job_id}/ranks``: one training process joining its job.

    A stage leader (the lowest global rank of its stage, when the stage's ranks combine their
    measurements through the job's process groups) also registers its ``peers``: they share
    its stage and ``supported_clocks_mhz`` (the clocks every rank of the stage supports), and
    the leader speaks for them (see :class:`StepReport`).
    """

    __pydantic_config__ = _FORBID_EXTRA

    rank: RankId
    stage: Annotated[int, Bound(ge=0, lt=MAX_STAGES)]
    supported_clocks_mhz: Annotated[List[Mhz], Bound(min_length=1, max_length=MAX_CLOCKS)]
    dp_rank: RankId = 0
    tp_rank: RankId = 0
    energy_update_period_s: Optional[Annotated[float, Bound(gt=0.0, le=10.0)]] = None
    peers: Annotated[List[PeerRank], Bound(max_length=MAX_RANKS)] = field(default_factory=list)


@dataclass(frozen=True)
class ReplicaSchedule:
    """Clocks for some data-parallel replicas of a stage that differ from the stage's default."""

    dp_ranks: List[int]
    frequencies_mhz: List[Optional[int]]


@dataclass(frozen=True)
class Schedule:
    """Answer to ``GET /jobs/{job_id}/schedule?rank=R&step=N``: one stage's clocks of one step.

    ``frequencies_mhz[i]`` is the clock of the ``i``-th ``(instruction, microbatch)`` of the
    stage's order (:func:`perseus.schedule.stage_order` of the job's schedule; ``None``:
    default clocks); clients hand clocks out by ``(instruction, microbatch)``, never by bare
    position. ``overrides`` (only for a rank that registered peers) lists replicas of the stage
    that run other clocks (a straggler's replica keeps the faster plan). ``message`` is the
    job's latest notice for the user (why it failed, or fell back to max speed).
    """

    step: int
    phase: Phase
    frequencies_mhz: List[Optional[int]]
    overrides: List[ReplicaSchedule] = field(default_factory=list)
    message: Optional[str] = None


@dataclass(frozen=True)
class InstructionReport:
    """One instruction as the rank measured it (counter readings in mJ)."""

    __pydantic_config__ = _FORBID_EXTRA

    position: Annotated[int, Bound(ge=0, lt=MAX_INSTRUCTIONS)]
    instruction: Literal["forward", "backward"]
    microbatch: Annotated[int, Bound(ge=0, lt=MAX_MICROBATCHES * 8)]
    start_s: Annotated[float, Bound(allow_inf_nan=False)]
    end_s: Annotated[float, Bound(allow_inf_nan=False)]
    frequency_mhz: Optional[Mhz] = None
    energy_begin_mj: Optional[Annotated[float, Bound(ge=0.0, allow_inf_nan=False)]] = None
    energy_end_mj: Optional[Annotated[float, Bound(ge=0.0, allow_inf_nan=False)]] = None


@dataclass(frozen=True)
class ReplicaTime:
    """A data-parallel replica's compute time in one stage (its slowest rank's)."""

    __pydantic_config__ = _FORBID_EXTRA

    dp_rank: RankId
    compute_time_s: Seconds


@dataclass(frozen=True)
class SequenceMismatch:
    """A peer ran another ``(instruction, microbatch)`` sequence than the job's schedule.

    ``position`` is the first differing position; ``got`` what the peer ran there (``"end"``:
    its iteration ended early).
    """

    __pydantic_config__ = _FORBID_EXTRA

    rank: RankId
    position: Annotated[int, Bound(ge=0, le=MAX_INSTRUCTIONS)]
    got: Annotated[str, Bound(pattern=r"^([FB][0-9]{1,6}|end)$")]


@dataclass(frozen=True)
class StepReport:
    """``POST /jobs/{job_id}/steps``: what one rank (or one stage) measured in one iteration.

    A stage leader's report combines its stage's ranks (``peers``: the other ranks it speaks
    for): ``iteration_time_s`` and ``compute_time_s`` are the slowest rank's, ``energy_j`` the
    sum over the ranks, ``replicas`` each data-parallel replica's compute time, and
    ``instructions`` the leader's own records (its GPU stands for the stage's). ``scheduled``
    is false for an iteration that ran without the server's schedule (none had arrived in
    time): its measurements are not used. ``sequence`` is the reporting rank's
    ``(instruction, microbatch)`` sequence (:func:`encode_sequence`); peers that ran another
    one are listed in ``mismatches``.
    """

    __pydantic_config__ = _FORBID_EXTRA

    rank: RankId
    step: StepId
    iteration_time_s: Seconds
    # From the iteration's start to the end of its last instruction: without the final
    # gradient synchronization, so that a straggling replica shows in it.
    compute_time_s: Optional[Seconds] = None
    energy_j: Optional[Joules] = None
    instructions: Annotated[List[InstructionReport], Bound(max_length=MAX_INSTRUCTIONS)] = field(
        default_factory=list
    )
    scheduled: bool = True
    peers: Annotated[List[RankId], Bound(max_length=MAX_RANKS)] = field(default_factory=list)
    replicas: Annotated[List[ReplicaTime], Bound(max_length=MAX_RANKS)] = field(
        default_factory=list
    )
    sequence: Optional[
        Annotated[str, Bound(pattern=SEQUENCE_PATTERN, max_length=MAX_SEQUENCE_CHARS)]
    ] = None
    mismatches: Annotated[List[SequenceMismatch], Bound(max_length=MAX_RANKS)] = field(
        default_factory=list
    )


@dataclass(frozen=True)
class IterationTime(Checked):
    """``PUT /jobs/{job_id}/iteration_time``: a time imposed from outside (a straggler)."""

    __pydantic_config__ = _FORBID_EXTRA

    iteration_time_s: Annotated[float, Bound(gt=0.0, le=1e6, allow_inf_nan=False)]


@dataclass(frozen=True)
class Ack:
    """A plain acknowledgement."""

    ok: bool = True
    detail: Dict[str, str] = field(default_factory=dict)


def encode_sequence(pairs: Sequence[Tuple[str, int]]) -> str:
    """``[("forward", 0), ("backward", 0)]`` -> ``"F0,B0"`` (the wire form of a sequence)."""
    return ",".join(("F" if name == "forward" else "B") + str(int(mb)) for name, mb in pairs)


def first_difference(expected: str, got: str) -> Optional[Tuple[int, str, str]]:
    """The first position where two encoded sequences differ: ``(position, expected, got)``.

    ``"end"`` stands for a sequence that ended there. ``None`` when they are equal.
    """
    if expected == got:
        return None
    a, b = expected.split(",") if expected else [], got.split(",") if got else []
    for position in range(max(len(a), len(b))):
        want = a[position] if position < len(a) else "end"
        have = b[position] if position < len(b) else "end"
        if want != have:
            return position, want, have
    return None  # pragma: no cover - unequal strings differ somewhere


def describe_item(item: str) -> str:
    """``"F3"`` -> ``"forward of microbatch 3"`` (``"end"``: the end of the iteration)."""
    if item == "end":
        return "the end of the iteration"
    return f"{'forward' if item[0] == 'F' else 'backward'} of microbatch {item[1:]}"


def to_json(message: Any) -> Dict[str, Any]:
    """A model as a JSON-ready dict (enums become their values)."""
    return dataclasses.asdict(message)


def from_json(model: Type[M], data: Any) -> M:
    """Build ``model`` from decoded JSON (nested models, enums and lists converted).

    Used by the client on the server's answers; the server validates requests with their
    bounds instead. Unknown keys are ignored (a newer server may send more).

    Raises:
        TypeError, ValueError, KeyError: ``data`` does not fit ``model``.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{model.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = get_type_hints(model)
    names = {f.name for f in dataclasses.fields(model)}  # type: ignore[arg-type]
    kwargs = {k: _convert(hints[k], v) for k, v in data.items() if k in names}
    return model(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _convert(args[0], value)
    if origin is Union:
        if value is None:
            return None
        return _convert(next(a for a in args if a is not type(None)), value)
    if origin in (list, List):
        return [_convert(args[0], v) for v in value]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return value


def _same_named(model: Type[Any], section: Any) -> Dict[str, Any]:
    """The values of ``section`` (a config dataclass) for the fields ``model`` has."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(model)}
