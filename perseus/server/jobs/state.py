"""A job's state as data: what :class:`~perseus.server.state_store.StateStore` keeps of it.

One JSON document per job: its phase's own data (each phase's ``to_state``), the record of what
the phases before measured (:class:`~perseus.server.jobs.record.JobRecord`), and what the job
keeps beside its phase (its message and files, the newest step asked for, its recent steps,
whether it is retired). Together with the ranks' registrations, the profiling records (replayed
into the job's estimates) and the solved frontier, a restarted server continues every job from
its phase: the sweeps keep every step they assigned, and the steps assigned but not reported
before the restart are measured again (they are *lost*); nothing else is repeated. A job whose
plan was not kept (``running`` or ``watching`` without its frontier) plans again.

Documents of version 1 (one flat document, before the phases kept their own data) are read too
(:func:`upgrade_v1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from perseus.server.jobs.record import JobRecord
from perseus.server.jobs.steps import JobStep, job_step_from_json, job_step_to_json
from perseus.server.phases.baseline import Baseline
from perseus.server.phases.planning import Planning
from perseus.server.phases.profiling import Profiling
from perseus.server.phases.running import Running
from perseus.server.phases.table import Failed, JobContext, JobNotes, JobPhase
from perseus.server.phases.watching import Watching
from perseus.server.planning import PlanResult
from perseus.wire import Phase

VERSION = 2
# Recent job steps kept in the state (the summary shows the last few).
KEPT_HISTORY = 8


@dataclass
class KeptJob:
    """A job as its state document describes it."""

    phase: JobPhase
    notes: JobNotes
    retired: bool
    newest_step: int
    history: List[JobStep]


def to_state(job: KeptJob) -> Dict[str, Any]:
    """``job``'s state document (call with the job's lock held)."""
    notes = job.notes
    return {
        "version": VERSION,
        "phase": str(job.phase.name),
        "phase_state": job.phase.to_state(),
        "record": job.phase.record.to_state(),
        "message": notes.message,
        "files": dict(notes.files),
        "retired": job.retired,
        "newest_step": job.newest_step,
        "history": [job_step_to_json(s) for s in job.history[-KEPT_HISTORY:]],
    }


def from_state(ctx: JobContext, state: Dict[str, Any], plans: Optional[PlanResult]) -> KeptJob:
    """The job ``state`` describes, on ``ctx`` (whose notes it fills).

    Args:
        ctx: The restored job's context.
        state: Its state document (version 1 or 2).
        plans: Its solved frontier, if kept (with the job's ``profile.csv``).

    Raises:
        ValueError: a version this server does not read.
    """
    version = int(state.get("version", 0))
    if version == 1:
        state = upgrade_v1(state)
    elif version != VERSION:
        raise ValueError(f"job state version {version} (this server reads 1 and {VERSION})")
    ctx.notes.message = state["message"]
    ctx.notes.files.update(state["files"])
    record = JobRecord.from_state(state["record"])
    phase_state = state["phase_state"]
    name = Phase(state["phase"])
    phase: JobPhase
    if name == Phase.baseline:
        phase = Baseline.from_state(ctx, record, phase_state)
    elif name == Phase.profiling:
        phase = Profiling.from_state(ctx, record, phase_state)
    elif name == Phase.running and plans is not None:
        phase = Running.from_state(ctx, record, phase_state, plans)
    elif name == Phase.watching and plans is not None:
        phase = Watching.from_state(ctx, record, phase_state, plans)
    elif name == Phase.failed:
        phase = Failed.from_state(ctx, record, phase_state, plans)
    else:  # planning, or a plan that was not kept: plan again
        phase = Planning(ctx, record)
    history = [job_step_from_json(s) for s in state["history"]]
    return KeptJob(
        phase=phase,
        notes=ctx.notes,
        retired=bool(state["retired"]),
        newest_step=int(state["newest_step"]),
        history=history,
    )


def upgrade_v1(old: Dict[str, Any]) -> Dict[str, Any]:
    """A version-1 document (one flat document) as a version-2 one."""
    phase = Phase(old["phase"])
    first, last = old["profiling_steps"]
    profiling = None
    if phase != Phase.profiling and old["profile_start"] is not None:
        profiling = {"first_step": first, "last_step": last, "summary": old["profiling_summary"]}
    pairs = {"reference": old["reference"], "plan": old["plan_samples"]}
    measured = pairs if phase in (Phase.watching, Phase.failed) and old["plans"] else None
    plan = {"epochs": old["plans"], "imposed_s": old["imposed_s"]} if old["plans"] else None
    phase_state: Dict[str, Any] = {}
    if phase == Phase.baseline:
        phase_state = {"steps": old["baseline"], "kind_times": old["kind_times"]}
    elif phase == Phase.profiling:
        phase_state = {"start_step": old["profile_start"], "sweeps": old["sweeps"]}
    elif phase == Phase.running:
        start = old["plans"][0]["start_step"] if old["plans"] else 0
        samples = {"max_speed": old["reference"], "plan": old["plan_samples"]}
        phase_state = {"plan": plan, "start_step": start, "samples": samples}
    elif phase == Phase.watching:
        phase_state = {"plan": plan, "watcher": old["watcher"], "fallback": old["fallback"]}
    elif phase == Phase.failed:
        phase_state = {"reason": old["failure"], "plan": plan, "fallback": old["fallback"]}
    baseline = [] if phase == Phase.baseline else old["baseline"]
    return {
        "version": VERSION,
        "phase": str(phase),
        "phase_state": phase_state,
        "record": {"baseline": baseline, "profiling": profiling, "measured": measured},
        "message": old["message"],
        "files": old["files"],
        "retired": old["retired"],
        "newest_step": old["max_requested"],
        "history": old["history"],
    }
