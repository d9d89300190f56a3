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

The phase ends (``planning``) when every sweep stopped or ``profiler.max_iterations`` are spent;
it fails when a stage lost every rank or the worker failed.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from perseus.profiler import StageSweep, sweep_clocks_mhz
from perseus.profiler.sweep.stage import warmup_positions
from perseus.records import EnergyUpdate, InstructionRecord
from perseus.server.estimation import AskStage, ReportReadings, StageAnswer
from perseus.server.jobs.record import JobRecord, ProfilingRecord
from perseus.server.phases.planning import Planning
from perseus.server.phases.table import Clocks, JobContext, JobPhase, Order
from perseus.wire import Phase, ProfilerSettings, StepReport


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
                max_steps=prof.max_iterations,
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
    """

    name = Phase.profiling

    def __init__(
        self, ctx: JobContext, record: JobRecord, start_step: int, sweeps: List[StageSweep]
    ) -> None:
        super().__init__(ctx, record)
        self.start_step = start_step
        self.sweeps = sweeps
        self._asking: Set[int] = set()
        self._again: Set[int] = set()
        self._error: Optional[str] = None

    def start(self) -> None:
        """Log the start."""
        self.ctx.events.write(
            "profiling_started",
            step=self.start_step,
            clocks=[len(s.clocks_mhz) for s in self.sweeps],
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
            budget = self.ctx.spec.profiler.max_iterations
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
        if max(s.num_steps for s in self.sweeps) >= spec.profiler.max_iterations:
            for sweep in self.sweeps:
                sweep.finish()  # the iteration budget is spent: stop where they are
        if not all(s.done for s in self.sweeps):
            return None
        last = self.ctx.next_step() - 1
        profiled = ProfilingRecord(self.start_step, last, self.sweep_summary())
        return Planning(self.ctx, replace(self.record, profiling=profiled))

    def release(self) -> None:
        """Drop the sweeps (answers still on their way are ignored)."""
        self.sweeps = []
        self._asking.clear()
        self._again.clear()

    def sweep_summary(self) -> Dict[str, Any]:
        """Where each stage's sweep stopped, how many clocks it swept, the iterations so far."""
        return {
            "stopped_at_mhz": [dict(s.stopped_at) for s in self.sweeps],
            "clocks_swept": [len(s.clocks_mhz) for s in self.sweeps],
            "iterations": max((s.num_steps for s in self.sweeps), default=0),
        }

    def outcome(self) -> JobRecord:
        """The record with the sweeps so far."""
        summary = self.sweep_summary() if self.sweeps else None
        return replace(self.record, profiling=ProfilingRecord(self.start_step, None, summary))

    def to_state(self) -> Dict[str, Any]:
        """The first step and every stage's sweep (every step it assigned)."""
        return {"start_step": self.start_step, "sweeps": [s.to_state() for s in self.sweeps]}

    @classmethod
    def from_state(cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any]) -> Profiling:
        """The phase :meth:`to_state` described."""
        sweeps = [StageSweep.from_state(ctx.orders[s], st) for s, st in enumerate(state["sweeps"])]
        return cls(ctx, record, int(state["start_step"]), sweeps)
