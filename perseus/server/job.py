"""One job on the coordination server: its ranks, its phase, its schedules and measurements.

Phases: ``baseline`` (every instruction at the highest clock; iterations ``settle_steps`` ..
``settle_steps + baseline_steps`` are measured) -> ``profiling`` (per-stage frequency sweeps) ->
``planning`` (a worker thread solves the frontier; the job keeps training at the highest clock) ->
``running`` (the plan the energy policy chose; after ``settle_steps``, ``measure_steps``
iterations of the plan alternate with as many at the highest clock, the baseline of the measured
saving) -> ``watching`` (the plan keeps running; an imposed iteration time or a straggling
data-parallel replica switches to the cheapest plan that meets the new time, and back when it
clears). ``failed`` means the job fell back to the highest clock for good.

A change of phase or plan takes effect at the iteration after the newest one any rank has asked
for, so that every rank runs one iteration under one schedule. Ranks of one stage (data- and
tensor-parallel peers) share the stage's schedule, except that a switch for a straggler only
slows the replicas that are not straggling.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from perseus.errors import ServerError
from perseus.profiler import JobProfiler
from perseus.runtime.types import InstructionRecord
from perseus.schedule import stage_order
from perseus.server.models import JobSpec, RankRegistration, StepReport
from perseus.server.planning import EventLog, PlanResult, plan_job, write_plan_files
from perseus.server.profiling import make_profiler
from perseus.server.steps import JobStep, RankStep, StepTable, typical_step
from perseus.server.switching import DriftWatcher

Submit = Callable[[Callable[[], None]], Any]


@dataclass
class RankState:
    """A registered rank."""

    rank: int
    stage: int
    dp_rank: int
    tp_rank: int
    clocks_mhz: List[int]
    update_period_s: Optional[float]
    last_seen: float
    status: str = "alive"  # alive | dead | finished


@dataclass
class PlanEpoch:
    """From ``start_step`` on, replicas run ``default`` unless ``overrides`` names another."""

    start_step: int
    default: Any
    overrides: Dict[int, Any]
    reason: str


class Job:
    """State of one job; every public method is thread-safe.

    Args:
        job_id: The validated job id.
        spec: The job as its ranks registered it.
        job_dir: Where the job's files go.
        submit: Runs a function in a worker (the planner); must not block the caller.
        rank_timeout_s: A rank silent this long is marked dead.
        drift_threshold: See :class:`DriftWatcher`.
        drift_patience: See :class:`DriftWatcher`.
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.job_dir = job_dir
        self.lock = threading.RLock()
        self._submit = submit
        self._clock = clock
        self.rank_timeout_s = rank_timeout_s
        self.order = stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)
        self.phase = "baseline"
        self.failure: Optional[str] = None
        self.ranks: Dict[int, RankState] = {}
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
        self.epochs: List[PlanEpoch] = []
        self.imposed_s: Optional[float] = None
        self.watcher = DriftWatcher(drift_threshold, drift_patience)
        self.files: Dict[str, str] = {}
        self._cache: Dict[Tuple[int, int, int], Tuple[str, List[Optional[int]]]] = {}
        self._kind_times: Dict[Tuple[int, str], List[float]] = {}
        self._baseline_records: Dict[int, List[List[InstructionRecord]]] = {}
        self.events = EventLog(job_dir / "events.jsonl")
        self.events.write("job_created", job_id=job_id, spec=spec.model_dump())

    # -- ranks ----------------------------------------------------------------------------------
    def register_rank(self, reg: RankRegistration) -> None:
        """Add (or re-add after a restart) one rank.

        Raises:
            ServerError: the rank's position does not fit the job.
        """
        spec = self.spec
        if reg.stage >= spec.num_stages or reg.dp_rank >= spec.dp or reg.tp_rank >= spec.tp:
            raise ServerError(
                f"rank {reg.rank}: stage {reg.stage} / dp {reg.dp_rank} / tp {reg.tp_rank} is "
                f"outside the job's {spec.num_stages} stages x dp {spec.dp} x tp {spec.tp}"
            )
        if reg.rank >= spec.num_stages * spec.dp * spec.tp:
            raise ServerError(f"rank {reg.rank} >= world size of job {self.job_id}")
        with self.lock:
            clocks = sorted(set(reg.supported_clocks_mhz), reverse=True)
            self.ranks[reg.rank] = RankState(
                reg.rank,
                reg.stage,
                reg.dp_rank,
                reg.tp_rank,
                clocks,
                reg.energy_update_period_s,
                self._clock(),
            )
            self.events.write("rank_registered", **reg.model_dump(exclude={"supported_clocks_mhz"}))

    def finish_rank(self, rank: int) -> None:
        """The rank ended training normally."""
        with self.lock:
            state = self._rank(rank)
            state.status = "finished"
            self.events.write("rank_finished", rank=rank)
            self._advance()

    def check_liveness(self) -> None:
        """Mark ranks silent for longer than the timeout as dead."""
        now = self._clock()
        with self.lock:
            changed = False
            for state in self.ranks.values():
                if state.status == "alive" and now - state.last_seen > self.rank_timeout_s:
                    state.status = "dead"
                    changed = True
                    self.events.write(
                        "rank_dead",
                        rank=state.rank,
                        stage=state.stage,
                        silent_s=round(now - state.last_seen, 3),
                    )
            if changed:
                self._advance()

    def _rank(self, rank: int) -> RankState:
        try:
            return self.ranks[rank]
        except KeyError:
            raise KeyError(f"rank {rank} is not registered with job {self.job_id}") from None

    def _touch(self, rank: int) -> RankState:
        state = self._rank(rank)
        state.last_seen = self._clock()
        if state.status == "dead":
            state.status = "alive"
            self.events.write("rank_back", rank=rank)
        return state

    def _live(self, stage: Optional[int] = None) -> Set[int]:
        return {
            r.rank
            for r in self.ranks.values()
            if r.status == "alive" and (stage is None or r.stage == stage)
        }

    @property
    def degraded(self) -> bool:
        """Some rank died."""
        return any(r.status == "dead" for r in self.ranks.values())

    # -- schedules ------------------------------------------------------------------------------
    def schedule(self, rank: int, step: int) -> Tuple[str, List[Optional[int]]]:
        """``(phase, frequency per position)`` of ``step`` for ``rank``'s stage and replica."""
        with self.lock:
            state = self._touch(rank)
            self.max_requested = max(self.max_requested, step)
            key = (state.stage, state.dp_rank, step)
            if key not in self._cache:
                self._cache[key] = self._decide(state.stage, state.dp_rank, step)
                if len(self._cache) > 4096:
                    horizon = self.max_requested - 64
                    self._cache = {k: v for k, v in self._cache.items() if k[2] >= horizon}
            return self._cache[key]

    def _stage_clocks(self, stage: int) -> List[int]:
        sets = [set(r.clocks_mhz) for r in self.ranks.values() if r.stage == stage]
        common = set.intersection(*sets) if sets else set()
        return sorted(common or (sets[0] if sets else {0}), reverse=True)

    def _decide(self, stage: int, dp_rank: int, step: int) -> Tuple[str, List[Optional[int]]]:
        top = self._stage_clocks(stage)[0]
        allmax: List[Optional[int]] = [top] * len(self.order[stage])
        if self.phase == "baseline" and step >= self.profile_start and self._all_stages_known():
            self._start_profiling()
        if self.phase == "profiling" and self.profiler is not None:
            sweep = self.profiler.sweeps[stage]
            budget = self.spec.profiler.max_iterations
            if step >= self.profile_start and not sweep.exhausted and sweep.num_steps < budget:
                return "profiling", list(sweep.frequencies_for_step(step))
            return "profiling", allmax
        if self.phase == "running" and self._measuring(step) == "baseline":
            return self.phase, allmax
        if self.phase in ("running", "watching"):
            point = self._point_for(dp_rank, step)
            if point is not None:
                return self.phase, [int(f) for f in point.freqs[stage]]
        return self.phase, allmax

    def _measuring(self, step: int) -> Optional[str]:
        """``baseline`` or ``plan`` for the iterations that measure the chosen plan's saving.

        After ``settle_steps`` under the plan, ``2 * measure_steps`` iterations alternate
        between max speed (even ones) and the plan (odd ones).
        """
        if not self.epochs:
            return None
        offset = step - self.epochs[0].start_step - self.spec.profiler.settle_steps
        if not 0 <= offset < 2 * self.spec.profiler.measure_steps:
            return None
        return "plan" if offset % 2 else "baseline"

    def _all_stages_known(self) -> bool:
        stages = {r.stage for r in self.ranks.values()}
        return len(stages) == self.spec.num_stages

    def _point_for(self, dp_rank: int, step: int) -> Any:
        for epoch in reversed(self.epochs):
            if epoch.start_step <= step:
                return epoch.overrides.get(dp_rank, epoch.default)
        return None

    # -- reports --------------------------------------------------------------------------------
    def report(self, rep: StepReport) -> None:
        """One rank's measurements of one iteration."""
        with self.lock:
            state = self._touch(rep.rank)
            if self.profiler is not None and rep.instructions:
                records = [InstructionRecord(**i.model_dump()) for i in rep.instructions]
                self.profiler.add_report(
                    state.stage, state.rank, rep.step, records, state.update_period_s
                )
            if self.spec.profiler.settle_steps <= rep.step < self.profile_start:
                for ins in rep.instructions:
                    self._kind_times.setdefault((state.stage, ins.instruction), []).append(
                        ins.end_s - ins.start_s
                    )
                if rep.instructions and self.profiler is None:
                    self._baseline_records.setdefault(state.rank, []).append(
                        [InstructionRecord(**i.model_dump()) for i in rep.instructions]
                    )
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
        live = self._live()
        for step in self.steps.pending_steps():
            if self.profiler is not None:
                for stage in range(self.spec.num_stages):
                    if self.steps.stage_complete(step, stage, self._live(stage)):
                        self.profiler.complete_step(stage, step)
            done = self.steps.take_complete(step, live)
            if done is not None:
                self._on_job_step(done)
        if self.phase == "profiling" and self.profiler is not None:
            if any(not self._live(s) for s in range(self.spec.num_stages)):
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
        if not self.epochs:
            return
        kind = self._measuring(js.step) if self.phase == "running" else None
        samples = self.reference if kind == "baseline" else self.plan_samples
        if kind is not None:
            samples.append(js)
        if kind == "plan" and len(self.plan_samples) == prof.measure_steps:
            self.phase = "watching"
            self.watcher.reference_s = statistics.median(
                max(js.replica_time_s.values()) for js in self.plan_samples
            )
            self.events.write("baseline_measured", interleaved=True, **typical_step(self.reference))
            self.events.write("plan_measured", **typical_step(self.plan_samples))
            self.write_summary()
        elif self.phase == "watching" and self.watcher.update(js.replica_time_s):
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
            [self._stage_clocks(s) for s in range(self.spec.num_stages)],
            self._kind_times,
        )
        for rank, steps in self._baseline_records.items():
            state = self.ranks[rank]
            for records in steps:
                self.profiler.add_reference_step(state.stage, rank, records, state.update_period_s)
        self._baseline_records.clear()
        self.phase = "profiling"
        self.profiling_steps = (self.profile_start, None)
        self.events.write(
            "profiling_started",
            step=self.profile_start,
            clocks=[len(s.clocks_mhz) for s in self.profiler.sweeps],
        )

    def _start_planning(self) -> None:
        assert self.profiler is not None
        self.phase = "planning"
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

    def _plan_worker(self, profile: Any, blocking: List[float]) -> None:
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
            self.epochs.append(PlanEpoch(start, result.chosen, {}, "chosen"))
            self.phase = "running"
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
        self.phase = "failed"
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
                typical_step(self.plan_samples)["iteration_time_s"] if (self.plan_samples) else None
            )
        if not measured_plan:
            return measured_s
        return measured_s * self.result.chosen.iteration_time_s / measured_plan

    def _switch(self, reason: str) -> None:
        from perseus.planner.policies import best_for_iteration_time

        assert self.result is not None
        chosen, frontier = self.result.chosen, self.result.frontier
        default, overrides = chosen, {}
        if self.imposed_s is not None:
            target = max(self._to_predicted_s(self.imposed_s), chosen.iteration_time_s)
            default = best_for_iteration_time(frontier, target)
        elif self.watcher.stragglers and self.watcher.target_s is not None:
            target = max(
                self._to_predicted_s(self.watcher.target_s, compute=True),
                chosen.iteration_time_s,
            )
            slower = best_for_iteration_time(frontier, target)
            default = slower
            overrides = {dp: chosen for dp in self.watcher.stragglers}
        start = self.max_requested + 1
        self.epochs.append(PlanEpoch(start, default, overrides, reason))
        del self.epochs[1:-8]
        self.events.write(
            "plan_switch",
            reason=reason,
            start_step=start,
            plan_id=default.plan_id,
            overrides={str(k): v.plan_id for k, v in overrides.items()},
        )

    # -- reporting ------------------------------------------------------------------------------
    def summary(self) -> Dict[str, Any]:
        """Measured baseline and plan, the plan's prediction, savings, profiling cost."""
        from perseus.server.summary import job_summary

        with self.lock:
            return job_summary(self)

    def write_summary(self) -> None:
        """Write ``summary.json`` into the job directory."""
        import json

        path = self.job_dir / "summary.json"
        self.files["summary"] = str(path)
        path.write_text(json.dumps(self.summary(), indent=1, default=str) + "\n")
