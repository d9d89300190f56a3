"""A job's state as data: what :class:`~perseus.server.state_store.StateStore` keeps of it.

:func:`snapshot` turns the phase machine of a :class:`~perseus.server.job_phases.Job` into
JSON-ready data; :func:`restore` puts it back into a fresh job of the same spec. Together with
the ranks' registrations, the profiling records (replayed into the job's estimates) and the
solved frontier, a restarted server continues every job from its phase: the sweeps keep every
step they assigned, and the steps assigned but not reported before the restart are measured
again (they are *lost*); nothing else is repeated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from perseus.formats.profile_csv import Profile
from perseus.profiler import StageSweep
from perseus.server.plan_switching import PlanEpochs
from perseus.server.planning import result_from_json
from perseus.server.steps import job_step_from_json, job_step_to_json
from perseus.wire import Phase

if TYPE_CHECKING:
    from perseus.server.job_phases import Job

VERSION = 1


def snapshot(job: Job) -> Dict[str, Any]:
    """``job``'s state (call with its lock held)."""
    return {
        "version": VERSION,
        "phase": str(job.phase),
        "failure": job.failure,
        "message": job.message,
        "fallback": job.fallback,
        "retired": job.retired,
        "profile_start": job.profile_start,
        "profiling_steps": list(job.profiling_steps),
        "profiling_summary": job.profiling_summary,
        "max_requested": job.max_requested,
        "baseline": [job_step_to_json(s) for s in job.baseline],
        "reference": [job_step_to_json(s) for s in job.reference],
        "plan_samples": [job_step_to_json(s) for s in job.plan_samples],
        "history": [job_step_to_json(s) for s in list(job.history)[-8:]],
        "kind_times": [[s, k, v] for (s, k), v in job._kind_times.items()],
        "sweeps": [s.to_state() for s in job.profiling.sweeps],
        "plans": job.plans.to_json(),
        "imposed_s": job.imposed_s,
        "watcher": job.watcher.to_json(),
        "files": dict(job.files),
    }


def restore(
    job: Job,
    state: Dict[str, Any],
    plan: Optional[Dict[str, Any]],
    profile: Optional[Profile],
) -> List[int]:
    """Put ``state`` back into ``job`` (lock held); returns the profiling steps lost."""
    if int(state.get("version", 0)) != VERSION:
        raise ValueError(f"job state version {state.get('version')} (this server reads {VERSION})")
    job.phase = Phase(state["phase"])
    job.failure = state["failure"]
    job.message = state["message"]
    job.fallback = state["fallback"]
    job.retired = bool(state["retired"])
    job.profile_start = state["profile_start"]
    first, last = state["profiling_steps"]
    job.profiling_steps = (first, last)
    job.profiling_summary = state["profiling_summary"]
    job.max_requested = int(state["max_requested"])
    job.baseline = [job_step_from_json(s) for s in state["baseline"]]
    job.reference = [job_step_from_json(s) for s in state["reference"]]
    job.plan_samples = [job_step_from_json(s) for s in state["plan_samples"]]
    job.history.extend(job_step_from_json(s) for s in state["history"])
    job._kind_times = {(int(s), str(k)): [float(x) for x in v] for s, k, v in state["kind_times"]}
    job.imposed_s = state["imposed_s"]
    job.watcher.restore(state["watcher"])
    job.files = dict(state["files"])
    lost: List[int] = []
    if state["sweeps"]:
        sweeps = [StageSweep.from_state(job.orders[s], st) for s, st in enumerate(state["sweeps"])]
        job.profiling.start(sweeps)
        lost = job.profiling.lose_pending()
    if plan is not None and profile is not None:
        job.result = result_from_json(job.spec, profile, plan)
        points = {p.plan_id: p for p in job.result.frontier.points}
        job.plans = PlanEpochs.from_json(state["plans"], points)
    elif job.phase in (Phase.running, Phase.watching):
        job.phase = Phase.planning  # the plan was not kept: plan again
    return lost
