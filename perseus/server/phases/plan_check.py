"""Does the measured plan keep its promise? If not, the job falls back to max speed.

The chosen plan is measured against max speed in blocks beside it (same host load, same moment;
:mod:`perseus.profiler.comparison`), which gives its saving and slowdown with 95 % intervals.
The plan is rejected when it runs slower than the energy policy allows (the policy's allowance,
or the plan's own predicted slowdown where the policy accepted one) by more than the tolerance
(``server.plan_slowdown_tolerance``: the runtime's own costs and the host's delays are not the
plan's fault) with the whole interval beyond it, or when even the interval's top of its saving
falls short of half the predicted saving. An interval, not a point, decides: noise never fails a
plan, and a plan that saves nothing measurable is not kept on faith.

Before it is measured, a plan predicted faster than all-max clocks beyond the tolerance
(:func:`faster_than_allmax`) is announced as suspect: lower clocks cannot make a pipeline
faster, so the profile was distorted (see :mod:`perseus.profiler.inversions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from perseus.config.enums import EnergyPolicy
from perseus.profiler.comparison import Comparison, Interval
from perseus.wire import EnergySettings

if TYPE_CHECKING:
    from perseus.planner.frontier import FrontierPoint

MIN_TOLERANCE = 0.01
# "Far less than predicted": below this fraction of the predicted saving.
SAVING_FRACTION = 0.5


@dataclass(frozen=True)
class PlanVerdict:
    """How the measured plan compares with what was allowed and predicted.

    Attributes:
        ok: The plan keeps its promise.
        measured_slowdown: Its slowdown against max speed (``None``: too few blocks).
        slowdown_ci95: Its 95 % interval ``[low, high]``.
        allowed_slowdown: What the policy allows.
        slowdown_tolerance: The tolerance beyond it.
        measured_saving: Its energy saving (``None``: not measurable).
        saving_ci95: Its 95 % interval ``[low, high]`` (``None``: energies unknown).
        saving_measurable: The interval excludes 0.
        predicted_saving: What the plan predicted.
        reason: Why it does not keep its promise (``None`` when it does).
    """

    ok: bool
    measured_slowdown: Optional[float]
    slowdown_ci95: Optional[List[float]]
    allowed_slowdown: float
    slowdown_tolerance: float
    measured_saving: Optional[float]
    saving_ci95: Optional[List[float]]
    saving_measurable: bool
    predicted_saving: float
    reason: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """As JSON-ready data (summary, event log)."""
        return dict(self.__dict__)


def allowed_slowdown(
    energy: EnergySettings, predicted_slowdown: float, reference_s: float
) -> float:
    """The slowdown the policy accepts (at least the chosen plan's predicted one)."""
    allowed = 0.0
    if energy.policy == EnergyPolicy.slowdown:
        allowed = float(energy.max_slowdown or 0.0)
    elif energy.policy == EnergyPolicy.deadline and energy.iteration_time_s and reference_s > 0:
        allowed = energy.iteration_time_s / reference_s - 1.0
    return max(allowed, predicted_slowdown, 0.0)


def _shown(interval: Interval) -> str:
    return f"{interval.value:.1%} (95 % interval {interval.low:.1%} to {interval.high:.1%})"


def judge_plan(
    comparison: Comparison,
    *,
    energy: EnergySettings,
    reference_time_s: float,
    predicted_slowdown: float,
    predicted_saving: float,
    slowdown_tolerance: float = 0.03,
) -> PlanVerdict:
    """Judge the plan on the intervals of its measured saving and slowdown (module docstring)."""
    tolerance = max(slowdown_tolerance, MIN_TOLERANCE)
    allowed = allowed_slowdown(energy, predicted_slowdown, reference_time_s)
    slowdown, saving = comparison.slowdown, comparison.energy_saving
    problems = []
    if slowdown is not None and slowdown.low > allowed + tolerance:
        problems.append(
            f"ran {_shown(slowdown)} slower than max speed where the policy ({energy.policy}) "
            f"allows {allowed:.1%} (tolerance {tolerance:.1%})"
        )
    if (
        saving is not None
        and predicted_saving > 0
        and (saving.high < SAVING_FRACTION * predicted_saving)
    ):
        problems.append(
            f"saved {_shown(saving)} of the energy where {predicted_saving:.1%} was predicted"
        )
    return PlanVerdict(
        ok=not problems,
        measured_slowdown=None if slowdown is None else slowdown.value,
        slowdown_ci95=None if slowdown is None else slowdown.to_list(),
        allowed_slowdown=allowed,
        slowdown_tolerance=tolerance,
        measured_saving=saving.value if comparison.energy_saving_measurable and saving else None,
        saving_ci95=None if saving is None else saving.to_list(),
        saving_measurable=comparison.energy_saving_measurable,
        predicted_saving=predicted_saving,
        reason=" and ".join(problems) if problems else None,
    )


def faster_than_allmax(
    chosen: FrontierPoint, allmax: FrontierPoint, tolerance: float
) -> Optional[str]:
    """Why the chosen plan is suspect (predicted faster than all-max clocks), or ``None``.

    Args:
        chosen: The plan the policy chose.
        allmax: Every instruction at the highest clock.
        tolerance: Relative difference tolerated (``server.plan_slowdown_tolerance``).
    """
    if chosen.is_allmax or allmax.iteration_time_s <= 0:
        return None
    faster = 1.0 - chosen.iteration_time_s / allmax.iteration_time_s
    if faster <= max(tolerance, MIN_TOLERANCE):
        return None
    return (
        f"the chosen plan {chosen.plan_id} is predicted {100 * faster:.1f} % faster than all-max "
        "clocks, which lower clocks cannot achieve: the profile is distorted (a busy host?). "
        "The plan is measured against max speed and replaced by it if it does not hold"
    )
