"""Per-iteration reports, combined once every live rank of every stage is covered.

A report covers the rank that sent it and the peers it speaks for (a stage leader's report
combines its stage). A job's iteration time is the slowest report's and each data-parallel
replica's time the slowest of its ranks' compute times. An iteration is *clean* when every
report ran the server's schedule; only clean iterations are measurements.

Energy arrives later than time (a GPU's counter covers an iteration only with its next update):
each reporter sends the energy of its earlier iterations in later reports. A job step's energy is
the sum over the reports it was combined from, known once every one of those reporters sent its
part (:class:`StepEnergies`); until then the step's ``energy_j`` is ``None``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

from perseus.profiler.comparison import mean_temperature_c


@dataclass(frozen=True)
class RankStep:
    """The part of one report the job keeps."""

    rank: int
    stage: int
    dp_rank: int
    iteration_time_s: float
    compute_time_s: Optional[float] = None
    covers: FrozenSet[int] = frozenset()
    replica_time_s: Tuple[Tuple[int, float], ...] = ()
    scheduled: bool = True
    temperature_c: Optional[float] = None

    @property
    def ranks(self) -> FrozenSet[int]:
        """Every rank this report speaks for."""
        return self.covers | {self.rank}


@dataclass(frozen=True)
class JobStep:
    """One iteration of the whole job."""

    step: int
    iteration_time_s: float
    energy_j: Optional[float]
    # Per data-parallel replica: the slowest rank's compute time (iteration time if unknown).
    replica_time_s: Dict[int, float]
    clean: bool = True
    # The stage leaders' mean GPU temperature at its end (°C; None: none reported).
    temperature_c: Optional[float] = None


@dataclass
class _Pending:
    reports: Dict[int, RankStep] = field(default_factory=dict)
    covered: Dict[int, Set[int]] = field(default_factory=dict)  # stage -> ranks
    stages_done: Set[int] = field(default_factory=set)


class StepTable:
    """Collects reports per step and says when a stage's step, or the job's, is complete.

    Args:
        keep_steps: Incomplete steps older than this many steps behind the newest are dropped.
    """

    def __init__(self, keep_steps: int = 64) -> None:
        self._pending: Dict[int, _Pending] = {}
        self._complete: Set[int] = set()
        self.keep_steps = keep_steps
        self._newest = -1

    def add(self, step: int, report: RankStep) -> bool:
        """Store one report of ``step`` (a repeat replaces the first); False if too late."""
        if step in self._complete or step < self._newest - self.keep_steps:
            return False
        pending = self._pending.setdefault(step, _Pending())
        pending.reports[report.rank] = report
        pending.covered.setdefault(report.stage, set()).update(report.ranks)
        if step > self._newest:
            self._newest = step
            horizon = step - self.keep_steps
            for old in [s for s in self._pending if s < horizon]:
                del self._pending[old]
            self._complete = {s for s in self._complete if s >= horizon}
        return True

    def pending_steps(self) -> List[int]:
        """Steps with at least one report that are not complete yet."""
        return sorted(self._pending)

    def stage_complete(self, step: int, stage: int, live_ranks: Set[int]) -> bool:
        """True once (and only the first time) every live rank of ``stage`` is covered."""
        pending = self._pending.get(step)
        if pending is None or stage in pending.stages_done:
            return False
        covered = pending.covered.get(stage)
        if not covered or not live_ranks <= covered:
            return False
        pending.stages_done.add(stage)
        return True

    def take_complete(
        self, step: int, live_stages: List[int]
    ) -> Optional[Tuple[JobStep, FrozenSet[int]]]:
        """The combined step once every stage with live ranks is complete (returned once).

        Returned with the ranks whose reports it combines (their energies make its energy).
        Call :meth:`stage_complete` for the stages first.
        """
        pending = self._pending.get(step)
        if pending is None or not live_stages:
            return None
        if any(s not in pending.stages_done for s in live_stages):
            return None
        del self._pending[step]
        self._complete.add(step)
        reports = list(pending.reports.values())
        replicas: Dict[int, float] = {}
        for r in reports:
            times = r.replica_time_s or (
                (r.dp_rank, r.iteration_time_s if r.compute_time_s is None else r.compute_time_s),
            )
            for dp, busy_s in times:
                replicas[dp] = max(replicas.get(dp, 0.0), busy_s)
        js = JobStep(
            step=step,
            iteration_time_s=max(r.iteration_time_s for r in reports),
            energy_j=None,
            replica_time_s=replicas,
            clean=all(r.scheduled for r in reports),
            temperature_c=mean_temperature_c([r.temperature_c for r in reports]),
        )
        return js, frozenset(pending.reports)


class StepEnergies:
    """Joins the reporters' late energies into job steps' energies.

    Args:
        keep_steps: Steps older than this many behind the newest one seen are forgotten.
    """

    def __init__(self, keep_steps: int = 4096) -> None:
        self.keep_steps = keep_steps
        self._parts: Dict[int, Dict[int, float]] = {}
        self._expected: Dict[int, FrozenSet[int]] = {}
        self._newest = -1

    def expect(self, step: int, reporters: FrozenSet[int]) -> Optional[float]:
        """Job step ``step`` was combined from ``reporters``; its energy if already all in."""
        self._expected[step] = reporters
        self._seen(step)
        return self._done(step)

    def add(self, step: int, reporter: int, energy_j: float) -> Optional[float]:
        """``reporter``'s energy of ``step``; the job step's energy once it is complete."""
        if step < self._newest - self.keep_steps:
            return None
        self._parts.setdefault(step, {})[reporter] = energy_j
        self._seen(step)
        return self._done(step)

    def _done(self, step: int) -> Optional[float]:
        expected, parts = self._expected.get(step), self._parts.get(step)
        if expected is None or parts is None or not expected <= set(parts):
            return None
        del self._expected[step], self._parts[step]
        return sum(parts[r] for r in expected)

    def _seen(self, step: int) -> None:
        if step <= self._newest:
            return
        self._newest = step
        horizon = step - self.keep_steps
        for table in (self._parts, self._expected):
            for old in [s for s in table if s < horizon]:
                del table[old]


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


def robust_sigma(values: List[float]) -> float:
    """Standard deviation estimated robustly: 1.4826 x MAD, else 1.2533 x mean deviation."""
    center = statistics.median(values)
    deviations = [abs(v - center) for v in values]
    return 1.4826 * statistics.median(deviations) or 1.2533 * statistics.fmean(deviations)


def inliers(values: List[float]) -> List[bool]:
    """Which of ``values`` lie within OUTLIER_SIGMAS standard deviations of their median.

    The standard deviation is estimated as 1.4826 x the median absolute deviation, or, when
    that is zero (more than half the values equal, as quantized readings can be), as 1.2533 x
    the mean absolute deviation (both are the standard deviation for normal data). The median
    itself is always an inlier.
    """
    center = statistics.median(values)
    sigma = robust_sigma(values)
    return [abs(v - center) <= OUTLIER_SIGMAS * sigma for v in values]


def job_step_to_json(js: JobStep) -> Dict[str, Any]:
    """A job step as JSON (for the persisted state)."""
    return {
        "step": js.step,
        "iteration_time_s": js.iteration_time_s,
        "energy_j": js.energy_j,
        "replica_time_s": {str(k): v for k, v in js.replica_time_s.items()},
        "clean": js.clean,
        "temperature_c": js.temperature_c,
    }


def job_step_from_json(data: Dict[str, Any]) -> JobStep:
    """The inverse of :func:`job_step_to_json`."""
    return JobStep(
        step=int(data["step"]),
        iteration_time_s=float(data["iteration_time_s"]),
        energy_j=None if data["energy_j"] is None else float(data["energy_j"]),
        replica_time_s={int(k): float(v) for k, v in data["replica_time_s"].items()},
        clean=bool(data.get("clean", True)),
        temperature_c=None if data.get("temperature_c") is None else float(data["temperature_c"]),
    )
