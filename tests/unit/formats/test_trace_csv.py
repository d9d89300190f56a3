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
            3, rank, 0.0, 1.0, None, [InstructionRecord(0, "forward", 2, None, 0.5, 0.75)]
        )
        writer.add(record)
        writer.close()
    assert read_traces(tmp_path) == [
        TraceRow(3, 0, "forward", 2, None, 100.5, 100.75),
        TraceRow(3, 1, "forward", 2, None, 100.5, 100.75),
    ]


def test_applied_clock_written_and_older_traces_read(tmp_path: Path) -> None:
    writer = TraceWriter(trace_path(tmp_path, 0), clock_offset_s=0.0)
    instructions = [
        InstructionRecord(0, "forward", 0, 1410, 0.5, 0.75),
        InstructionRecord(1, "backward", 0, None, 0.75, 1.0),
    ]
    writer.add(StepRecord(0, 0, 0.0, 1.0, None, instructions, applied_mhz=[1395, None]))
    writer.close()
    assert [row.applied_mhz for row in read_traces(tmp_path)] == [1395, None]
    # A trace from before the applied_mhz column reads with the column empty.
    header = "step,stage,instruction,microbatch,frequency_mhz,start_s,end_s"
    (tmp_path / "trace-rank0.csv").write_text(header + "\n1,0,forward,0,,0.5,1.0\n")
    assert read_traces(tmp_path) == [TraceRow(1, 0, "forward", 0, None, 0.5, 1.0)]


def test_bad_traces_are_named(tmp_path: Path) -> None:
    (tmp_path / "trace-rank0.csv").write_text("step,stage\n1,0\n")
    with pytest.raises(PlanError, match="trace-rank0.csv: trace lacks column"):
        read_traces(tmp_path)
