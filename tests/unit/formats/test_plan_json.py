"""Plan files: JSON round trip, the reference literal format, and clear rejections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.errors import PlanError
from perseus.formats.plan.document import (
    Plan,
    PlanStep,
    load_plan,
    plan_from_dict,
    plan_from_reference,
)


def _plan() -> Plan:
    order = [
        [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)],
        [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)],
    ]
    stages = [
        [PlanStep(name, mb, 1410 - 15 * i) for i, (name, mb) in enumerate(stage)] for stage in order
    ]
    return Plan(
        schedule="1f1b",
        num_stages=2,
        num_microbatches=2,
        stages=stages,
        predicted_iteration_time_s=1.5,
        predicted_energy_j=300.0,
    )


def test_json_round_trip(tmp_path: Path) -> None:
    plan = _plan()
    path = plan.write(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["format"] == "perseus-plan/1"
    assert data["predicted"] == {"iteration_time_s": 1.5, "energy_j": 300.0}
    assert data["stages"][1][1] == {
        "instruction": "backward",
        "microbatch": 0,
        "frequency_mhz": 1395,
    }
    again = load_plan(path)
    assert again == plan


def test_reference_literal_round_trip(tmp_path: Path) -> None:
    plan = _plan()
    path = tmp_path / "freqs_pipeline_00003.py"
    path.write_text(plan.to_reference_literal())
    again = load_plan(path)
    assert again.stages == plan.stages
    assert again.num_microbatches == 2


def test_reference_file_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "freqs_pipeline_00000.py"
    path.write_text(f"__import__('pathlib').Path({str(marker)!r}).touch()\n")
    with pytest.raises(PlanError, match="not a Python literal"):
        load_plan(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="v0"), "'format' is 'v0'"),
        (lambda d: d.pop("stages"), "missing key 'stages'"),
        (
            lambda d: d["stages"][0][0].update(instruction="fwd"),
            r"stages\[0\]\[0\]: instruction 'fwd'",
        ),
        (lambda d: d["stages"][1][2].update(frequency_mhz=-5), r"stages\[1\]\[2\]: frequency -5"),
        (lambda d: d["stages"][0].pop(), "stage 0: expected every microbatch"),
        (lambda d: d.update(num_stages=3), "num_stages=3"),
        (lambda d: d.update(num_stages="2"), "'num_stages' is '2'; it must be an integer in 1.."),
        (
            lambda d: d.update(num_microbatches=0),
            "'num_microbatches' is 0; it must be an integer in 1..",
        ),
        (lambda d: d.update(num_microbatches="x"), "'num_microbatches' is 'x'"),
        (lambda d: d["stages"].__setitem__(1, 5), r"stages\[1\]: expected a list"),
        (lambda d: d.update(predicted=[1.0]), "'predicted' must be an object"),
    ],
)
def test_bad_plans_are_rejected_with_location(mutate, message: str) -> None:
    data = _plan().to_dict()
    mutate(data)
    with pytest.raises(PlanError, match=message):
        plan_from_dict(data, source="p.json")


def test_bad_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(PlanError, match=str(path)):
        load_plan(path)


def test_missing_file_says_which_key(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="runtime.plan"):
        load_plan(tmp_path / "nope.json")


def test_reference_rejects_unknown_instruction() -> None:
    with pytest.raises(PlanError, match="stage 0, item 1"):
        plan_from_reference("[[('forward', 1410), ('jump', 1200)]]")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[5]", "stage 0 must be a list of"),
        ("[[('backward', 1410)]]", "stage 0 has no forward instruction"),
        ("[]", "non-empty list"),
    ],
)
def test_reference_structure_errors_name_the_stage(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_reference(text, source="freqs_pipeline_00000.py")
