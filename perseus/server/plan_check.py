"""Does the measured plan keep its promise? If not, the job falls back to max speed.

The chosen plan is measured against max speed on interleaved iterations (same host load, same
moment). The plan is rejected when it runs slower than the energy policy allows (the policy's
allowance, or the plan's own predicted slowdown where the policy accepted one) by more than the
tolerance (``server.plan_slowdown_tolerance``, or the measured noise where that is larger: the
runtime's own costs and the host's delays are not the plan's fault), or when it saves far less
than predicted (less than half the predicted saving, beyond the noise). Noise: three standard
errors of the paired differences (robust), at least :data:`MIN_TOLERANCE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from perseus.config_enums import EnergyPolicy
from perseus.server.steps import JobStep, robust_sigma, typical_step
from perseus.wire import EnergySettings

MIN_TOLERANCE = 0.01
SIGMAS = 3.0
# "Far less than predicted": below this fraction of the predicted saving.
SAVING_FRACTION = 0.5


@dataclass(frozen=True)
class PlanVerdict:
    """How the measured plan compares with what was allowed and predicted."""

    ok: bool
    measured_slowdown: float
    allowed_slowdown: float
    slowdown_tolerance: float
    measured_saving: Optional[float]
    predicted_saving: float
    saving_tolerance: float
    reason: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """As JSON-ready data (summary, event log)."""
        return dict(self.__dict__)


def _tolerance(pairs: List[float]) -> float:
    if len(pairs) < 2:
        return MIN_TOLERANCE
    return max(MIN_TOLERANCE, SIGMAS * robust_sigma(pairs) / math.sqrt(len(pairs)))


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


def judge_plan(
    reference: List[JobStep],
    plan: List[JobStep],
    *,
    energy: EnergySettings,
    predicted_slowdown: float,
    predicted_saving: float,
    slowdown_tolerance: float = 0.03,
) -> PlanVerdict:
    """Compare the plan's measured iterations with the interleaved max-speed ones."""
    ref, got = typical_step(reference), typical_step(plan)
    slowdown = got["iteration_time_s"] / ref["iteration_time_s"] - 1.0
    time_pairs = [p.iteration_time_s / r.iteration_time_s - 1.0 for r, p in zip(reference, plan)]
    time_tol = max(slowdown_tolerance, _tolerance(time_pairs))
    allowed = allowed_slowdown(energy, predicted_slowdown, ref["iteration_time_s"])
    saving: Optional[float] = None
    saving_tol = MIN_TOLERANCE
    if ref["energy_j"] and got["energy_j"] is not None:
        saving = 1.0 - got["energy_j"] / ref["energy_j"]
        energy_pairs = [
            1.0 - p.energy_j / r.energy_j
            for r, p in zip(reference, plan)
            if r.energy_j and p.energy_j is not None
        ]
        saving_tol = _tolerance(energy_pairs)
    problems = []
    if slowdown > allowed + time_tol:
        problems.append(
            f"ran {slowdown:.1%} slower than max speed where the policy "
            f"({energy.policy}) allows {allowed:.1%} (tolerance {time_tol:.1%})"
        )
    if (
        saving is not None
        and predicted_saving > 0
        and saving < SAVING_FRACTION * predicted_saving - saving_tol
    ):
        problems.append(
            f"saved {saving:.1%} of the energy where {predicted_saving:.1%} was predicted "
            f"(measured noise {saving_tol:.1%})"
        )
    reason = None
    if problems:
        reason = " and ".join(problems)
    return PlanVerdict(
        ok=not problems,
        measured_slowdown=slowdown,
        allowed_slowdown=allowed,
        slowdown_tolerance=time_tol,
        measured_saving=saving,
        predicted_saving=predicted_saving,
        saving_tolerance=saving_tol,
        reason=reason,
    )
