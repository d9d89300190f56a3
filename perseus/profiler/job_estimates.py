"""The estimation half of profiling a job: one estimator per GPU, combined per stage.

Ranks of one stage (data- and tensor-parallel peers) run the same schedule. Their measurements
combine as in the planner's model of a stage: the time of an instruction is the slowest GPU's,
its energy the sum over the GPUs, and so is the blocking power. An estimator may stand for
several GPUs (``num_gpus``): a stage leader's records represent every GPU of its stage when the
stage's ranks combine their measurements before reporting, and its energy counts that many
times.

This is the heavy part (least squares over every stored step): the coordination server runs it
in a worker process (:mod:`perseus.server.workers`), fed incrementally with each new step.
"""

from __future__ import annotations

import statistics
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from perseus.formats.profile_csv import Profile
from perseus.profiler import inversions
from perseus.profiler.estimate import StageEstimator, TypeEstimate
from perseus.records import InstructionRecord

Key = Tuple[str, int]


class JobEstimates:
    """Estimators of every GPU of a job, by stage.

    Args:
        num_stages: Number of pipeline stages.
    """

    def __init__(self, num_stages: int) -> None:
        self.num_stages = num_stages
        self._estimators: Dict[int, Dict[Hashable, StageEstimator]] = {
            s: {} for s in range(num_stages)
        }
        self._gpus: Dict[Tuple[int, Hashable], int] = {}

    def add_step(
        self,
        stage: int,
        rank_key: Hashable,
        instructions: Sequence[InstructionRecord],
        warmup_positions: Sequence[int] = (),
        update_period_s: Optional[float] = 0.02,
        num_gpus: int = 1,
    ) -> None:
        """One GPU's records of one iteration.

        Args:
            stage: The GPU's stage.
            rank_key: Identifies the GPU within the stage.
            instructions: Its instruction records of that iteration.
            warmup_positions: Positions whose durations are not averaged.
            update_period_s: The GPU's energy counter update period, if known.
            num_gpus: GPUs these records stand for (the stage's ranks a leader speaks for).
        """
        est = self._estimators[stage].get(rank_key)
        if est is None:
            est = self._estimators[stage][rank_key] = StageEstimator(update_period_s)
        self._gpus[(stage, rank_key)] = max(1, int(num_gpus))
        est.add_step(instructions, warmup_positions)

    def forget_rank(self, stage: int, rank_key: Hashable) -> None:
        """Drop a dead rank's data."""
        self._estimators[stage].pop(rank_key, None)
        self._gpus.pop((stage, rank_key), None)

    def energy_models(self) -> List[Dict[str, str]]:
        """Per stage, which counter model each rank's estimator uses (``exact`` or ``lag``)."""
        return [{str(k): e.model for k, e in ests.items()} for ests in self._estimators.values()]

    def stage_estimates(self, stage: int) -> Tuple[Dict[Key, TypeEstimate], Optional[float]]:
        """Combined estimates of one stage: time max over GPUs, energy and power summed."""
        per_rank = [
            (est.estimate(), self._gpus.get((stage, key), 1))
            for key, est in self._estimators[stage].items()
        ]
        if not per_rank:
            return {}, None
        keys = set.intersection(*(set(types) for (types, _), _ in per_rank))
        out: Dict[Key, TypeEstimate] = {}
        for key in keys:
            time_s = max(types[key].time_s for (types, _), _ in per_rank)
            energy_j = sum(n * types[key].energy_j for (types, _), n in per_rank)
            samples = min(types[key].num_samples for (types, _), _ in per_rank)
            out[key] = TypeEstimate(time_s, energy_j / time_s, samples)
        blocking = [(b, n) for (_, b), n in per_rank]
        total_w = None
        if not any(b is None for b, _ in blocking):
            total_w = sum(n * b for b, n in blocking if b)
        return out, total_w

    def stage_energies(self, stage: int) -> Dict[Key, float]:
        """Energy per (instruction, clock) of one stage (what the sweep's stop rule reads)."""
        estimates, _ = self.stage_estimates(stage)
        return {k: e.energy_j for k, e in estimates.items()}

    def least_certain_clocks(self, stage: int, swept_mhz: Sequence[int]) -> List[int]:
        """``swept_mhz``, the clock with the least certain energy estimate first."""
        score: Dict[int, float] = {}
        for est in self._estimators[stage].values():
            est.estimate()
            for (_, freq), rel in est.relative_uncertainty().items():
                score[freq] = max(score.get(freq, 0.0), rel)
        return sorted(swept_mhz, key=lambda f: -score.get(f, 0.0))

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

    def honest_profile(self, source: str = "online profiler") -> Tuple[Profile, Optional[str]]:
        """:meth:`profile` with inverted points repaired, and what was found (or ``None``).

        A point where a lower clock ran faster than a higher one beyond the measured noise
        (:mod:`perseus.profiler.inversions`) is planned as no faster than that higher clock.
        """
        profile = self.profile(source)
        noise: Dict[Tuple[int, str, int], float] = {}
        for stage in range(self.num_stages):
            for est in self._estimators[stage].values():
                for (instruction, freq), value in est.time_noise_s().items():
                    key = (stage, instruction, freq)
                    noise[key] = max(noise.get(key, 0.0), value)
        found = inversions.find_inversions(profile.rows(), noise)
        if not found:
            return profile, None
        return inversions.repair(profile, found), inversions.describe(found)

    def complete_estimates(self) -> List[Dict[Key, TypeEstimate]]:
        """Per stage, :meth:`stage_estimates` plus borrowed powers for timed keys without one."""
        per_stage = [self.stage_estimates(s)[0] for s in range(self.num_stages)]
        out = []
        for stage, estimates in enumerate(per_stage):
            estimates = dict(estimates)
            gpus = self._stage_gpus(stage)
            for key, (time_s, n) in self._stage_times(stage).items():
                if key in estimates:
                    continue
                # Other stages' power per GPU, times this stage's GPUs.
                others = [
                    e[key].power_w / self._stage_gpus(s)
                    for s, e in enumerate(per_stage)
                    if s != stage and key in e
                ]
                if others and time_s > 0:
                    estimates[key] = TypeEstimate(time_s, gpus * statistics.median(others), n)
            out.append(estimates)
        return out

    def _stage_gpus(self, stage: int) -> int:
        return sum(self._gpus.get((stage, k), 1) for k in self._estimators[stage]) or 1

    def _stage_times(self, stage: int) -> Dict[Key, Tuple[float, int]]:
        """Slowest GPU's typical duration per timed key of ``stage``."""
        times: Dict[Key, Tuple[float, int]] = {}
        for est in self._estimators[stage].values():
            for key, (time_s, n) in est.times_s().items():
                old = times.get(key)
                times[key] = (max(time_s, old[0]), min(n, old[1])) if old else (time_s, n)
        return times

    def blocking_power_w(self, fallback_w: float) -> List[float]:
        """Measured blocking (P2P) power per stage; ``fallback_w`` per GPU where unknown.

        A stage that hardly ever waits (the last one in 1F1B) leaves its blocking power
        undetermined: an estimate outside (0, highest instruction power] is not trusted.
        """
        out = []
        for stage in range(self.num_stages):
            estimates, power_w = self.stage_estimates(stage)
            ceiling_w = max((e.power_w for e in estimates.values()), default=0.0)
            ok = power_w is not None and 0 < power_w <= ceiling_w
            fallback = fallback_w * self._stage_gpus(stage)
            out.append(power_w if ok and power_w is not None else fallback)
        return out
