"""Planning a job from its measured profile, and writing the job's files.

Runs in a worker thread of the server (never on the event loop). Files go under the job's own
directory through :mod:`perseus.formats.plan_outputs`: ``profile.csv``, ``frontier.csv``,
``plans/<plan_id>.json``, ``plan.json`` (and ``summary.json`` once the plan is measured).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

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
