"""Per-iteration reports of every rank, combined once all live ranks have reported.

A job's iteration time is the slowest rank's, its energy the sum over all ranks (every GPU of the
job). Each data-parallel replica's iteration time is the slowest of its ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set


@dataclass(frozen=True)
class RankStep:
    """The part of one rank's report the job keeps."""

    rank: int
    stage: int
    dp_rank: int
    iteration_time_s: float
    energy_j: Optional[float]
    compute_time_s: Optional[float] = None


@dataclass(frozen=True)
class JobStep:
    """One iteration of the whole job."""

    step: int
    iteration_time_s: float
    energy_j: Optional[float]
    # Per data-parallel replica: the slowest rank's compute time (iteration time if unknown).
    replica_time_s: Dict[int, float]


class StepTable:
    """Collects reports per step and says when a step or a stage's step is complete.

    Args:
        keep_steps: Incomplete steps older than this many steps behind the newest are dropped.
    """

    def __init__(self, keep_steps: int = 64) -> None:
        self._reports: Dict[int, Dict[int, RankStep]] = {}
        self._complete: Set[int] = set()
        self._stage_complete: Set[tuple] = set()
        self.keep_steps = keep_steps

    def add(self, step: int, report: RankStep) -> None:
        """Store one rank's report of ``step`` (a repeated report replaces the first)."""
        if step in self._complete:
            return
        self._reports.setdefault(step, {})[report.rank] = report
        newest = max(self._reports)
        for old in [s for s in self._reports if s < newest - self.keep_steps]:
            del self._reports[old]
        self._complete = {s for s in self._complete if s >= newest - 4 * self.keep_steps}
        self._stage_complete = {
            k for k in self._stage_complete if k[1] >= newest - 4 * self.keep_steps
        }

    def pending_steps(self) -> List[int]:
        """Steps with at least one report that are not complete yet."""
        return sorted(self._reports)

    def stage_complete(self, step: int, stage: int, live_ranks: Set[int]) -> bool:
        """True once (and only the first time) every live rank of ``stage`` reported ``step``."""
        key = (stage, step)
        if key in self._stage_complete:
            return False
        got = self._reports.get(step, {})
        ranks_of_stage = {r for r, rep in got.items() if rep.stage == stage}
        needed = live_ranks
        if not needed or not needed <= set(got) or not ranks_of_stage:
            return False
        self._stage_complete.add(key)
        return True

    def take_complete(self, step: int, live_ranks: Set[int]) -> Optional[JobStep]:
        """The combined step once every live rank reported it (returned once), else None."""
        got = self._reports.get(step)
        if got is None or not live_ranks or not live_ranks <= set(got):
            return None
        del self._reports[step]
        self._complete.add(step)
        reports = [got[r] for r in live_ranks]
        energies = [r.energy_j for r in reports]
        replicas: Dict[int, float] = {}
        for r in reports:
            busy_s = r.iteration_time_s if r.compute_time_s is None else r.compute_time_s
            replicas[r.dp_rank] = max(replicas.get(r.dp_rank, 0.0), busy_s)
        return JobStep(
            step=step,
            iteration_time_s=max(r.iteration_time_s for r in reports),
            energy_j=None if any(e is None for e in energies) else sum(e or 0.0 for e in energies),
            replica_time_s=replicas,
        )


def typical_step(steps: List[JobStep]) -> Dict[str, Any]:
    """Typical iteration of a measurement window, with the plain means alongside.

    Time: the median, so that one iteration the host delayed does not move it. Energy: the mean
    over the iterations whose time and energy are both inliers (see :func:`inliers`): an
    iteration the host delayed burned extra idle energy and is left out, and over consecutive
    iterations the energy counter's quantization errors cancel in a mean (one iteration's last
    update is the next one's first) where they would not in a median.
    """
    energies = [s.energy_j for s in steps]
    times = [s.iteration_time_s for s in steps]
    known = None if any(e is None for e in energies) else [e or 0.0 for e in energies]
    energy_j = None
    if known is not None:
        usual = [a and b for a, b in zip(inliers(times), inliers(known))]
        energy_j = statistics.fmean(e for e, keep in zip(known, usual) if keep)
    return {
        "iteration_time_s": statistics.median(times),
        "energy_j": energy_j,
        "mean_iteration_time_s": statistics.fmean(times),
        "mean_energy_j": None if known is None else statistics.fmean(known),
        "num_steps": len(steps),
        "first_step": steps[0].step,
    }


# Values farther than this many standard deviations (estimated robustly) from the median are
# outliers.
OUTLIER_SIGMAS = 3.0


def inliers(values: List[float]) -> List[bool]:
    """Which of ``values`` lie within OUTLIER_SIGMAS standard deviations of their median.

    The standard deviation is estimated as 1.4826 x the median absolute deviation, or, when
    that is zero (more than half the values equal, as quantized readings can be), as 1.2533 x
    the mean absolute deviation (both are the standard deviation for normal data). The median
    itself is always an inlier.
    """
    center = statistics.median(values)
    deviations = [abs(v - center) for v in values]
    sigma = 1.4826 * statistics.median(deviations) or 1.2533 * statistics.fmean(deviations)
    return [d <= OUTLIER_SIGMAS * sigma for d in deviations]
