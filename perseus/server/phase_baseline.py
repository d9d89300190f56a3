"""The ``baseline`` phase: every instruction at the highest clock, and the job's first measurement.

From ``settle_steps`` on, the clean job iterations are the job's max-speed baseline, the
instruction durations size the profiling sweeps' windows, and the instruction records already
feed the job's estimates (the highest clock's points). Once every stage registered and
``baseline_steps`` clean iterations are measured, the job goes on to ``profiling`` (or fails
where profiling is disabled).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from perseus.server.job_phases import JobContext, JobPhase
from perseus.server.job_record import JobRecord
from perseus.server.phase_profiling import (
    Profiling,
    feed_estimates,
    instruction_records,
    make_sweeps,
    warmup_after_changes,
)
from perseus.server.steps import JobStep, job_step_from_json, job_step_to_json, typical_step
from perseus.wire import Phase, StepReport

# Instruction durations kept per (stage, instruction).
MAX_KIND_TIMES = 4096


class Baseline(JobPhase):
    """The job at max speed until its baseline is measured and every stage is known.

    Args:
        ctx: What the phase may use of its job.
        record: Empty (nothing came before).
        steps: The clean iterations measured so far.
        kind_times_s: ``(stage, instruction) -> durations`` measured so far.
    """

    name = Phase.baseline

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        steps: Optional[List[JobStep]] = None,
        kind_times_s: Optional[Dict[Tuple[int, str], List[float]]] = None,
    ) -> None:
        super().__init__(ctx, record)
        self.steps: List[JobStep] = steps or []
        self.kind_times_s: Dict[Tuple[int, str], List[float]] = kind_times_s or {}

    def records(self, report: StepReport, stage: int, num_gpus: int) -> None:
        """Durations of a settled, scheduled iteration; its records and updates to the estimates."""
        prof = self.ctx.spec.profiler
        if not report.scheduled or report.step < prof.settle_steps or not report.instructions:
            feed_estimates(self.ctx, stage, report, [], [], num_gpus)
            return
        records = instruction_records(report)
        for rec in records:
            times = self.kind_times_s.setdefault((stage, rec.instruction), [])
            if len(times) < MAX_KIND_TIMES:
                times.append(rec.end_s - rec.start_s)
        warmup = warmup_after_changes(records, prof.warmup_instructions)
        feed_estimates(self.ctx, stage, report, records, warmup, num_gpus)

    def job_step(self, js: JobStep) -> None:
        """A clean, settled iteration is a baseline measurement."""
        prof = self.ctx.spec.profiler
        if js.clean and js.step >= prof.settle_steps:
            self.steps.append(js)
            if len(self.steps) == prof.baseline_steps:
                self.ctx.events.write("baseline_measured", **typical_step(self.steps))

    def next_phase(self) -> Optional[JobPhase]:
        """``profiling`` once every stage registered and the baseline is measured."""
        ctx = self.ctx
        prof = ctx.spec.profiler
        if not ctx.ranks.all_stages_known() or len(self.steps) < prof.baseline_steps:
            return None
        if not prof.enabled:
            return self.failed(
                "profiling is disabled (profiler.enabled=false); staying at default clocks"
            )
        stage_clocks = [ctx.ranks.stage_clocks(s) for s in range(ctx.spec.num_stages)]
        sweeps = make_sweeps(prof, ctx.orders, stage_clocks, self.kind_times_s)
        return Profiling(ctx, self.outcome(), ctx.next_step(), sweeps)

    def release(self) -> None:
        """Drop the instruction durations."""
        self.kind_times_s = {}

    def outcome(self) -> JobRecord:
        """The record with the baseline measured so far."""
        return replace(self.record, baseline=list(self.steps))

    def to_state(self) -> Dict[str, Any]:
        """The clean iterations and the instruction durations so far."""
        return {
            "steps": [job_step_to_json(s) for s in self.steps],
            "kind_times": [[s, k, v] for (s, k), v in self.kind_times_s.items()],
        }

    @classmethod
    def from_state(cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any]) -> Baseline:
        """The phase :meth:`to_state` described."""
        kind_times = {(int(s), str(k)): [float(x) for x in v] for s, k, v in state["kind_times"]}
        return cls(ctx, record, [job_step_from_json(s) for s in state["steps"]], kind_times)
