"""One job on the coordination server: its lock, its ranks, its reports, its schedules, its phase.

:class:`Job` answers the server's requests for one job and drives its phase machine
(:mod:`perseus.server.phases.table`): the current phase object decides the schedules and what the
reports mean; after anything happened (a report, a registration, a rank's death, a worker's
answer) the job asks it for the next phase until there is none, and enters each change through
the table of allowed changes. Around the phase the job keeps what every phase shares: the ranks
(:mod:`perseus.server.jobs.ranks`), the reports and the job steps they combine into
(:mod:`perseus.server.jobs.reports`), the schedules handed out
(:mod:`perseus.server.jobs.schedules`),
its message and files, its state on disk (:mod:`perseus.server.jobs.state`), and its live
telemetry (:mod:`perseus.server.live.telemetry`: cheap appends of what the job receives anyway,
for the metrics and the live page).

Ranks of one stage share the stage's schedule, except that a switch for a straggler only slows
the replicas that are not straggling (the stage leader gets both and hands each replica its
own). Nothing slow runs under the job's lock: estimation and planning happen in workers
(:mod:`perseus.server.workers`), and the state reaches disk through
:class:`~perseus.server.state_store.StateStore`'s writer thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional

from perseus.errors import PerseusError
from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.profile.table import Profile
from perseus.observability.snapshot import JobDetail, JobSnapshot
from perseus.schedule import stage_order
from perseus.server.estimation import CloseJob, ForgetRank, OpenJob, ReportReadings
from perseus.server.jobs import state as job_state
from perseus.server.jobs.ranks import RankRegistry
from perseus.server.jobs.record import JobRecord
from perseus.server.jobs.reports import ReportIntake
from perseus.server.jobs.schedules import ScheduleBook, schedule_for
from perseus.server.jobs.steps import JobStep
from perseus.server.jobs.summary import JobView, job_status, job_summary
from perseus.server.live import views as live_views
from perseus.server.live.telemetry import JobTelemetry
from perseus.server.phases.baseline import Baseline
from perseus.server.phases.table import (
    Handler,
    JobContext,
    JobNotes,
    JobPhase,
    JobSettings,
    check_change,
)
from perseus.server.planning import EventLog, result_from_json
from perseus.server.state_store import StateStore
from perseus.server.workers import EstimatorPool, PlannerPool, Reply
from perseus.wire import JobSpec, Phase, RankRegistration, Schedule, StepReport

# Job steps kept for the summary's recent steps.
HISTORY_STEPS = 64


class Job:
    """One job; every public method is thread-safe.

    Args:
        job_id: The validated job id.
        spec: The job as its ranks registered it.
        job_dir: Where the job's files go.
        estimators: Where the job's profile estimates live.
        planners: Where the job is planned.
        store: Keeps the job's state on disk (``None``: memory only).
        rank_timeout_s: A rank silent this long is marked dead.
        settings: How the job's plan is judged and watched (default: the defaults).
        clock: Monotonic clock (tests may pass another).
        live_history_s: How long the live telemetry keeps each GPU's power.
    """

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        job_dir: Path,
        *,
        estimators: EstimatorPool,
        planners: PlannerPool,
        store: Optional[StateStore] = None,
        rank_timeout_s: float = 30.0,
        settings: Optional[JobSettings] = None,
        clock: Callable[[], float] = time.monotonic,
        live_history_s: float = 600.0,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.job_dir = job_dir
        self.lock = threading.RLock()
        self.ranks = RankRegistry(job_id, spec, clock)
        self.events = EventLog(job_dir / "events.jsonl")
        self.retired = False
        self._store = store
        self._estimators = estimators
        self._rank_timeout_s = rank_timeout_s
        orders = stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)
        self._reports = ReportIntake(spec, orders, self.ranks)
        self._schedules = ScheduleBook(orders, self.ranks)
        self._history: Deque[JobStep] = deque(maxlen=HISTORY_STEPS)
        self._notes = JobNotes()
        self._ctx = JobContext(
            job_id=job_id,
            spec=spec,
            orders=orders,
            job_dir=job_dir,
            ranks=self.ranks,
            events=self.events,
            store=store,
            estimators=estimators,
            planners=planners,
            settings=settings or JobSettings(),
            notes=self._notes,
            next_step=self._schedules.next_step,
            update_period_s=self._reports.update_period_s,
            reply=self._reply,
        )
        self._phase: JobPhase = Baseline(self._ctx, JobRecord())
        self.live = JobTelemetry(spec.num_stages, history_s=live_history_s)
        self.live.phase(str(Phase.baseline), 0, "registered")
        self._live_kept: Optional[JobSnapshot] = None
        self._live_version = -1
        estimators.send(job_id, OpenJob(num_stages=spec.num_stages))

    @property
    def phase(self) -> Phase:
        """The job's phase."""
        return self._phase.name

    def created(self) -> None:
        """A new job (not a restored one): log and keep it."""
        self.events.write("job_created", job_id=self.job_id, spec=asdict(self.spec))
        if self._store is not None:
            self._store.put_job(self.job_id, asdict(self.spec))
        self._changed()

    # -- ranks ----------------------------------------------------------------------------------
    def register_rank(self, reg: RankRegistration, *, restoring: bool = False) -> None:
        """Add (or re-add after a restart) one rank and the peers it speaks for.

        Raises:
            ServerError: a rank's position does not fit the job.
        """
        with self.lock:
            self.ranks.register(reg)
            self._reports.registered(reg)
            self._schedules.stage_changed(reg.stage)
            self.live.registered(reg)
            if restoring:
                return
            fields = {k: v for k, v in asdict(reg).items() if k not in ("supported_clocks_mhz",)}
            fields["peers"] = len(reg.peers)
            self.events.write("rank_registered", **fields)
            if self._store is not None:
                self._store.put_rank(self.job_id, reg.rank, asdict(reg))
            self._settle()
            self._changed()

    def finish_rank(self, rank: int) -> None:
        """The rank ended training normally."""
        with self.lock:
            self.ranks.finish(rank)
            self.events.write("rank_finished", rank=rank)
            self._recheck()
            self._changed()

    def check_liveness(self) -> None:
        """Mark ranks silent for longer than the timeout as dead (the profiler forgets them)."""
        with self.lock:
            died = self.ranks.mark_silent_dead(self._rank_timeout_s)
            for state, silent_s in died:
                if state.rank == state.leader:
                    self._estimators.send(
                        self.job_id, ForgetRank(stage=state.stage, rank=state.rank)
                    )
                self.events.write(
                    "rank_dead", rank=state.rank, stage=state.stage, silent_s=round(silent_s, 3)
                )
            if died:
                self._recheck()
                self._changed()

    def _revive(self, ranks: List[int]) -> None:
        for rank in self.ranks.revive(ranks):
            self.events.write("rank_back", rank=rank)

    # -- requests -------------------------------------------------------------------------------
    def schedule(self, rank: int, step: int) -> Schedule:
        """The schedule of ``step`` for ``rank``'s stage (and its replicas, for a leader)."""
        self.ranks.heard((rank,))
        with self.lock:
            state = self.ranks.get(rank)
            self._revive([rank])
            book = self._schedules
            book.asked(step)
            decision = book.decided(state.stage, step)
            if decision is None:
                freqs, overrides = self._phase.clocks(state.stage, step, book.allmax(state.stage))
                decision = (self._phase.name, freqs, overrides)
                book.keep(state.stage, step, decision)
                self._changed()
            leads = self._reports.leads(rank)
            return schedule_for(decision, step, state.dp_rank, leads, self._notes.message)

    def report(self, rep: StepReport) -> None:
        """One rank's (or one stage's) measurements of one iteration."""
        covered = [rep.rank, *rep.peers]
        self.ranks.heard(covered)
        with self.lock:
            state = self.ranks.get(rep.rank)
            self._revive(covered)
            if self._phase.name == Phase.failed or self.retired:
                return
            problem = self._reports.problem(state.stage, rep)
            if problem is not None:
                self._fail(problem)
                return
            if rep.instructions or rep.energy_updates:
                self._phase.records(rep, state.stage, 1 + len(rep.peers))
            self.live.report(
                rep,
                state.stage,
                self._scheduled_clocks(state.stage, state.dp_rank, rep.step),
                self._ctx.orders[state.stage],
            )
            if self._reports.add(rep, state):
                self._complete(rep.step, [state.stage])
            energies = self._reports.energies(rep)
            for step, energy_j in energies:
                self._energy(step, energy_j)
            if energies and self._phase.name == Phase.running:
                self._live_measured()
            self._settle()
            self._changed()

    def impose_iteration_time(self, iteration_time_s: Optional[float]) -> None:
        """Run no faster than ``iteration_time_s`` (measured seconds); ``None`` clears it.

        Raises:
            ServerError: the job has no plans, fell back to max speed, or failed.
        """
        with self.lock:
            self._phase.impose(iteration_time_s)
            self._changed()

    # -- job steps ------------------------------------------------------------------------------
    def _complete(self, step: int, stages: Iterable[int]) -> None:
        done, js = self._reports.complete(step, stages)
        for stage in done:
            self._phase.stage_step_done(stage, step)
        if js is not None:
            self._history.append(js)
            arm = live_views.arm_of(self._phase, js.step)
            self.live.job_step(
                js.step, js.iteration_time_s, js.energy_j, arm, str(self._phase.name)
            )
            self._phase.job_step(js)
            self._settle()

    def _energy(self, step: int, energy_j: float) -> None:
        """Job step ``step``'s energy arrived: the recent steps and the phase take it."""
        for i, js in enumerate(self._history):
            if js.step == step:
                self._history[i] = replace(js, energy_j=energy_j)
        self.live.energy(step, energy_j)
        self._phase.step_energy(step, energy_j)

    def _recheck(self) -> None:
        """Ranks died or finished: steps may be complete now."""
        for step in self._reports.pending_steps():
            self._complete(step, self.ranks.live_stages())
        self._settle()

    # -- the phase machine ----------------------------------------------------------------------
    def _settle(self) -> None:
        """Enter the next phase while the current one names one."""
        while True:
            new = self._phase.advance()
            if new is None:
                return
            self._enter(new)

    def _enter(self, new: JobPhase) -> None:
        """Change to ``new`` (a change the table allows) and start it."""
        old = self._phase.name
        why = check_change(self.job_id, old, new.name)
        self._phase = new
        self.events.write(
            "phase_changed",
            previous=str(old),
            phase=str(new.name),
            at_step=self._schedules.next_step(),
            why=why,
        )
        self.live.phase(str(new.name), self._schedules.next_step(), why)
        self._live_plans()
        if new.name == Phase.watching:
            self._live_measured()
        new.start()
        if new.name == Phase.watching:  # the plan is measured: its summary for the run
            self._notes.files["summary"] = str(self.job_dir / plan_outputs.SUMMARY_JSON)
            plan_outputs.write_summary(self.job_dir, job_summary(self.view()))
        self._changed()

    def _fail(self, reason: str) -> None:
        if self._phase.name != Phase.failed:
            self._enter(self._phase.failed(reason))

    def _reply(self, phase: JobPhase, handler: Handler) -> Reply:
        """A worker's answer for ``phase``: handled under the lock while ``phase`` is current."""

        def reply(result: Any, error: Optional[BaseException]) -> None:
            with self.lock:
                if self._phase is not phase:
                    return  # the job moved on: the answer is stale
                handler(result, error)
                self._settle()
                self._changed()

        return reply

    def retire(self) -> None:
        """Every rank is gone: drop what only a running job needs (the summary stays)."""
        with self.lock:
            if self.retired:
                return
            self.retired = True
            self._schedules.clear()
            self._reports.release()
            self._phase.release()
            self.live.retired()
            self._estimators.send(self.job_id, CloseJob())
            self.events.write("job_retired", ranks=self.ranks.counts())
            self._changed()

    # -- what the job shows ---------------------------------------------------------------------
    def view(self) -> JobView:
        """What the job shows of itself (its summary is made from it)."""
        with self.lock:
            shown = self._phase.view()
            plan = shown.plan
            return JobView(
                job_id=self.job_id,
                phase=self._phase.name,
                profiler_mode=str(self.spec.profiler.mode),
                failure=shown.failure,
                message=self._notes.message,
                fallback=shown.fallback,
                degraded=self.ranks.degraded,
                ranks=self.ranks.statuses(),
                record=shown.record,
                result=None if plan is None else plan.result,
                epoch=None if plan is None else plan.epochs.current,
                imposed_s=None if plan is None else plan.imposed_s,
                stragglers=shown.stragglers,
                recent=list(self._history)[-5:],
                files=dict(self._notes.files),
            )

    def summary(self) -> Dict[str, Any]:
        """Everything known about the job (``GET /jobs/{job_id}/summary``)."""
        return job_summary(self.view())

    def status(self) -> Dict[str, Any]:
        """The job's phase, ranks and what runs now (``GET /jobs/{job_id}``)."""
        return job_status(self.view())

    # -- live views (the metrics, the live page) -------------------------------------------------
    def live_snapshot(self) -> JobSnapshot:
        """The job's live snapshot (kept until the job changes again)."""
        with self.lock:
            if self._live_kept is not None and self._live_version == self.live.version:
                return self._live_kept
            snap = live_views.job_snapshot(
                self.view(),
                self.live,
                num_stages=self.spec.num_stages,
                profiling=live_views.profiling_progress(self._phase, self.spec.profiler),
                ranks=self.ranks.counts(),
            )
            self._live_kept, self._live_version = snap, self.live.version
            return snap

    def live_detail(self) -> JobDetail:
        """What the live page draws of this job besides its snapshot."""
        with self.lock:
            return live_views.job_detail(self.view(), self.live)

    def _scheduled_clocks(self, stage: int, dp_rank: int, step: int) -> Optional[List[Any]]:
        """The clocks the job scheduled for replica ``dp_rank`` of ``stage`` at ``step``."""
        decision = self._schedules.decided(stage, step)
        if decision is None:
            return None
        _, freqs, overrides = decision
        for group in overrides:
            if dp_rank in group.dp_ranks:
                return list(group.frequencies_mhz)
        return freqs

    def _live_measured(self) -> None:
        """The plan's measurement may have another block pair: its saving so far."""
        measured = self._phase.outcome().measured
        if measured is None or not measured.blocks:
            return
        found = live_views.comparison_intervals(measured.comparison())
        if found is not None:
            self.live.measured(*found)

    def _live_plans(self) -> None:
        """Once the job has plans: the profile's instruction times weight the stages' clocks."""
        plan = self._phase.view().plan
        if plan is None or self.live.profile_time_s is not None:
            return
        profile = plan.result.frontier.problem.profile

        def time_s(stage: int, kind: str, mhz: int) -> Optional[float]:
            try:
                return profile.lookup(stage, kind, mhz).time_s
            except PerseusError:
                return None

        self.live.profile_time_s = time_s

    # -- kept state -----------------------------------------------------------------------------
    def _changed(self) -> None:
        self.live.changed()
        if self._store is not None:
            self._store.state_changed(self.job_id, self.snapshot)

    def snapshot(self) -> Dict[str, Any]:
        """The job's state as JSON-ready data (taken under the job's lock)."""
        with self.lock:
            kept = job_state.KeptJob(
                phase=self._phase,
                notes=self._notes,
                retired=self.retired,
                newest_step=self._schedules.newest_step,
                history=list(self._history),
            )
            return job_state.to_state(kept)

    def restore(
        self,
        state: Optional[Dict[str, Any]],
        readings: List[ReportReadings],
        plan: Optional[Dict[str, Any]],
        profile: Optional[Profile],
    ) -> None:
        """Take back a kept state (see :mod:`perseus.server.jobs.state`) and log it.

        Args:
            state: The job's state document (``None``: none was written).
            readings: The profiling readings to replay into the job's estimates.
            plan: The solved frontier as kept (``None``: not planned, or not kept).
            profile: The job's ``profile.csv`` (the frontier needs it).
        """
        with self.lock:
            for reading in readings:
                self._estimators.send(self.job_id, reading)
            lost: List[int] = []
            if state is not None:
                plans = None
                if plan is not None and profile is not None:
                    plans = result_from_json(self.spec, profile, plan)
                kept = job_state.from_state(self._ctx, state, plans)
                self._phase = kept.phase  # restored, not changed: no table entry
                self.retired = kept.retired
                self._schedules.newest_step = kept.newest_step
                self._history.extend(kept.history)
                lost = self._phase.resume()
                self.live.phase(str(self._phase.name), self._schedules.next_step(), "restored")
                self._live_plans()
                if self.retired:
                    self.live.retired()
            self._settle()
            profiled = self._phase.outcome().profiling
            summary = (profiled and profiled.summary) or {}
            self.events.write(
                "restored",
                phase=str(self._phase.name),
                ranks=len(self.ranks),
                profiling_iterations=summary.get("iterations", 0),
                lost_steps=lost,
            )
