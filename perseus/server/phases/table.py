"""A job's phases: the table of the changes allowed between them, and what every phase offers.

Phases (:class:`~perseus.wire.Phase`), one object each that holds the phase's own data and
writes it to the job's kept state (``to_state``, ``from_state``):

* ``baseline`` (:mod:`perseus.server.phases.baseline`): every instruction at the highest clock;
  ``baseline_steps`` clean iterations from ``settle_steps`` on are measured.
* ``profiling`` (:mod:`perseus.server.phases.profiling`): per-stage frequency sweeps.
* ``planning`` (:mod:`perseus.server.phases.planning`): a planner worker solves the frontier; the
  job keeps training at the highest clock.
* ``running`` (:mod:`perseus.server.phases.running`): the plan the energy policy chose; after
  ``settle_steps``, plan iterations alternate with as many at the highest clock until
  ``measure_steps`` clean ones of each are measured, and the plan is judged
  (:mod:`perseus.server.phases.plan_check`: a plan slower than the policy allows, or saving far less
  than predicted, is replaced by max speed).
* ``watching`` (:mod:`perseus.server.phases.watching`): the plan keeps running; an imposed
  iteration time or a straggling data-parallel replica switches to the cheapest plan that meets
  the new time, and back when it clears.
* ``failed`` (:class:`Failed`): default clocks for good; the reason is the job's message (ranks
  print it).

:class:`~perseus.server.jobs.job.Job` drives the phases. After anything happened to the job (a
report, a registration, a rank's death, a worker's answer) it lets its phase act and name the next
one (:meth:`JobPhase.advance`) until there is none, and enters each through :func:`check_change`:
:data:`PHASE_CHANGES` is every change a job can make. A phase never sets the job's phase itself. A
restarted server restores each job in its kept phase (``planning`` where the plan was not kept);
that is no change.

A change of phase or plan takes effect at the iteration after the newest one any rank has asked
for (:attr:`JobContext.next_step`), so that every rank runs one iteration under one schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

from perseus.config.schema import ServerConfig
from perseus.errors import ServerError
from perseus.server.estimation import CloseJob
from perseus.server.jobs.ranks import RankRegistry
from perseus.server.jobs.record import JobRecord
from perseus.server.jobs.steps import JobStep
from perseus.server.phases.plan_switching import PlanInForce
from perseus.server.planning import EventLog, PlanResult
from perseus.server.state_store import StateStore
from perseus.server.workers import EstimatorPool, PlannerPool, Reply
from perseus.wire import JobSpec, Phase, ReplicaSchedule, StepReport

# Every change of phase a job can make, with when it happens.
PHASE_CHANGES: Dict[Tuple[Phase, Phase], str] = {
    (Phase.baseline, Phase.profiling): "every stage registered and baseline_steps measured",
    (Phase.profiling, Phase.planning): "every sweep stopped, or profiler.max_iterations spent",
    (Phase.planning, Phase.running): "the planner worker's plan is ready",
    (Phase.running, Phase.watching): "measure_steps of the plan and of max speed measured",
    (Phase.baseline, Phase.failed): "profiling is disabled, or a rank runs another schedule",
    (Phase.profiling, Phase.failed): "a stage lost every rank, estimation failed, or a rank "
    "runs another schedule",
    (Phase.planning, Phase.failed): "the profile is unusable, planning failed, or a rank runs "
    "another schedule",
    (Phase.running, Phase.failed): "a rank runs another schedule",
    (Phase.watching, Phase.failed): "a rank runs another schedule",
}

# One stage's clocks of one step: its frequencies, and other clocks for some of its replicas.
Clocks = Tuple[List[Optional[int]], List[ReplicaSchedule]]
Order = Sequence[Tuple[str, int]]
Handler = Callable[[Any, Optional[BaseException]], None]


class PhaseChangeError(RuntimeError):
    """A change of phase :data:`PHASE_CHANGES` does not allow: a bug in the server."""


def check_change(job_id: str, old: Phase, new: Phase) -> str:
    """Why ``old -> new`` is allowed (the table's text).

    Raises:
        PhaseChangeError: the table has no such change.
    """
    why = PHASE_CHANGES.get((old, new))
    if why is None:
        allowed = sorted(str(to) for (frm, to) in PHASE_CHANGES if frm == old)
        raise PhaseChangeError(
            f"internal error: job {job_id} cannot go from {old} to {new} (from {old} only to "
            f"{', '.join(allowed) or 'nothing'}); this is a bug in the Perseus server, please "
            "report it with the job's events.jsonl"
        )
    return why


@dataclass(frozen=True)
class JobSettings:
    """The server's settings a job's plan is judged and watched by (``server.*``)."""

    plan_slowdown_tolerance: float = 0.03
    plan_check: bool = True
    drift_threshold: float = 0.05
    drift_patience: int = 3

    @classmethod
    def of(cls, cfg: ServerConfig) -> JobSettings:
        """The settings of ``cfg``."""
        return cls(
            plan_slowdown_tolerance=cfg.plan_slowdown_tolerance,
            plan_check=cfg.plan_check,
            drift_threshold=cfg.drift_threshold,
            drift_patience=cfg.drift_patience,
        )


@dataclass
class JobNotes:
    """What a job keeps beside its phases: its message to the ranks and the files it wrote."""

    message: Optional[str] = None
    files: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobContext:
    """What a phase may use of its job; the job builds it once and the phases keep no other link.

    Attributes:
        job_id: The job's id.
        spec: The job as its ranks registered it.
        orders: Each stage's ``(instruction, microbatch)`` order in one iteration.
        job_dir: Where the job's files go.
        ranks: The job's ranks (stage clocks, which are alive).
        events: The job's ``events.jsonl``.
        store: Keeps the job's state on disk (``None``: memory only).
        estimators: Where the job's profile estimates live.
        planners: Where the job is planned.
        settings: How the job's plan is judged and watched.
        notes: The job's message and files (phases set them).
        next_step: The first step a change made now applies to.
        update_period_s: The ranks' energy counter update period, as measured from their
            reports (``None``: not known yet).
        reply: ``reply(phase, handler)``: a worker's answer for ``phase``, handled under the
            job's lock while ``phase`` is the job's (the job then moves on as its phase says).
    """

    job_id: str
    spec: JobSpec
    orders: Sequence[Order]
    job_dir: Path
    ranks: RankRegistry
    events: EventLog
    store: Optional[StateStore]
    estimators: EstimatorPool
    planners: PlannerPool
    settings: JobSettings
    notes: JobNotes
    next_step: Callable[[], int]
    update_period_s: Callable[[], Optional[float]]
    reply: Callable[[JobPhase, Handler], Reply]


@dataclass(frozen=True)
class PhaseView:
    """What a phase shows of the job (the summary's part that depends on the phase)."""

    record: JobRecord
    plan: Optional[PlanInForce] = None
    failure: Optional[str] = None
    fallback: Optional[Dict[str, Any]] = None
    stragglers: Tuple[int, ...] = ()


class JobPhase:
    """One phase of a job: what it schedules, what it takes from reports, when it ends.

    Every method runs with the job's lock held. The defaults are what most phases do: run the
    highest clock, take nothing from the instruction records or the job's steps, never end.

    Args:
        ctx: What the phase may use of its job.
        record: What the phases before measured.
    """

    name: ClassVar[Phase]

    def __init__(self, ctx: JobContext, record: JobRecord) -> None:
        self.ctx = ctx
        self.record = record

    # -- entering -------------------------------------------------------------------------------
    def start(self) -> None:
        """The job entered this phase from the one before (events, work for the workers)."""

    def resume(self) -> List[int]:
        """The job was restored in this phase after a restart; returns profiling steps lost."""
        return []

    # -- what happens to the job ----------------------------------------------------------------
    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """``stage``'s clocks at ``step`` (``allmax``: the highest clock everywhere)."""
        return allmax, []

    def records(self, report: StepReport, stage: int, num_gpus: int) -> None:
        """The instruction records and counter updates of one report.

        Args:
            report: The report (with records, or counter updates, or both).
            stage: The reporting rank's stage.
            num_gpus: The GPUs the report speaks for.
        """

    def stage_step_done(self, stage: int, step: int) -> None:
        """Every live rank of ``stage`` reported ``step``."""

    def job_step(self, js: JobStep) -> None:
        """Every live stage reported ``js.step``: the job's iteration (its energy may follow)."""

    def step_energy(self, step: int, energy_j: float) -> None:
        """The energy of job step ``step`` arrived (after the step itself).

        By default the job's record takes it (a measured step of an earlier phase).
        """
        self.record = self.record.with_energy(step, energy_j)

    def advance(self) -> Optional[JobPhase]:
        """Act on what the phase measured so far; the phase the job goes to now, or ``None``.

        The job calls this after every change. It is an action, not a question: a phase may
        conclude here (write its events, set the job's message, fall back its plan, close its
        sweeps) before it names the next phase.
        """
        return None

    def impose(self, iteration_time_s: Optional[float]) -> None:
        """Run no faster than ``iteration_time_s``; ``None`` clears it.

        Raises:
            ServerError: the phase has no plans to switch between.
        """
        raise ServerError(f"job {self.ctx.job_id} has no plans yet (phase {self.name})")

    def failed(self, reason: str) -> JobPhase:
        """The phase the job goes to when it fails here (it keeps showing what it measured)."""
        view = self.view()
        return Failed(self.ctx, view.record, reason, view.plan, view.fallback)

    def release(self) -> None:
        """Every rank is gone: drop what only a running job needs."""

    # -- what the job shows and keeps -----------------------------------------------------------
    def outcome(self) -> JobRecord:
        """The record with what this phase measured so far."""
        return self.record

    def view(self) -> PhaseView:
        """What the summary shows of this phase (and a failure here keeps showing)."""
        return PhaseView(self.outcome())

    def to_state(self) -> Dict[str, Any]:
        """The phase's own data as JSON-ready data (its ``from_state`` takes it back)."""
        return {}


class Failed(JobPhase):
    """Default clocks for good; the job keeps showing what it measured before.

    Args:
        ctx: What the phase may use of its job.
        record: What the job measured.
        reason: Why the job failed (said to the ranks).
        plan: The plans that ran before (shown, no longer scheduled).
        fallback: The plan check's verdict, where the plan fell back to max speed.
    """

    name = Phase.failed

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        reason: str,
        plan: Optional[PlanInForce] = None,
        fallback: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(ctx, record)
        self.reason = reason
        self.plan = plan
        self.fallback = fallback

    def start(self) -> None:
        """Say why, and drop the job's estimates."""
        self.ctx.notes.message = self.reason
        self.ctx.events.write("failed", reason=self.reason)
        self.ctx.estimators.send(self.ctx.job_id, CloseJob())

    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """Default clocks everywhere."""
        return [None] * len(self.ctx.orders[stage]), []

    def impose(self, iteration_time_s: Optional[float]) -> None:
        """A failed job runs default clocks: nothing to impose.

        Raises:
            ServerError: always.
        """
        raise ServerError(
            f"job {self.ctx.job_id} failed ({self.reason}) and runs at default clocks: "
            "no plan to switch"
        )

    def view(self) -> PhaseView:
        """What was measured, the plans that ran, why the job failed."""
        return PhaseView(self.record, self.plan, failure=self.reason, fallback=self.fallback)

    def to_state(self) -> Dict[str, Any]:
        """The reason, the plans and the verdict."""
        return {
            "reason": self.reason,
            "plan": None if self.plan is None else self.plan.to_state(),
            "fallback": self.fallback,
        }

    @classmethod
    def from_state(
        cls,
        ctx: JobContext,
        record: JobRecord,
        state: Dict[str, Any],
        plan: Optional[PlanResult],
    ) -> Failed:
        """The phase :meth:`to_state` described (``plan``: the job's solved plans, if kept)."""
        kept = None
        if state["plan"] is not None and plan is not None:
            kept = PlanInForce.from_state(state["plan"], plan)
        return cls(ctx, record, str(state["reason"]), kept, state["fallback"])
