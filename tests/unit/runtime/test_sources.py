from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.errors import PlanError, ScheduleMismatchError
from perseus.records import InstructionRecord, StepRecord
from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource
from tests.unit.runtime.fakes import make_plan, one_f_one_b


def _record(step: int, n: int) -> StepRecord:
    ins = [
        InstructionRecord(
            position=i,
            instruction="forward",
            microbatch=i,
            frequency_mhz=None,
            start_s=0.0,
            end_s=0.0,
        )
        for i in range(n)
    ]
    return StepRecord(step=step, stage=0, start_s=0.0, end_s=1.0, energy_j=None, instructions=ins)


def test_measure_and_max_speed() -> None:
    assert MeasureSource().frequency_mhz(0, 0, "forward", 0) is None
    assert MeasureSource.changes_clocks is False
    src = MaxSpeedSource(1410)
    assert [src.frequency_mhz(0, p, "backward", p) for p in range(3)] == [1410] * 3
    with pytest.raises(PlanError, match="max_mhz=0"):
        MaxSpeedSource(0)


def test_plan_source_follows_positions() -> None:
    plan = make_plan(3, 4)
    for stage in range(3):
        src = PlanSource(plan, stage)
        counts = {"forward": 0, "backward": 0}
        got = []
        for pos, (name, _mb) in enumerate(one_f_one_b(3, stage, 4)):
            got.append(src.frequency_mhz(0, pos, name, counts[name]))
            counts[name] += 1
        assert got == plan.frequencies(stage)


def test_plan_source_rejects_stage_out_of_range() -> None:
    with pytest.raises(PlanError, match="2 stage.*stage 5"):
        PlanSource(make_plan(2, 2), 5)


def test_mismatch_names_position_expected_and_got() -> None:
    plan = make_plan(2, 3)  # stage 0: F0 F1 B0 F2 B1 B2
    src = PlanSource(plan, 0)
    src.frequency_mhz(7, 0, "forward", 0)
    with pytest.raises(ScheduleMismatchError) as info:
        src.frequency_mhz(7, 1, "backward", 0)
    msg = str(info.value)
    assert "stage 0, iteration 7" in msg
    assert "expected forward of microbatch 1 at position 1" in msg
    assert "got backward of microbatch 0" in msg
    assert "runtime.strict=false" in msg


def test_mismatch_past_the_end_and_short_iteration() -> None:
    src = PlanSource(make_plan(2, 2), 1)  # stage 1: F0 B0 F1 B1
    with pytest.raises(ScheduleMismatchError, match="end after 4 instructions"):
        src.frequency_mhz(0, 4, "forward", 2)
    with pytest.raises(ScheduleMismatchError, match="ended after 3 instruction"):
        src.end_step(_record(0, 3))
    src.end_step(_record(1, 4))  # complete iteration: fine


def test_non_strict_warns_once_and_falls_back() -> None:
    plan = make_plan(2, 3, clocks_mhz=(1410, 1000))
    src = PlanSource(plan, 0, strict=False)
    with pytest.warns(RuntimeWarning, match="expected forward of microbatch 1"):
        f = src.frequency_mhz(0, 1, "backward", 0)
    # Fallback: the plan's clock of the first backward occurrence.
    first_backward = next(s.frequency_mhz for s in plan.stages[0] if s.instruction == "backward")
    assert f == first_backward
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # An occurrence the plan does not have: the highest clock of that kind.
        assert src.frequency_mhz(0, 2, "forward", 9) == 1410
        src.end_step(_record(0, 2))  # no second warning, no error


@settings(max_examples=60, deadline=None)
@given(
    num_stages=st.integers(1, 4),
    num_mb=st.integers(1, 6),
    data=st.data(),
)
def test_plan_source_accepts_the_plan_order_and_pinpoints_the_first_deviation(
    num_stages: int, num_mb: int, data: st.DataObject
) -> None:
    plan = make_plan(num_stages, num_mb, clocks_mhz=(1410, 1200, 1005, 810))
    stage = data.draw(st.integers(0, num_stages - 1))
    order = [name for name, _ in one_f_one_b(num_stages, stage, num_mb)]
    flip = data.draw(st.integers(-1, len(order) - 1))  # -1: run the plan as is
    ran = list(order)
    if flip >= 0:
        ran[flip] = "backward" if ran[flip] == "forward" else "forward"
    src = PlanSource(plan, stage)
    counts = {"forward": 0, "backward": 0}
    for pos, name in enumerate(ran):
        if pos == flip:
            with pytest.raises(ScheduleMismatchError, match=f"at position {pos},"):
                src.frequency_mhz(0, pos, name, counts[name])
            return
        assert (
            src.frequency_mhz(0, pos, name, counts[name]) == plan.stages[stage][pos].frequency_mhz
        )
        counts[name] += 1
    src.end_step(_record(0, len(ran)))
