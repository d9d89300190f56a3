"""Profiling of a whole job: one sweep per stage, one estimator per GPU, combined into a Profile.

Ranks of one stage (data- and tensor-parallel peers) run the same schedule. Their measurements
combine as in the planner's model of a stage: the time of an instruction is the slowest rank's,
its energy the sum over the ranks, and so is the blocking power.
"""

from __future__ import annotations

import statistics
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from perseus.formats.profile_csv import Profile
from perseus.profiler.estimate import StageEstimator, TypeEstimate
from perseus.profiler.stage_sweep import StageSweep
from perseus.runtime.types import InstructionRecord

Key = Tuple[str, int]


class JobProfiler:
    """Profiles every stage of a job.

    Args:
        sweeps: One :class:`StageSweep` per stage.
    """

    def __init__(self, sweeps: Sequence[StageSweep]) -> None:
        self.sweeps = list(sweeps)
        self._estimators: Dict[int, Dict[Hashable, StageEstimator]] = {
            s: {} for s in range(len(self.sweeps))
        }

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages."""
        return len(self.sweeps)

    def schedule(self, stage: int, step: int) -> List[int]:
        """Frequencies of every position of ``step`` on ``stage``."""
        return self.sweeps[stage].frequencies_for_step(step)

    def add_report(
        self,
        stage: int,
        rank_key: Hashable,
        step: int,
        instructions: Sequence[InstructionRecord],
        update_period_s: Optional[float] = 0.02,
    ) -> None:
        """One rank's records of a profiling step of its stage.

        Args:
            stage: The rank's stage.
            rank_key: Identifies the rank (its GPU) within the stage.
            step: The iteration the records belong to (ignored unless a profiling step).
            instructions: The rank's instruction records of that iteration.
            update_period_s: The rank's energy counter update period, if known.
        """
        sweep = self.sweeps[stage]
        if step not in sweep.assigned:
            return
        est = self._estimators[stage].get(rank_key)
        if est is None:
            est = self._estimators[stage][rank_key] = StageEstimator(update_period_s)
        est.add_step(instructions, sweep.warmup.get(step, ()))

    def add_reference_step(
        self,
        stage: int,
        rank_key: Hashable,
        instructions: Sequence[InstructionRecord],
        update_period_s: Optional[float] = 0.02,
    ) -> None:
        """Records of an iteration outside the sweep (e.g. the baseline at the highest clock).

        They add samples (and counter equations) for whatever clocks they ran at.
        """
        est = self._estimators[stage].get(rank_key)
        if est is None:
            est = self._estimators[stage][rank_key] = StageEstimator(update_period_s)
        est.add_step(instructions)

    def complete_step(self, stage: int, step: int) -> None:
        """Every live rank of ``stage`` reported ``step``: update the stop rule."""
        sweep = self.sweeps[stage]
        if step not in sweep.assigned:
            return
        sweep.mark_reported(step)
        if sweep.observing:
            estimates, _ = self.stage_estimates(stage)
            sweep.observe({k: e.energy_j for k, e in estimates.items()})
        elif sweep.refine_priority is None:
            sweep.prioritize(self._least_certain_clocks(stage))

    def _least_certain_clocks(self, stage: int) -> List[int]:
        """Swept clocks of ``stage``, the least certain energy estimate first."""
        score: Dict[int, float] = {}
        for est in self._estimators[stage].values():
            est.estimate()
            for (_, freq), rel in est.relative_uncertainty().items():
                score[freq] = max(score.get(freq, 0.0), rel)
        swept = self.sweeps[stage].swept_mhz
        return sorted(swept, key=lambda f: -score.get(f, 0.0))

    def energy_models(self) -> List[Dict[str, str]]:
        """Per stage, which counter model each rank's estimator uses (``exact`` or ``lag``)."""
        return [{str(k): e.model for k, e in ests.items()} for ests in self._estimators.values()]

    def finish(self) -> None:
        """Stop every sweep where it is (iteration budget spent)."""
        for sweep in self.sweeps:
            sweep.finish()

    def forget_rank(self, stage: int, rank_key: Hashable) -> None:
        """Drop a dead rank's data."""
        self._estimators[stage].pop(rank_key, None)

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
        per_rank = [est.estimate() for est in self._estimators[stage].values()]
        if not per_rank:
            return {}, None
        keys = set.intersection(*(set(types) for types, _ in per_rank))
        out: Dict[Key, TypeEstimate] = {}
        for key in keys:
            time_s = max(types[key].time_s for types, _ in per_rank)
            energy_j = sum(types[key].energy_j for types, _ in per_rank)
            samples = min(types[key].num_samples for types, _ in per_rank)
            out[key] = TypeEstimate(time_s, energy_j / time_s, samples)
        blocking = [b for _, b in per_rank]
        total_w = None if any(b is None for b in blocking) else sum(b for b in blocking if b)
        return out, total_w

    def profile(self, source: str = "online profiler") -> Profile:
        """The measured profile (profile CSV rows): one for every timed (instruction, clock).

        A row whose power no counter reading of its own stage determines (a dead or stuck
        counter) borrows the median power of the other stages at that clock (see
        :meth:`complete_estimates`); clocks whose power is unknown everywhere are left out.

        Raises:
            ProfileError: when a stage has no usable forward or backward measurement at all.
        """
        rows = []
        for stage, estimates in enumerate(self.complete_estimates()):
            for (instruction, freq), est in sorted(estimates.items()):
                if est.time_s > 0 and est.energy_j > 0 and est.num_samples > 0:
                    rows.append((stage, instruction, freq, est.time_s, est.energy_j))
        return Profile.from_rows(rows, source)

    def complete_estimates(self) -> List[Dict[Key, TypeEstimate]]:
        """Per stage, :meth:`stage_estimates` plus borrowed powers for timed keys without one."""
        per_stage = [self.stage_estimates(s)[0] for s in range(self.num_stages)]
        out = []
        for stage, estimates in enumerate(per_stage):
            estimates = dict(estimates)
            for key, (time_s, n) in self._stage_times(stage).items():
                if key in estimates:
                    continue
                others = [
                    e[key].power_w for s, e in enumerate(per_stage) if s != stage and key in e
                ]
                if others and time_s > 0:
                    estimates[key] = TypeEstimate(time_s, statistics.median(others), n)
            out.append(estimates)
        return out

    def _stage_times(self, stage: int) -> Dict[Key, Tuple[float, int]]:
        """Slowest rank's typical duration per timed key of ``stage``."""
        times: Dict[Key, Tuple[float, int]] = {}
        for est in self._estimators[stage].values():
            for key, (time_s, n) in est.times_s().items():
                old = times.get(key)
                times[key] = (max(time_s, old[0]), min(n, old[1])) if old else (time_s, n)
        return times

    def blocking_power_w(self, fallback_w: float) -> List[float]:
        """Measured blocking (P2P) power per stage; ``fallback_w`` where unknown.

        A stage that hardly ever waits (the last one in 1F1B) leaves its blocking power
        undetermined: an estimate outside (0, highest instruction power] is not trusted.
        """
        out = []
        for stage in range(self.num_stages):
            estimates, power_w = self.stage_estimates(stage)
            ceiling_w = max((e.power_w for e in estimates.values()), default=0.0)
            ok = power_w is not None and 0 < power_w <= ceiling_w
            out.append(power_w if ok and power_w is not None else fallback_w)
        return out
