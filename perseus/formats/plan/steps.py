"""One stage's instructions in a plan, and the checks every plan format runs on them.

Part of the plan formats (:mod:`perseus.formats.plan.document`, ``docs/design.md``, "Plan JSON").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from perseus.config.numbers import Range
from perseus.errors import ConfigError, PlanError
from perseus.formats.profile.table import INSTRUCTIONS
from perseus.pipeline_order import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    PipelineOrder,
)

REGENERATE = "regenerate the plan with perseus-plan"
MICROBATCH = Range(ge=0, lt=10**6, integer=True)
STAGE = Range(ge=0, lt=10**4, integer=True)
FREQUENCY = Range(gt=0, le=100_000, integer=True, unit="MHz")


@dataclass(frozen=True)
class PlanStep:
    """One instruction of one stage at its frequency.

    ``pipeline_stage`` is the model chunk it computes, numbered along the model, in plans of a
    schedule given by an engine's order (``None`` for the schedules Perseus generates).
    """

    instruction: str
    microbatch: int
    frequency_mhz: int
    pipeline_stage: Optional[int] = None


def step_json(step: PlanStep) -> Dict[str, Any]:
    """The step as a JSON object (``pipeline_stage`` only where the plan names stages)."""
    out: Dict[str, Any] = {
        "instruction": step.instruction,
        "microbatch": step.microbatch,
        "frequency_mhz": step.frequency_mhz,
    }
    if step.pipeline_stage is not None:
        out["pipeline_stage"] = step.pipeline_stage
    return out


def check_order(stages: List[List[PlanStep]], schedule: str, source: str) -> None:
    """A plan of an engine's order names each instruction's pipeline stage, consistently."""
    if any(s.pipeline_stage is None for st in stages for s in st):
        raise PlanError(
            f"{source}: a plan of the {schedule} schedule (an engine's own order) names every "
            f"instruction's pipeline_stage; {REGENERATE}"
        )
    try:
        order = PipelineOrder.of(
            schedule,
            [
                [(s.instruction, s.microbatch, int(s.pipeline_stage or 0)) for s in st]
                for st in stages
            ],
        )
        order.check()
    except ConfigError as exc:
        raise PlanError(f"{source}: {exc}; {REGENERATE}") from None


def step_from_values(
    instruction: Any, microbatch: Any, frequency: Any, where: str, pipeline_stage: Any = None
) -> PlanStep:
    """A :class:`PlanStep` of checked values.

    Raises:
        PlanError: naming ``where``, the value and what is wrong with it.
    """
    if instruction not in INSTRUCTIONS:
        raise PlanError(
            f"{where}: instruction {shown(instruction)} is not one of {INSTRUCTIONS}; fix the "
            f"entry or {REGENERATE}"
        )
    problem = MICROBATCH.problem(microbatch)
    if problem:
        raise PlanError(f"{where}: microbatch {shown(microbatch)} {problem}")
    problem = FREQUENCY.problem(frequency)
    if problem:
        raise PlanError(f"{where}: frequency {shown(frequency)} {problem}")
    if pipeline_stage is not None:
        problem = STAGE.problem(pipeline_stage)
        if problem:
            raise PlanError(f"{where}: pipeline_stage {shown(pipeline_stage)} {problem}")
    return PlanStep(instruction, microbatch, frequency, pipeline_stage)


def check_stage(steps: List[PlanStep], num_microbatches: int, where: str) -> None:
    """Each microbatch's forward and backward equally often (once per model chunk).

    A backward may run whole or split into its input and weight halves.
    """
    counts = {
        name: Counter(s.microbatch for s in steps if s.instruction == name)
        for name in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
    }
    backwards = counts[BACKWARD] + counts[BACKWARD_INPUT]
    for name, seen in ((FORWARD, counts[FORWARD]), ("backward", backwards)):
        outside = sorted(m for m in seen if m >= num_microbatches)
        missing = [m for m in range(num_microbatches) if m not in seen] if not outside else []
        uneven = not outside and not missing and len(set(seen.values())) > 1
        unmatched = (
            name != FORWARD
            and not (outside or missing or uneven)
            and (seen != counts[FORWARD] or counts[BACKWARD_INPUT] != counts[BACKWARD_WEIGHT])
        )
        if not seen or outside or missing or uneven or unmatched:
            found = (
                f"microbatch(es) {_few(outside)} beyond num_microbatches={num_microbatches}"
                if outside
                else f"no {name} of microbatch(es) {_few(missing)}"
                if missing
                else f"microbatches {_few(sorted(seen))} a different number of times"
                if uneven
                else "backwards (whole, or input and weight halves in pairs) and forwards "
                "that do not match"
                if unmatched
                else f"no {name} at all"
            )
            raise PlanError(
                f"{where}: expected every microbatch 0..{num_microbatches - 1} to have a "
                f"{name} (once per model chunk), found {found}; {REGENERATE}"
            )


def _few(values: List[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return f"[{shown}{', ...' if len(values) > 8 else ''}]"


def shown(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
