"""Online profiling logic: frequency sweeps, the stop rule, energy attribution, aggregation.

Pure logic with no I/O: the coordination server drives it with the step records ranks report and
their GPUs' energy-counter updates (:mod:`perseus.profiler.estimation.attribution`), and turns the
result into a :class:`perseus.formats.profile.table.Profile` whose rows carry their standard errors.

The names below are imported on first use: the stdlib-only modules of this package (the profiling's
cost and payback, :mod:`perseus.profiler.payback`) load in an installation without NumPy, as the
training command's outcome line needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict

from perseus.lazy_names import lazy_names

if TYPE_CHECKING:
    from perseus.profiler.estimation.estimate import StageEstimator as StageEstimator
    from perseus.profiler.estimation.estimate import TypeEstimate as TypeEstimate
    from perseus.profiler.job_profiler import JobProfiler as JobProfiler
    from perseus.profiler.sweep.stage import StageSweep as StageSweep
    from perseus.profiler.sweep.stage import sweep_clocks_mhz as sweep_clocks_mhz
    from perseus.profiler.sweep.stop import EnergyRiseStop as EnergyRiseStop

_MODULE_OF: Dict[str, str] = {
    "EnergyRiseStop": "perseus.profiler.sweep.stop",
    "JobProfiler": "perseus.profiler.job_profiler",
    "StageEstimator": "perseus.profiler.estimation.estimate",
    "StageSweep": "perseus.profiler.sweep.stage",
    "TypeEstimate": "perseus.profiler.estimation.estimate",
    "sweep_clocks_mhz": "perseus.profiler.sweep.stage",
}
__all__ = sorted(_MODULE_OF)


__getattr__, __dir__ = lazy_names("perseus.profiler", _MODULE_OF, globals())
