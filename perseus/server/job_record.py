"""What a job has measured so far: the part of its state that outlives the phase that made it.

A phase hands the record on to the next one with its own part added: the baseline its clean
max-speed iterations, profiling the steps it ran and where its sweeps stopped, running the
chosen plan's iterations and the max-speed ones interleaved with them. The summary shows the
record of the current phase together with what that phase measured so far
(:meth:`~perseus.server.job_phases.JobPhase.outcome`). A record is not changed once made: a
phase adds its part by making a new one (:func:`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from perseus.server.steps import JobStep, job_step_from_json, job_step_to_json


@dataclass(frozen=True)
class ProfilingRecord:
    """Where a job's frequency sweeps ran.

    Attributes:
        first_step: The first profiling step (as many max-speed iterations came before).
        last_step: The newest step asked for when profiling ended (``None`` while it runs).
        summary: Where each stage's sweep stopped, the clocks it swept and the iterations
            (:meth:`~perseus.server.phase_profiling.Profiling.sweep_summary`).
    """

    first_step: int
    last_step: Optional[int] = None
    summary: Optional[Dict[str, Any]] = None

    def to_state(self) -> Dict[str, Any]:
        """As JSON-ready data (see :meth:`from_state`)."""
        return {"first_step": self.first_step, "last_step": self.last_step, "summary": self.summary}

    @classmethod
    def from_state(cls, data: Dict[str, Any]) -> ProfilingRecord:
        """The record :meth:`to_state` described."""
        last = data["last_step"]
        return cls(int(data["first_step"]), None if last is None else int(last), data["summary"])


@dataclass(frozen=True)
class PlanMeasurement:
    """The chosen plan's clean iterations and the max-speed ones interleaved with them."""

    reference: List[JobStep]
    plan: List[JobStep]

    def to_state(self) -> Dict[str, Any]:
        """As JSON-ready data (see :meth:`from_state`)."""
        return {
            "reference": [job_step_to_json(s) for s in self.reference],
            "plan": [job_step_to_json(s) for s in self.plan],
        }

    @classmethod
    def from_state(cls, data: Dict[str, Any]) -> PlanMeasurement:
        """The measurement :meth:`to_state` described."""
        return cls(
            [job_step_from_json(s) for s in data["reference"]],
            [job_step_from_json(s) for s in data["plan"]],
        )


@dataclass(frozen=True)
class JobRecord:
    """What the phases behind a job (and the current one, in a summary) measured.

    Attributes:
        baseline: The clean max-speed iterations at the start of the job.
        profiling: Where the sweeps ran (``None`` before profiling).
        measured: The plan against max speed (``None`` before the plan runs).
    """

    baseline: List[JobStep] = field(default_factory=list)
    profiling: Optional[ProfilingRecord] = None
    measured: Optional[PlanMeasurement] = None

    @property
    def max_speed(self) -> List[JobStep]:
        """Max speed as measured last: beside the plan once it runs, else at the start."""
        if self.measured is not None and self.measured.reference:
            return self.measured.reference
        return self.baseline

    @property
    def plan(self) -> List[JobStep]:
        """The chosen plan's measured iterations (empty before it runs)."""
        return [] if self.measured is None else self.measured.plan

    def to_state(self) -> Dict[str, Any]:
        """As JSON-ready data (see :meth:`from_state`)."""
        return {
            "baseline": [job_step_to_json(s) for s in self.baseline],
            "profiling": None if self.profiling is None else self.profiling.to_state(),
            "measured": None if self.measured is None else self.measured.to_state(),
        }

    @classmethod
    def from_state(cls, data: Dict[str, Any]) -> JobRecord:
        """The record :meth:`to_state` described."""
        profiling, measured = data["profiling"], data["measured"]
        return cls(
            [job_step_from_json(s) for s in data["baseline"]],
            None if profiling is None else ProfilingRecord.from_state(profiling),
            None if measured is None else PlanMeasurement.from_state(measured),
        )
