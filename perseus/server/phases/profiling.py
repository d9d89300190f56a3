"""The ``profiling`` phase: per-stage frequency sweeps here, the estimates in a worker.

The sweeps (which clocks each stage runs at which step, and when to stop) are cheap and stay
with the phase, under the job's lock. Every report's instruction records go to the job's
estimates in an :class:`~perseus.server.workers.EstimatorPool` worker as they arrive (the
baseline's too: :func:`feed_estimates`); when a stage completed a profiling step, the worker is
asked for the stage's energies (or, once the stop rule ended the sweep, for the clocks to
re-measure first) and the answer updates the sweep when it comes back. At most one such question
per stage is in flight: a stage that completes steps faster than the worker answers gets one
answer for all of them.

A profiling step whose records do not show the clocks it was assigned (the rank ran without
the schedule, or the server restarted in between) is *lost*: its clocks go to a later step,
and its records still count for the clocks they did run at.

The phase ends (``planning``) when every sweep stopped (after the first pass, each re-measures
its clocks until their rows reach the 2 % target) or the budget is spent: the smallest of
``profiler.max_iterations``, ``profiler.max_iterations_fraction`` of the job's iterations
(``profiler.job_iterations``) and the iterations that ran within ``profiler.max_minutes``
(:func:`iteration_budget`); it fails when a stage lost every rank or the worker failed. What the
profiling cost is kept as it runs (:class:`~perseus.profiler.payback.ProfilingCost`: its
iterations, their time and the energy the counters measured over them), for the summary to set
against max speed and against the plan's measured saving (the payback).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from perseus.profiler import StageSweep, sweep_clocks_mhz
from perseus.profiler.payback import ProfilingCost
from perseus.profiler.sweep.stage import warmup_positions
from perseus.records import EnergyUpdate, InstructionRecord
from perseus.server.estimation import AskStage, ReportReadings, StageAnswer
from perseus.server.jobs.record import JobRecord, ProfilingRecord
from perseus.server.jobs.steps import JobStep
from perseus.server.phases.planning import Planning
from perseus.server.phases.table import Clocks, JobContext, JobPhase, Order
from perseus.wire import Phase, ProfilerSettings, StepReport

# Why profiling ended: every sweep over (its rows at the target, or its stop rule where it does
# not re-measure), or one of the budget's keys.
STOPPED_BY_SWEEPS = ("target", "stop_rule")


def iteration_budget(prof: ProfilerSettings) -> Tuple[int, str]:
    """The profiling iterations the job allows, and the key that sets that number.

    ``profiler.max_iterations``, or ``profiler.max_iterations_fraction`` of
    ``profiler.job_iterations`` (at least one iteration) where that is smaller.
    """
    budget, key = prof.max_iterations, "profiler.max_iterations"
    if prof.max_iterations_fraction is not None and prof.job_iterations is not None:
        share = max(1, math.floor(prof.max_iterations_fraction * prof.job_iterations))
        if share < budget:
            budget, key = share, "profiler.max_iterations_fraction"
    return budget, key


def make_sweeps(
    prof: ProfilerSettings,
    orders: Sequence[Order],
    stage_clocks_mhz: Sequence[List[int]],
    kind_times_s: Dict[Tuple[int, str], List[float]],
    update_period_s: Optional[float] = None,
) -> List[StageSweep]:
    """One frequency sweep per stage, sized by what the baseline measured.

    Args:
        prof: The job's profiler settings.
        orders: Each stage's instruction order in one iteration.
        stage_clocks_mhz: Each stage's supported SM clocks, highest first.
        kind_times_s: ``(stage, instruction) -> durations`` measured in the baseline.
        update_period_s: The ranks' energy counter update period as measured (a window spans
            the counter intervals its rows need); ``None``: not known yet (assumed).
    """
    sweeps = []
    for stage, order in enumerate(orders):
        times = {
            kind: statistics.median(v) for (s, kind), v in kind_times_s.items() if s == stage and v
        }
        clocks = sweep_clocks_mhz(
            stage_clocks_mhz[stage], prof.min_frequency_mhz, prof.frequency_step
        )
        sweeps.append(
            StageSweep(
                order,
                clocks,
                mode=prof.mode,
                patience=prof.energy_rise_patience,
                warmup_instructions=prof.warmup_instructions,
                min_window_s=prof.min_window_s,
                instruction_time_s=times,
                max_steps=iteration_budget(prof)[0],
                update_period_s=update_period_s,
            )
        )
    return sweeps


def instruction_records(report: StepReport) -> List[InstructionRecord]:
    """The instruction records of ``report``."""
    return [InstructionRecord(**asdict(i)) for i in report.instructions]


def warmup_after_changes(
    records: Sequence[InstructionRecord], warmup_instructions: int
) -> List[int]:
    """Positions of ``records`` left out of the time averages: the first after a clock change."""
    items = [(r.instruction, r.microbatch) for r in records]
    return warmup_positions(items, [r.frequency_mhz for r in records], warmup_instructions)


def feed_estimates(
    ctx: JobContext,
    stage: int,
    report: StepReport,
    records: Sequence[InstructionRecord],
    warmup: Sequence[int],
    num_gpus: int,
) -> None:
    """Send one report's records and counter updates to the job's estimates (and keep them).

    Args:
        ctx: The job.
        stage: The reporting rank's stage.
        report: The report (its rank's GPU: the counter updates, the power limit).
        records: Its instruction records (empty: only the counter updates count).
        warmup: Positions left out of the time averages.
        num_gpus: The GPUs the report speaks for.
    """
    if not records and not report.energy_updates:
        return
    readings = ReportReadings(
        stage=stage,
        rank=report.rank,
        records=tuple(records),
        warmup=tuple(warmup),
        updates=tuple(
            EnergyUpdate(time_s=u.time_s, energy_mj=u.energy_mj, time_error_s=u.time_error_s)
            for u in report.energy_updates
        ),
        num_gpus=num_gpus,
        power_limit_w=ctx.ranks.get(report.rank).power_limit_w,
        step=report.step,
        start_s=report.start_s,
        end_s=report.end_s,
    )
    ctx.estimators.send(ctx.job_id, readings)
    if ctx.store is not None:
        ctx.store.add_readings(ctx.job_id, readings)


class Profiling(JobPhase):
    """Per-stage frequency sweeps from ``start_step`` on.

    Args:
        ctx: What the phase may use of its job.
        record: What the baseline measured.
        start_step: The first profiling step (the steps before run at the highest clock).
        sweeps: One sweep per stage (:func:`make_sweeps`).
        cost: What the profiling steps took so far (a restored phase's).
    """

    name = Phase.profiling

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        start_step: int,
        sweeps: List[StageSweep],
        cost: Optional[ProfilingCost] = None,
    ) -> None:
        super().__init__(ctx, record)
        self.start_step = start_step
        self.sweeps = sweeps
        self.cost = cost if cost is not None else ProfilingCost()
        self.stopped_by: Optional[str] = None
        self._asking: Set[int] = set()
        self._again: Set[int] = set()
        self._error: Optional[str] = None

    def start(self) -> None:
        """Log the start and the budget."""
        prof = self.ctx.spec.profiler
        budget, key = iteration_budget(prof)
        self.ctx.events.write(
            "profiling_started",
            step=self.start_step,
            clocks=[len(s.clocks_mhz) for s in self.sweeps],
            budget_iterations=budget,
            budget_key=key,
            budget_minutes=prof.max_minutes,
        )

    def resume(self) -> List[int]:
        """Mark every assigned, unreported step lost (after a restart); returns them."""
        lost = []
        for sweep in self.sweeps:
            for step in list(sweep.pending_steps):
                if sweep.lost(step):
                    lost.append(step)
        return sorted(set(lost))

    # -- schedules ------------------------------------------------------------------------------
    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """The sweep's clocks of ``step``; the highest clock before the sweeps or after them."""
        if step >= self.start_step and self.sweeps:
            sweep = self.sweeps[stage]
            if step in sweep.assigned:
                return list(sweep.assigned[step]), []
            budget, _ = iteration_budget(self.ctx.spec.profiler)
            if not sweep.exhausted and sweep.num_steps < budget:
                return list(sweep.frequencies_for_step(step)), []
        return allmax, []

    # -- measurements ---------------------------------------------------------------------------
    def records(self, report: StepReport, stage: int, num_gpus: int) -> None:
        """Route one report's records and counter updates to the estimates.

        Records of a step the sweep assigned count with the assignment's warm-up positions if
        they ran its clocks; otherwise the step is lost (retried later) and the records count
        with warm-up positions of the clocks they did run at.
        """
        if report.step < self.start_step or not self.sweeps or not report.instructions:
            # Max-speed iterations between the baseline and the sweeps: the counter only.
            feed_estimates(self.ctx, stage, report, [], [], num_gpus)
            return
        records = instruction_records(report)
        freqs = [r.frequency_mhz for r in records]
        warmup: Sequence[int]
        sweep = self.sweeps[stage]
        assigned = sweep.assigned.get(report.step)
        if assigned is not None and report.scheduled and list(assigned) == freqs:
            warmup = sweep.warmup.get(report.step, ())
        else:
            if assigned is not None:
                sweep.lost(report.step)
            warmup = warmup_after_changes(records, self.ctx.spec.profiler.warmup_instructions)
        feed_estimates(self.ctx, stage, report, records, warmup, num_gpus)

    def job_step(self, js: JobStep) -> None:
        """A profiling iteration of the whole job: its time (and energy, later) is the cost."""
        if js.step >= self.start_step and self.sweeps:
            self.cost.add_step(js.step, js.iteration_time_s, js.energy_j)

    def step_energy(self, step: int, energy_j: float) -> None:
        """A step's energy arrived: a profiling step's adds to the cost."""
        super().step_energy(step, energy_j)
        self.cost.add_energy(step, energy_j)

    def stage_step_done(self, stage: int, step: int) -> None:
        """Every live rank of ``stage`` reported ``step``: update the sweep (in the worker)."""
        if not self.sweeps:
            return
        sweep = self.sweeps[stage]
        if step not in sweep.assigned:
            return
        sweep.mark_reported(step)
        if not sweep.observing and not sweep.refining:
            return
        self._ask(stage)

    def _ask(self, stage: int) -> None:
        if stage in self._asking:
            self._again.add(stage)
            return
        sweep = self.sweeps[stage]
        self._asking.add(stage)

        def answered(result: Any, error: Optional[BaseException]) -> None:
            self._answered(stage, result, error)

        ask = AskStage(
            stage=stage,
            energies=sweep.observing,
            uncertain=sweep.refining,
            swept_mhz=tuple(sweep.swept_mhz),
        )
        self.ctx.estimators.send(self.ctx.job_id, ask, reply=self.ctx.reply(self, answered))

    def _answered(self, stage: int, result: Any, error: Optional[BaseException]) -> None:
        if not self.sweeps:
            return  # released
        self._asking.discard(stage)
        if error is not None:
            self._error = f"profile estimation failed: {type(error).__name__}: {error}"
            return
        answer: StageAnswer = result
        energies, uncertain = answer.energies, answer.uncertain_mhz
        sweep = self.sweeps[stage]
        if energies is not None and sweep.observing:
            sweep.observe(energies)
        if uncertain is not None and sweep.refining:
            sweep.prioritize(uncertain)  # an empty list: every row certain, the sweep ends
        if stage in self._again:
            self._again.discard(stage)
            if sweep.observing or sweep.refining:
                self._ask(stage)

    # -- the end --------------------------------------------------------------------------------
    def advance(self) -> Optional[JobPhase]:
        """``planning`` once every sweep is done; ``failed`` if the sweeps cannot finish."""
        if self._error is not None:
            return self.failed(self._error)
        if not self.sweeps:
            return None
        spec = self.ctx.spec
        if any(self.ctx.ranks.stage_lost(s) for s in range(spec.num_stages)):
            return self.failed("a pipeline stage has no live rank left; profiling cannot finish")
        if self.stopped_by is None:
            self.stopped_by = self._budget_spent()
            if self.stopped_by is not None:
                for sweep in self.sweeps:
                    sweep.finish()  # the budget is spent: stop where they are
        if not all(s.done for s in self.sweeps):
            return None
        if self.stopped_by is None:
            refined = all(s.refine_priority == [] for s in self.sweeps)
            self.stopped_by = STOPPED_BY_SWEEPS[0] if refined else STOPPED_BY_SWEEPS[1]
        last = self.ctx.next_step() - 1
        profiled = ProfilingRecord(self.start_step, last, self.sweep_summary())
        return Planning(self.ctx, replace(self.record, profiling=profiled))

    def release(self) -> None:
        """Drop the sweeps (answers still on their way are ignored)."""
        self.sweeps = []
        self._asking.clear()
        self._again.clear()

    def _budget_spent(self) -> Optional[str]:
        """The budget key that is spent now (``None``: none)."""
        prof = self.ctx.spec.profiler
        budget, key = iteration_budget(prof)
        if max(s.num_steps for s in self.sweeps) >= budget:
            return key
        if prof.max_minutes is not None and self.cost.time_s >= 60.0 * prof.max_minutes:
            return "profiler.max_minutes"
        return None

    def sweep_summary(self) -> Dict[str, Any]:
        """Where the sweeps stopped, the iterations so far, the budget, the cost so far.

        ``stopped_by``: why profiling ended (``None`` while it runs): ``target`` (every row
        re-measured to its target), ``stop_rule`` (the sweeps' stop rule, no re-measurement:
        ``profiler.mode=sweep``), or the budget key that was spent. ``measured``: the sums of
        :class:`~perseus.profiler.payback.ProfilingCost`; the summary sets them against max
        speed.
        """
        prof = self.ctx.spec.profiler
        budget, key = iteration_budget(prof)
        return {
            "stopped_at_mhz": [dict(s.stopped_at) for s in self.sweeps],
            "clocks_swept": [len(s.clocks_mhz) for s in self.sweeps],
            "iterations": max((s.num_steps for s in self.sweeps), default=0),
            "budget": {"iterations": budget, "key": key, "minutes": prof.max_minutes},
            "stopped_by": self.stopped_by,
            "measured": self.cost.to_json(),
            "update_period_s": self.ctx.update_period_s(),
        }

    def outcome(self) -> JobRecord:
        """The record with the sweeps so far."""
        summary = self.sweep_summary() if self.sweeps else None
        return replace(self.record, profiling=ProfilingRecord(self.start_step, None, summary))

    def to_state(self) -> Dict[str, Any]:
        """The first step, every stage's sweep (every step it assigned) and the cost so far."""
        return {
            "start_step": self.start_step,
            "sweeps": [s.to_state() for s in self.sweeps],
            "cost": self.cost.to_json(),
        }

    @classmethod
    def from_state(cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any]) -> Profiling:
        """The phase :meth:`to_state` described (a state kept before the cost: none so far)."""
        sweeps = [StageSweep.from_state(ctx.orders[s], st) for s, st in enumerate(state["sweeps"])]
        cost = ProfilingCost.from_json(state["cost"]) if "cost" in state else None
        return cls(ctx, record, int(state["start_step"]), sweeps, cost)
