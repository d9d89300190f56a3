"""Planning a job from its measured profile, and writing the job's files.

Runs in a worker thread of the server (never on the event loop). Files go under the job's own
directory: ``profile.csv``, ``frontier.csv``, ``plans/<plan_id>.json``, ``plan.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from perseus.config import EnergyConfig, EnergyPolicy
from perseus.errors import ServerError
from perseus.profile import Profile
from perseus.server.models import JobSpec


@dataclass
class PlanResult:
    """A solved job: its frontier and the plan its energy policy chose."""

    frontier: Any  # perseus.planner.frontier.Frontier
    chosen: Any  # perseus.planner.frontier.FrontierPoint
    solve_time_s: float


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
        policy=EnergyPolicy(spec.energy.policy),
        max_slowdown=spec.energy.max_slowdown,
        iteration_time_s=spec.energy.iteration_time_s,
        eta=spec.energy.eta,
    )
    chosen = choose(frontier, energy)
    return PlanResult(frontier, chosen, time.perf_counter() - t0)


def write_plan_files(job_dir: Path, profile: Profile, result: PlanResult) -> Dict[str, str]:
    """Write the profile, the frontier, every plan and the chosen plan; returns their paths."""
    job_dir.mkdir(parents=True, exist_ok=True)
    files = {"profile": str(profile.write(job_dir / "profile.csv"))}
    frontier = result.frontier
    frontier.to_dataframe().to_csv(job_dir / "frontier.csv", index=False)
    files["frontier"] = str(job_dir / "frontier.csv")
    for point in frontier.points:
        frontier.to_plan(point).write(job_dir / "plans" / f"{point.plan_id}.json")
    files["plans"] = str(job_dir / "plans")
    files["plan"] = str(frontier.to_plan(result.chosen).write(job_dir / "plan.json"))
    return files


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
