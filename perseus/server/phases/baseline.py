"""The ``baseline`` phase: every instruction at the highest clock, and the job's first measurement.

From ``settle_steps`` on, and once every stage registered and its GPU is thermally settled,
the clean job iterations are the job's max-speed baseline (before, a job step holds only the
stages registered: not the job's time and energy), the instruction durations and the energy
counters' update period (as the job measured it from the ranks' counter updates) size the
profiling sweeps' windows, and the instruction records and counter updates already feed the
job's estimates (the highest clock's points). Once ``baseline_steps`` clean iterations are
measured, the job goes on to ``profiling`` (or fails where profiling is disabled). The sweeps
then re-measure the clocks whose rows the estimates still find uncertain, as their budget
allows.

**Thermally settled** (``docs/design.md``, "Thermal drift"): leakage power rises with the
card's temperature, so iterations measured while a card still warms up from idle read low. Each
stage leader reports its GPU's temperature with every iteration; a stage has settled when its
temperature's least-squares slope over the last minute is within 0.5 °C per minute
(:class:`~perseus.records.ThermalCriterion`), or after ten minutes of waiting (said in the
``thermally_settled`` event), or at once where no temperature is reported. Until every stage has,
the iterations run at max speed as before, unmeasured. The verdict is taken once: the phases
after the baseline start on a settled card.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from perseus.records import ThermalWatch, stages_settled
from perseus.server.jobs.record import JobRecord, fill_energy
from perseus.server.jobs.steps import JobStep, job_step_from_json, job_step_to_json, typical_step
from perseus.server.phases.profiling import (
    Profiling,
    feed_estimates,
    instruction_records,
    make_sweeps,
    warmup_after_changes,
)
from perseus.server.phases.table import JobContext, JobPhase
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
        thermal: Each reporting rank's temperature readings so far (a stage leader's GPU
            stands for its stage; each on its own clock).
        settled: Whether every stage was found thermally settled (measuring started).
    """

    name = Phase.baseline

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        steps: Optional[List[JobStep]] = None,
        kind_times_s: Optional[Dict[Tuple[int, str], List[float]]] = None,
        thermal: Optional[Dict[int, ThermalWatch]] = None,
        settled: bool = False,
    ) -> None:
        super().__init__(ctx, record)
        self.steps: List[JobStep] = steps or []
        self.kind_times_s: Dict[Tuple[int, str], List[float]] = kind_times_s or {}
        self.thermal: Dict[int, ThermalWatch] = thermal or {}
        self.settled = settled
        self._said = False

    def records(self, report: StepReport, stage: int, num_gpus: int) -> None:
        """Durations of a settled, scheduled iteration; its records and updates to the estimates."""
        if report.temperature_c is not None and report.end_s is not None:  # on its own clock
            watch = self.thermal.setdefault(report.rank, ThermalWatch())
            watch.add(report.end_s, report.temperature_c)
        prof = self.ctx.spec.profiler
        if (
            not report.scheduled
            or report.step < prof.settle_steps
            or not report.instructions
            or not self.thermally_settled()
        ):
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
        """A clean, settled iteration is a baseline measurement (``baseline_steps`` of them)."""
        prof = self.ctx.spec.profiler
        if (
            js.clean
            and js.step >= prof.settle_steps
            and len(self.steps) < prof.baseline_steps
            and self.thermally_settled()
        ):
            self.steps.append(js)
            self._measured()

    def thermally_settled(self) -> bool:
        """Whether every stage's GPU has settled (see the module docstring); once true, stays.

        Never before every stage registered: until then a job step holds only the stages
        known (their time and energy, not the job's), and a stage not heard from has not
        settled.
        """
        if self.settled:
            return True
        if not self.ctx.ranks.all_stages_known():
            return False
        ready, verdicts = stages_settled(self.thermal)
        if not ready:
            return False
        self.settled = True
        if verdicts:
            self.ctx.events.write(
                "thermally_settled",
                ranks={
                    str(rank): {
                        "reason": v.reason,
                        "temperature_c": v.temperature_c,
                        "slope_c_per_min": v.slope_c_per_min,
                    }
                    for rank, v in verdicts.items()
                },
            )
        return True

    def step_energy(self, step: int, energy_j: float) -> None:
        """A baseline step's energy arrived."""
        super().step_energy(step, energy_j)
        self.steps = fill_energy(self.steps, step, energy_j)
        self._measured()

    def _measured(self) -> None:
        """Say what the baseline measured, once its steps and their energies are in."""
        steps = self.steps
        complete = len(steps) == self.ctx.spec.profiler.baseline_steps
        if complete and not self._said and all(js.energy_j is not None for js in steps):
            self._said = True
            self.ctx.events.write("baseline_measured", **typical_step(steps))

    def advance(self) -> Optional[JobPhase]:
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
        sweeps = make_sweeps(
            prof, ctx.orders, stage_clocks, self.kind_times_s, ctx.update_period_s()
        )
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
            "thermal": [[stage, watch.to_state()] for stage, watch in self.thermal.items()],
            "settled": self.settled,
        }

    @classmethod
    def from_state(cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any]) -> Baseline:
        """The phase :meth:`to_state` described."""
        kind_times = {(int(s), str(k)): [float(x) for x in v] for s, k, v in state["kind_times"]}
        thermal = {int(s): ThermalWatch.from_state(w) for s, w in state.get("thermal", [])}
        return cls(
            ctx,
            record,
            [job_step_from_json(s) for s in state["steps"]],
            kind_times,
            thermal,
            bool(state.get("settled", not thermal)),
        )
