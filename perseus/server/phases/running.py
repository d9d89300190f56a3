"""The ``running`` phase: the chosen plan, measured against max speed before the job trusts it.

The phase owns its measurement: :class:`ArmSchedule` says which steps run which arm (the plan,
or max speed for comparison), :class:`BlockSamples` collects the clean iterations of each arm.
A GPU's energy counter updates every ~100 ms, so the arms run in **blocks** of equal length,
each spanning at least ten counter updates (:func:`~perseus.profiler.comparison.block_steps`,
from the baseline's iteration time and the counter's measured period), in the order max speed,
plan, plan, max speed, ... (a steady drift cancels). Once ``measure_steps`` plan iterations (and
at least four block pairs) are measured with their energies (which arrive a step or more after
the steps), the plan is judged on the 95 % intervals of its saving and slowdown
(:func:`~perseus.server.phases.plan_check.judge_plan`) and the job goes on ``watching`` with the
plan,
or with max speed where the plan did not keep its promise (``server.plan_check``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any, Dict, List, Optional, Set

from perseus.config.enums import ConfigChoice
from perseus.profiler.comparison import (
    MIN_PAIRS,
    PLAN,
    REFERENCE,
    Block,
    ThermalBlock,
    block_steps,
    compare,
    mean_temperature_c,
)
from perseus.server.jobs.record import JobRecord, PlanMeasurement
from perseus.server.jobs.steps import JobStep, job_step_from_json, job_step_to_json, typical_step
from perseus.server.phases.plan_check import judge_plan
from perseus.server.phases.plan_switching import DriftWatcher, PlanInForce
from perseus.server.phases.table import Clocks, JobContext, JobPhase, PhaseView
from perseus.server.phases.watching import Watching
from perseus.server.planning import PlanResult
from perseus.wire import Phase

# Block pairs measured at least (the 95 % intervals need a few to mean anything).
MIN_MEASURED_PAIRS = MIN_PAIRS + 1


class Arm(ConfigChoice):
    """What one measured step runs."""

    max_speed = "max_speed"
    plan = "plan"


# The arms of a pair of blocks: max speed first in even pairs, the plan first in odd ones.
_PAIR_ORDER = ((Arm.max_speed, Arm.plan), (Arm.plan, Arm.max_speed))
_COMPARISON_ARM = {Arm.max_speed: REFERENCE, Arm.plan: PLAN}


class ArmSchedule:
    """Which arm each step of the measurement runs.

    After ``settle_steps`` under the plan, blocks of ``block_steps`` steps run max speed, the
    plan, the plan, max speed, max speed, the plan, ...

    Args:
        first_step: The step the plan started at.
        settle_steps: Steps under the plan before measuring (``profiler.settle_steps``).
        block_steps: Steps per block.
    """

    def __init__(self, first_step: int, settle_steps: int, block_steps: int = 1) -> None:
        self.first_step = first_step
        self.settle_steps = settle_steps
        self.block_steps = max(1, block_steps)

    def block(self, step: int) -> Optional[int]:
        """The block ``step`` belongs to (``None``: not a measured step)."""
        offset = step - self.first_step - self.settle_steps
        return None if offset < 0 else offset // self.block_steps

    def arm(self, step: int) -> Optional[Arm]:
        """The arm ``step`` runs (``None``: not a measured step)."""
        block = self.block(step)
        if block is None:
            return None
        pair, second = divmod(block, 2)
        return _PAIR_ORDER[pair % 2][second]

    def steps_of(self, block: int) -> range:
        """The steps of ``block``."""
        first = self.first_step + self.settle_steps + block * self.block_steps
        return range(first, first + self.block_steps)


class BlockSamples:
    """The clean measured iterations, by step, and the blocks they complete.

    A block is complete once every one of its steps is a clean iteration with its energy; a
    block with an unclean step is never complete (its pair partner then pairs with a
    neighbour, see :func:`~perseus.profiler.comparison.pairs_of`).

    Args:
        schedule: Which step runs which arm.
        wanted_pairs: Complete block pairs wanted.
        steps: What was collected before (a restored phase).
        unclean: Blocks with an unclean step (likewise).
    """

    def __init__(
        self,
        schedule: ArmSchedule,
        wanted_pairs: int,
        steps: Optional[Dict[int, JobStep]] = None,
        unclean: Optional[Set[int]] = None,
    ) -> None:
        self.schedule = schedule
        self.wanted_pairs = wanted_pairs
        self.steps: Dict[int, JobStep] = steps or {}
        self.unclean: Set[int] = unclean or set()

    def add(self, js: JobStep) -> None:
        """One job step (of a measured block)."""
        block = self.schedule.block(js.step)
        if block is None:
            return
        if not js.clean:
            self.unclean.add(block)
        elif len(self.steps) < 4 * self.wanted_pairs * self.schedule.block_steps:
            self.steps[js.step] = js

    def fill_energy(self, step: int, energy_j: float) -> None:
        """The energy of a measured step arrived."""
        js = self.steps.get(step)
        if js is not None:
            self.steps[step] = replace(js, energy_j=energy_j)

    def complete_blocks(self) -> List[List[JobStep]]:
        """The steps of every complete block, in order."""
        out: List[List[JobStep]] = []
        if not self.steps:
            return out
        last = self.schedule.block(max(self.steps))
        for block in range(0 if last is None else last + 1):
            found = [self.steps.get(s) for s in self.schedule.steps_of(block)]
            steps = [js for js in found if js is not None and js.energy_j is not None]
            if block not in self.unclean and len(steps) == len(found):
                out.append(steps)
        return out

    def blocks(self) -> List[Block]:
        """The complete blocks, in order."""
        out: List[Block] = []
        for steps in self.complete_blocks():
            arm = self.schedule.arm(steps[0].step)
            assert arm is not None
            energy_j = sum(js.energy_j or 0.0 for js in steps)
            time_s = sum(js.iteration_time_s for js in steps)
            temperature_c = mean_temperature_c([js.temperature_c for js in steps])
            out.append(
                ThermalBlock(
                    arm=_COMPARISON_ARM[arm],
                    num_steps=len(steps),
                    time_s=time_s,
                    energy_j=energy_j,
                    temperature_c=temperature_c,
                )
            )
        return out

    @property
    def complete(self) -> bool:
        """Enough complete block pairs for the plan to be judged."""
        return compare(self.blocks()).num_pairs >= self.wanted_pairs

    def measurement(self) -> PlanMeasurement:
        """The iterations of the complete blocks and the blocks."""
        steps = [js for block in self.complete_blocks() for js in block]
        arm = self.schedule.arm
        reference = [js for js in steps if arm(js.step) is Arm.max_speed]
        plan = [js for js in steps if arm(js.step) is Arm.plan]
        return PlanMeasurement(reference, plan, self.blocks(), self.schedule.block_steps)


def wanted_pairs(measure_steps: int, steps_per_block: int) -> int:
    """Block pairs measured: ``measure_steps`` plan iterations, and four pairs at least."""
    return max(MIN_MEASURED_PAIRS, math.ceil(measure_steps / steps_per_block))


class Running(JobPhase):
    """The chosen plan runs and is measured against max-speed blocks beside it.

    Args:
        ctx: What the phase may use of its job.
        record: What the baseline and profiling measured.
        plan: The job's plans (the chosen one from ``start_step``).
        start_step: The step the plan started at.
        steps_per_block: Iterations per block (``None``: from the baseline's iteration time
            and the counter's update period).
        samples: What was measured before (a restored phase).
    """

    name = Phase.running

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        plan: PlanInForce,
        start_step: int,
        steps_per_block: Optional[int] = None,
        samples: Optional[BlockSamples] = None,
    ) -> None:
        super().__init__(ctx, record)
        prof = ctx.spec.profiler
        self.plan = plan
        if steps_per_block is None:
            baseline = record.baseline
            time_s = typical_step(baseline)["iteration_time_s"] if baseline else 0.0
            steps_per_block = block_steps(time_s, ctx.update_period_s())
        self.arms = ArmSchedule(start_step, prof.settle_steps, steps_per_block)
        self.samples = samples or BlockSamples(
            self.arms, wanted_pairs(prof.measure_steps, steps_per_block)
        )

    def start(self) -> None:
        """Say how the plan is measured."""
        self.ctx.events.write(
            "plan_measurement",
            block_steps=self.arms.block_steps,
            pairs=self.samples.wanted_pairs,
            first_step=self.arms.first_step + self.arms.settle_steps,
        )

    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """Max speed on the steps that measure it, else the plan in force."""
        if self.arms.arm(step) is Arm.max_speed:
            return allmax, []
        return self.plan.clocks(stage, step) or (allmax, [])

    def job_step(self, js: JobStep) -> None:
        """A measured step counts for its block."""
        self.samples.add(js)

    def step_energy(self, step: int, energy_j: float) -> None:
        """A measured step's energy (or an earlier phase's) arrived."""
        super().step_energy(step, energy_j)
        self.samples.fill_energy(step, energy_j)

    def impose(self, iteration_time_s: Optional[float]) -> None:
        """Switch to the cheapest plan that meets ``iteration_time_s`` (``None``: clear)."""
        measured = self.samples.measurement().plan
        self.plan.impose(
            iteration_time_s,
            self.ctx.next_step(),
            self.ctx.events,
            plan_time_s=typical_step(measured)["iteration_time_s"] if measured else None,
        )

    def advance(self) -> Optional[JobPhase]:
        """``watching`` once both arms are measured (with max speed if the plan failed)."""
        if not self.samples.complete:
            return None
        ctx = self.ctx
        measured = self.samples.measurement()
        comparison = measured.comparison()
        ctx.events.write("baseline_measured", interleaved=True, **typical_step(measured.reference))
        ctx.events.write("plan_measured", **typical_step(measured.plan))
        result: PlanResult = self.plan.result
        chosen, allmax = result.chosen, result.frontier.allmax
        verdict = judge_plan(
            comparison,
            energy=ctx.spec.energy,
            reference_time_s=typical_step(measured.reference)["iteration_time_s"],
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
        """The plans, the first step, the block length and the iterations measured so far."""
        return {
            "plan": self.plan.to_state(),
            "start_step": self.arms.first_step,
            "block_steps": self.arms.block_steps,
            "steps": [job_step_to_json(s) for s in self.samples.steps.values()],
            "unclean_blocks": sorted(self.samples.unclean),
        }

    @classmethod
    def from_state(
        cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any], result: PlanResult
    ) -> Running:
        """The phase :meth:`to_state` described, on the job's kept plans ``result``.

        A state written before blocks (one step per block, ``samples`` by arm) restarts the
        measurement from its iterations as blocks of one step.
        """
        prof = ctx.spec.profiler
        start = int(state["start_step"])
        per_block = int(state.get("block_steps", 1))
        schedule = ArmSchedule(start, prof.settle_steps, per_block)
        if "steps" in state:
            kept = [job_step_from_json(s) for s in state["steps"]]
        else:
            kept = [job_step_from_json(s) for arm in state["samples"].values() for s in arm]
        samples = BlockSamples(
            schedule,
            wanted_pairs(prof.measure_steps, per_block),
            {js.step: js for js in kept},
            {int(b) for b in state.get("unclean_blocks", [])},
        )
        plan = PlanInForce.from_state(state["plan"], result)
        return cls(ctx, record, plan, start, per_block, samples)
