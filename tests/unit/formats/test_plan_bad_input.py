"""Malformed plans, as users and other tools produce them: each one a PlanError with a position.

Files are written as real bytes and read with :func:`load_plan` (what ``runtime.plan`` and the
launcher's preflight use); structural cases mutate a valid plan's JSON. The message must name the
file, where in it the problem is (line and column, or the key path) and what was found; nothing
else may escape (UnicodeDecodeError, RecursionError, ValueError, ...). Writing refuses NaN.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from perseus.errors import NonFiniteError, PlanError
from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.plan.document import (
    Plan,
    PlanStep,
    check_plan_for_job,
    load_plan,
    plan_from_dict,
)
from perseus.formats.strict_json import dumps
from perseus.schedule import stage_order


def _plan(schedule: str = "1f1b", num_stages: int = 2, num_microbatches: int = 2) -> Plan:
    order = stage_order(schedule, num_stages, num_microbatches)
    stages = [[PlanStep(name, mb, 1410) for name, mb in stage] for stage in order]
    return Plan(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stages=stages,
        predicted_iteration_time_s=1.5,
        predicted_energy_j=300.0,
    )


def _dict() -> Dict[str, Any]:
    return _plan().to_dict()


def _load(tmp_path: Path, data: bytes, name: str = "plan.json") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    message = str(info.value)
    assert str(path) in message
    return message


GOOD = json.dumps(_dict()).encode()

BAD_BYTES = [
    (b"\xff\xfe{}", ["line 1 column 1", "byte 0xff is not UTF-8"]),
    (json.dumps(_dict(), indent=1).encode("utf-16"), ["byte 0xff is not UTF-8"]),
    (GOOD.replace(b'"schedule"', b'"sch\xe9dule"'), ["line 1 column", "byte 0xe9"]),
    (b"[" * 100_000 + b"]" * 100_000, ["line 1 column 100000", "nested too deeply"]),
    (b'{"format": ' + b"7" * 5000 + b"}", ["line 1 column 12", "5000 digits cannot be read"]),
    (GOOD.replace(b'"energy_j": 300.0', b'"energy_j": NaN'), ["NaN is not a JSON number"]),
    (GOOD.replace(b'"frequency_mhz": 1410', b'"frequency_mhz": Infinity', 1), ["Infinity is"]),
    (GOOD.replace(b"1.5", b"-Infinity"), ["-Infinity is not a JSON number"]),
    (GOOD[:-40], ["not valid JSON"]),
    (GOOD + b"garbage", ["not valid JSON (Extra data)"]),
    (b"{'format': 'perseus-plan/1'}", ["line 1 column 2", "not valid JSON"]),
    (b"", ["is empty"]),
    (b"  \n\t\n", ["is empty"]),
    (b"[1, 2]", ["a plan must be a JSON object, got list"]),
    (b'"plan"', ["got str"]),
    (b"null", ["got NoneType"]),
    (b"{}", ["'format' is None, expected 'perseus-plan/1'"]),
]


@pytest.mark.parametrize(("data", "fragments"), BAD_BYTES)
def test_bad_file_content(tmp_path: Path, data: bytes, fragments: List[str]) -> None:
    message = _load(tmp_path, data)
    for fragment in fragments:
        assert fragment in message, message


def test_nan_position_is_its_line(tmp_path: Path) -> None:
    data = json.dumps(_dict(), indent=1).replace('"energy_j": 300.0', '"energy_j": NaN')
    line = next(i for i, text in enumerate(data.splitlines(), 1) if "NaN" in text)
    assert f"line {line} column 15: NaN" in _load(tmp_path, data.encode())


def test_directory_and_missing_file(tmp_path: Path) -> None:
    folder = tmp_path / "plan.json"
    folder.mkdir()
    with pytest.raises(PlanError, match="is a directory, not a file; check runtime.plan"):
        load_plan(folder)
    with pytest.raises(PlanError, match="does not exist; check runtime.plan"):
        load_plan(tmp_path / "other.json")


@pytest.mark.parametrize(
    "data",
    [b"\xef\xbb\xbf" + GOOD, json.dumps(_dict(), indent=2).replace("\n", "\r\n").encode()],
)
def test_bom_and_crlf_are_read(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    assert load_plan(path) == _plan()


Mutation = Callable[[Dict[str, Any]], Any]

BAD_STRUCTURE: List[tuple] = [
    (lambda d: d.update(format="perseus-plan/2"), "'format' is 'perseus-plan/2'"),
    (lambda d: d.pop("schedule"), "missing key 'schedule'"),
    (lambda d: d.pop("num_microbatches"), "missing key 'num_microbatches'"),
    (lambda d: d.update(schedule="zigzag"), "'schedule' is 'zigzag', expected one of"),
    (lambda d: d.update(schedule=5), "'schedule' is 5"),
    (lambda d: d.update(num_stages="2"), "'num_stages' is '2'; it must be an integer"),
    (lambda d: d.update(num_stages=0), "'num_stages' is 0"),
    (lambda d: d.update(num_stages=-1), "'num_stages' is -1"),
    (lambda d: d.update(num_stages=2.0), "'num_stages' is 2.0"),
    (lambda d: d.update(num_stages=True), "'num_stages' is True"),
    (lambda d: d.update(num_stages=None), "'num_stages' is None"),
    (lambda d: d.update(num_stages=10**7), "'num_stages' is 10000000"),
    (lambda d: d.update(num_stages=3), "'stages' must be a list of num_stages=3 lists"),
    (lambda d: d.update(num_microbatches=10**6), "no forward of microbatch(es) [2, 3, 4,"),
    (lambda d: d.update(num_microbatches=1), "microbatch(es) [1] beyond num_microbatches=1"),
    (lambda d: d.update(stages={"0": []}), "'stages' must be a list of num_stages=2 lists"),
    (lambda d: d["stages"].append([]), "found a list of 3"),
    (lambda d: d["stages"].__setitem__(1, 5), r"stages[1]: expected a list"),
    (lambda d: d["stages"][0].__setitem__(0, ["forward", 0, 1410]), "stages[0][0]: expected an"),
    (lambda d: d["stages"][0][0].update(instruction="fwd"), "stages[0][0]: instruction 'fwd'"),
    (lambda d: d["stages"][0][0].pop("instruction"), "stages[0][0]: instruction None"),
    (lambda d: d["stages"][0][0].update(instruction=5), "stages[0][0]: instruction 5"),
    (lambda d: d["stages"][0][1].update(microbatch=-1), "stages[0][1]: microbatch -1"),
    (lambda d: d["stages"][0][1].update(microbatch="1"), "stages[0][1]: microbatch '1'"),
    (lambda d: d["stages"][0][1].update(microbatch=1.5), "stages[0][1]: microbatch 1.5"),
    (lambda d: d["stages"][0][1].update(microbatch=True), "stages[0][1]: microbatch True"),
    (lambda d: d["stages"][0][1].pop("microbatch"), "stages[0][1]: microbatch None"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=0), "stages[1][2]: frequency 0"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=-5), "stages[1][2]: frequency -5"),
    (lambda d: d["stages"][1][2].update(frequency_mhz="1410"), "frequency '1410' must be"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=1410.5), "frequency 1410.5 must be"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=10**6), "<= 100000 MHz"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=None), "frequency None"),
    (lambda d: d["stages"][1][2].update(frequency_mhz=False), "frequency False"),
    (lambda d: d["stages"][0].pop(), "stage 0: expected every microbatch 0..1 to have a backward"),
    (lambda d: d["stages"][0][3].update(microbatch=0), "no backward of microbatch(es) [1]"),
    (
        lambda d: d["stages"][0].extend([dict(d["stages"][0][0])] * 2),
        "a different number of times",
    ),
    (lambda d: d.update(predicted=[1.0]), "'predicted' must be an object"),
    (lambda d: d["predicted"].update(iteration_time_s="x"), "predicted.iteration_time_s is 'x'"),
    (lambda d: d["predicted"].update(iteration_time_s=0), "predicted.iteration_time_s is 0"),
    (lambda d: d["predicted"].update(energy_j=-5), "predicted.energy_j is -5"),
    (lambda d: d["predicted"].update(energy_j=float("inf")), "predicted.energy_j is inf"),
]


@pytest.mark.parametrize(("mutate", "fragment"), BAD_STRUCTURE)
def test_bad_structure_names_the_key(mutate: Mutation, fragment: str) -> None:
    data = _dict()
    mutate(data)
    with pytest.raises(PlanError) as info:
        plan_from_dict(data, source="p.json")
    message = str(info.value)
    assert message.startswith("p.json") and fragment in message, message


def test_unknown_keys_are_kept_and_missing_prediction_is_fine() -> None:
    data = _dict()
    data["policy"], data["note"] = "no_slowdown", {"any": [1, 2]}
    data.pop("predicted")
    plan = plan_from_dict(data)
    assert plan.extra == {"policy": "no_slowdown", "note": {"any": [1, 2]}}
    assert plan.predicted_energy_j is None


BAD_REFERENCE = [
    ("__import__('os').system('true')", "not a Python literal"),
    ("[[('forward', 1410),\n ('backward', 1410)]", "line 1: not a Python literal"),
    ("[" * 10_000 + "]" * 10_000, "not a Python literal"),
    ("[[('forward', " + "9" * 5000 + "), ('backward', 1410)]]", "not a Python literal"),
    ("{'stages': []}", "expected a non-empty list with one list per stage, found"),
    ("[]", "non-empty list"),
    ("[[('forward', 1410, 3)]]", "stage 0, item 0: expected (instruction, frequency)"),
    ("[[('forward', 1410.5), ('backward', 1410)]]", "frequency 1410.5"),
    ("[[('forward', -1), ('backward', 1410)]]", "frequency -1"),
    ("[[('jump', 1410)]]", "instruction 'jump'"),
    ("[[('forward', 1410), ('backward', 1410)], [('forward', 1410)]]", "stage 1: expected"),
    ("[[('backward', 1410)]]", "stage 0 has no forward instruction"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_REFERENCE)
def test_bad_reference_plan(tmp_path: Path, text: str, fragment: str) -> None:
    message = _load(tmp_path, text.encode(), name="freqs_pipeline_00000.py")
    assert fragment in message, message


def test_reference_plan_that_is_not_utf8(tmp_path: Path) -> None:
    assert "byte 0xff" in _load(tmp_path, b"[[('forward', 1410)]]\xff", "freqs_pipeline_00001.py")


@pytest.mark.parametrize(
    ("job", "fragment"),
    [
        ({"num_stages": 4}, "has 2 stages but the job runs 4 (parallelism.pp)"),
        (
            {"num_microbatches": 3},
            "has 2 microbatches per iteration but the job runs 3 (parallelism.num_microbatches)",
        ),
        (
            {"num_stages": 4, "num_microbatches": 8},
            "has 2 stages but the job runs 4 (parallelism.pp), and 2 microbatches per iteration "
            "but the job runs 8 (parallelism.num_microbatches); plan for this job",
        ),
        ({"schedule": "gpipe"}, "stage 1, position 1 has backward where the job runs forward"),
        (
            {"schedule": "interleaved_1f1b", "num_model_chunks": 2},
            "does not follow the job's schedule interleaved_1f1b",
        ),
    ],
)
def test_plan_that_does_not_fit_the_job(job: Dict[str, Any], fragment: str) -> None:
    fits: Dict[str, Any] = {"num_stages": 2, "num_microbatches": 2, "source": "p.json"}
    fits.update(job)
    with pytest.raises(PlanError) as info:
        check_plan_for_job(_plan(), **fits)
    assert fragment in str(info.value) and "p.json" in str(info.value)


def test_plan_for_another_schedule_names_both() -> None:
    with pytest.raises(PlanError) as info:
        check_plan_for_job(
            _plan("gpipe", 2, 4), num_stages=2, num_microbatches=4, source="p", schedule="1f1b"
        )
    message = str(info.value)
    assert "(schedule gpipe)" in message and "parallelism.schedule=1f1b" in message
    assert "runtime.strict=false" in message
    check_plan_for_job(_plan(), num_stages=2, num_microbatches=2, source="p", schedule="1f1b")


def test_writing_a_plan_with_nan_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    plan = _plan()
    plan.predicted_energy_j = float("nan")
    with pytest.raises(NonFiniteError, match=r"plan.json: predicted.energy_j is nan"):
        plan.write(tmp_path / "plan.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"chosen": {"saving": float("inf")}}, "chosen.saving is inf"),
        ({"rows": [[1.0, 2.0], [3.0, float("-inf")]]}, "rows[1][1] is -inf"),
        ({"p2p_power_w": [80.0, float("nan")]}, "p2p_power_w[1] is nan"),
    ],
)
def test_json_outputs_are_strict(tmp_path: Path, data: Dict[str, Any], path: str) -> None:
    with pytest.raises(NonFiniteError, match=path.replace("[", r"\[").replace("]", r"\]")):
        plan_outputs.write_summary(tmp_path, data)
    assert not (tmp_path / plan_outputs.SUMMARY_JSON).exists()
    with pytest.raises(NonFiniteError):
        dumps(data, what="x")


def test_a_bad_plan_among_the_frontier_plans_is_named(tmp_path: Path) -> None:
    plans = tmp_path / plan_outputs.PLANS_DIR
    plans.mkdir()
    _plan().write(plans / "0.json")
    (plans / "1.json").write_bytes(b'{"format": "perseus-plan/1", "num_stages": NaN}')
    with pytest.raises(PlanError, match=r"1\.json, line 1 column 44: NaN"):
        plan_outputs.read_frontier_plans(tmp_path)
