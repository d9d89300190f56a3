"""The ``running`` phase: the chosen plan, measured against max speed before the job trusts it.

The phase owns its measurement: :class:`ArmSchedule` says which steps run which arm (the plan,
or max speed for comparison), :class:`ArmSamples` collects the clean iterations of each arm.
After ``settle_steps`` under the plan, steps alternate between max speed and the plan (same host
load, same moment) until ``measure_steps`` clean iterations of each are measured; then the plan
is judged (:func:`~perseus.server.plan_check.judge_plan`) and the job goes on ``watching`` with
the plan, or with max speed where the plan did not keep its promise (``server.plan_check``).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Dict, List, Optional

from perseus.config_enums import ConfigChoice
from perseus.server.job_phases import Clocks, JobContext, JobPhase, PhaseView
from perseus.server.job_record import JobRecord, PlanMeasurement
from perseus.server.phase_watching import Watching
from perseus.server.plan_check import judge_plan
from perseus.server.plan_switching import DriftWatcher, PlanInForce
from perseus.server.planning import PlanResult
from perseus.server.steps import JobStep, job_step_from_json, job_step_to_json, typical_step
from perseus.wire import Phase


class Arm(ConfigChoice):
    """What one measured step runs."""

    max_speed = "max_speed"
    plan = "plan"


class ArmSchedule:
    """Which arm each step of the measurement runs.

    After ``settle_steps`` under the plan, even offsets run max speed and odd ones the plan.

    Args:
        first_step: The step the plan started at.
        settle_steps: Steps under the plan before measuring (``profiler.settle_steps``).
    """

    def __init__(self, first_step: int, settle_steps: int) -> None:
        self.first_step = first_step
        self.settle_steps = settle_steps

    def arm(self, step: int) -> Optional[Arm]:
        """The arm ``step`` runs (``None``: not a measured step)."""
        offset = step - self.first_step - self.settle_steps
        if offset < 0:
            return None
        return Arm.plan if offset % 2 else Arm.max_speed


class ArmSamples:
    """The clean iterations of each arm, by step, up to ``per_arm`` of each.

    Args:
        per_arm: Iterations wanted of each arm (``profiler.measure_steps``).
        steps: What was collected before (a restored phase).
    """

    def __init__(self, per_arm: int, steps: Optional[Dict[Arm, Dict[int, JobStep]]] = None) -> None:
        self.per_arm = per_arm
        self.steps: Dict[Arm, Dict[int, JobStep]] = steps or {arm: {} for arm in Arm}

    def add(self, arm: Arm, js: JobStep) -> None:
        """One clean iteration of ``arm`` (beyond ``per_arm``, ignored)."""
        kept = self.steps[arm]
        if len(kept) < self.per_arm:
            kept[js.step] = js

    @property
    def complete(self) -> bool:
        """Both arms have ``per_arm`` iterations."""
        return all(len(kept) >= self.per_arm for kept in self.steps.values())

    def measurement(self) -> PlanMeasurement:
        """The iterations so far, in the order they came."""
        return PlanMeasurement(
            list(self.steps[Arm.max_speed].values()), list(self.steps[Arm.plan].values())
        )


class Running(JobPhase):
    """The chosen plan runs and is measured against interleaved max-speed iterations.

    Args:
        ctx: What the phase may use of its job.
        record: What the baseline and profiling measured.
        plan: The job's plans (the chosen one from ``start_step``).
        start_step: The step the plan started at.
        samples: What was measured before (a restored phase).
    """

    name = Phase.running

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        plan: PlanInForce,
        start_step: int,
        samples: Optional[ArmSamples] = None,
    ) -> None:
        super().__init__(ctx, record)
        prof = ctx.spec.profiler
        self.plan = plan
        self.arms = ArmSchedule(start_step, prof.settle_steps)
        self.samples = samples or ArmSamples(prof.measure_steps)

    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """Max speed on the steps that measure it, else the plan in force."""
        if self.arms.arm(step) is Arm.max_speed:
            return allmax, []
        return self.plan.clocks(stage, step) or (allmax, [])

    def job_step(self, js: JobStep) -> None:
        """A clean measured step counts for its arm."""
        arm = self.arms.arm(js.step)
        if arm is not None and js.clean:
            self.samples.add(arm, js)

    def impose(self, iteration_time_s: Optional[float]) -> None:
        """Switch to the cheapest plan that meets ``iteration_time_s`` (``None``: clear)."""
        measured = self.samples.measurement().plan
        self.plan.impose(
            iteration_time_s,
            self.ctx.next_step(),
            self.ctx.events,
            plan_time_s=typical_step(measured)["iteration_time_s"] if measured else None,
        )

    def next_phase(self) -> Optional[JobPhase]:
        """``watching`` once both arms are measured (with max speed if the plan failed)."""
        if not self.samples.complete:
            return None
        ctx = self.ctx
        measured = self.samples.measurement()
        ctx.events.write("baseline_measured", interleaved=True, **typical_step(measured.reference))
        ctx.events.write("plan_measured", **typical_step(measured.plan))
        result: PlanResult = self.plan.result
        chosen, allmax = result.chosen, result.frontier.allmax
        verdict = judge_plan(
            measured.reference,
            measured.plan,
            energy=ctx.spec.energy,
            predicted_slowdown=chosen.iteration_time_s / allmax.iteration_time_s - 1.0,
            predicted_saving=1.0 - chosen.energy_j / allmax.energy_j,
            slowdown_tolerance=ctx.settings.plan_slowdown_tolerance,
        )
        fallback = None
        if not verdict.ok and not chosen.is_allmax:
            if not ctx.settings.plan_check:
                ctx.events.write("plan_check_ignored", **verdict.to_json())
            else:
                fallback = verdict.to_json()
                ctx.notes.message = (
                    f"the chosen plan {verdict.reason}; job {ctx.job_id} falls back to max speed"
                )
                epoch = self.plan.fall_back(ctx.next_step())
                ctx.events.write(
                    "plan_fallback",
                    start_step=epoch.start_step,
                    message=ctx.notes.message,
                    **fallback,
                )
        watcher = DriftWatcher(ctx.settings.drift_threshold, ctx.settings.drift_patience)
        watcher.reference_s = statistics.median(
            max(js.replica_time_s.values()) for js in measured.plan
        )
        record = replace(self.record, measured=measured)
        return Watching(ctx, record, self.plan, watcher, fallback)

    def outcome(self) -> JobRecord:
        """The record with the measurement so far."""
        return replace(self.record, measured=self.samples.measurement())

    def view(self) -> PhaseView:
        """The measurement so far and the plans."""
        return PhaseView(self.outcome(), self.plan)

    def to_state(self) -> Dict[str, Any]:
        """The plans, the first step and the iterations measured so far."""
        return {
            "plan": self.plan.to_state(),
            "start_step": self.arms.first_step,
            "samples": {
                str(arm): [job_step_to_json(s) for s in kept.values()]
                for arm, kept in self.samples.steps.items()
            },
        }

    @classmethod
    def from_state(
        cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any], result: PlanResult
    ) -> Running:
        """The phase :meth:`to_state` described, on the job's kept plans ``result``."""
        steps = {
            Arm(arm): {js.step: js for js in map(job_step_from_json, kept)}
            for arm, kept in state["samples"].items()
        }
        samples = ArmSamples(ctx.spec.profiler.measure_steps, steps)
        plan = PlanInForce.from_state(state["plan"], result)
        return cls(ctx, record, plan, int(state["start_step"]), samples)
