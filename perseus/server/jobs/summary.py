"""The job summary that ``GET /jobs/{job_id}/summary`` answers, and ``summary.json``.

Measured baseline and plan, the plan's prediction, savings, the profiling cost and what runs
now; ``perseus-train`` builds report.json from it. It is made from a :class:`JobView`, the
small picture a job gives of itself (:meth:`perseus.server.jobs.job.Job.view`).

Once the plan is measured against max speed (in blocks, :mod:`perseus.profiler.comparison`),
``baseline`` and ``plan`` are each arm's mean iteration, and ``savings`` gives the energy saving
and the slowdown with their 95 % intervals; a saving whose interval contains 0 is not measurable
and has no value (``energy_fraction`` is ``null``), only its interval.

``profiling.cost`` is what profiling took against max speed (its iterations, their time and
energy, and what those are above max speed's, with standard errors; max speed as measured beside
the plan, before that the baseline); ``payback`` is after how many plan iterations the measured
saving repays that energy, with its interval, or not measurable (:mod:`perseus.profiler.payback`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from perseus.profiler.comparison import REFERENCE, Comparison
from perseus.profiler.payback import (
    PerIteration,
    ProfilingCost,
    payback,
    per_iteration,
    profiling_cost,
)
from perseus.server.jobs.record import JobRecord
from perseus.server.jobs.steps import JobStep, typical_step
from perseus.server.phases.plan_switching import PlanEpoch
from perseus.server.planning import PlanResult, predicted_saving
from perseus.wire import Phase

# Keys of the summary that ``GET /jobs/{job_id}`` answers (the job's status).
STATUS_KEYS = (
    "job_id",
    "phase",
    "failure",
    "message",
    "fallback",
    "degraded",
    "ranks",
    "current",
    "profiling",
)


@dataclass(frozen=True)
class JobView:
    """What a job shows of itself, taken under its lock.

    Attributes:
        job_id: The job.
        phase: Its phase.
        profiler_mode: ``profiler.mode`` of its spec.
        failure: Why it failed (``failed`` only).
        message: What it says to its ranks.
        fallback: The plan check's verdict where the plan fell back to max speed.
        degraded: Some rank died.
        ranks: ``rank -> alive | dead | finished``.
        record: What it measured (with the current phase's measurements so far).
        result: Its frontier and chosen plan (once planned).
        epoch: The plan in force now (once planned).
        imposed_s: The iteration time imposed on it.
        stragglers: The data-parallel replicas that straggle.
        recent: Its last few job steps.
        files: The files it wrote.
    """

    job_id: str
    phase: Phase
    profiler_mode: str
    failure: Optional[str]
    message: Optional[str]
    fallback: Optional[Dict[str, Any]]
    degraded: bool
    ranks: Dict[str, str]
    record: JobRecord
    result: Optional[PlanResult]
    epoch: Optional[PlanEpoch]
    imposed_s: Optional[float]
    stragglers: Tuple[int, ...]
    recent: List[JobStep]
    files: Dict[str, str]


def job_summary(view: JobView) -> Dict[str, Any]:
    """Everything known about the job."""
    record = view.record
    measured = record.measured
    comparison = None if measured is None or not measured.blocks else measured.comparison()
    out: Dict[str, Any] = {
        "job_id": view.job_id,
        "phase": str(view.phase),
        "failure": view.failure,
        "message": view.message,
        "fallback": view.fallback,
        "degraded": view.degraded,
        "ranks": view.ranks,
        # Max speed measured right beside the plan; before that, at the start of the job.
        "baseline": typical_step(record.max_speed) if record.max_speed else None,
        "plan": typical_step(record.plan) if record.plan else None,
        "predicted": None if view.result is None else _prediction(view.result),
        "savings": None,
        "profiling": _profiling(view),
        "current": _current(view),
        "files": dict(view.files),
    }
    if comparison is not None and measured is not None:
        out["baseline"] = _arm(comparison.reference, measured.reference)
        out["plan"] = _arm(comparison.plan, measured.plan)
        out["savings"] = _savings(comparison, measured.block_steps)
    out["payback"] = _payback(comparison, out["profiling"].get("cost"), view.fallback)
    return out


def _max_speed(record: JobRecord) -> Optional[PerIteration]:
    """Max speed's iteration: its blocks beside the plan, else the baseline (``None``: none)."""
    measured = record.measured
    blocks = [] if measured is None else [b for b in measured.blocks if b.arm == REFERENCE]
    if blocks:
        groups = [(b.num_steps, b.time_s, b.energy_j) for b in blocks]
        return per_iteration(groups, "plan_measurement")
    if record.baseline:
        steps = [(1, js.iteration_time_s, js.energy_j) for js in record.baseline]
        return per_iteration(steps, "baseline")
    return None


def _payback(
    comparison: Optional[Comparison],
    cost: Optional[Dict[str, Any]],
    fallback: Optional[Dict[str, Any]],
) -> Optional[Dict[str, Any]]:
    """After how many plan iterations the saving repays profiling (``None``: no cost yet).

    A plan that fell back to max speed saves nothing from then on: nothing repays.
    """
    if cost is None:
        return None
    if fallback is not None:
        comparison = None
    saving = None if comparison is None else comparison.energy_saving
    measurable = comparison is not None and comparison.energy_saving_measurable
    reference_j = None if comparison is None else comparison.reference.get("energy_j")
    repaid = payback(
        cost,
        saving.value if saving is not None and measurable else None,
        None if saving is None else saving.to_list(),
        reference_j,
    )
    if fallback is not None:
        repaid["reason"] = "the plan fell back to max speed"
    return repaid


def _arm(means: Dict[str, Optional[float]], steps: List[JobStep]) -> Dict[str, Any]:
    """One arm of the measurement: its mean iteration over the paired blocks.

    With its GPUs' mean temperature where the ranks report one.
    """
    out: Dict[str, Any] = {
        "iteration_time_s": means["iteration_time_s"],
        "energy_j": means["energy_j"],
        "num_steps": int(means["num_steps"] or 0),
        "first_step": steps[0].step if steps else None,
    }
    if means["temperature_c"] is not None:
        out["temperature_c"] = means["temperature_c"]
    return out


def _savings(comparison: Comparison, block_steps: int) -> Dict[str, Any]:
    """The plan against max speed: the saving (a value only when measurable), the slowdown."""
    saving, slowdown = comparison.energy_saving, comparison.slowdown
    warmth = comparison.temperature_difference_c
    measurable = comparison.energy_saving_measurable
    out: Dict[str, Any] = {
        "energy_fraction": saving.value if saving is not None and measurable else None,
        "energy_saving_ci95": None if saving is None else saving.to_list(),
        "energy_saving_measurable": measurable,
        "slowdown_fraction": None if slowdown is None else slowdown.value,
        "slowdown_ci95": None if slowdown is None else slowdown.to_list(),
        "num_block_pairs": comparison.num_pairs,
        "block_steps": block_steps,
    }
    if warmth is not None:  # the plan's blocks' temperature minus max speed's, where reported
        out["temperature_difference_c"] = warmth.value
        out["temperature_difference_ci95"] = warmth.to_list()
    return out


def job_status(view: JobView) -> Dict[str, Any]:
    """The job's phase, ranks and what runs now (a part of :func:`job_summary`)."""
    summary = job_summary(view)
    return {key: summary[key] for key in STATUS_KEYS}


def _profiling(view: JobView) -> Dict[str, Any]:
    profiled = view.record.profiling
    first = None if profiled is None else profiled.first_step
    out: Dict[str, Any] = {
        "mode": view.profiler_mode,
        "baseline_iterations": first,
        "iterations": None,
        "first_step": first,
        "last_step": None if profiled is None else profiled.last_step,
    }
    if profiled is not None and profiled.summary is not None:
        summary = dict(profiled.summary)
        sums, period_s = summary.pop("measured", None), summary.pop("update_period_s", None)
        out.update(summary)
        reference = _max_speed(view.record)
        if sums is not None and reference is not None:
            out["cost"] = profiling_cost(ProfilingCost.from_json(sums), reference, period_s)
    return out


def _current(view: JobView) -> Dict[str, Any]:
    epoch = view.epoch
    return {
        "imposed_iteration_time_s": view.imposed_s,
        "straggler_dp_ranks": list(view.stragglers),
        "plan_id": None if epoch is None else epoch.default.plan_id,
        "overrides": {}
        if epoch is None
        else {str(k): v.plan_id for k, v in epoch.overrides.items()},
        "since_step": None if epoch is None else epoch.start_step,
        "reason": None if epoch is None else epoch.reason,
        "recent_steps": [
            {"step": js.step, "iteration_time_s": js.iteration_time_s, "energy_j": js.energy_j}
            for js in view.recent
        ],
    }


def _prediction(result: PlanResult) -> Dict[str, Any]:
    chosen, allmax = result.chosen, result.frontier.allmax
    _, low, high = predicted_saving(result)
    return {
        "plan_id": chosen.plan_id,
        "iteration_time_s": chosen.iteration_time_s,
        "energy_j": chosen.energy_j,
        "allmax_iteration_time_s": allmax.iteration_time_s,
        "allmax_energy_j": allmax.energy_j,
        "energy_saving_fraction": 1.0 - chosen.energy_j / allmax.energy_j,
        "energy_saving_ci95": None if low is None or high is None else [low, high],
        "slowdown_fraction": chosen.iteration_time_s / allmax.iteration_time_s - 1.0,
        "solve_time_s": result.solve_time_s,
        "frontier_points": len(result.frontier.points),
    }
