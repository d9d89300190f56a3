"""Profiling of a whole job in one process: one sweep per stage, the job's estimates.

:class:`JobProfiler` drives the sweeps (:mod:`perseus.profiler.sweep.stage`) with the estimates
(:mod:`perseus.profiler.estimation.job_estimates`) right away, in the caller's thread: the
profiler's benchmarks and tests use it. The coordination server keeps the sweeps itself and runs the
estimates in a worker process (:mod:`perseus.server.phases.profiling`); both use the same rules
(:func:`sweep_update`).
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from perseus.formats.profile.table import Profile
from perseus.profiler.estimation.estimate import TypeEstimate
from perseus.profiler.estimation.job_estimates import JobEstimates, Key
from perseus.profiler.sweep.stage import StageSweep
from perseus.records import InstructionRecord
from perseus.records.energy import EnergyUpdate


def sweep_update(sweep: StageSweep, estimates: JobEstimates, stage: int) -> None:
    """After a reported step: feed the stop rule, or order the re-measurements.

    Once the first pass is over, the clocks whose rows are still uncertain are re-measured,
    in passes of alternating direction; when none is left the sweep ends.
    """
    if sweep.observing:
        sweep.observe(estimates.stage_energies(stage))
    if sweep.refining:
        sweep.prioritize(estimates.uncertain_clocks(stage, sweep.swept_mhz))


class JobProfiler:
    """Profiles every stage of a job.

    Args:
        sweeps: One :class:`StageSweep` per stage.
        estimates: The job's estimates so far (e.g. with the baseline iterations); default:
            new ones.
    """

    def __init__(
        self, sweeps: Sequence[StageSweep], estimates: Optional[JobEstimates] = None
    ) -> None:
        self.sweeps = list(sweeps)
        self.estimates = estimates if estimates is not None else JobEstimates(len(self.sweeps))

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages."""
        return len(self.sweeps)

    def schedule(self, stage: int, step: int) -> List[int]:
        """Frequencies of every position of ``step`` on ``stage``.

        A stage whose sweep is over runs its highest clock (as the server schedules it) while
        the others go on.
        """
        sweep = self.sweeps[stage]
        if sweep.exhausted and step not in sweep.assigned:
            return [sweep.clocks_mhz[0]] * len(sweep.order)
        return sweep.frequencies_for_step(step)

    def add_updates(self, stage: int, rank_key: Hashable, updates: Sequence[EnergyUpdate]) -> None:
        """Counter updates of one GPU, oldest first (its sampler's series, in any batches).

        Describe the GPU (its power limit, the GPUs it stands for) with
        ``estimates.set_gpu``.
        """
        self.estimates.add_updates(stage, rank_key, updates)

    def add_report(
        self,
        stage: int,
        rank_key: Hashable,
        step: int,
        instructions: Sequence[InstructionRecord],
        step_start_s: Optional[float] = None,
        step_end_s: Optional[float] = None,
    ) -> None:
        """One rank's records of a profiling step of its stage.

        Steps the sweep did not assign count as reference steps (their clocks, no warm-up).
        """
        sweep = self.sweeps[stage]
        warmup = sweep.warmup.get(step, ()) if step in sweep.assigned else ()
        self.estimates.add_step(
            stage,
            rank_key,
            instructions,
            warmup,
            step=step,
            step_start_s=step_start_s,
            step_end_s=step_end_s,
        )

    def add_reference_step(
        self,
        stage: int,
        rank_key: Hashable,
        instructions: Sequence[InstructionRecord],
        step: Optional[int] = None,
        step_start_s: Optional[float] = None,
        step_end_s: Optional[float] = None,
    ) -> None:
        """Records of an iteration outside the sweep (e.g. the baseline at the highest clock).

        They add samples (and counter equations) for whatever clocks they ran at.
        """
        self.estimates.add_step(
            stage,
            rank_key,
            instructions,
            (),
            step=step,
            step_start_s=step_start_s,
            step_end_s=step_end_s,
        )

    def complete_step(self, stage: int, step: int) -> None:
        """Every live rank of ``stage`` reported ``step``: update the stop rule."""
        sweep = self.sweeps[stage]
        if step not in sweep.assigned:
            return
        sweep.mark_reported(step)
        sweep_update(sweep, self.estimates, stage)

    def energy_models(self) -> List[Dict[str, str]]:
        """Per stage, what each rank's estimator fitted (equations, lag, misfit, period)."""
        return self.estimates.energy_models()

    def finish(self) -> None:
        """Stop every sweep where it is (iteration budget spent)."""
        for sweep in self.sweeps:
            sweep.finish()

    def forget_rank(self, stage: int, rank_key: Hashable) -> None:
        """Drop a dead rank's data."""
        self.estimates.forget_rank(stage, rank_key)

    @property
    def done(self) -> bool:
        """Every stage finished its sweep."""
        return all(s.done for s in self.sweeps)

    @property
    def num_steps(self) -> int:
        """Profiling iterations so far (the longest stage's)."""
        return max((s.num_steps for s in self.sweeps), default=0)

    # -- results --------------------------------------------------------------------------------
    def stage_estimates(self, stage: int) -> Tuple[Dict[Key, TypeEstimate], Optional[float]]:
        """Combined estimates of one stage: time max over ranks, energy and power summed."""
        return self.estimates.stage_estimates(stage)

    def profile(self, source: str = "online profiler") -> Profile:
        """The measured profile (see :meth:`JobEstimates.profile`)."""
        return self.estimates.profile(source)

    def complete_estimates(self) -> List[Dict[Key, TypeEstimate]]:
        """Per stage, the estimates plus borrowed powers (see :class:`JobEstimates`)."""
        return self.estimates.complete_estimates()

    def blocking_power_w(self, fallback_w: float) -> List[float]:
        """Measured blocking (P2P) power per stage; ``fallback_w`` per GPU where unknown."""
        return self.estimates.blocking_power_w(fallback_w)
