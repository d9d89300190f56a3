"""Planning a job from its measured profile, and writing the job's files.

Runs in a planner worker (:class:`perseus.server.workers.PlannerPool`), never in a request
handler. A job's first plan is planned at :data:`ONLINE_EFFORT` (``balanced``: seconds for
8 stages x 96 microbatches), so the job leaves max clocks soon; :func:`refine_and_write` plans
the same job again at :data:`REFINE_EFFORT` (``thorough``: minutes) and returns a result only
when the energy policy then chooses a better plan, which the job can switch to.

Files go under the job's own directory through :mod:`perseus.formats.plan.outputs`:
``profile.csv``, ``frontier.csv``, ``plans/<plan_id>.json``, ``plan.json`` (and
``summary.json`` once the plan is measured). A solved job is kept as data
(:func:`result_to_json`) so that a restarted server goes on with the same plans.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from perseus.config.schema import EnergyConfig
from perseus.errors import ServerError
from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.profile.table import Profile
from perseus.wire import JobSpec

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint
    from perseus.planner.problem import PlanningProblem


@dataclass
class PlanResult:
    """A solved job: its frontier and the plan its energy policy chose."""

    frontier: Frontier
    chosen: FrontierPoint
    solve_time_s: float
    policy: str = ""
    solver: str = ""


def predicted_saving(result: PlanResult) -> Tuple[float, Optional[float], Optional[float]]:
    """The chosen plan's predicted saving against all-max clocks, with its 95 % interval.

    Fractions of the all-max iteration energy: the re-simulated saving, and the interval the
    profile rows' standard errors give its instruction energy
    (:func:`~perseus.profiler.uncertainty.saving_interval_j`; ``None`` where a row the plans use
    differently has no standard error).
    """
    from perseus.profiler.uncertainty import saving_interval_j

    frontier = result.frontier
    allmax = frontier.allmax
    value = 1.0 - result.chosen.energy_j / allmax.energy_j
    if result.chosen.is_allmax:
        return value, value, value
    saving_j, low_j, high_j = saving_interval_j(
        frontier.problem.profile, frontier.to_plan(result.chosen), frontier.to_plan(allmax)
    )
    if not (math.isfinite(low_j) and math.isfinite(high_j)):
        return value, None, None
    # The interval's width around the re-simulated saving (which adds blocking energy).
    return (
        value,
        value - (saving_j - low_j) / allmax.energy_j,
        value + (high_j - saving_j) / (allmax.energy_j),
    )


#: The effort a job's first plan is planned at (``planner.effort``'s default).
ONLINE_EFFORT = "balanced"
#: The effort of a background refinement (:func:`refine_and_write`).
REFINE_EFFORT = "thorough"


def plan_job(
    spec: JobSpec,
    profile: Profile,
    blocking_power_w: List[float],
    effort: str = ONLINE_EFFORT,
) -> PlanResult:
    """Build the planning problem, solve it with ``spec.solver`` and apply the policy.

    Args:
        spec: The job.
        profile: Its measured profile.
        blocking_power_w: Its blocking power per stage.
        effort: ``planner.effort`` of the ``lp`` solver (other solvers have none).
    """
    from perseus.planner import plan_frontier

    t0 = time.perf_counter()
    problem = _problem(spec, profile, blocking_power_w)
    return _result(spec, plan_frontier(problem, solver=spec.solver, effort=effort), t0)


def plan_and_write(
    spec: JobSpec,
    profile: Profile,
    blocking_power_w: List[float],
    job_dir: Path,
    effort: str = ONLINE_EFFORT,
) -> Tuple[PlanResult, Dict[str, str]]:
    """Plan the job and write its files (the planner worker's task)."""
    result = plan_job(spec, profile, blocking_power_w, effort)
    return result, write_plan_files(job_dir, profile, result)


def refine_job(
    spec: JobSpec,
    profile: Profile,
    blocking_power_w: List[float],
    current: PlanResult,
    effort: str = REFINE_EFFORT,
) -> Optional[PlanResult]:
    """The job planned again at ``effort``, when its policy then chooses a better plan.

    The new frontier is the Pareto front of ``current``'s plans and the new ones, so no
    deadline gets a worse plan than before; the policy chooses from it. Its plan ids are
    new: the result replaces ``current`` as a whole (frontier, chosen plan and files).

    Returns:
        The refined result, or None when the chosen plan would be the same (within
        1e-9 in time and energy).
    """
    from perseus.planner.frontier import build_frontier

    t0 = time.perf_counter()
    refined = plan_job(spec, profile, blocking_power_w, effort).frontier
    old = current.frontier
    frontier = build_frontier(
        refined.problem,
        [old.choices(p) for p in old.points] + [refined.choices(p) for p in refined.points],
    )
    frontier.empty_gaps = refined.empty_gaps
    result = _result(spec, frontier, t0)
    chosen, before = result.chosen, current.chosen
    same = math.isclose(
        chosen.iteration_time_s, before.iteration_time_s, rel_tol=1e-9
    ) and math.isclose(chosen.energy_j, before.energy_j, rel_tol=1e-9)
    return None if same else result


def refine_and_write(
    spec: JobSpec,
    profile: Profile,
    blocking_power_w: List[float],
    job_dir: Path,
    current: PlanResult,
    effort: str = REFINE_EFFORT,
) -> Optional[Tuple[PlanResult, Dict[str, str]]]:
    """:func:`refine_job` and, when it found a better plan, the job's files rewritten."""
    result = refine_job(spec, profile, blocking_power_w, current, effort)
    if result is None:
        return None
    return result, write_plan_files(job_dir, profile, result)


def _problem(spec: JobSpec, profile: Profile, blocking_power_w: List[float]) -> PlanningProblem:
    from perseus.planner.problem import PlanningProblem

    return PlanningProblem(profile, spec.num_microbatches, blocking_power_w, schedule=spec.schedule)


def _result(spec: JobSpec, frontier: Frontier, started_s: float) -> PlanResult:
    """The frontier with the plan the job's energy policy chooses from it."""
    from perseus.planner.policies import choose

    energy = EnergyConfig(
        policy=spec.energy.policy,
        max_slowdown=spec.energy.max_slowdown,
        iteration_time_s=spec.energy.iteration_time_s,
        eta=spec.energy.eta,
    )
    return PlanResult(
        frontier=frontier,
        chosen=choose(frontier, energy),
        solve_time_s=time.perf_counter() - started_s,
        policy=str(spec.energy.policy),
        solver=spec.solver,
    )


def result_to_json(result: PlanResult, blocking_power_w: List[float]) -> Dict[str, Any]:
    """A solved job as JSON-ready data (the frontier's points, the chosen one, how)."""
    return {
        "points": [
            {
                "plan_id": p.plan_id,
                "iteration_time_s": p.iteration_time_s,
                "energy_j": p.energy_j,
                "freqs": [[int(f) for f in stage] for stage in p.freqs],
                "is_allmax": bool(p.is_allmax),
            }
            for p in result.frontier.points
        ],
        "chosen": result.chosen.plan_id,
        "solve_time_s": result.solve_time_s,
        "policy": result.policy,
        "solver": result.solver,
        "blocking_power_w": list(blocking_power_w),
    }


def result_from_json(spec: JobSpec, profile: Profile, data: Dict[str, Any]) -> PlanResult:
    """The inverse of :func:`result_to_json`, with ``profile`` (the job's ``profile.csv``)."""
    from perseus.planner.frontier import Frontier, FrontierPoint

    problem = _problem(spec, profile, data["blocking_power_w"])
    points = [
        FrontierPoint(
            plan_id=int(p["plan_id"]),
            iteration_time_s=float(p["iteration_time_s"]),
            energy_j=float(p["energy_j"]),
            freqs=[[int(f) for f in stage] for stage in p["freqs"]],
            is_allmax=bool(p["is_allmax"]),
        )
        for p in data["points"]
    ]
    frontier = Frontier(problem, points)
    chosen = next(p for p in points if p.plan_id == int(data["chosen"]))
    return PlanResult(
        frontier=frontier,
        chosen=chosen,
        solve_time_s=float(data["solve_time_s"]),
        policy=str(data["policy"]),
        solver=str(data["solver"]),
    )


def write_plan_files(job_dir: Path, profile: Profile, result: PlanResult) -> Dict[str, str]:
    """Write the profile, the frontier, every plan and the chosen plan; returns their paths."""
    files = plan_outputs.write_frontier_outputs(
        job_dir,
        result.frontier,
        result.chosen,
        plan_extra={"policy": result.policy, "solver": result.solver},
    )
    paths = {key: str(job_dir / name.rstrip("/")) for key, name in files.items()}
    paths["profile"] = str(profile.write(job_dir / plan_outputs.PROFILE_CSV))
    return paths


def safe_job_dir(dump_dir: Path, job_id: str) -> Path:
    """``dump_dir / job_id``, refusing anything that would land outside ``dump_dir``."""
    root = dump_dir.resolve()
    path = (root / job_id).resolve()
    if path.parent != root:
        raise ServerError(f"job id {job_id!r} would escape the dump directory {root}")
    return path


class EventLog:
    """Append-only JSON-lines log of a job's events (``events.jsonl``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: Any) -> None:
        """Append one event with a wall-clock timestamp."""
        record = {"time": time.time(), "event": event, **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
