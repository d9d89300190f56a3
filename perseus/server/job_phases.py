"""One job on the coordination server: its phase machine, schedules and measurements.

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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Deque, Dict, FrozenSet, List, Optional, Tuple

from perseus.errors import ServerError
from perseus.formats.profile_csv import Profile
from perseus.runtime.types import InstructionRecord
from perseus.schedule import stage_order
from perseus.server import job_state
from perseus.server.job_planning import JobPlanning
from perseus.server.job_profiling import JobProfiling
from perseus.server.plan_switching import DriftWatcher, PlanEpochs, switched_epoch
from perseus.server.planning import EventLog, PlanResult
from perseus.server.ranks import RankRegistry
from perseus.server.state_store import StateStore
from perseus.server.steps import JobStep, RankStep, StepTable, typical_step
from perseus.server.workers import EstimatorPool, PlannerPool
from perseus.wire import (
    JobSpec,
    Phase,
    RankRegistration,
    ReplicaSchedule,
    Schedule,
    StepReport,
    describe_item,
    encode_sequence,
    first_difference,
)

Decision = Tuple[Phase, List[Optional[int]], List[ReplicaSchedule]]
# Schedules kept per stage for this many steps behind the newest one asked for.
CACHED_STEPS = 32
# Baseline instruction durations kept per (stage, instruction).
MAX_KIND_TIMES = 4096


class Job(JobPlanning):
    """State of one job; every public method is thread-safe.

    Args:
        job_id: The validated job id.
        spec: The job as its ranks registered it.
        job_dir: Where the job's files go.
        estimators: Where the job's profile estimates live.
        planners: Where the job is planned.
        store: Keeps the job's state on disk (``None``: memory only).
        rank_timeout_s: A rank silent this long is marked dead.
        drift_threshold: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        drift_patience: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        plan_slowdown_tolerance: See :func:`~perseus.server.plan_check.judge_plan`.
        plan_check: False keeps a plan that fails the check (the verdict is only recorded).
        on_plan_measured: Called (lock held) once the chosen plan's saving is measured.
        clock: Monotonic clock (tests may pass another).
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
        drift_threshold: float = 0.05,
        drift_patience: int = 3,
        plan_slowdown_tolerance: float = 0.03,
        plan_check: bool = True,
        on_plan_measured: Optional[Callable[[Job], None]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.job_dir = job_dir
        self.lock = threading.RLock()
        self.estimators = estimators
        self.planners = planners
        self.store = store
        self._on_plan_measured = on_plan_measured
        self.rank_timeout_s = rank_timeout_s
        self.plan_slowdown_tolerance = plan_slowdown_tolerance
        self.plan_check = plan_check
        self.orders = stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)
        self._sequences: Dict[int, str] = {}
        self.phase = Phase.baseline
        self.failure: Optional[str] = None
        self.message: Optional[str] = None
        self.fallback: Optional[Dict[str, Any]] = None
        self.retired = False
        self.ranks = RankRegistry(job_id, spec, clock)
        self._peers: Dict[int, FrozenSet[int]] = {}
        self.steps = StepTable(keep_steps=16)
        self.profiling = JobProfiling(
            job_id,
            self.orders,
            estimators,
            spec.profiler.warmup_instructions,
            on_change=self._advance,
            lock=self.lock,
            on_error=self._fail,
        )
        self.profile_start: Optional[int] = None
        self.profiling_steps: Tuple[Optional[int], Optional[int]] = (None, None)
        self.profiling_summary: Optional[Dict[str, Any]] = None
        self.baseline: List[JobStep] = []
        # Max-speed iterations interleaved with the plan's measured ones: the baseline of the
        # measured saving (same conditions, same moment: host load drifts cancel out).
        self.reference: List[JobStep] = []
        self.plan_samples: List[JobStep] = []
        self.history: Deque[JobStep] = deque(maxlen=64)
        self.max_requested = -1
        self.result: Optional[PlanResult] = None
        self.plans = PlanEpochs()
        self.imposed_s: Optional[float] = None
        self.watcher = DriftWatcher(drift_threshold, drift_patience)
        self.files: Dict[str, str] = {}
        self._cache: Dict[int, Dict[int, Decision]] = {}
        self._allmax: Dict[int, List[Optional[int]]] = {}
        self._kind_times: Dict[Tuple[int, str], List[float]] = {}
        self.events = EventLog(job_dir / "events.jsonl")
        estimators.call(job_id, "open", spec.num_stages)

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

    # -- schedules ------------------------------------------------------------------------------
    def schedule(self, rank: int, step: int) -> Schedule:
        """The schedule of ``step`` for ``rank``'s stage (and its replicas, for a leader)."""
        self.ranks.heard((rank,))
        with self.lock:
            state = self.ranks.get(rank)
            self._heard([rank])
            if step > self.max_requested:
                self.max_requested = step
                for old in [s for s in self._cache if s < step - CACHED_STEPS]:
                    del self._cache[old]
            per_step = self._cache.setdefault(step, {})
            decision = per_step.get(state.stage)
            if decision is None:
                decision = per_step[state.stage] = self._decide(state.stage, step)
                self._changed()
            phase, freqs, overrides = decision
            if self._peers.get(rank):
                return Schedule(step, phase, freqs, overrides, self.message)
            for group in overrides:  # a rank on its own gets its replica's clocks
                if state.dp_rank in group.dp_ranks:
                    freqs = group.frequencies_mhz
            return Schedule(step, phase, freqs, [], self.message)

    def _allmax_clocks(self, stage: int) -> List[Optional[int]]:
        clocks = self._allmax.get(stage)
        if clocks is None:
            top = self.ranks.stage_clocks(stage)[0]
            clocks = self._allmax[stage] = [top] * len(self.orders[stage])
        return clocks

    def _decide(self, stage: int, step: int) -> Decision:
        phase = self.phase
        if phase == Phase.failed:
            return phase, [None] * len(self.orders[stage]), []
        allmax = self._allmax_clocks(stage)
        if phase == Phase.profiling and self.profile_start is not None:
            if step >= self.profile_start:
                freqs = self.profiling.frequencies(stage, step, self.spec.profiler.max_iterations)
                if freqs is not None:
                    return phase, list(freqs), []
            return phase, allmax, []
        if phase == Phase.running and self._measuring(step) == "baseline":
            return phase, allmax, []
        if phase in (Phase.running, Phase.watching):
            epoch = self.plans.epoch_for(step)
            if epoch is not None:
                groups: Dict[int, List[int]] = {}
                points = {}
                for dp, point in epoch.overrides.items():
                    if point.plan_id != epoch.default.plan_id:
                        groups.setdefault(point.plan_id, []).append(dp)
                        points[point.plan_id] = point
                overrides = [
                    ReplicaSchedule(sorted(dps), _clocks(points[plan_id].freqs[stage]))
                    for plan_id, dps in sorted(groups.items())
                ]
                return phase, _clocks(epoch.default.freqs[stage]), overrides
        return phase, allmax, []

    def _measuring(self, step: int) -> Optional[str]:
        return self.plans.measuring(step, self.spec.profiler.settle_steps)

    # -- reports --------------------------------------------------------------------------------
    def report(self, rep: StepReport) -> None:
        """One rank's (or one stage's) measurements of one iteration."""
        covered = [rep.rank, *rep.peers]
        self.ranks.heard(covered)
        with self.lock:
            state = self.ranks.get(rep.rank)
            self._heard(covered)
            if self.phase == Phase.failed or self.retired:
                return
            stage = state.stage
            if rep.sequence is not None:
                self._check_sequence(stage, rep.rank, rep.sequence)
            for mismatch in rep.mismatches:
                self._sequence_failed(stage, mismatch.rank, mismatch.position, mismatch.got)
            if self.phase == Phase.failed:
                return
            if rep.instructions and self.phase in (Phase.baseline, Phase.profiling):
                self._records(rep, stage, state.update_period_s, 1 + len(rep.peers))
            peers = self._peers.get(rep.rank)
            covers = peers if peers is not None and peers == frozenset(rep.peers) else None
            added = self.steps.add(
                rep.step,
                RankStep(
                    rep.rank,
                    stage,
                    state.dp_rank,
                    rep.iteration_time_s,
                    rep.energy_j,
                    rep.compute_time_s,
                    covers if covers is not None else frozenset(rep.peers),
                    tuple((r.dp_rank, r.compute_time_s) for r in rep.replicas),
                    rep.scheduled,
                ),
            )
            if added:
                self._complete(rep.step, stage)
            self._advance()
            self._changed()

    def _records(
        self, rep: StepReport, stage: int, period_s: Optional[float], num_gpus: int
    ) -> None:
        records = [InstructionRecord(**asdict(i)) for i in rep.instructions]
        settle = self.spec.profiler.settle_steps
        in_baseline = self.phase == Phase.baseline
        if in_baseline and (not rep.scheduled or rep.step < settle):
            return
        if in_baseline:
            for rec in records:
                times = self._kind_times.setdefault((stage, rec.instruction), [])
                if len(times) < MAX_KIND_TIMES:
                    times.append(rec.end_s - rec.start_s)
        elif self.profile_start is None or rep.step < self.profile_start:
            return  # max-speed iterations between the baseline and the sweeps
        args = self.profiling.add_records(
            stage, rep.rank, rep.step, records, rep.scheduled, period_s, num_gpus
        )
        if args is not None and self.store is not None:
            self.store.add_records(self.job_id, args)

    def _check_sequence(self, stage: int, rank: int, sequence: str) -> None:
        expected = self._sequences.get(stage)
        if expected is None:
            expected = self._sequences[stage] = encode_sequence(self.orders[stage])
        diff = first_difference(expected, sequence)
        if diff is not None:
            self._sequence_failed(stage, rank, diff[0], diff[2])

    def _sequence_failed(self, stage: int, rank: int, position: int, got: str) -> None:
        order = self.orders[stage]
        want = "end" if position >= len(order) else encode_sequence([order[position]])
        self._fail(
            f"stage {stage} (rank {rank}) does not run the job's schedule: at position "
            f"{position} it ran {describe_item(got)} where the job's {self.spec.schedule} "
            f"schedule with {self.spec.num_microbatches} microbatches has {describe_item(want)}; "
            "Perseus runs this job at default clocks (set parallelism.num_microbatches and "
            "parallelism.schedule to what the framework runs)"
        )

    def _complete(self, step: int, stage: int) -> None:
        if self.steps.stage_complete(step, stage, self.ranks.live(stage)):
            self.profiling.step_reported(stage, step)
        done = self.steps.take_complete(step, self.ranks.live_stages())
        if done is not None:
            self._on_job_step(done)

    def _recheck(self) -> None:
        """Ranks died or finished: steps may be complete now."""
        for step in self.steps.pending_steps():
            for stage in self.ranks.live_stages():
                if self.steps.stage_complete(step, stage, self.ranks.live(stage)):
                    self.profiling.step_reported(stage, step)
            done = self.steps.take_complete(step, self.ranks.live_stages())
            if done is not None:
                self._on_job_step(done)
        self._advance()

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

    def _on_job_step(self, js: JobStep) -> None:
        self.history.append(js)
        prof = self.spec.profiler
        if self.phase == Phase.baseline:
            if js.clean and js.step >= prof.settle_steps:
                self.baseline.append(js)
                if len(self.baseline) == prof.baseline_steps:
                    self.events.write("baseline_measured", **typical_step(self.baseline))
        elif self.phase == Phase.running and self.plans.epochs:
            kind = self._measuring(js.step)
            if kind is None or not js.clean:
                return
            samples = self.reference if kind == "baseline" else self.plan_samples
            if len(samples) < prof.measure_steps:
                samples.append(js)
            if min(len(self.reference), len(self.plan_samples)) >= prof.measure_steps:
                self._plan_measured()
        elif self._watching() and self.watcher.update(js.replica_time_s):
            self.events.write(
                "drift", stragglers=sorted(self.watcher.stragglers), target_s=self.watcher.target_s
            )
            self._switch("drift" if self.watcher.stragglers else "drift_cleared")

    def _watching(self) -> bool:
        """The job watches for stragglers (it runs a plan it trusts)."""
        return self.phase == Phase.watching and self.fallback is None and self.result is not None

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

    # -- plan switching -------------------------------------------------------------------------
    def impose_iteration_time(self, iteration_time_s: Optional[float]) -> None:
        """Run no faster than ``iteration_time_s`` (measured seconds); ``None`` clears it.

        Raises:
            ServerError: the job has no plans yet, or fell back to max speed.
        """
        with self.lock:
            if self.result is None:
                raise ServerError(f"job {self.job_id} has no plans yet (phase {self.phase})")
            if self.fallback is not None:
                raise ServerError(
                    f"job {self.job_id} fell back to max speed (its plan did not hold): "
                    "no slower plan is trusted"
                )
            self.imposed_s = iteration_time_s
            self.events.write("iteration_time_imposed", iteration_time_s=iteration_time_s)
            self._switch("imposed" if iteration_time_s is not None else "imposed_cleared")
            self._changed()

    def _to_predicted_s(self, measured_s: float, compute: bool = False) -> float:
        """Measured seconds (iteration, or replica compute time) on the planner's scale."""
        assert self.result is not None
        if compute:
            measured_plan = self.watcher.reference_s
        else:
            measured_plan = (
                typical_step(self.plan_samples)["iteration_time_s"] if self.plan_samples else None
            )
        if not measured_plan:
            return measured_s
        return measured_s * self.result.chosen.iteration_time_s / measured_plan

    def _switch(self, reason: str) -> None:
        assert self.result is not None
        target = self.watcher.target_s
        epoch = switched_epoch(
            self.result.frontier,
            self.result.chosen,
            self.max_requested + 1,
            reason,
            imposed_s=None if self.imposed_s is None else self._to_predicted_s(self.imposed_s),
            stragglers=set(self.watcher.stragglers),
            straggler_s=None if target is None else self._to_predicted_s(target, compute=True),
        )
        self.plans.add(epoch)
        self.events.write(
            "plan_switch",
            reason=reason,
            start_step=epoch.start_step,
            plan_id=epoch.default.plan_id,
            overrides={str(k): v.plan_id for k, v in epoch.overrides.items()},
        )

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


def _clocks(freqs: Any) -> List[Optional[int]]:
    return [int(f) for f in freqs]
