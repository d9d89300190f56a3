"""One job on the coordination server: its phase machine, schedules and measurements.

Phases (:class:`~perseus.wire.Phase`): ``baseline`` (every instruction at the highest clock;
iterations ``settle_steps`` .. ``settle_steps + baseline_steps`` are measured) -> ``profiling``
(per-stage frequency sweeps) -> ``planning`` (a worker solves the frontier; the job keeps
training at the highest clock) -> ``running`` (the plan the energy policy chose; after
``settle_steps``, ``measure_steps`` iterations of the plan alternate with as many at the highest
clock, the baseline of the measured saving) -> ``watching`` (the plan keeps running; an imposed
iteration time or a straggling data-parallel replica switches to the cheapest plan that meets
the new time, and back when it clears). ``failed`` means the job fell back to the highest clock
for good.

A change of phase or plan takes effect at the iteration after the newest one any rank has asked
for, so that every rank runs one iteration under one schedule. Ranks of one stage (data- and
tensor-parallel peers) share the stage's schedule, except that a switch for a straggler only
slows the replicas that are not straggling. The ranks are kept by
:class:`~perseus.server.ranks.RankRegistry`, the plans in force by
:class:`~perseus.server.plan_switching.PlanEpochs`.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from perseus.errors import ServerError
from perseus.formats.profile_csv import Profile
from perseus.profiler import JobProfiler
from perseus.runtime.types import InstructionRecord
from perseus.schedule import stage_order
from perseus.server.plan_switching import DriftWatcher, PlanEpoch, PlanEpochs, switched_epoch
from perseus.server.planning import EventLog, PlanResult, plan_job, write_plan_files
from perseus.server.profiling import make_profiler
from perseus.server.ranks import RankRegistry
from perseus.server.steps import JobStep, RankStep, StepTable, typical_step
from perseus.wire import JobSpec, Phase, RankRegistration, StepReport

Submit = Callable[[Callable[[], None]], Any]
Schedule = Tuple[Phase, List[Optional[int]]]
# The schedule cache is trimmed to recent steps past this many entries.
MAX_CACHED_SCHEDULES = 4096


class Job:
    """State of one job; every public method is thread-safe.

    Args:
        job_id: The validated job id.
        spec: The job as its ranks registered it.
        job_dir: Where the job's files go.
        submit: Runs a function in a worker (the planner); must not block the caller.
        rank_timeout_s: A rank silent this long is marked dead.
        drift_threshold: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        drift_patience: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        on_plan_measured: Called (lock held) once the chosen plan's saving is measured.
        clock: Monotonic clock (tests may pass another).
    """

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        job_dir: Path,
        submit: Submit,
        *,
        rank_timeout_s: float = 30.0,
        drift_threshold: float = 0.05,
        drift_patience: int = 3,
        on_plan_measured: Optional[Callable[[Job], None]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.job_dir = job_dir
        self.lock = threading.RLock()
        self._submit = submit
        self._on_plan_measured = on_plan_measured
        self.rank_timeout_s = rank_timeout_s
        self.order = stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)
        self.phase = Phase.baseline
        self.failure: Optional[str] = None
        self.ranks = RankRegistry(job_id, spec, clock)
        self.steps = StepTable()
        self.profiler: Optional[JobProfiler] = None
        prof = spec.profiler
        self.profile_start = prof.settle_steps + prof.baseline_steps
        self.profiling_steps: Tuple[Optional[int], Optional[int]] = (None, None)
        self.baseline: List[JobStep] = []
        # Max-speed iterations interleaved with the plan's measured ones: the baseline of the
        # measured saving (same conditions, same moment: host load drifts cancel out).
        self.reference: List[JobStep] = []
        self.plan_samples: List[JobStep] = []
        self.history: Deque[JobStep] = deque(maxlen=256)
        self.max_requested = -1
        self.result: Optional[PlanResult] = None
        self.plans = PlanEpochs()
        self.imposed_s: Optional[float] = None
        self.watcher = DriftWatcher(drift_threshold, drift_patience)
        self.files: Dict[str, str] = {}
        self._cache: Dict[Tuple[int, int, int], Schedule] = {}
        self._kind_times: Dict[Tuple[int, str], List[float]] = {}
        self._baseline_records: Dict[int, List[List[InstructionRecord]]] = {}
        self.events = EventLog(job_dir / "events.jsonl")
        self.events.write("job_created", job_id=job_id, spec=asdict(spec))

    # -- ranks ----------------------------------------------------------------------------------
    def register_rank(self, reg: RankRegistration) -> None:
        """Add (or re-add after a restart) one rank.

        Raises:
            ServerError: the rank's position does not fit the job.
        """
        with self.lock:
            self.ranks.register(reg)
            fields = {k: v for k, v in asdict(reg).items() if k != "supported_clocks_mhz"}
            self.events.write("rank_registered", **fields)

    def finish_rank(self, rank: int) -> None:
        """The rank ended training normally."""
        with self.lock:
            self.ranks.finish(rank)
            self.events.write("rank_finished", rank=rank)
            self._advance()

    def check_liveness(self) -> None:
        """Mark ranks silent for longer than the timeout as dead (the profiler forgets them)."""
        with self.lock:
            died = self.ranks.mark_silent_dead(self.rank_timeout_s)
            for state, silent_s in died:
                if self.profiler is not None:
                    self.profiler.forget_rank(state.stage, state.rank)
                self.events.write(
                    "rank_dead", rank=state.rank, stage=state.stage, silent_s=round(silent_s, 3)
                )
            if died:
                self._advance()

    @property
    def degraded(self) -> bool:
        """Some rank died."""
        return self.ranks.degraded

    def _touch(self, rank: int) -> Any:
        state, back = self.ranks.touch(rank)
        if back:
            self.events.write("rank_back", rank=rank)
        return state

    # -- schedules ------------------------------------------------------------------------------
    def schedule(self, rank: int, step: int) -> Schedule:
        """``(phase, frequency per position)`` of ``step`` for ``rank``'s stage and replica."""
        with self.lock:
            state = self._touch(rank)
            self.max_requested = max(self.max_requested, step)
            key = (state.stage, state.dp_rank, step)
            if key not in self._cache:
                self._cache[key] = self._decide(state.stage, state.dp_rank, step)
                if len(self._cache) > MAX_CACHED_SCHEDULES:
                    horizon = self.max_requested - 64
                    self._cache = {k: v for k, v in self._cache.items() if k[2] >= horizon}
            return self._cache[key]

    def _decide(self, stage: int, dp_rank: int, step: int) -> Schedule:
        top = self.ranks.stage_clocks(stage)[0]
        allmax: List[Optional[int]] = [top] * len(self.order[stage])
        if (
            self.phase == Phase.baseline
            and step >= self.profile_start
            and self.ranks.all_stages_known()
        ):
            self._start_profiling()
        if self.phase == Phase.profiling and self.profiler is not None:
            sweep = self.profiler.sweeps[stage]
            budget = self.spec.profiler.max_iterations
            if step >= self.profile_start and not sweep.exhausted and sweep.num_steps < budget:
                return Phase.profiling, list(sweep.frequencies_for_step(step))
            return Phase.profiling, allmax
        if self.phase == Phase.running and self._measuring(step) == "baseline":
            return self.phase, allmax
        if self.phase in (Phase.running, Phase.watching):
            point = self.plans.point_for(dp_rank, step)
            if point is not None:
                return self.phase, [int(f) for f in point.freqs[stage]]
        return self.phase, allmax

    def _measuring(self, step: int) -> Optional[str]:
        prof = self.spec.profiler
        return self.plans.measuring(step, prof.settle_steps, prof.measure_steps)

    # -- reports --------------------------------------------------------------------------------
    def report(self, rep: StepReport) -> None:
        """One rank's measurements of one iteration."""
        with self.lock:
            state = self._touch(rep.rank)
            records = [InstructionRecord(**asdict(i)) for i in rep.instructions]
            if self.profiler is not None and records:
                self.profiler.add_report(
                    state.stage, state.rank, rep.step, records, state.update_period_s
                )
            if self.spec.profiler.settle_steps <= rep.step < self.profile_start:
                for rec in records:
                    self._kind_times.setdefault((state.stage, rec.instruction), []).append(
                        rec.end_s - rec.start_s
                    )
                if records and self.profiler is None:
                    self._baseline_records.setdefault(state.rank, []).append(records)
            self.steps.add(
                rep.step,
                RankStep(
                    rep.rank,
                    state.stage,
                    state.dp_rank,
                    rep.iteration_time_s,
                    rep.energy_j,
                    rep.compute_time_s,
                ),
            )
            self._advance()

    def _advance(self) -> None:
        live = self.ranks.live()
        for step in self.steps.pending_steps():
            if self.profiler is not None:
                for stage in range(self.spec.num_stages):
                    if self.steps.stage_complete(step, stage, self.ranks.live(stage)):
                        self.profiler.complete_step(stage, step)
            done = self.steps.take_complete(step, live)
            if done is not None:
                self._on_job_step(done)
        if self.phase == Phase.profiling and self.profiler is not None:
            if any(not self.ranks.live(s) for s in range(self.spec.num_stages)):
                self._fail("a pipeline stage has no live rank left; profiling cannot finish")
                return
            if self.profiler.num_steps >= self.spec.profiler.max_iterations:
                self.profiler.finish()
            if self.profiler.done:
                self._start_planning()

    def _on_job_step(self, js: JobStep) -> None:
        self.history.append(js)
        prof = self.spec.profiler
        if prof.settle_steps <= js.step < self.profile_start:
            self.baseline.append(js)
            if len(self.baseline) == prof.baseline_steps:
                self.events.write("baseline_measured", **typical_step(self.baseline))
        if not self.plans.epochs:
            return
        kind = self._measuring(js.step) if self.phase == Phase.running else None
        samples = self.reference if kind == "baseline" else self.plan_samples
        if kind is not None:
            samples.append(js)
        if kind == "plan" and len(self.plan_samples) == prof.measure_steps:
            self.phase = Phase.watching
            self.watcher.reference_s = statistics.median(
                max(js.replica_time_s.values()) for js in self.plan_samples
            )
            self.events.write("baseline_measured", interleaved=True, **typical_step(self.reference))
            self.events.write("plan_measured", **typical_step(self.plan_samples))
            if self._on_plan_measured is not None:
                self._on_plan_measured(self)
        elif self.phase == Phase.watching and self.watcher.update(js.replica_time_s):
            self.events.write(
                "drift", stragglers=sorted(self.watcher.stragglers), target_s=self.watcher.target_s
            )
            self._switch("drift" if self.watcher.stragglers else "drift_cleared")

    # -- profiling and planning -----------------------------------------------------------------
    def _start_profiling(self) -> None:
        prof = self.spec.profiler
        if not prof.enabled:
            self._fail("profiling is disabled (profiler.enabled=false); staying at max speed")
            return
        self.profiler = make_profiler(
            prof,
            self.order,
            [self.ranks.stage_clocks(s) for s in range(self.spec.num_stages)],
            self._kind_times,
        )
        for rank, steps in self._baseline_records.items():
            state = self.ranks.get(rank)
            for records in steps:
                self.profiler.add_reference_step(state.stage, rank, records, state.update_period_s)
        self._baseline_records.clear()
        self.phase = Phase.profiling
        self.profiling_steps = (self.profile_start, None)
        self.events.write(
            "profiling_started",
            step=self.profile_start,
            clocks=[len(s.clocks_mhz) for s in self.profiler.sweeps],
        )

    def _start_planning(self) -> None:
        assert self.profiler is not None
        self.phase = Phase.planning
        self.profiling_steps = (self.profile_start, self.max_requested)
        try:
            profile = self.profiler.profile(f"online profile of job {self.job_id}")
        except Exception as exc:
            self._fail(f"the measured profile is unusable: {exc}")
            return
        blocking = self.profiler.blocking_power_w(self.spec.p2p_power_w)
        stopped = [dict(s.stopped_at) for s in self.profiler.sweeps]
        self.events.write(
            "profiling_done",
            iterations=self.profiler.num_steps,
            blocking_power_w=blocking,
            stopped_at=stopped,
            energy_models=self.profiler.energy_models(),
        )
        self._submit(lambda: self._plan_worker(profile, blocking))

    def _plan_worker(self, profile: Profile, blocking: List[float]) -> None:
        try:
            result = plan_job(self.spec, profile, blocking)
            files = write_plan_files(self.job_dir, profile, result)
        except Exception as exc:
            with self.lock:
                self._fail(f"planning failed: {type(exc).__name__}: {exc}")
            return
        with self.lock:
            self.result = result
            self.files.update(files)
            start = self.max_requested + 1
            self.plans.add(PlanEpoch(start, result.chosen))
            self.phase = Phase.running
            self.events.write(
                "plan_ready",
                start_step=start,
                plan_id=result.chosen.plan_id,
                solve_time_s=result.solve_time_s,
                predicted_iteration_time_s=result.chosen.iteration_time_s,
                predicted_energy_j=result.chosen.energy_j,
                frontier_points=len(result.frontier.points),
            )

    def _fail(self, why: str) -> None:
        self.phase = Phase.failed
        self.failure = why
        self.events.write("failed", reason=why)

    # -- plan switching -------------------------------------------------------------------------
    def impose_iteration_time(self, iteration_time_s: Optional[float]) -> None:
        """Run no faster than ``iteration_time_s`` (measured seconds); ``None`` clears it.

        Raises:
            ServerError: the job has no plan yet.
        """
        with self.lock:
            if self.result is None:
                raise ServerError(f"job {self.job_id} has no plans yet (phase {self.phase})")
            self.imposed_s = iteration_time_s
            self.events.write("iteration_time_imposed", iteration_time_s=iteration_time_s)
            self._switch("imposed" if iteration_time_s is not None else "imposed_cleared")

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
