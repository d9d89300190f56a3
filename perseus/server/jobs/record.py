"""What a job has measured so far: the part of its state that outlives the phase that made it.

A phase hands the record on to the next one with its own part added: the baseline its clean
max-speed iterations, profiling the steps it ran and where its sweeps stopped, running the
chosen plan's iterations and the max-speed ones interleaved with them. The summary shows the
record of the current phase together with what that phase measured so far
(:meth:`~perseus.server.phases.table.JobPhase.outcome`). A record is not changed once made: a
phase adds its part by making a new one (:func:`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

from perseus.profiler.comparison import PLAN, REFERENCE, Block, Comparison, ThermalBlock, compare
from perseus.server.jobs.steps import JobStep, job_step_from_json, job_step_to_json


def fill_energy(steps: List[JobStep], step: int, energy_j: float) -> List[JobStep]:
    """``steps`` with ``step``'s energy filled in (the same list when it holds no such step)."""
    if not any(js.step == step for js in steps):
        return steps
    return [replace(js, energy_j=energy_j) if js.step == step else js for js in steps]


@dataclass(frozen=True)
class ProfilingRecord:
    """Where a job's frequency sweeps ran.

    Attributes:
        first_step: The first profiling step (as many max-speed iterations came before).
        last_step: The newest step asked for when profiling ended (``None`` while it runs).
        summary: Where each stage's sweep stopped, the clocks it swept and the iterations
            (:meth:`~perseus.server.phases.profiling.Profiling.sweep_summary`).
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
    """The chosen plan's clean iterations and the max-speed ones in blocks beside them.

    Attributes:
        reference: The max-speed iterations of the complete blocks.
        plan: The plan's iterations of the complete blocks.
        blocks: The complete blocks, in order (:mod:`perseus.profiler.comparison`).
        block_steps: Iterations per block.
    """

    reference: List[JobStep]
    plan: List[JobStep]
    blocks: List[Block] = field(default_factory=list)
    block_steps: int = 1

    def comparison(self) -> Comparison:
        """The plan against max speed, with 95 % intervals."""
        return compare(self.blocks)

    def to_state(self) -> Dict[str, Any]:
        """As JSON-ready data (see :meth:`from_state`)."""
        return {
            "reference": [job_step_to_json(s) for s in self.reference],
            "plan": [job_step_to_json(s) for s in self.plan],
            "blocks": [
                [b.arm, b.num_steps, b.time_s, b.energy_j, b.temperature_c] for b in self.blocks
            ],
            "block_steps": self.block_steps,
        }

    @classmethod
    def from_state(cls, data: Dict[str, Any]) -> PlanMeasurement:
        """The measurement :meth:`to_state` described.

        An earlier server interleaved the arms one iteration at a time and kept no blocks:
        its iterations become blocks of one, in the order they ran.
        """
        reference = [job_step_from_json(s) for s in data["reference"]]
        plan = [job_step_from_json(s) for s in data["plan"]]
        blocks: List[Block]
        if "blocks" in data:
            blocks = [
                ThermalBlock(
                    arm=str(b[0]),
                    num_steps=int(b[1]),
                    time_s=float(b[2]),
                    energy_j=None if b[3] is None else float(b[3]),
                    temperature_c=None if len(b) < 5 or b[4] is None else float(b[4]),
                )
                for b in data["blocks"]
            ]
        else:
            arms = [(js, REFERENCE) for js in reference] + [(js, PLAN) for js in plan]
            blocks = [
                Block(arm, 1, js.iteration_time_s, js.energy_j)
                for js, arm in sorted(arms, key=lambda item: item[0].step)
            ]
        return cls(reference, plan, blocks, int(data.get("block_steps", 1)))


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

    def with_energy(self, step: int, energy_j: float) -> JobRecord:
        """The record with ``step``'s energy filled in where it holds that step."""
        baseline = fill_energy(self.baseline, step, energy_j)
        measured = self.measured
        if measured is not None:
            measured = replace(
                measured,
                reference=fill_energy(measured.reference, step, energy_j),
                plan=fill_energy(measured.plan, step, energy_j),
            )
        if baseline is self.baseline and (
            measured is None or measured == self.measured  # nothing of it changed
        ):
            return self
        return JobRecord(baseline, self.profiling, measured)

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
