"""Per-instruction trace files: ``trace-rank{R}.csv``.

Columns: ``step,stage,instruction,microbatch,frequency_mhz,start_s,end_s,applied_mhz``.
``frequency_mhz`` is the clock the runtime asked for (empty: default clocks); ``applied_mhz`` the
SM clock read back from the device when the instruction ended (empty: no clock locked, or the
device cannot say) — lower than asked means throttling (power or heat) or a clock the GPU does
not have. ``start_s`` / ``end_s`` are seconds since the Unix epoch (microsecond resolution), so
traces of different ranks line up on one time axis; they are taken after synchronizing the
device, so they bound the instruction's GPU work. Rows are buffered and written at the end of
each iteration and on close, never per instruction. :func:`read_traces` reads every rank's trace
of a run directory back; ``applied_mhz`` is optional there (traces written before it existed)
and extra columns are ignored.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, List, NamedTuple, Optional, Union

from perseus.errors import PlanError

if TYPE_CHECKING:
    from perseus.records import StepRecord

TRACE_COLUMNS = (
    "step",
    "stage",
    "instruction",
    "microbatch",
    "frequency_mhz",
    "start_s",
    "end_s",
    "applied_mhz",
)
# What a reader needs; later columns are optional.
REQUIRED_TRACE_COLUMNS = TRACE_COLUMNS[:7]


TRACE_GLOB = "trace-rank*.csv"


class TraceRow(NamedTuple):
    """One instruction of one iteration as a rank ran it (times in epoch seconds)."""

    step: int
    stage: int
    instruction: str
    microbatch: int
    frequency_mhz: Optional[int]
    start_s: float
    end_s: float
    applied_mhz: Optional[int] = None


def trace_path(trace_dir: Union[str, os.PathLike], rank: int) -> Path:
    """Where rank ``rank`` writes its trace inside ``trace_dir``."""
    return Path(trace_dir) / f"trace-rank{rank}.csv"


def read_trace(path: Union[str, os.PathLike]) -> List[TraceRow]:
    """The rows of one trace file.

    Raises:
        PlanError: the file lacks a trace column or holds a malformed row (named).
    """
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise PlanError(
                f"{path}: trace lacks column(s) {missing}; expected {','.join(TRACE_COLUMNS)} "
                "(written by runtime.trace=true)"
            )
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                freq = row["frequency_mhz"]
                applied = row.get("applied_mhz")
                rows.append(
                    TraceRow(
                        step=int(row["step"]),
                        stage=int(row["stage"]),
                        instruction=row["instruction"],
                        microbatch=int(row["microbatch"]),
                        frequency_mhz=int(freq) if freq else None,
                        start_s=float(row["start_s"]),
                        end_s=float(row["end_s"]),
                        applied_mhz=int(applied) if applied else None,
                    )
                )
            except (TypeError, ValueError) as exc:
                raise PlanError(f"{path}, row {line}: not a trace row ({exc})") from None
    return rows


def read_traces(run_dir: Union[str, os.PathLike]) -> List[TraceRow]:
    """Every rank's trace rows in ``run_dir`` (files in name order)."""
    rows: List[TraceRow] = []
    for path in sorted(Path(run_dir).glob(TRACE_GLOB)):
        rows.extend(read_trace(path))
    return rows


class TraceWriter:
    """Append iterations to one rank's trace CSV.

    Args:
        path: The CSV to create (its folder is created; an existing file is replaced).
        clock_offset_s: Added to the records' ``perf_counter`` times to get epoch seconds.
    """

    def __init__(self, path: Union[str, os.PathLike], clock_offset_s: float) -> None:
        """Open ``path`` and write the header."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._offset_s = clock_offset_s
        self._lines: List[str] = []
        self._file: Optional[IO[str]] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._file.write(",".join(TRACE_COLUMNS) + "\n")
        self._file.flush()

    def add(self, record: StepRecord) -> None:
        """Buffer the rows of one iteration."""
        off = self._offset_s
        step, stage = record.step, record.stage
        applied_mhz = record.applied_mhz
        for i, ins in enumerate(record.instructions):
            freq = "" if ins.frequency_mhz is None else str(ins.frequency_mhz)
            read = applied_mhz[i] if i < len(applied_mhz) else None
            applied = "" if read is None else str(read)
            self._lines.append(
                f"{step},{stage},{ins.instruction},{ins.microbatch},{freq},"
                f"{ins.start_s + off:.6f},{ins.end_s + off:.6f},{applied}\n"
            )

    def flush(self) -> None:
        """Write buffered rows to the file."""
        if self._file is None or not self._lines:
            return
        self._file.write("".join(self._lines))
        self._lines.clear()
        self._file.flush()

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if self._file is None:
            return
        self.flush()
        self._file.close()
        self._file = None
