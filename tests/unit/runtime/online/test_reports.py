"""The stage leader's report of an iteration, as built from its record and the stage's payloads."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from perseus.records import InstructionRecord, StepRecord
from perseus.runtime.online import payload as payloads
from perseus.runtime.online.exchange import Member
from perseus.runtime.online.reports import combined_report
from perseus.wire import InstructionReport, Phase


def _record() -> StepRecord:
    names = ["forward", "forward", "backward", "backward"]
    return StepRecord(
        step=4,
        stage=1,
        start_s=10.0,
        end_s=10.5,
        instructions=[
            InstructionRecord(
                position=i,
                instruction=name,
                microbatch=i % 2,
                frequency_mhz=None if i == 2 else 1005 + i,
                start_s=10.0 + i,
                end_s=10.1 + i,
            )
            for i, name in enumerate(names)
        ],
    )


def _payload(record: StepRecord) -> list:
    return payloads.pack(
        payloads.payload_size(len(record.instructions), 1),
        scheduled=True,
        step=record.step,
        iteration_time_s=0.5,
        compute_time_s=0.45,
        energies=[],
        mismatch=None,
        num_positions=len(record.instructions),
    )


@pytest.mark.parametrize("phase", [Phase.baseline, Phase.profiling])
def test_instructions_are_reported_field_by_field_where_the_server_uses_them(
    phase: Phase,
) -> None:
    record = _record()
    members = [Member(rank=0, dp_rank=0, tp_rank=0, clocks_mhz=[1005, 1410])]
    report = combined_report(0, members, record, "F0 F1 B0 B1", phase, [_payload(record)])
    assert report.instructions == [
        InstructionReport(**dataclasses.asdict(i)) for i in record.instructions
    ]
    assert [r.frequency_mhz for r in report.instructions] == [1005, 1006, None, 1008]
    assert (report.step, report.iteration_time_s, report.compute_time_s) == (4, 0.5, 0.45)


@pytest.mark.parametrize("phase", [None, Phase.running, Phase.planning])
def test_no_instructions_outside_baseline_and_profiling(phase: Optional[Phase]) -> None:
    record = _record()
    members = [Member(rank=0, dp_rank=0, tp_rank=0, clocks_mhz=[1005, 1410])]
    report = combined_report(0, members, record, "F0 F1 B0 B1", phase, [_payload(record)])
    assert report.instructions == []


@pytest.mark.parametrize(
    "reading, sent", [(61.0, 61.0), (None, None), (float("nan"), None), (900.0, None)]
)
def test_the_leaders_temperature_goes_with_the_report_when_it_is_a_reading(
    reading: Optional[float], sent: Optional[float]
) -> None:
    record = _record()
    record.temperature_c = reading
    members = [Member(rank=0, dp_rank=0, tp_rank=0, clocks_mhz=[1005, 1410])]
    report = combined_report(0, members, record, "F0 F1 B0 B1", Phase.running, [_payload(record)])
    assert report.temperature_c == sent
