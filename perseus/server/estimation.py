"""What the estimator worker is asked, one type per command, and how it answers.

A job's profile estimates (:class:`~perseus.profiler.estimation.job_estimates.JobEstimates`) live
in a worker (:class:`~perseus.server.workers.EstimatorPool`). The job sends it one of the
commands below; :func:`execute` runs a command on the worker's jobs, dispatching on its type.
``AskStage`` is answered with a :class:`StageAnswer`, ``AskProfile`` with a
:class:`ProfileAnswer`; the other commands answer nothing.

:class:`ReportReadings` is also what the state file keeps of every profiling report (the table
``records`` of :mod:`perseus.server.state_store`), so a restarted server can give its estimates
back: it is stored as a JSON object with an explicit format (:data:`READINGS_FORMAT`). The previous
server kept the same ten fields as a positional list; :meth:`ReportReadings.from_stored` reads both,
and says ``None`` for anything older (readings per instruction without counter updates, which the
current estimates cannot attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from perseus.errors import ServerError
from perseus.formats.profile.table import Profile
from perseus.records import EnergyUpdate, InstructionRecord

READINGS_FORMAT = "perseus-readings/2"
"""The format of a stored :class:`ReportReadings` (format 1: a positional list of ten fields)."""
# The fields of format 1, in its order.
_POSITIONAL = (
    "stage",
    "rank",
    "records",
    "warmup",
    "updates",
    "num_gpus",
    "power_limit_w",
    "step",
    "start_s",
    "end_s",
)


def _float_or_none(value: Any) -> Optional[float]:
    return None if value is None else float(value)


@dataclass(frozen=True)
class OpenJob:
    """Start a job's estimates."""

    num_stages: int


@dataclass(frozen=True)
class ReportReadings:
    """One report's readings for the estimates: its records and its GPU's counter updates.

    Attributes:
        stage: The reporting rank's stage.
        rank: The rank whose GPU the counter updates are of (the stage leader).
        records: The instruction records (empty: only the counter updates count).
        warmup: Positions in ``records`` left out of the time averages.
        updates: The counter updates seen since the rank's previous report.
        num_gpus: The GPUs the report speaks for (the leader and its peers).
        power_limit_w: The rank's GPU power limit (``None``: not known).
        step: The iteration.
        start_s: When the iteration began (the rank's clock; ``None``: not reported).
        end_s: When it ended (``None``: not reported).
    """

    stage: int
    rank: int
    records: Tuple[InstructionRecord, ...] = ()
    warmup: Tuple[int, ...] = ()
    updates: Tuple[EnergyUpdate, ...] = ()
    num_gpus: int = 1
    power_limit_w: Optional[float] = None
    step: int = 0
    start_s: Optional[float] = None
    end_s: Optional[float] = None

    def to_stored(self) -> Dict[str, Any]:
        """The readings as kept in the state file (JSON-ready, with their format)."""
        return {
            "format": READINGS_FORMAT,
            "stage": self.stage,
            "rank": self.rank,
            "records": [
                [r.position, r.instruction, r.microbatch, r.frequency_mhz, r.start_s, r.end_s]
                for r in self.records
            ],
            "warmup": list(self.warmup),
            "updates": [[u.time_s, u.energy_mj, u.time_error_s] for u in self.updates],
            "num_gpus": self.num_gpus,
            "power_limit_w": self.power_limit_w,
            "step": self.step,
            "start_s": self.start_s,
            "end_s": self.end_s,
        }

    @classmethod
    def from_stored(cls, stored: Any) -> Optional[ReportReadings]:
        """ReportReadings kept by this server or the previous one; ``None`` for older ones.

        Raises:
            ServerError: A kept object of an unknown format, or one whose fields do not fit.
        """
        if isinstance(stored, list):
            if len(stored) != len(_POSITIONAL):
                return None  # an earlier server's readings: they cannot be attributed
            stored = {"format": READINGS_FORMAT, **dict(zip(_POSITIONAL, stored))}
        if not isinstance(stored, dict) or stored.get("format") != READINGS_FORMAT:
            found = stored.get("format") if isinstance(stored, dict) else type(stored).__name__
            raise ServerError(
                f"the state file keeps profiling readings of format {found!r}; this server reads "
                f"{READINGS_FORMAT!r}. Start it on a new server.dump_dir, or with the Perseus "
                "version that wrote the file."
            )
        try:
            return cls(
                stage=int(stored["stage"]),
                rank=int(stored["rank"]),
                records=tuple(InstructionRecord(*r) for r in stored["records"]),
                warmup=tuple(int(p) for p in stored["warmup"]),
                updates=tuple(EnergyUpdate(*u) for u in stored["updates"]),
                num_gpus=int(stored["num_gpus"]),
                power_limit_w=stored["power_limit_w"],
                step=int(stored["step"]),
                start_s=_float_or_none(stored["start_s"]),
                end_s=_float_or_none(stored["end_s"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerError(
                f"damaged profiling readings in the state file ({type(exc).__name__}: {exc}); "
                "start the server on a new server.dump_dir"
            ) from exc


@dataclass(frozen=True)
class StageAnswer:
    """What the estimates say of one stage.

    Attributes:
        energies: Energy per (instruction, clock) (``None``: not asked).
        uncertain_mhz: The swept clocks with a row still uncertain, least certain first (``None``:
            not asked; empty: every row is certain).
    """

    energies: Optional[Dict[Tuple[str, int], float]]
    uncertain_mhz: Optional[List[int]]


@dataclass(frozen=True)
class AskStage:
    """Ask for one stage's energies (while its sweep observes them) and uncertain clocks.

    Attributes:
        stage: The stage.
        energies: Whether the sweep wants the energies (it is still observing).
        uncertain: Whether it wants the clocks to re-measure (it is refining).
        swept_mhz: The clocks the sweep ran.
    """

    stage: int
    energies: bool
    uncertain: bool
    swept_mhz: Tuple[int, ...] = ()


@dataclass(frozen=True)
class ProfileAnswer:
    """The job's measured profile and what the estimates know around it.

    Attributes:
        profile: The profile, inverted points repaired.
        blocking_power_w: Measured blocking (P2P) power per stage.
        energy_models: Per stage, what each rank's estimator fitted.
        note: What the repair found (``None``: nothing).
    """

    profile: Profile
    blocking_power_w: List[float]
    energy_models: List[Dict[str, str]]
    note: Optional[str]


@dataclass(frozen=True)
class AskProfile:
    """Ask for the job's profile.

    Attributes:
        source: Where the profile came from, for its messages.
        fallback_power_w: The blocking power of a stage whose own was not measured.
    """

    source: str
    fallback_power_w: float


@dataclass(frozen=True)
class ForgetRank:
    """A rank died: drop its data."""

    stage: int
    rank: int


@dataclass(frozen=True)
class CloseJob:
    """The job is planned or gone: drop its estimates."""


Command = Union[OpenJob, ReportReadings, AskStage, AskProfile, ForgetRank, CloseJob]
"""Every command the estimator worker takes."""

_C = TypeVar("_C")
_Handler = Callable[[Dict[str, Any], str, Any], Any]
_HANDLERS: Dict[type, _Handler] = {}


def _handles(kind: Type[_C]) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        _HANDLERS[kind] = fn
        return fn

    return register


def _estimates(jobs: Dict[str, Any], job_id: str) -> Any:
    estimates = jobs.get(job_id)
    if estimates is None:
        raise KeyError(f"no estimates for job {job_id}")
    return estimates


@_handles(OpenJob)
def _open(jobs: Dict[str, Any], job_id: str, command: OpenJob) -> None:
    from perseus.profiler.estimation.job_estimates import JobEstimates

    jobs[job_id] = JobEstimates(command.num_stages)


@_handles(ReportReadings)
def _add(jobs: Dict[str, Any], job_id: str, command: ReportReadings) -> None:
    estimates = _estimates(jobs, job_id)
    stage, key = command.stage, command.rank
    estimates.set_gpu(stage, key, num_gpus=command.num_gpus, power_limit_w=command.power_limit_w)
    estimates.add_updates(stage, key, list(command.updates))
    if command.records:
        estimates.add_step(
            stage,
            key,
            list(command.records),
            list(command.warmup),
            step=command.step,
            step_start_s=command.start_s,
            step_end_s=command.end_s,
        )


@_handles(AskStage)
def _ask_stage(jobs: Dict[str, Any], job_id: str, command: AskStage) -> StageAnswer:
    estimates = _estimates(jobs, job_id)
    return StageAnswer(
        energies=estimates.stage_energies(command.stage) if command.energies else None,
        uncertain_mhz=(
            estimates.uncertain_clocks(command.stage, command.swept_mhz)
            if command.uncertain
            else None
        ),
    )


@_handles(AskProfile)
def _ask_profile(jobs: Dict[str, Any], job_id: str, command: AskProfile) -> ProfileAnswer:
    estimates = _estimates(jobs, job_id)
    profile, note = estimates.honest_profile(command.source)
    return ProfileAnswer(
        profile=profile,
        blocking_power_w=estimates.blocking_power_w(command.fallback_power_w),
        energy_models=estimates.energy_models(),
        note=note,
    )


@_handles(ForgetRank)
def _forget(jobs: Dict[str, Any], job_id: str, command: ForgetRank) -> None:
    _estimates(jobs, job_id).forget_rank(command.stage, command.rank)


@_handles(CloseJob)
def _close(jobs: Dict[str, Any], job_id: str, command: CloseJob) -> None:
    jobs.pop(job_id, None)


def execute(jobs: Dict[str, Any], job_id: str, command: Command) -> Any:
    """Run one command on the worker's jobs (``job_id -> JobEstimates``); its answer or ``None``.

    Raises:
        TypeError: ``command`` is not one of :data:`Command`'s types.
        KeyError: The job's estimates were never opened (or were closed).
    """
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise TypeError(f"not an estimator command: {type(command).__name__}")
    return handler(jobs, job_id, command)


def stored_readings(kept: Sequence[Any]) -> List[ReportReadings]:
    """The readings a state file kept, oldest first, those too old to attribute left out."""
    return [r for r in (ReportReadings.from_stored(k) for k in kept) if r is not None]
