"""A job's way from measurements to a trusted plan: profiling, planning and the plan's check.

The part of :class:`~perseus.server.job_phases.Job`'s phase machine that starts the per-stage
frequency sweeps, hands the measured profile to an estimator worker and the planning problem to a
planner worker (their answers come back on their threads, under the job's lock), takes the plan,
and judges the measured plan against the interleaved max-speed iterations
(:mod:`perseus.server.plan_check`). Everything here runs with the job's lock held.
"""

from __future__ import annotations

import statistics
from typing import Any, List, Optional

from perseus.server.job_base import JobBase
from perseus.server.job_profiling import make_sweeps
from perseus.server.plan_check import faster_than_allmax, judge_plan
from perseus.server.plan_switching import PlanEpoch
from perseus.server.planning import plan_and_write, result_to_json
from perseus.server.steps import typical_step
from perseus.wire import Phase


class JobPlanning(JobBase):
    """Profiling, planning and the plan check of one job (a part of ``Job``)."""

    def _plan_measured(self) -> None:
        assert self.result is not None
        self.phase = Phase.watching
        self.watcher.reference_s = statistics.median(
            max(js.replica_time_s.values()) for js in self.plan_samples
        )
        self.events.write("baseline_measured", interleaved=True, **typical_step(self.reference))
        self.events.write("plan_measured", **typical_step(self.plan_samples))
        chosen, allmax = self.result.chosen, self.result.frontier.allmax
        verdict = judge_plan(
            self.reference,
            self.plan_samples,
            energy=self.spec.energy,
            predicted_slowdown=chosen.iteration_time_s / allmax.iteration_time_s - 1.0,
            predicted_saving=1.0 - chosen.energy_j / allmax.energy_j,
            slowdown_tolerance=self.plan_slowdown_tolerance,
        )
        if not verdict.ok and not chosen.is_allmax:
            if not self.plan_check:
                self.events.write("plan_check_ignored", **verdict.to_json())
            else:
                self.fallback = verdict.to_json()
                self.message = (
                    f"the chosen plan {verdict.reason}; job {self.job_id} falls back to max speed"
                )
                epoch = PlanEpoch(self.max_requested + 1, allmax, reason="fallback")
                self.plans.add(epoch)
                self.events.write(
                    "plan_fallback",
                    start_step=epoch.start_step,
                    message=self.message,
                    **self.fallback,
                )
        if self._on_plan_measured is not None:
            self._on_plan_measured(self)

    # -- profiling and planning -----------------------------------------------------------------
    def _start_profiling(self) -> None:
        prof = self.spec.profiler
        if not prof.enabled:
            self._fail("profiling is disabled (profiler.enabled=false); staying at default clocks")
            return
        sweeps = make_sweeps(
            prof,
            self.orders,
            [self.ranks.stage_clocks(s) for s in range(self.spec.num_stages)],
            self._kind_times,
        )
        self.profiling.start(sweeps)
        self.profile_start = self.max_requested + 1
        self.phase = Phase.profiling
        self.profiling_steps = (self.profile_start, None)
        self._kind_times = {}
        self.events.write(
            "profiling_started",
            step=self.profile_start,
            clocks=[len(s.clocks_mhz) for s in sweeps],
        )

    def _start_planning(self) -> None:
        self.phase = Phase.planning
        if self.profiling.started:
            self.profiling_steps = (self.profile_start, self.max_requested)
            self.profiling_summary = self.profiling.summary()
        self.profiling.start([])  # the sweeps are done: their memory goes
        generation = self.profiling.generation

        def profiled(result: Any, error: Optional[BaseException]) -> None:
            with self.lock:
                if self.phase == Phase.planning and generation == self.profiling.generation:
                    self._profiled(result, error)

        source = f"online profile of job {self.job_id}"
        self.estimators.call(self.job_id, "profile", source, self.spec.p2p_power_w, reply=profiled)
        self._changed()

    def _profiled(self, result: Any, error: Optional[BaseException]) -> None:
        if error is not None:
            self._fail(f"the measured profile is unusable: {error}")
            return
        profile, blocking, models, note = result
        if note:
            # Said to the ranks (rank 0 prints it) and kept in the job's events.
            self.message = note
            self.events.write("profile_inversions", message=note)
        self.events.write(
            "profiling_done",
            iterations=(self.profiling_summary or {}).get("iterations"),
            blocking_power_w=blocking,
            stopped_at=(self.profiling_summary or {}).get("stopped_at_mhz"),
            energy_models=models,
        )
        self.estimators.call(self.job_id, "close")

        def planned(answer: Any, failure: Optional[BaseException]) -> None:
            with self.lock:
                self._planned(answer, failure, blocking)

        self.planners.submit(
            plan_and_write, self.spec, profile, blocking, self.job_dir, reply=planned
        )

    def _planned(self, answer: Any, error: Optional[BaseException], blocking: List[float]) -> None:
        if self.phase != Phase.planning:
            return
        if error is not None:
            self._fail(f"planning failed: {type(error).__name__}: {error}")
            return
        result, files = answer
        self.result = result
        self.files.update(files)
        too_fast = faster_than_allmax(
            result.chosen, result.frontier.allmax, self.plan_slowdown_tolerance
        )
        if too_fast:
            self.message = too_fast
            self.events.write("plan_faster_than_allmax", message=too_fast)
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
        if self.store is not None:
            self.store.put_plan(self.job_id, result_to_json(result, blocking))
            self.store.drop_records(self.job_id)
        self._changed()
