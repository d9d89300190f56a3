"""A job's schedules: the clocks each stage runs at each step, and the switches between plans.

The part of :class:`~perseus.server.job_phases.Job` that answers ``GET .../schedule``: a
stage's schedule of a step is decided once, on the first ask, from the phase (the highest clock,
a profiling sweep, or the plan epoch in force) and kept for the stage's other ranks. An imposed
iteration time or a change of straggling replicas starts a new plan epoch
(:func:`~perseus.server.plan_switching.switched_epoch`) from the step after the newest one any
rank asked for.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from perseus.errors import ServerError
from perseus.server.job_base import Decision, JobBase
from perseus.server.plan_switching import switched_epoch
from perseus.server.steps import typical_step
from perseus.wire import Phase, ReplicaSchedule, Schedule

# Schedules kept per stage for this many steps behind the newest one asked for.
CACHED_STEPS = 32


class JobSchedules(JobBase):
    """Schedules and plan switches of one job (a part of ``Job``)."""

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


def _clocks(freqs: Any) -> List[Optional[int]]:
    return [int(f) for f in freqs]
