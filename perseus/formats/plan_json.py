"""Frequency plans: the planner's output and the runtime's input (``docs/design.md``, "Plan JSON").

A plan is data. JSON plans use the ``perseus-plan/1`` format; the reference system's
``freqs_pipeline_%05d.py`` files (a Python literal) are read with :func:`ast.literal_eval`,
never executed.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from perseus.errors import PlanError
from perseus.formats.atomic_file import write_json_atomic
from perseus.formats.profile_csv import INSTRUCTIONS

PLAN_FORMAT = "perseus-plan/1"


@dataclass(frozen=True)
class PlanStep:
    """One instruction of one stage at its frequency."""

    instruction: str
    microbatch: int
    frequency_mhz: int


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
            "stages": [
                [
                    {
                        "instruction": s.instruction,
                        "microbatch": s.microbatch,
                        "frequency_mhz": s.frequency_mhz,
                    }
                    for s in stage
                ]
                for stage in self.stages
            ],
        }
        out.update(self.extra)
        return out

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
        PlanError: naming the file and what is wrong with it.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"cannot read plan file {path}: {exc}; check runtime.plan") from exc
    if path.suffix == ".py":
        return plan_from_reference(text, source=str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(
            f"{path}: not valid JSON ({exc}); a plan is the plan.json written by perseus-plan"
        ) from exc
    return plan_from_dict(data, source=str(path))


def plan_from_dict(data: Any, source: str = "<plan>") -> Plan:
    """Build a :class:`Plan` from its JSON dict, checking every field.

    Raises:
        PlanError: naming ``source``, the key and how to fix it.
    """
    if not isinstance(data, dict):
        raise PlanError(
            f"{source}: a plan must be a JSON object, got {type(data).__name__}; {_REGENERATE}"
        )
    if data.get("format") != PLAN_FORMAT:
        raise PlanError(
            f"{source}: 'format' is {data.get('format')!r}, expected {PLAN_FORMAT!r}; {_REGENERATE}"
        )
    for key in ("schedule", "num_stages", "num_microbatches", "stages"):
        if key not in data:
            raise PlanError(f"{source}: missing key {key!r}; {_REGENERATE}")
    num_stages = _positive_int(data, "num_stages", source)
    num_microbatches = _positive_int(data, "num_microbatches", source)
    stages_raw = data["stages"]
    if not isinstance(stages_raw, list) or len(stages_raw) != num_stages:
        raise PlanError(
            f"{source}: 'stages' must be a list of num_stages={num_stages} lists (one per "
            f"pipeline stage); {_REGENERATE}"
        )
    stages = [
        _stage_from_json(stage, num_microbatches, source, s) for s, stage in enumerate(stages_raw)
    ]
    predicted = data.get("predicted") or {}
    if not isinstance(predicted, dict):
        raise PlanError(
            f"{source}: 'predicted' must be an object with iteration_time_s and energy_j; "
            f"{_REGENERATE}"
        )
    extra = {k: v for k, v in data.items() if k not in _KNOWN_KEYS}
    return Plan(
        schedule=str(data["schedule"]),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stages=stages,
        predicted_iteration_time_s=predicted.get("iteration_time_s"),
        predicted_energy_j=predicted.get("energy_j"),
        extra=extra,
    )


_KNOWN_KEYS = {"format", "schedule", "num_stages", "num_microbatches", "predicted", "stages"}
_REGENERATE = "regenerate the plan with perseus-plan"


def _positive_int(data: Dict[str, Any], key: str, source: str) -> int:
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{source}: {key!r} is {value!r}; it must be a positive integer")
    return value


def _stage_from_json(stage: Any, num_microbatches: int, source: str, index: int) -> List[PlanStep]:
    where = f"{source}: stages[{index}]"
    if not isinstance(stage, list):
        raise PlanError(
            f"{where}: expected a list of instructions in execution order, got {stage!r}"
        )
    steps = []
    for i, step in enumerate(stage):
        if not isinstance(step, dict):
            raise PlanError(
                f"{where}[{i}]: expected an object with instruction, microbatch and "
                f"frequency_mhz, got {step!r}"
            )
        steps.append(
            _step(
                step.get("instruction"),
                step.get("microbatch"),
                step.get("frequency_mhz"),
                f"{where}[{i}]",
            )
        )
    _check_stage(steps, num_microbatches, f"{source}: stage {index}")
    return steps


def plan_from_reference(text: str, source: str = "<reference plan>") -> Plan:
    """Parse the reference ``freqs_pipeline_%05d.py`` literal (never executed)."""
    try:
        raw = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError) as exc:
        raise PlanError(
            f"{source}: not a Python literal of per-stage (instruction, frequency) lists: {exc}"
        ) from exc
    if not isinstance(raw, (list, tuple)) or not raw:
        raise PlanError(f"{source}: expected a non-empty list with one list per stage")
    stages: List[List[PlanStep]] = []
    for s, stage in enumerate(raw):
        if not isinstance(stage, (list, tuple)):
            raise PlanError(
                f"{source}: stage {s} must be a list of (instruction, frequency) pairs, "
                f"got {stage!r}"
            )
        counters = {name: 0 for name in INSTRUCTIONS}
        steps = []
        for i, item in enumerate(stage):
            where = f"{source}: stage {s}, item {i}"
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise PlanError(f"{where}: expected (instruction, frequency), got {item!r}")
            name, freq = item
            mb = counters.get(name, 0)
            steps.append(_step(name, mb, freq, where))
            counters[name] = mb + 1
        stages.append(steps)
    num_mb = sum(1 for st in stages[0] if st.instruction == "forward")
    if num_mb == 0:
        raise PlanError(
            f"{source}: stage 0 has no forward instruction; every stage lists each "
            "microbatch's forward and backward in execution order"
        )
    for s, steps in enumerate(stages):
        _check_stage(steps, num_mb, f"{source}: stage {s}")
    return Plan(schedule="1f1b", num_stages=len(stages), num_microbatches=num_mb, stages=stages)


def _step(instruction: Any, microbatch: Any, frequency: Any, where: str) -> PlanStep:
    if instruction not in INSTRUCTIONS:
        raise PlanError(
            f"{where}: instruction {instruction!r} is not one of {INSTRUCTIONS}; fix the "
            f"entry or {_REGENERATE}"
        )
    if not isinstance(microbatch, int) or isinstance(microbatch, bool) or microbatch < 0:
        raise PlanError(f"{where}: microbatch {microbatch!r} must be an integer >= 0")
    if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency <= 0:
        raise PlanError(f"{where}: frequency {frequency!r} must be a positive integer (MHz)")
    return PlanStep(instruction, microbatch, frequency)


def _check_stage(steps: List[PlanStep], num_microbatches: int, where: str) -> None:
    for name in INSTRUCTIONS:
        mbs = sorted(s.microbatch for s in steps if s.instruction == name)
        # Interleaved schedules run each microbatch once per model chunk: allow multiples.
        if not mbs or len(mbs) % num_microbatches or set(mbs) != set(range(num_microbatches)):
            raise PlanError(
                f"{where}: expected every microbatch 0..{num_microbatches - 1} to have a "
                f"{name}, found microbatches {mbs}"
            )
