"""Traces written by the runtime read back with their types."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.errors import PlanError
from perseus.formats.trace_csv import TraceRow, TraceWriter, read_traces, trace_path
from perseus.records import InstructionRecord, StepRecord


def test_round_trip_over_ranks(tmp_path: Path) -> None:
    for rank in (1, 0):
        writer = TraceWriter(trace_path(tmp_path, rank), clock_offset_s=100.0)
        record = StepRecord(
            step=3,
            stage=rank,
            start_s=0.0,
            end_s=1.0,
            energy_j=None,
            instructions=[
                InstructionRecord(
                    position=0,
                    instruction="forward",
                    microbatch=2,
                    frequency_mhz=None,
                    start_s=0.5,
                    end_s=0.75,
                )
            ],
        )
        writer.add(record)
        writer.close()
    assert read_traces(tmp_path) == [
        TraceRow(
            step=3,
            stage=0,
            instruction="forward",
            microbatch=2,
            frequency_mhz=None,
            start_s=100.5,
            end_s=100.75,
        ),
        TraceRow(
            step=3,
            stage=1,
            instruction="forward",
            microbatch=2,
            frequency_mhz=None,
            start_s=100.5,
            end_s=100.75,
        ),
    ]


def test_applied_clock_written_and_older_traces_read(tmp_path: Path) -> None:
    writer = TraceWriter(trace_path(tmp_path, 0), clock_offset_s=0.0)
    instructions = [
        InstructionRecord(
            position=0,
            instruction="forward",
            microbatch=0,
            frequency_mhz=1410,
            start_s=0.5,
            end_s=0.75,
        ),
        InstructionRecord(
            position=1,
            instruction="backward",
            microbatch=0,
            frequency_mhz=None,
            start_s=0.75,
            end_s=1.0,
        ),
    ]
    writer.add(
        StepRecord(
            step=0,
            stage=0,
            start_s=0.0,
            end_s=1.0,
            energy_j=None,
            instructions=instructions,
            applied_mhz=[1395, None],
        )
    )
    writer.close()
    assert [row.applied_mhz for row in read_traces(tmp_path)] == [1395, None]
    # A trace from before the applied_mhz column reads with the column empty.
    header = "step,stage,instruction,microbatch,frequency_mhz,start_s,end_s"
    (tmp_path / "trace-rank0.csv").write_text(header + "\n1,0,forward,0,,0.5,1.0\n")
    assert read_traces(tmp_path) == [
        TraceRow(
            step=1,
            stage=0,
            instruction="forward",
            microbatch=0,
            frequency_mhz=None,
            start_s=0.5,
            end_s=1.0,
        )
    ]


def test_bad_traces_are_named(tmp_path: Path) -> None:
    (tmp_path / "trace-rank0.csv").write_text("step,stage\n1,0\n")
    with pytest.raises(PlanError, match="trace-rank0.csv: trace lacks column"):
        read_traces(tmp_path)
