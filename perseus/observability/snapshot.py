"""The live snapshot of one job: what the metrics, the live page and a job's textfile show.

A snapshot is immutable and small: taken once (under the job's lock on the server, by a
publisher's thread elsewhere) and rendered as often as asked, so that a scrape or a page's
poll never touches a running job. :class:`JobSnapshot` is what every view shows of every job
(the metrics, the page's list); :class:`JobDetail` adds what only the page's view of one job
draws (the frontier, the planned timeline, recent iterations, power over time).

Every number is in the unit its name ends with (``_s`` seconds, ``_j`` joules, ``_w`` watts,
``_mhz``); a figure not measured (yet) is ``None``, never a made-up value. A measured saving
comes as an :class:`Interval`: its 95 % bounds always, its value only when the interval
excludes zero (``measurable``).

:func:`snapshot_to_json` and :func:`snapshot_from_json` carry a snapshot through a file (a job
without a server publishes it for a server's ``server.live_dir``); reading checks every field
and bound and says which one is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from perseus.wire.live import LiveStep

# Kinds of job a snapshot describes.
PIPELINE = "pipeline"  # a pipeline job of a coordination server (phases, plans)
RANK = "rank"  # a rank without a server (runtime.mode plan, measure or max_speed)
POWER_LIMIT = "power_limit"  # the power-limit optimizer
BATCH_SIZE = "batch_size"  # a recurring job's batch-size optimizer
KINDS = (PIPELINE, RANK, POWER_LIMIT, BATCH_SIZE)

# The phases of a pipeline job, in order (``perseus.wire.Phase``), and the arms it measures.
PHASES = ("baseline", "profiling", "planning", "running", "watching", "failed")
ARMS = ("baseline", "plan")

# Bounds of what a snapshot read from a file may hold.
MAX_TEXT = 4096
MAX_ITEMS = 4096


@dataclass(frozen=True)
class Interval:
    """A measured or predicted fraction with its 95 % interval.

    Attributes:
        value: The estimate (``None`` where it is not measurable: the interval contains 0).
        lower: The interval's lower bound (``None``: no interval).
        upper: Its upper bound.
        measurable: The interval excludes zero.
    """

    value: Optional[float]
    lower: Optional[float] = None
    upper: Optional[float] = None
    measurable: bool = True


@dataclass(frozen=True)
class ArmFigures:
    """One arm's typical iteration (``baseline``: max speed; ``plan``: the chosen plan)."""

    arm: str
    iteration_time_s: Optional[float]
    energy_j: Optional[float]
    num_steps: int = 0


@dataclass(frozen=True)
class GpuReading:
    """One GPU's live readings.

    Attributes:
        rank: The global rank driving it.
        stage: Its pipeline stage (``None``: not a pipeline).
        gpu: Which GPU, ``<host>:<index>`` (or ``rank<R>`` where the rank did not say).
        energy_j: Energy counted since the job first saw this GPU (only grows).
        power_w: Mean power over the last counter updates (``None``: not known yet).
        sm_clock_mhz: The SM clock Perseus applied (the time-weighted mean over the last
            iteration's instructions; ``None``: default clocks).
        power_limit_w: The power limit in force (``None``: not known).
    """

    rank: int
    stage: Optional[int]
    gpu: str
    energy_j: float = 0.0
    power_w: Optional[float] = None
    sm_clock_mhz: Optional[float] = None
    power_limit_w: Optional[float] = None


@dataclass(frozen=True)
class OptimizerChoice:
    """One option an optimizer measured (a power limit, or a batch size at its best limit).

    Attributes:
        label: How it is shown (``"250 W"``, ``"batch 128"``).
        power_limit_w: The power limit (``None``: not a power-limit choice).
        batch_size: The batch size (``None``: not a batch-size choice).
        time_s: Time per step (power limit) or per run (batch size).
        energy_j: Energy likewise.
        cost: The optimizer's cost, ``eta * E + (1 - eta) * P_max * T`` (joules).
        runs: Measurements it rests on (windows, or runs).
        chosen: The optimizer's choice now.
    """

    label: str
    power_limit_w: Optional[float] = None
    batch_size: Optional[int] = None
    time_s: Optional[float] = None
    energy_j: Optional[float] = None
    cost: Optional[float] = None
    runs: int = 0
    chosen: bool = False


@dataclass(frozen=True)
class OptimizerState:
    """A power-limit or batch-size optimizer's choices so far.

    Attributes:
        kind: ``power_limit`` or ``batch_size``.
        state: Where it is (``warmup``/``profiling``/``done``; ``pruning``/``bandit``/
            ``exhausted``).
        choices: Every option measured so far.
        saving: The chosen option's energy saving against the highest power limit.
        slowdown: Its slowdown likewise.
        note: Why there is no choice or no interval.
    """

    kind: str
    state: str
    choices: Tuple[OptimizerChoice, ...] = ()
    saving: Optional[Interval] = None
    slowdown: Optional[Interval] = None
    note: Optional[str] = None


@dataclass(frozen=True)
class JobSnapshot:
    """One job's live state (see the module docstring).

    Attributes:
        job_id: The job (any text: a name given by a user is rendered as text everywhere).
        kind: One of :data:`KINDS`.
        phase: A pipeline job's phase, else what runs (a runtime mode, an optimizer's state).
        updated_s: When this was taken (Unix time).
        phase_since_s: Since when the job is in ``phase`` (Unix time).
        step: The newest iteration seen.
        num_stages: Pipeline stages.
        ranks: ``alive`` / ``dead`` / ``finished`` -> how many ranks.
        profiling_steps: Profiling iterations run, and :attr:`profiling_max_steps` the most.
        profiling_progress: Profiling's progress, 0 to 1 (1 once every sweep stopped).
        plan_id: The frontier plan in force (``None`` before planning).
        plan_reason: Why it runs (``chosen``, ``drift``, ``imposed``, ``fallback``, ...).
        plan_since_step: From which iteration.
        message: What the job last told its ranks (a failure, a fall-back).
        arms: Each measured arm's typical iteration.
        last_iteration_time_s: The newest iteration's time, and its energy when known
            (:attr:`last_energy_j`, the job's all GPUs).
        predicted_saving: The plan's predicted saving against max speed.
        energy_saving: The measured saving against max speed (once the plan is measured).
        slowdown: The measured slowdown likewise.
        energy_saved_j: Energy saved by the plan's iterations so far (measured saving per
            iteration times the plan's iterations), with its interval.
        gpus: The GPUs whose readings the job has (a stage's leader GPU on a server).
        optimizer: A power-limit or batch-size optimizer's choices.
        retired: Every rank of the job ended.
        phases_entered_s: ``phase -> when the job first entered it`` (Unix time).
    """

    job_id: str
    kind: str
    phase: str
    updated_s: float
    phase_since_s: Optional[float] = None
    step: Optional[int] = None
    num_stages: int = 0
    ranks: Dict[str, int] = field(default_factory=dict)
    profiling_steps: Optional[int] = None
    profiling_max_steps: Optional[int] = None
    profiling_progress: Optional[float] = None
    plan_id: Optional[int] = None
    plan_reason: Optional[str] = None
    plan_since_step: Optional[int] = None
    message: Optional[str] = None
    arms: Tuple[ArmFigures, ...] = ()
    last_iteration_time_s: Optional[float] = None
    last_energy_j: Optional[float] = None
    predicted_saving: Optional[Interval] = None
    energy_saving: Optional[Interval] = None
    slowdown: Optional[Interval] = None
    energy_saved_j: Optional[Interval] = None
    gpus: Tuple[GpuReading, ...] = ()
    optimizer: Optional[OptimizerState] = None
    retired: bool = False
    phases_entered_s: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FrontierPlan:
    """One plan of the frontier, as the page draws it."""

    plan_id: int
    iteration_time_s: float
    energy_j: float
    is_allmax: bool = False
    chosen: bool = False
    in_force: bool = False


@dataclass(frozen=True)
class TimelineBox:
    """One instruction of the planned timeline: ``kind`` is ``F``, ``B``, ``I`` or ``W``."""

    kind: str
    microbatch: int
    start_s: float
    end_s: float
    frequency_mhz: int


@dataclass(frozen=True)
class SavingPoint:
    """The measured saving as it stood once ``num_pairs`` block pairs were measured."""

    time_s: float
    num_pairs: int
    energy_saving: Interval
    slowdown: Interval


@dataclass(frozen=True)
class PhaseChange:
    """The job entered ``phase`` at ``time_s`` (Unix time), from iteration ``step``."""

    phase: str
    time_s: float
    step: Optional[int] = None
    why: Optional[str] = None


@dataclass(frozen=True)
class JobDetail:
    """What the page's view of one job draws besides its :class:`JobSnapshot`.

    Attributes:
        frontier: Every frontier plan (bounded: the page draws at most this many).
        timeline: The plan in force over one iteration, per stage (stages, never ranks).
        timeline_plan_id: Which plan :attr:`timeline` shows.
        power: Per GPU (``gpu`` label), ``(Unix time, W)`` over the last minutes.
        steps: The most recent iterations (the wire's :class:`~perseus.wire.LiveStep`, without
            the stages' clocks).
        savings: The measured saving each time another block pair completed.
        phases: The job's phase changes.
    """

    frontier: Tuple[FrontierPlan, ...] = ()
    timeline: Tuple[Tuple[TimelineBox, ...], ...] = ()
    timeline_plan_id: Optional[int] = None
    power: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)
    steps: Tuple[LiveStep, ...] = ()
    savings: Tuple[SavingPoint, ...] = ()
    phases: Tuple[PhaseChange, ...] = ()


def interval_of(
    value: Optional[float], bounds: Optional[List[float]], measurable: bool = True
) -> Optional[Interval]:
    """An :class:`Interval` from a value and ``[lower, upper]`` (``None`` without either)."""
    if value is None and not bounds:
        return None
    lower, upper = (bounds[0], bounds[1]) if bounds else (None, None)
    return Interval(value if measurable else None, lower, upper, measurable)


def finite(value: Any) -> Optional[float]:
    """``value`` as a float when it is a finite number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# -- JSON -----------------------------------------------------------------------------------------
def snapshot_to_json(snapshot: JobSnapshot) -> Dict[str, Any]:
    """``snapshot`` as JSON-ready data (nested records as objects, tuples as lists)."""
    return to_json(snapshot)  # type: ignore[no-any-return]


def to_json(value: Any) -> Any:
    """Any of this module's records as JSON-ready data (a non-finite number becomes ``None``)."""
    return _encode(value)


def _encode(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def snapshot_from_json(data: Any) -> JobSnapshot:
    """The snapshot :func:`snapshot_to_json` wrote, every field checked.

    Raises:
        ValueError: naming the first field that is missing, of the wrong type or too large.
    """
    reader = _Reader("snapshot")
    obj = reader.obj(data)
    kind = reader.text(obj, "kind")
    if kind not in KINDS:
        raise ValueError(f"snapshot.kind={kind!r}: expected one of {', '.join(KINDS)}")
    optimizer = obj.get("optimizer")
    return JobSnapshot(
        job_id=reader.text(obj, "job_id"),
        kind=kind,
        phase=reader.text(obj, "phase"),
        updated_s=reader.number(obj, "updated_s"),
        phase_since_s=reader.number(obj, "phase_since_s", optional=True),
        step=reader.integer(obj, "step", optional=True),
        num_stages=reader.integer(obj, "num_stages", default=0),
        ranks={str(k): reader.integer({k: v}, k) for k, v in reader.mapping(obj, "ranks").items()},
        profiling_steps=reader.integer(obj, "profiling_steps", optional=True),
        profiling_max_steps=reader.integer(obj, "profiling_max_steps", optional=True),
        profiling_progress=reader.number(obj, "profiling_progress", optional=True),
        plan_id=reader.integer(obj, "plan_id", optional=True),
        plan_reason=reader.text(obj, "plan_reason", optional=True),
        plan_since_step=reader.integer(obj, "plan_since_step", optional=True),
        message=reader.text(obj, "message", optional=True),
        arms=tuple(
            ArmFigures(
                arm=reader.text(a, "arm"),
                iteration_time_s=reader.number(a, "iteration_time_s", optional=True),
                energy_j=reader.number(a, "energy_j", optional=True),
                num_steps=reader.integer(a, "num_steps", default=0),
            )
            for a in reader.items(obj, "arms")
        ),
        last_iteration_time_s=reader.number(obj, "last_iteration_time_s", optional=True),
        last_energy_j=reader.number(obj, "last_energy_j", optional=True),
        predicted_saving=reader.interval(obj, "predicted_saving"),
        energy_saving=reader.interval(obj, "energy_saving"),
        slowdown=reader.interval(obj, "slowdown"),
        energy_saved_j=reader.interval(obj, "energy_saved_j"),
        gpus=tuple(
            GpuReading(
                rank=reader.integer(g, "rank"),
                stage=reader.integer(g, "stage", optional=True),
                gpu=reader.text(g, "gpu"),
                energy_j=reader.number(g, "energy_j", default=0.0),
                power_w=reader.number(g, "power_w", optional=True),
                sm_clock_mhz=reader.number(g, "sm_clock_mhz", optional=True),
                power_limit_w=reader.number(g, "power_limit_w", optional=True),
            )
            for g in reader.items(obj, "gpus")
        ),
        optimizer=None if optimizer is None else reader.optimizer(optimizer),
        retired=bool(obj.get("retired", False)),
        phases_entered_s={
            str(k): reader.number({k: v}, k)
            for k, v in reader.mapping(obj, "phases_entered_s").items()
        },
    )


class _Reader:
    """Checked access to decoded JSON; errors name ``where`` and the key."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.where}.{key}: {what}")

    def obj(self, data: Any, key: str = "") -> Dict[str, Any]:
        if not isinstance(data, dict):
            raise ValueError(f"{self.where}{'.' + key if key else ''}: expected a JSON object")
        return data

    def text(self, obj: Dict[str, Any], key: str, optional: bool = False) -> Any:
        value = obj.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
            raise self.fail(key, f"expected text of 1 to {MAX_TEXT} characters")
        return value

    def number(
        self, obj: Dict[str, Any], key: str, optional: bool = False, default: Any = ...
    ) -> Any:
        value = obj.get(key)
        if value is None and (optional or default is not ...):
            return None if optional else default
        number = finite(value)
        if number is None:
            raise self.fail(key, f"expected a finite number, got {value!r:.40}")
        return number

    def integer(
        self, obj: Dict[str, Any], key: str, optional: bool = False, default: Any = ...
    ) -> Any:
        value = obj.get(key)
        if value is None and (optional or default is not ...):
            return None if optional else default
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 10**15:
            raise self.fail(key, f"expected an integer, got {value!r:.40}")
        return value

    def items(self, obj: Dict[str, Any], key: str) -> List[Dict[str, Any]]:
        value = obj.get(key) or []
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self.fail(key, f"expected a list of at most {MAX_ITEMS} objects")
        return [self.obj(v, key) for v in value]

    def mapping(self, obj: Dict[str, Any], key: str) -> Dict[str, Any]:
        value = obj.get(key) or {}
        if not isinstance(value, dict) or len(value) > MAX_ITEMS:
            raise self.fail(key, "expected an object")
        return value

    def interval(self, obj: Dict[str, Any], key: str) -> Optional[Interval]:
        value = obj.get(key)
        if value is None:
            return None
        sub = self.obj(value, key)
        return Interval(
            value=self.number(sub, "value", optional=True),
            lower=self.number(sub, "lower", optional=True),
            upper=self.number(sub, "upper", optional=True),
            measurable=bool(sub.get("measurable", True)),
        )

    def optimizer(self, data: Any) -> OptimizerState:
        obj = self.obj(data, "optimizer")
        return OptimizerState(
            kind=self.text(obj, "kind"),
            state=self.text(obj, "state"),
            choices=tuple(
                OptimizerChoice(
                    label=self.text(c, "label"),
                    power_limit_w=self.number(c, "power_limit_w", optional=True),
                    batch_size=self.integer(c, "batch_size", optional=True),
                    time_s=self.number(c, "time_s", optional=True),
                    energy_j=self.number(c, "energy_j", optional=True),
                    cost=self.number(c, "cost", optional=True),
                    runs=self.integer(c, "runs", default=0),
                    chosen=bool(c.get("chosen", False)),
                )
                for c in self.items(obj, "choices")
            ),
            saving=self.interval(obj, "saving"),
            slowdown=self.interval(obj, "slowdown"),
            note=self.text(obj, "note", optional=True),
        )
