"""Planning a job from its measured profile, and writing the job's files.

Runs in a planner worker (:class:`perseus.server.workers.PlannerPool`), never in a request
handler. Files go under the job's own directory through :mod:`perseus.formats.plan_outputs`:
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

from perseus.config import EnergyConfig
from perseus.errors import ServerError
from perseus.formats import plan_outputs
from perseus.formats.profile_csv import Profile
from perseus.wire import JobSpec

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint


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


def plan_job(spec: JobSpec, profile: Profile, blocking_power_w: List[float]) -> PlanResult:
    """Build the planning problem, solve it with ``spec.solver`` and apply the policy."""
    from perseus.planner import plan_frontier
    from perseus.planner.policies import choose
    from perseus.planner.problem import PlanningProblem

    t0 = time.perf_counter()
    problem = PlanningProblem(
        profile, spec.num_microbatches, blocking_power_w, schedule=spec.schedule
    )
    frontier = plan_frontier(problem, solver=spec.solver)
    energy = EnergyConfig(
        policy=spec.energy.policy,
        max_slowdown=spec.energy.max_slowdown,
        iteration_time_s=spec.energy.iteration_time_s,
        eta=spec.energy.eta,
    )
    chosen = choose(frontier, energy)
    return PlanResult(
        frontier, chosen, time.perf_counter() - t0, str(spec.energy.policy), spec.solver
    )


def plan_and_write(
    spec: JobSpec, profile: Profile, blocking_power_w: List[float], job_dir: Path
) -> Tuple[PlanResult, Dict[str, str]]:
    """Plan the job and write its files (the planner worker's task)."""
    result = plan_job(spec, profile, blocking_power_w)
    return result, write_plan_files(job_dir, profile, result)


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
    from perseus.planner.problem import PlanningProblem

    problem = PlanningProblem(
        profile, spec.num_microbatches, data["blocking_power_w"], schedule=spec.schedule
    )
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
        frontier, chosen, float(data["solve_time_s"]), str(data["policy"]), str(data["solver"])
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
