"""Online profiling logic: frequency sweeps, the stop rule, energy attribution, aggregation.

Pure logic with no I/O: the coordination server drives it with the step records ranks report and
their GPUs' energy-counter updates (:mod:`perseus.profiler.estimation.attribution`), and turns the
result into a :class:`perseus.formats.profile.table.Profile` whose rows carry their standard errors.
"""

from perseus.profiler.estimation.estimate import StageEstimator, TypeEstimate
from perseus.profiler.job_profiler import JobProfiler
from perseus.profiler.sweep.stage import StageSweep, sweep_clocks_mhz
from perseus.profiler.sweep.stop import EnergyRiseStop

__all__ = [
    "EnergyRiseStop",
    "JobProfiler",
    "StageEstimator",
    "StageSweep",
    "TypeEstimate",
    "sweep_clocks_mhz",
]
