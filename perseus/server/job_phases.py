"""One job on the coordination server: its phase machine, its ranks and its kept state.

Phases (:class:`~perseus.wire.Phase`): ``baseline`` (every instruction at the highest clock;
``baseline_steps`` clean iterations from ``settle_steps`` on are measured) -> ``profiling``
(per-stage frequency sweeps, :mod:`perseus.server.job_profiling`) -> ``planning`` (a planner
worker solves the frontier; the job keeps training at the highest clock) -> ``running`` (the
plan the energy policy chose; after ``settle_steps``, plan iterations alternate with as many at
the highest clock until ``measure_steps`` clean pairs are measured) -> ``watching`` (the plan
keeps running; an imposed iteration time or a straggling data-parallel replica switches to the
cheapest plan that meets the new time, and back when it clears). A measured plan slower than
the policy allows, or saving far less than predicted, is replaced by max speed
(:mod:`perseus.server.plan_check`). ``failed`` means default clocks for good (the reason is the
job's message: ranks print it).

A change of phase or plan takes effect at the iteration after the newest one any rank has asked
for, so that every rank runs one iteration under one schedule. Ranks of one stage share the
stage's schedule, except that a switch for a straggler only slows the replicas that are not
straggling (the stage leader gets both and hands each replica its own). Nothing slow runs under
the job's lock: estimation and planning happen in workers (:mod:`perseus.server.workers`), and
the state reaches disk through :class:`~perseus.server.state_store.StateStore`'s writer thread.

:class:`Job` owns the phase machine (when the job moves on), its ranks (registered, finished,
dead) and its kept state; its other parts are the schedules and plan switches
(:mod:`perseus.server.job_schedules`), the step reports (:mod:`perseus.server.job_reports`) and
profiling, planning and the plan check (:mod:`perseus.server.job_planning`), on the state
:class:`~perseus.server.job_base.JobBase` builds.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List, Optional

from perseus.formats.profile_csv import Profile
from perseus.server import job_state
from perseus.server.job_planning import JobPlanning
from perseus.server.job_reports import JobReports
from perseus.server.job_schedules import JobSchedules
from perseus.server.steps import StepTable
from perseus.wire import Phase, RankRegistration


class Job(JobReports, JobSchedules, JobPlanning):
    """State of one job; every public method is thread-safe.

    Takes the arguments of :class:`~perseus.server.job_base.JobBase`, which builds the state
    every part of the job shares.
    """

    def created(self) -> None:
        """A new job (not a restored one): log and keep it."""
        self.events.write("job_created", job_id=self.job_id, spec=asdict(self.spec))
        if self.store is not None:
            self.store.put_job(self.job_id, asdict(self.spec))
        self._changed()

    # -- ranks ----------------------------------------------------------------------------------
    def register_rank(self, reg: RankRegistration, *, restoring: bool = False) -> None:
        """Add (or re-add after a restart) one rank and the peers it speaks for.

        Raises:
            ServerError: a rank's position does not fit the job.
        """
        with self.lock:
            self.ranks.register(reg)
            self._peers[reg.rank] = frozenset(p.rank for p in reg.peers)
            self._allmax.pop(reg.stage, None)
            if restoring:
                return
            fields = {k: v for k, v in asdict(reg).items() if k not in ("supported_clocks_mhz",)}
            fields["peers"] = len(reg.peers)
            self.events.write("rank_registered", **fields)
            if self.store is not None:
                self.store.put_rank(self.job_id, reg.rank, asdict(reg))
            self._advance()
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
            died = self.ranks.mark_silent_dead(self.rank_timeout_s)
            for state, silent_s in died:
                if state.rank == state.leader:
                    self.estimators.call(self.job_id, "forget", state.stage, state.rank)
                self.events.write(
                    "rank_dead", rank=state.rank, stage=state.stage, silent_s=round(silent_s, 3)
                )
            if died:
                self._recheck()
                self._changed()

    @property
    def degraded(self) -> bool:
        """Some rank died."""
        return self.ranks.degraded

    def _heard(self, ranks: List[int]) -> None:
        for rank in self.ranks.revive(ranks):
            self.events.write("rank_back", rank=rank)

    # -- phases ---------------------------------------------------------------------------------
    def _advance(self) -> None:
        prof = self.spec.profiler
        if (
            self.phase == Phase.baseline
            and self.ranks.all_stages_known()
            and len(self.baseline) >= prof.baseline_steps
        ):
            self._start_profiling()
        if self.phase == Phase.profiling and self.profiling.started:
            if any(self.ranks.stage_lost(s) for s in range(self.spec.num_stages)):
                self._fail("a pipeline stage has no live rank left; profiling cannot finish")
                return
            if self.profiling.num_steps >= prof.max_iterations:
                self.profiling.finish()
            if self.profiling.done:
                self._start_planning()

    def retire(self) -> None:
        """Every rank is gone: drop what only a running job needs (the summary stays)."""
        with self.lock:
            if self.retired:
                return
            self.retired = True
            self._cache.clear()
            self._kind_times = {}
            self.steps = StepTable(keep_steps=16)
            self.profiling.start([])
            self.estimators.call(self.job_id, "close")
            self.events.write("job_retired", ranks=self.ranks.counts())
            self._changed()

    def _fail(self, why: str) -> None:
        if self.phase == Phase.failed:
            return
        self.phase = Phase.failed
        self.failure = why
        self.message = why
        self.profiling.start([])
        self.events.write("failed", reason=why)
        self.estimators.call(self.job_id, "close")
        self._changed()

    # -- persistence ----------------------------------------------------------------------------
    def _changed(self) -> None:
        if self.store is not None:
            self.store.state_changed(self.job_id, self.snapshot)

    def snapshot(self) -> Dict[str, Any]:
        """The job's state as JSON-ready data (taken under the job's lock)."""
        with self.lock:
            return job_state.snapshot(self)

    def restore(
        self,
        state: Optional[Dict[str, Any]],
        records: List[List[Any]],
        plan: Optional[Dict[str, Any]],
        profile: Optional[Profile],
    ) -> List[int]:
        """Take back a kept state (see :mod:`perseus.server.job_state`); returns lost steps."""
        with self.lock:
            for args in records:
                self.estimators.call(self.job_id, "add", *args)
            lost = job_state.restore(self, state, plan, profile) if state is not None else []
            if self.phase == Phase.planning and self.result is None:
                self._start_planning()  # planning was in flight: plan again
            self._advance()
            return lost
