"""A backward's halves (backward_input, backward_weight) through profiles, plans and the wire."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pydantic
import pytest

from perseus import PerseusOptimizer
from perseus.errors import PlanError, ProfileError
from perseus.formats.plan.document import (
    Plan,
    PlanStep,
    check_plan_for_job,
    load_plan,
    plan_from_dict,
)
from perseus.formats.profile.split import split_backward
from perseus.formats.profile.table import Profile, parse_profile_csv
from perseus.pipeline_order import PipelineOrder
from perseus.records import RankInfo
from perseus.runtime.sources import PlanSource
from perseus.schedule import pipeline_order
from perseus.server.limits import job_positions
from perseus.wire import (
    InstructionReport,
    JobSpec,
    describe_item,
    encode_sequence,
    first_difference,
    from_json,
    to_json,
)
from tests.unit.runtime.fakes import RecordingGPU

ORDER = PipelineOrder("zbv_zero_bubble", ["0F0,1F0,1I0,1W0,0I0,0W0"])


def _whole_profile() -> Profile:
    return Profile.from_rows(
        [
            (0, kind, f, t * (1410 / f), e)
            for kind, t, e in (("forward", 0.1, 20.0), ("backward", 0.2, 44.0))
            for f in (1410, 1200)
        ]
    )


def test_split_backward_halves_the_backward_at_every_clock() -> None:
    whole = _whole_profile()
    split = split_backward(whole)
    assert split.kinds() == ("forward", "backward", "backward_input", "backward_weight")
    for f in (1410, 1200):
        b = split.lookup(0, "backward", f)
        i, w = split.lookup(0, "backward_input", f), split.lookup(0, "backward_weight", f)
        assert i.time_s + w.time_s == pytest.approx(b.time_s)
        assert i.energy_j + w.energy_j == pytest.approx(b.energy_j)
        assert i.energy_j / i.time_s == pytest.approx(b.energy_j / b.time_s)  # same power
    uneven = split_backward(whole, input_fraction=0.6)
    assert uneven.lookup(0, "backward_input", 1410).time_s == pytest.approx(0.12)
    # Measured halves stay as they were.
    assert split_backward(uneven).rows() == uneven.rows()
    with pytest.raises(ProfileError, match="strictly between 0 and 1"):
        split_backward(whole, input_fraction=1.0)


def test_profiles_with_halves_and_without_the_whole_backward() -> None:
    text = "stage,instruction,frequency,time,energy\n" + "".join(
        f"0,{kind},1410,0.1,20\n" for kind in ("forward", "backward_input", "backward_weight")
    )
    profile = parse_profile_csv(text)
    assert profile.kinds() == ("forward", "backward_input", "backward_weight")
    with pytest.raises(ProfileError, match="stage 0 has no backward_weight rows"):
        parse_profile_csv(text.replace("0,backward_weight,1410,0.1,20\n", ""))
    with pytest.raises(ProfileError, match="only one backward half"):
        split_backward(parse_profile_csv(text.replace("0,backward_weight,", "0,backward,")))


def _plan_dict(**changes: Any) -> Dict[str, Any]:
    steps = [
        {"instruction": kind, "microbatch": 0, "frequency_mhz": 1410, "pipeline_stage": stage}
        for kind, _, stage in ORDER.actions[0]
    ]
    data = {
        "format": "perseus-plan/1",
        "schedule": "zbv_zero_bubble",
        "num_stages": 1,
        "num_microbatches": 1,
        "stages": [steps],
    }
    data.update(changes)
    return data


def test_plan_of_an_engine_order_round_trips(tmp_path: Path) -> None:
    plan = plan_from_dict(_plan_dict())
    assert plan.pipeline_order() == ORDER
    path = plan.write(tmp_path / "plan.json")
    again = load_plan(path)
    assert again.stages == plan.stages and again.pipeline_order() == ORDER
    # A generated schedule's plan keeps its format: no pipeline stages.
    old = Plan(
        schedule="1f1b",
        num_stages=1,
        num_microbatches=1,
        stages=[[PlanStep("forward", 0, 1410), PlanStep("backward", 0, 1410)]],
    )
    assert "pipeline_stage" not in json.dumps(old.to_dict())
    assert old.pipeline_order() is None


def test_plan_of_an_engine_order_is_checked() -> None:
    data = _plan_dict()
    del data["stages"][0][2]["pipeline_stage"]
    with pytest.raises(PlanError, match="names every instruction's pipeline_stage"):
        plan_from_dict(data)
    data = _plan_dict()
    data["stages"][0].pop()  # stage 0's weight half
    with pytest.raises(PlanError, match="do not match"):
        plan_from_dict(data)
    data = _plan_dict()
    data["stages"][0][4]["pipeline_stage"] = 1  # stage 1 runs microbatch 0's input half twice
    with pytest.raises(PlanError, match="twice"):
        plan_from_dict(data)
    with pytest.raises(PlanError, match="expected one of"):
        plan_from_dict(_plan_dict(schedule="zero_bubble"))


def test_plan_of_an_engine_schedule_checked_against_the_job_by_name() -> None:
    plan = plan_from_dict(_plan_dict())
    check_plan_for_job(
        plan, num_stages=1, num_microbatches=1, source="p", schedule="zbv_zero_bubble"
    )
    with pytest.raises(PlanError, match="is for the zbv_zero_bubble schedule but the job runs"):
        check_plan_for_job(
            plan, num_stages=1, num_microbatches=1, source="p", schedule="dual_pipe_v"
        )


def test_the_hooks_count_each_kind_and_apply_the_plan(tmp_path: Path) -> None:
    plan = plan_from_dict(_plan_dict())
    gpu = RecordingGPU()
    opt = PerseusOptimizer.on_gpu(
        RankInfo(), gpu, PlanSource(plan, 0), state_dir=tmp_path, synchronous_clocks=True
    )
    for _ in range(2):
        opt.on_step_begin()
        for kind, _, _ in ORDER.actions[0]:
            opt.on_instruction_begin(kind)
            opt.on_instruction_end(kind)
        opt.on_step_end()
    assert opt.last_step is not None
    ran = [(r.instruction, r.microbatch) for r in opt.last_step.instructions]
    assert ran == ORDER.sequences()[0]
    first = [("forward", 0), ("forward", 1), ("backward_input", 0), ("backward_weight", 0)]
    assert ran[:4] == first
    opt.close()


def test_sequences_on_the_wire() -> None:
    seq = ORDER.sequences()[0]
    assert encode_sequence(seq) == "F0,F1,I0,W0,I1,W1"
    assert first_difference("F0,I0,W0", "F0,W0,I0") == (1, "I0", "W0")
    assert describe_item("W3") == "backward_weight of microbatch 3"
    report = pydantic.TypeAdapter(InstructionReport).validate_python(
        {"position": 2, "instruction": "backward_input", "microbatch": 0, "start_s": 1, "end_s": 2}
    )
    assert report.instruction == "backward_input"


def test_job_spec_carries_an_engine_order() -> None:
    spec = JobSpec(num_stages=1, num_microbatches=1, schedule=ORDER)
    data = to_json(spec)
    assert data["schedule"] == {"name": "zbv_zero_bubble", "ranks": list(ORDER.ranks)}
    assert from_json(JobSpec, data) == spec
    server = pydantic.TypeAdapter(JobSpec)
    assert server.validate_python(data) == spec
    assert job_positions(spec) == 6
    assert job_positions(JobSpec(num_stages=2, num_microbatches=3)) == 12
    # Generated schedules stay a name.
    assert server.validate_python({"num_stages": 1, "num_microbatches": 1}).schedule == "1f1b"


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (["0F0,1F0,1I0,0I0,0W0"], "incomplete"),
        (["0F0,1F0,1X0"], "pattern"),
    ],
)
def test_server_refuses_bad_orders(ranks: list, message: str) -> None:
    data = to_json(JobSpec(num_stages=1, num_microbatches=1, schedule=ORDER))
    data["schedule"]["ranks"] = ranks
    with pytest.raises(pydantic.ValidationError, match=message):
        pydantic.TypeAdapter(JobSpec).validate_python(data)
    with pytest.raises(ValueError, match="1 rank"):
        JobSpec(num_stages=2, num_microbatches=1, schedule=ORDER)
    assert pipeline_order("1f1b", 1, 2).ranks == ["0F0,0B0,0F1,0B1"]


def test_the_emulated_gpu_runs_a_backwards_halves_from_a_whole_profile() -> None:
    from perseus.gpu.emulated.device import EmulatedGPU

    gpu = EmulatedGPU(_whole_profile(), blocking_power_w=50.0, sleep=False)
    before = gpu.true_energy_j()
    for kind in ("forward", "backward_input", "backward_weight"):
        gpu.instruction_begin(0, kind)
        gpu.instruction_end(kind)
    # Forward 20 J, then the backward's 44 J in two halves.
    assert gpu.true_energy_j() - before == pytest.approx(64.0, abs=0.5)  # + blocking power
    gpu.close()


def test_timeline_plot_of_an_engine_order(tmp_path: Path) -> None:
    from perseus.planner.plots import plot_timeline
    from perseus.planner.problem import PlanningProblem

    problem = PlanningProblem(split_backward(_whole_profile()), 1, 50.0, ORDER)
    path = plot_timeline(problem, problem.allmax_freqs(), tmp_path / "timeline.png")
    assert path.stat().st_size > 0
