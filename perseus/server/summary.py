"""The job summary that ``GET /jobs/{job_id}/summary`` answers, and ``summary.json``.

Measured baseline and plan, the plan's prediction, savings, the profiling cost and what runs
now; ``perseus-train`` builds report.json from it. The job itself does not know this module:
the server hands :func:`write_summary` to the job as its ``on_plan_measured`` callback.
"""

from __future__ import annotations

from typing import Any, Dict

from perseus.formats import plan_outputs
from perseus.server.job_phases import Job
from perseus.server.planning import PlanResult
from perseus.server.steps import typical_step

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


def job_summary(job: Job) -> Dict[str, Any]:
    """Everything known about ``job``."""
    with job.lock:
        return _summary(job)


def job_status(job: Job) -> Dict[str, Any]:
    """The job's phase, ranks and what runs now (a part of :func:`job_summary`)."""
    summary = job_summary(job)
    return {key: summary[key] for key in STATUS_KEYS}


def write_summary(job: Job) -> None:
    """Write ``summary.json`` into the job directory (and list it in the job's files)."""
    with job.lock:
        job.files["summary"] = str(job.job_dir / plan_outputs.SUMMARY_JSON)
        plan_outputs.write_summary(job.job_dir, _summary(job))


def _summary(job: Job) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "job_id": job.job_id,
        "phase": str(job.phase),
        "failure": job.failure,
        "message": job.message,
        "fallback": job.fallback,
        "degraded": job.degraded,
        "ranks": job.ranks.statuses(),
        "baseline": _baseline(job),
        "plan": typical_step(job.plan_samples) if job.plan_samples else None,
        "predicted": None if job.result is None else _prediction(job.result),
        "savings": None,
        "profiling": _profiling(job),
        "current": _current(job),
        "files": dict(job.files),
    }
    base, plan = out["baseline"], out["plan"]
    if base and plan and base.get("energy_j") and plan.get("energy_j") is not None:
        out["savings"] = {
            "energy_fraction": 1.0 - plan["energy_j"] / base["energy_j"],
            "slowdown_fraction": plan["iteration_time_s"] / base["iteration_time_s"] - 1,
        }
    return out


def _baseline(job: Job) -> Any:
    """Max speed measured right before the plan; before that, at the start of the job."""
    steps = job.reference or job.baseline
    return typical_step(steps) if steps else None


def _profiling(job: Job) -> Dict[str, Any]:
    first, last = job.profiling_steps
    out: Dict[str, Any] = {
        "mode": job.spec.profiler.mode,
        "baseline_iterations": job.profile_start,
        "iterations": None,
        "first_step": first,
        "last_step": last,
    }
    done = job.profiling_summary
    if job.profiling.started:
        out.update(job.profiling.summary())
    elif done is not None:
        out.update(done)
    return out


def _current(job: Job) -> Dict[str, Any]:
    epoch = job.plans.current
    return {
        "imposed_iteration_time_s": job.imposed_s,
        "straggler_dp_ranks": sorted(job.watcher.stragglers),
        "plan_id": None if epoch is None else epoch.default.plan_id,
        "overrides": {}
        if epoch is None
        else {str(k): v.plan_id for k, v in epoch.overrides.items()},
        "since_step": None if epoch is None else epoch.start_step,
        "reason": None if epoch is None else epoch.reason,
        "recent_steps": [
            {"step": js.step, "iteration_time_s": js.iteration_time_s, "energy_j": js.energy_j}
            for js in list(job.history)[-5:]
        ],
    }


def _prediction(result: PlanResult) -> Dict[str, Any]:
    chosen, allmax = result.chosen, result.frontier.allmax
    return {
        "plan_id": chosen.plan_id,
        "iteration_time_s": chosen.iteration_time_s,
        "energy_j": chosen.energy_j,
        "allmax_iteration_time_s": allmax.iteration_time_s,
        "allmax_energy_j": allmax.energy_j,
        "energy_saving_fraction": 1.0 - chosen.energy_j / allmax.energy_j,
        "slowdown_fraction": chosen.iteration_time_s / allmax.iteration_time_s - 1.0,
        "solve_time_s": result.solve_time_s,
        "frontier_points": len(result.frontier.points),
    }
