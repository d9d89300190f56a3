"""Frequency plans: the planner's output and the runtime's input (``docs/design.md``, "Plan JSON").

A plan is data. JSON plans use the ``perseus-plan/1`` format; the reference system's
``freqs_pipeline_%05d.py`` files (a Python literal) are read with :func:`ast.literal_eval`,
never executed.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from perseus.config.numbers import Range
from perseus.errors import PlanError
from perseus.formats import strict_json
from perseus.formats.atomic_file import write_json_atomic
from perseus.formats.plan.steps import (
    REGENERATE,
    PlanStep,
    check_order,
    check_stage,
    shown,
    step_from_values,
    step_json,
)
from perseus.formats.profile.table import INSTRUCTIONS
from perseus.formats.text_file import read_text_file
from perseus.pipeline_order import PipelineOrder
from perseus.schedule import (
    ALL_SCHEDULES,
    ORDER_SCHEDULES,
    SCHEDULES,
    ScheduleLike,
    stage_order_chunks,
)

PLAN_FORMAT = "perseus-plan/1"
__all__ = ["PLAN_FORMAT", "Plan", "PlanStep", "check_plan_for_job", "load_plan", "plan_from_dict"]


@dataclass
class Plan:
    """Per-stage instructions in execution order, each with its SM frequency."""

    schedule: str
    num_stages: int
    num_microbatches: int
    stages: List[List[PlanStep]]
    predicted_iteration_time_s: Optional[float] = None
    predicted_energy_j: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """The plan as a JSON-ready dict in the ``perseus-plan/1`` format."""
        out: Dict[str, Any] = {
            "format": PLAN_FORMAT,
            "schedule": self.schedule,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "predicted": {
                "iteration_time_s": self.predicted_iteration_time_s,
                "energy_j": self.predicted_energy_j,
            },
            "stages": [[step_json(s) for s in stage] for stage in self.stages],
        }
        out.update(self.extra)
        return out

    def pipeline_order(self) -> Optional[PipelineOrder]:
        """The engine's order the plan was made for (``None``: a schedule Perseus generates)."""
        if not self.stages or any(s.pipeline_stage is None for st in self.stages for s in st):
            return None
        return PipelineOrder.of(
            self.schedule,
            [
                [(s.instruction, s.microbatch, int(s.pipeline_stage or 0)) for s in st]
                for st in self.stages
            ],
        )

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Write the plan as JSON (atomically); returns the path."""
        return write_json_atomic(path, self.to_dict())

    def to_reference_literal(self) -> str:
        """The plan in the reference ``freqs_pipeline_%05d.py`` format."""
        stages = [[(s.instruction, s.frequency_mhz) for s in stage] for stage in self.stages]
        return repr(stages) + "\n"

    def frequencies(self, stage: int) -> List[int]:
        """The frequencies of one stage's instructions in execution order."""
        return [s.frequency_mhz for s in self.stages[stage]]


def load_plan(path: Union[str, os.PathLike]) -> Plan:
    """Read a plan: JSON (``perseus-plan/1``) or a reference ``.py`` literal.

    Raises:
        PlanError: naming the file, where in it the problem is (line and column, or the key
            path such as ``stages[1][3].frequency_mhz``), what was found and the fix.
    """
    path = Path(path)
    fix = f"check runtime.plan, or {REGENERATE}"
    text = read_text_file(path, what="plan file", error=PlanError, fix=fix)
    if path.suffix == ".py":
        return plan_from_reference(text, source=str(path))
    data = strict_json.loads(text, source=str(path), error=PlanError, fix=REGENERATE)
    return plan_from_dict(data, source=str(path))


def plan_from_dict(data: Any, source: str = "<plan>") -> Plan:
    """Build a :class:`Plan` from its JSON dict, checking every field.

    Raises:
        PlanError: naming ``source``, the key and how to fix it.
    """
    if not isinstance(data, dict):
        raise PlanError(
            f"{source}: a plan must be a JSON object, got {type(data).__name__}; {REGENERATE}"
        )
    if data.get("format") != PLAN_FORMAT:
        raise PlanError(
            f"{source}: 'format' is {shown(data.get('format'))}, expected {PLAN_FORMAT!r}; "
            f"{REGENERATE}"
        )
    for key in ("schedule", "num_stages", "num_microbatches", "stages"):
        if key not in data:
            raise PlanError(f"{source}: missing key {key!r}; {REGENERATE}")
    if data["schedule"] not in ALL_SCHEDULES:
        raise PlanError(
            f"{source}: 'schedule' is {shown(data['schedule'])}, expected one of "
            f"{ALL_SCHEDULES}; {REGENERATE}"
        )
    num_stages = _positive_int(data, "num_stages", source)
    num_microbatches = _positive_int(data, "num_microbatches", source)
    stages_raw = data["stages"]
    if not isinstance(stages_raw, list) or len(stages_raw) != num_stages:
        found = (
            f"a list of {len(stages_raw)}"
            if isinstance(stages_raw, list)
            else type(stages_raw).__name__
        )
        raise PlanError(
            f"{source}: 'stages' must be a list of num_stages={num_stages} lists (one per "
            f"pipeline stage), found {found}; {REGENERATE}"
        )
    stages = [
        _stage_from_json(stage, num_microbatches, source, s) for s, stage in enumerate(stages_raw)
    ]
    if data["schedule"] not in SCHEDULES:
        check_order(stages, str(data["schedule"]), source)
    time_s, energy_j = _predicted(data.get("predicted"), source)
    extra = {k: v for k, v in data.items() if k not in _KNOWN_KEYS}
    return Plan(
        schedule=str(data["schedule"]),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stages=stages,
        predicted_iteration_time_s=time_s,
        predicted_energy_j=energy_j,
        extra=extra,
    )


_KNOWN_KEYS = {"format", "schedule", "num_stages", "num_microbatches", "predicted", "stages"}
COUNT = Range(ge=1, le=10**6, integer=True)
PREDICTED = {
    "iteration_time_s": Range(gt=0.0, optional=True, unit="s"),
    "energy_j": Range(ge=0.0, optional=True, unit="J"),
}


def _positive_int(data: Dict[str, Any], key: str, source: str) -> int:
    value = data[key]
    problem = COUNT.problem(value)
    if problem:
        raise PlanError(f"{source}: {key!r} is {shown(value)}; it {problem}")
    return int(value)


def _predicted(predicted: Any, source: str) -> Tuple[Optional[float], Optional[float]]:
    if predicted is None:
        return None, None
    if not isinstance(predicted, dict):
        raise PlanError(
            f"{source}: 'predicted' must be an object with iteration_time_s and energy_j, "
            f"found {shown(predicted)}; {REGENERATE}"
        )
    for key, allowed in PREDICTED.items():
        problem = allowed.problem(predicted.get(key))
        if problem:
            raise PlanError(
                f"{source}: predicted.{key} is {shown(predicted.get(key))}; it {problem}; "
                f"{REGENERATE}"
            )
    return predicted.get("iteration_time_s"), predicted.get("energy_j")


def _stage_from_json(stage: Any, num_microbatches: int, source: str, index: int) -> List[PlanStep]:
    where = f"{source}: stages[{index}]"
    if not isinstance(stage, list):
        raise PlanError(
            f"{where}: expected a list of instructions in execution order, got {shown(stage)}"
        )
    steps = []
    for i, step in enumerate(stage):
        if not isinstance(step, dict):
            raise PlanError(
                f"{where}[{i}]: expected an object with instruction, microbatch and "
                f"frequency_mhz, got {shown(step)}"
            )
        steps.append(
            step_from_values(
                step.get("instruction"),
                step.get("microbatch"),
                step.get("frequency_mhz"),
                f"{where}[{i}]",
                step.get("pipeline_stage"),
            )
        )
    check_stage(steps, num_microbatches, f"{source}: stage {index}")
    return steps


def plan_from_reference(text: str, source: str = "<reference plan>") -> Plan:
    """Parse the reference ``freqs_pipeline_%05d.py`` literal (never executed)."""
    try:
        raw = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        where = f", line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise PlanError(
            f"{source}{where}: not a Python literal of per-stage (instruction, frequency) lists "
            f"({type(exc).__name__}: {_first_line(exc)}); {REGENERATE}"
        ) from None
    if not isinstance(raw, (list, tuple)) or not raw:
        raise PlanError(
            f"{source}: expected a non-empty list with one list per stage, found {shown(raw)}"
        )
    stages: List[List[PlanStep]] = []
    for s, stage in enumerate(raw):
        if not isinstance(stage, (list, tuple)):
            raise PlanError(
                f"{source}: stage {s} must be a list of (instruction, frequency) pairs, "
                f"got {shown(stage)}"
            )
        counters = {name: 0 for name in INSTRUCTIONS}
        steps = []
        for i, item in enumerate(stage):
            where = f"{source}: stage {s}, item {i}"
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise PlanError(f"{where}: expected (instruction, frequency), got {shown(item)}")
            name, freq = item
            mb = counters.get(name, 0)
            steps.append(step_from_values(name, mb, freq, where))
            counters[name] = mb + 1
        stages.append(steps)
    num_mb = sum(1 for st in stages[0] if st.instruction == "forward")
    if num_mb == 0:
        raise PlanError(
            f"{source}: stage 0 has no forward instruction; every stage lists each "
            "microbatch's forward and backward in execution order"
        )
    for s, steps in enumerate(stages):
        check_stage(steps, num_mb, f"{source}: stage {s}")
    return Plan(schedule="1f1b", num_stages=len(stages), num_microbatches=num_mb, stages=stages)


def check_plan_for_job(
    plan: Plan,
    *,
    num_stages: int,
    num_microbatches: int,
    source: str,
    schedule: Optional[ScheduleLike] = None,
    num_model_chunks: int = 1,
) -> None:
    """Check that ``plan`` fits the job it is applied to.

    Args:
        plan: The plan.
        num_stages: The job's pipeline stages (``parallelism.pp``).
        num_microbatches: Microbatches per iteration (``parallelism.num_microbatches``).
        source: The plan file, named in messages.
        schedule: The schedule the job runs; when given, each stage's instruction order must
            be that schedule's (what a strict plan source checks at every position).
        num_model_chunks: Model chunks per stage of ``schedule``.

    Raises:
        PlanError: naming what the plan has, what the job runs and the setting to change.
    """
    shape = []  # every count that differs, so that one message names them all
    if plan.num_stages != num_stages:
        shape.append(f"{plan.num_stages} stages but the job runs {num_stages} (parallelism.pp)")
    if plan.num_microbatches != num_microbatches:
        shape.append(
            f"{plan.num_microbatches} microbatches per iteration but the job runs "
            f"{num_microbatches} (parallelism.num_microbatches)"
        )
    if shape:
        raise PlanError(
            f"plan {source} has {', and '.join(shape)}; plan for this job with perseus-plan"
        )
    if schedule is None:
        return
    if isinstance(schedule, str) and schedule in ORDER_SCHEDULES:
        # The engine says its order only once it runs; its ranks check the plan position by
        # position. Before that, the plan must be one of this schedule's.
        if plan.schedule != schedule:
            raise PlanError(
                f"plan {source} is for the {plan.schedule} schedule but the job runs "
                f"{schedule}; plan with the job's own run (perseus-runs/<job>/plan.json)"
            )
        return
    orders = stage_order_chunks(schedule, num_stages, num_microbatches, num_model_chunks)
    for stage, (order, steps) in enumerate(zip(orders, plan.stages)):
        runs = [name for name, _, _ in order]
        has = [step.instruction for step in steps]
        if runs == has:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(runs, has)) if a != b), min(len(runs), len(has))
        )
        expected = runs[at] if at < len(runs) else "the end of the iteration"
        found = has[at] if at < len(has) else "the end of the plan"
        raise PlanError(
            f"plan {source} (schedule {plan.schedule}) does not follow the job's schedule "
            f"{schedule}: stage {stage}, position {at} has {found} where the job runs {expected}; "
            f"plan with parallelism.schedule={schedule}, or set runtime.strict=false to fall back "
            "to per-microbatch clocks"
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
