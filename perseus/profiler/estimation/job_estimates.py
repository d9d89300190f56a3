"""The estimation half of profiling a job: one estimator per GPU, combined per stage.

Each GPU's estimator (:class:`~perseus.profiler.estimation.estimate.StageEstimator`) gets that GPU's
iterations (instruction stamps, iteration start and end) and its energy counter's updates (a
stage leader's updates arrive with its reports). Ranks of one stage (data- and tensor-parallel
peers) run the same schedule. Their measurements combine as in the planner's model of a stage:
the time of an instruction is the slowest GPU's, its energy the sum over the GPUs, and so is the
blocking power. An estimator may stand for several GPUs (``num_gpus``): a stage leader's
measurements represent every GPU of its stage, and its energy counts that many times.

This is the heavy part (least squares over every stored iteration): the coordination server runs
it in a worker process (:mod:`perseus.server.workers`), fed incrementally.
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from perseus.formats.profile.table import Profile
from perseus.profiler import inversions
from perseus.profiler.estimation.estimate import MAX_RELATIVE_SE, StageEstimator, TypeEstimate
from perseus.profiler.estimation.type_estimate import REMEASURE_SHARE
from perseus.records import InstructionRecord
from perseus.records.energy import EnergyUpdate

Key = Tuple[str, int]
RowKey = Tuple[int, str, int]


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
        self._limits: Dict[Tuple[int, Hashable], Optional[float]] = {}

    # -- input ----------------------------------------------------------------------------------
    def set_gpu(
        self,
        stage: int,
        rank_key: Hashable,
        *,
        num_gpus: int = 1,
        power_limit_w: Optional[float] = None,
    ) -> None:
        """Describe one measured GPU (before or after its first data).

        Args:
            stage: Its stage.
            rank_key: Identifies it within the stage.
            num_gpus: GPUs its measurements stand for (a stage leader's: the stage's ranks).
            power_limit_w: Its power limit (from the rank's registration): no power above it
                is ever returned.
        """
        self._gpus[(stage, rank_key)] = max(1, int(num_gpus))
        self._limits[(stage, rank_key)] = power_limit_w
        est = self._estimators[stage].get(rank_key)
        if est is not None:
            est.set_power_limit(power_limit_w)

    def _estimator(self, stage: int, rank_key: Hashable) -> StageEstimator:
        est = self._estimators[stage].get(rank_key)
        if est is None:
            limit = self._limits.get((stage, rank_key))
            est = self._estimators[stage][rank_key] = StageEstimator(limit)
            self._gpus.setdefault((stage, rank_key), 1)
        return est

    def add_step(
        self,
        stage: int,
        rank_key: Hashable,
        instructions: Sequence[InstructionRecord],
        warmup_positions: Sequence[int] = (),
        *,
        step: Optional[int] = None,
        step_start_s: Optional[float] = None,
        step_end_s: Optional[float] = None,
    ) -> None:
        """One GPU's records of one iteration (see :meth:`StageEstimator.add_step`)."""
        self._estimator(stage, rank_key).add_step(
            instructions, warmup_positions, step_start_s, step_end_s, step
        )

    def add_updates(self, stage: int, rank_key: Hashable, updates: Sequence[EnergyUpdate]) -> int:
        """Counter updates of one GPU, oldest first; returns how many were new."""
        return self._estimator(stage, rank_key).add_updates(updates)

    def forget_rank(self, stage: int, rank_key: Hashable) -> None:
        """Drop a dead rank's data."""
        self._estimators[stage].pop(rank_key, None)
        self._gpus.pop((stage, rank_key), None)
        self._limits.pop((stage, rank_key), None)

    # -- the counters ---------------------------------------------------------------------------
    def energy_models(self) -> List[Dict[str, str]]:
        """Per stage, what each rank's estimator fitted (equations, lag, misfit, period)."""
        return [
            {str(k): e.describe() for k, e in ests.items()} for ests in self._estimators.values()
        ]

    def update_period_s(self, stage: int) -> Optional[float]:
        """The slowest measured counter update period among the stage's GPUs (``None``: none)."""
        periods = [e.update_period for e in self._estimators[stage].values()]
        known = [p.median_s for p in periods if p is not None]
        return max(known) if known else None

    def equation_noise(self, stage: int) -> Optional[float]:
        """The largest relative residual of one counter equation among the stage's GPUs."""
        noise = [e.equation_noise() for e in self._estimators[stage].values()]
        known = [n for n in noise if n is not None]
        return max(known) if known else None

    # -- results --------------------------------------------------------------------------------
    def stage_estimates(self, stage: int) -> Tuple[Dict[Key, TypeEstimate], Optional[float]]:
        """Combined estimates of one stage: time max over GPUs, energy and power summed.

        Standard errors: a GPU standing for ``n`` counts ``n`` times (its error too); different
        GPUs' errors are independent.
        """
        per_rank = [
            (est.estimate(), self._gpus.get((stage, key), 1))
            for key, est in self._estimators[stage].items()
        ]
        if not per_rank:
            return {}, None
        keys = set.intersection(*(set(types) for (types, _), _ in per_rank))
        out: Dict[Key, TypeEstimate] = {}
        for key in keys:
            slowest = max((types[key] for (types, _), _ in per_rank), key=lambda e: e.time_s)
            energy_j = sum(n * types[key].energy_j for (types, _), n in per_rank)
            energy_se = math.sqrt(
                sum((n * types[key].energy_se_j) ** 2 for (types, _), n in per_rank)
            )
            samples = min(types[key].num_samples for (types, _), _ in per_rank)
            clamped = any(types[key].clamped for (types, _), _ in per_rank)
            time_s = slowest.time_s
            power_w = energy_j / time_s
            time_part = power_w * slowest.time_se_s
            power_se = math.sqrt(max(0.0, energy_se**2 - time_part**2)) / time_s
            if math.isinf(energy_se):
                power_se = math.inf
            out[key] = TypeEstimate(
                time_s=time_s,
                power_w=power_w,
                num_samples=samples,
                power_se_w=power_se,
                time_se_s=slowest.time_se_s,
                clamped=clamped,
            )
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
        score = self._clock_uncertainty(stage)
        return sorted(swept_mhz, key=lambda f: -score.get(f, math.inf))

    def uncertain_clocks(
        self,
        stage: int,
        swept_mhz: Sequence[int],
        max_relative_se: float = REMEASURE_SHARE * MAX_RELATIVE_SE,
    ) -> List[int]:
        """The swept clocks with a row known to worse than ``max_relative_se``.

        What the sweep re-measures (by default a little inside the profile's target, see
        :data:`~perseus.profiler.estimation.type_estimate.REMEASURE_SHARE`). Least certain
        first; clocks not estimated yet count as uncertain.
        """
        score = self._clock_uncertainty(stage)
        bad = [f for f in swept_mhz if not score.get(f, math.inf) <= max_relative_se]
        return sorted(bad, key=lambda f: -score.get(f, math.inf))

    def _clock_uncertainty(self, stage: int) -> Dict[int, float]:
        estimates, _ = self.stage_estimates(stage)
        score: Dict[int, float] = {}
        for (_, freq), est in estimates.items():
            rel = math.inf if est.clamped else est.relative_se
            score[freq] = max(score.get(freq, 0.0), rel)
        return score

    def profile(self, source: str = "online profiler") -> Profile:
        """The measured profile (profile CSV rows): one for every timed (instruction, clock).

        Every row carries its energy's standard error; rows known to worse than
        :data:`~perseus.profiler.estimation.estimate.MAX_RELATIVE_SE`, clamped to the GPU's power
        range or borrowed are marked uncertain. A row whose power no counter update of its own stage
        determines (a dead or stuck counter) borrows the median power of the other stages at that
        clock (see :meth:`complete_estimates`); clocks whose power is unknown everywhere are left
        out.

        Raises:
            ProfileError: when a stage has no usable forward or backward measurement at all.
        """
        rows = []
        se: Dict[RowKey, float] = {}
        uncertain: List[RowKey] = []
        for stage, estimates in enumerate(self.complete_estimates()):
            for (instruction, freq), est in sorted(estimates.items()):
                if est.time_s > 0 and est.energy_j > 0 and est.num_samples > 0:
                    rows.append((stage, instruction, freq, est.time_s, est.energy_j))
                    se[(stage, instruction, freq)] = est.energy_se_j
                    if est.uncertain:
                        uncertain.append((stage, instruction, freq))
        return Profile.from_rows(rows, source, energy_se_j=se, uncertain=uncertain)

    def honest_profile(self, source: str = "online profiler") -> Tuple[Profile, Optional[str]]:
        """:meth:`profile` with inverted points repaired, and what was found (or ``None``).

        A point where a lower clock ran faster than a higher one beyond the measured noise
        (:mod:`perseus.profiler.inversions`) is planned as no faster than that higher clock.
        """
        profile = self.profile(source)
        noise: Dict[RowKey, float] = {}
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
        """Per stage, :meth:`stage_estimates` plus borrowed powers for timed keys without one.

        A borrowed power has no standard error of its own (``inf``: the row is uncertain).
        """
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
                    power = gpus * statistics.median(others)
                    estimates[key] = TypeEstimate(
                        time_s=time_s, power_w=power, num_samples=n, power_se_w=math.inf
                    )
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
