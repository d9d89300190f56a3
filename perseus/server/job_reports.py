"""A job's step reports: what the ranks measured, checked and combined into job steps.

The part of :class:`~perseus.server.job_phases.Job` that takes ``POST .../steps``: every report
carries the sequence of ``(instruction, microbatch)`` its stage ran (a sequence other than the
job's schedule fails the job); in the baseline and while profiling its instruction records feed
the sweeps; and once every live rank of every stage reported a step, the combined job step is
a baseline measurement, one of the chosen plan's measured pairs, or (watching) what the
straggler watch sees.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from perseus.records import InstructionRecord
from perseus.server.job_base import JobBase
from perseus.server.steps import JobStep, RankStep, typical_step
from perseus.wire import Phase, StepReport, describe_item, encode_sequence, first_difference

# Baseline instruction durations kept per (stage, instruction).
MAX_KIND_TIMES = 4096


class JobReports(JobBase):
    """Step reports of one job (a part of ``Job``)."""

    def report(self, rep: StepReport) -> None:
        """One rank's (or one stage's) measurements of one iteration."""
        covered = [rep.rank, *rep.peers]
        self.ranks.heard(covered)
        with self.lock:
            state = self.ranks.get(rep.rank)
            self._heard(covered)
            if self.phase == Phase.failed or self.retired:
                return
            stage = state.stage
            if rep.sequence is not None:
                self._check_sequence(stage, rep.rank, rep.sequence)
            for mismatch in rep.mismatches:
                self._sequence_failed(stage, mismatch.rank, mismatch.position, mismatch.got)
            if self.phase == Phase.failed:
                return
            if rep.instructions and self.phase in (Phase.baseline, Phase.profiling):
                self._records(rep, stage, state.update_period_s, 1 + len(rep.peers))
            peers = self._peers.get(rep.rank)
            covers = peers if peers is not None and peers == frozenset(rep.peers) else None
            added = self.steps.add(
                rep.step,
                RankStep(
                    rep.rank,
                    stage,
                    state.dp_rank,
                    rep.iteration_time_s,
                    rep.energy_j,
                    rep.compute_time_s,
                    covers if covers is not None else frozenset(rep.peers),
                    tuple((r.dp_rank, r.compute_time_s) for r in rep.replicas),
                    rep.scheduled,
                ),
            )
            if added:
                self._complete(rep.step, stage)
            self._advance()
            self._changed()

    def _records(
        self, rep: StepReport, stage: int, period_s: Optional[float], num_gpus: int
    ) -> None:
        records = [InstructionRecord(**asdict(i)) for i in rep.instructions]
        settle = self.spec.profiler.settle_steps
        in_baseline = self.phase == Phase.baseline
        if in_baseline and (not rep.scheduled or rep.step < settle):
            return
        if in_baseline:
            for rec in records:
                times = self._kind_times.setdefault((stage, rec.instruction), [])
                if len(times) < MAX_KIND_TIMES:
                    times.append(rec.end_s - rec.start_s)
        elif self.profile_start is None or rep.step < self.profile_start:
            return  # max-speed iterations between the baseline and the sweeps
        args = self.profiling.add_records(
            stage, rep.rank, rep.step, records, rep.scheduled, period_s, num_gpus
        )
        if args is not None and self.store is not None:
            self.store.add_records(self.job_id, args)

    def _check_sequence(self, stage: int, rank: int, sequence: str) -> None:
        expected = self._sequences.get(stage)
        if expected is None:
            expected = self._sequences[stage] = encode_sequence(self.orders[stage])
        diff = first_difference(expected, sequence)
        if diff is not None:
            self._sequence_failed(stage, rank, diff[0], diff[2])

    def _sequence_failed(self, stage: int, rank: int, position: int, got: str) -> None:
        order = self.orders[stage]
        want = "end" if position >= len(order) else encode_sequence([order[position]])
        self._fail(
            f"stage {stage} (rank {rank}) does not run the job's schedule: at position "
            f"{position} it ran {describe_item(got)} where the job's {self.spec.schedule} "
            f"schedule with {self.spec.num_microbatches} microbatches has {describe_item(want)}; "
            "Perseus runs this job at default clocks (set parallelism.num_microbatches and "
            "parallelism.schedule to what the framework runs)"
        )

    # -- job steps ------------------------------------------------------------------------------
    def _complete(self, step: int, stage: int) -> None:
        if self.steps.stage_complete(step, stage, self.ranks.live(stage)):
            self.profiling.step_reported(stage, step)
        done = self.steps.take_complete(step, self.ranks.live_stages())
        if done is not None:
            self._on_job_step(done)

    def _recheck(self) -> None:
        """Ranks died or finished: steps may be complete now."""
        for step in self.steps.pending_steps():
            for stage in self.ranks.live_stages():
                if self.steps.stage_complete(step, stage, self.ranks.live(stage)):
                    self.profiling.step_reported(stage, step)
            done = self.steps.take_complete(step, self.ranks.live_stages())
            if done is not None:
                self._on_job_step(done)
        self._advance()

    def _on_job_step(self, js: JobStep) -> None:
        self.history.append(js)
        prof = self.spec.profiler
        if self.phase == Phase.baseline:
            if js.clean and js.step >= prof.settle_steps:
                self.baseline.append(js)
                if len(self.baseline) == prof.baseline_steps:
                    self.events.write("baseline_measured", **typical_step(self.baseline))
        elif self.phase == Phase.running and self.plans.epochs:
            kind = self._measuring(js.step)
            if kind is None or not js.clean:
                return
            samples = self.reference if kind == "baseline" else self.plan_samples
            if len(samples) < prof.measure_steps:
                samples.append(js)
            if min(len(self.reference), len(self.plan_samples)) >= prof.measure_steps:
                self._plan_measured()
        elif self._watching() and self.watcher.update(js.replica_time_s):
            self.events.write(
                "drift", stragglers=sorted(self.watcher.stragglers), target_s=self.watcher.target_s
            )
            self._switch("drift" if self.watcher.stragglers else "drift_cleared")

    def _watching(self) -> bool:
        """The job watches for stragglers (it runs a plan it trusts)."""
        return self.phase == Phase.watching and self.fallback is None and self.result is not None
