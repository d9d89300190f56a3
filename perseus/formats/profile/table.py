"""The profile table: time and energy of one microbatch's instruction per stage per frequency.

CSV contract (``docs/design.md``, "Profile CSV")::

    stage,instruction,frequency,time,energy[,energy_se,uncertain]

``time`` in seconds and ``energy`` in joules of ONE microbatch's instruction on that stage at
that SM frequency (MHz): ``forward``, ``backward``, and for schedules that split the backward
(zero-bubble), its input half ``backward_input`` and weight half ``backward_weight``. A
measured profile adds ``energy_se`` (the standard error of ``energy``, J; empty where unknown)
and ``uncertain`` (``1``: known to worse than the profiler's target, or clamped to the GPU's
power range, or borrowed; ``0`` otherwise); both are optional and read when present. Other
extra columns are ignored; spaces around column names and values (``stage, instruction, ...``)
are trimmed. Read and written with the standard ``csv`` module (the emulated GPU loads profiles
inside training processes).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from perseus.config.numbers import Range
from perseus.errors import ProfileError
from perseus.formats.profile.fields import (
    as_float,
    as_int,
    checked,
    column_index,
    short,
    width_problem,
)
from perseus.formats.text_file import read_text_file
from perseus.pipeline_order import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, KINDS

COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
UNCERTAINTY_COLUMNS = ("energy_se", "uncertain")
#: Every instruction kind a profile may have rows for.
INSTRUCTIONS = KINDS
RowKey = Tuple[int, str, int]


@dataclass(frozen=True)
class Measurement:
    """Time (s) and energy (J) of one microbatch's instruction at one frequency."""

    frequency_mhz: int
    time_s: float
    energy_j: float


class Profile:
    """A validated profile: per (stage, instruction), measurements sorted by frequency.

    Attributes:
        num_stages: Number of pipeline stages (stages are ``0..num_stages-1``).
        source: Where the profile came from (a path or a description), for messages.
        energy_se_j: Standard error of a row's energy, by ``(stage, instruction, frequency)``
            (measured profiles; rows without one are absent).
        uncertain: Rows whose energy is not known well enough to plan on with confidence.
    """

    def __init__(
        self,
        table: Dict[Tuple[int, str], List[Measurement]],
        source: str = "<profile>",
        *,
        energy_se_j: Optional[Mapping[RowKey, float]] = None,
        uncertain: Iterable[RowKey] = (),
    ) -> None:
        """Wrap an already-validated table; use :func:`read_profile_csv` or :meth:`from_rows`."""
        self._table = {k: sorted(v, key=lambda m: -m.frequency_mhz) for k, v in table.items()}
        self.source = source
        self.num_stages = 1 + max(stage for stage, _ in self._table)
        self._index = {k: {m.frequency_mhz: m for m in v} for k, v in self._table.items()}
        rows = {(s, i, m.frequency_mhz) for (s, i), ms in self._table.items() for m in ms}
        self.energy_se_j: Dict[RowKey, float] = {
            k: float(v) for k, v in (energy_se_j or {}).items() if k in rows
        }
        self.uncertain: Set[RowKey] = {k for k in uncertain if k in rows}

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Sequence[Any]],
        source: str = "<profile>",
        *,
        energy_se_j: Optional[Mapping[RowKey, float]] = None,
        uncertain: Iterable[RowKey] = (),
    ) -> Profile:
        """Build from ``(stage, instruction, frequency, time, energy)`` tuples, validating.

        Rows are numbered as in a spreadsheet under a header (the first is row 2).
        ``energy_se_j`` and ``uncertain``: see the class attributes.
        """
        return cls.from_numbered_rows(
            enumerate(rows, start=2), source, energy_se_j=energy_se_j, uncertain=uncertain
        )

    @classmethod
    def from_numbered_rows(
        cls,
        rows: Iterable[Tuple[int, Sequence[Any]]],
        source: str = "<profile>",
        *,
        energy_se_j: Optional[Mapping[RowKey, float]] = None,
        uncertain: Iterable[RowKey] = (),
    ) -> Profile:
        """Like :meth:`from_rows`, each row with the number messages name it by."""
        table: Dict[Tuple[int, str], List[Measurement]] = {}
        seen: Dict[Tuple[int, str, int], int] = {}
        for row_no, row in rows:
            stage, instruction, freq, time_s, energy_j = _check_row(row, source, row_no)
            key3 = (stage, instruction, freq)
            if key3 in seen:
                raise ProfileError(
                    f"{source}, row {row_no}: duplicate of row {seen[key3]} (stage {stage}, "
                    f"{instruction}, {freq} MHz); keep one measurement per frequency"
                )
            seen[key3] = row_no
            table.setdefault((stage, instruction), []).append(Measurement(freq, time_s, energy_j))
        if not table:
            raise ProfileError(f"{source}: no rows; a profile needs at least one stage")
        num_stages = 1 + max(stage for stage, _ in table)
        for stage in range(num_stages):
            missing = _missing_kind(table, stage)
            if missing:
                raise ProfileError(
                    f"{source}: stage {stage} has no {missing} rows; every stage "
                    f"0..{num_stages - 1} needs forward and backward measurements (a "
                    "zero-bubble schedule's profile may have backward_input and "
                    "backward_weight instead of backward)"
                )
        return cls(table, source, energy_se_j=energy_se_j, uncertain=uncertain)

    # -- queries ----------------------------------------------------------------------------
    def stages(self) -> range:
        """The stage indices."""
        return range(self.num_stages)

    def has(self, stage: int, instruction: str) -> bool:
        """Whether the profile has rows for ``instruction`` on ``stage``."""
        return (stage, instruction) in self._table

    def kinds(self) -> Tuple[str, ...]:
        """The instruction kinds every stage has rows for, in :data:`INSTRUCTIONS` order."""
        return tuple(kind for kind in INSTRUCTIONS if all(self.has(s, kind) for s in self.stages()))

    def measurements(self, stage: int, instruction: str) -> List[Measurement]:
        """All measurements of one (stage, instruction), highest frequency first."""
        try:
            return self._table[(stage, instruction)]
        except KeyError:
            raise ProfileError(
                f"{self.source}: no measurements for stage {stage} {instruction}"
            ) from None

    def frequencies(self, stage: int, instruction: str) -> List[int]:
        """Profiled frequencies (MHz) of one (stage, instruction), highest first."""
        return [m.frequency_mhz for m in self.measurements(stage, instruction)]

    def lookup(self, stage: int, instruction: str, frequency_mhz: int) -> Measurement:
        """The measurement at exactly ``frequency_mhz``."""
        try:
            return self._index[(stage, instruction)][frequency_mhz]
        except KeyError:
            raise ProfileError(
                f"{self.source}: stage {stage} {instruction} was not profiled at "
                f"{frequency_mhz} MHz; profiled: {self.frequencies(stage, instruction)}"
            ) from None

    def max_frequency_mhz(self, stage: int, instruction: str) -> int:
        """Highest profiled frequency of one (stage, instruction)."""
        return self.measurements(stage, instruction)[0].frequency_mhz

    def pareto(self, stage: int, instruction: str) -> List[Measurement]:
        """Measurements not dominated in (time, energy), fastest first.

        A frequency is dropped when another is at least as fast and uses at most as much
        energy (strictly better in one). Ties keep the higher frequency.
        """
        ms = sorted(
            self.measurements(stage, instruction),
            key=lambda m: (m.time_s, m.energy_j, -m.frequency_mhz),
        )
        out: List[Measurement] = []
        for m in ms:
            if not out or m.energy_j < out[-1].energy_j:
                out.append(m)
        return out

    def is_uncertain(self, stage: int, instruction: str, frequency_mhz: int) -> bool:
        """Whether that row's energy is marked uncertain."""
        return (stage, instruction, frequency_mhz) in self.uncertain

    def restrict(self, min_frequency_mhz: int) -> Profile:
        """A copy keeping frequencies >= ``min_frequency_mhz`` (at least the highest one)."""
        table = {}
        for key, ms in self._table.items():
            kept = [m for m in ms if m.frequency_mhz >= min_frequency_mhz]
            table[key] = kept or ms[:1]
        return Profile(
            table,
            f"{self.source} (>= {min_frequency_mhz} MHz)",
            energy_se_j=self.energy_se_j,
            uncertain=self.uncertain,
        )

    def scaled(self, time_scale: float, energy_scale: float) -> Profile:
        """A copy with every time and energy multiplied by the given factors."""
        table = {
            key: [
                Measurement(m.frequency_mhz, m.time_s * time_scale, m.energy_j * energy_scale)
                for m in ms
            ]
            for key, ms in self._table.items()
        }
        se = {k: v * energy_scale for k, v in self.energy_se_j.items()}
        return Profile(table, self.source, energy_se_j=se, uncertain=self.uncertain)

    def rows(self) -> List[Tuple[int, str, int, float, float]]:
        """All rows as ``(stage, instruction, frequency, time, energy)``, sorted."""
        return [
            (stage, instruction, m.frequency_mhz, m.time_s, m.energy_j)
            for (stage, instruction) in sorted(self._table)
            for m in self._table[(stage, instruction)]
        ]

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Write the profile CSV; returns the path.

        The uncertainty columns are written when any row has a standard error or is marked.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        extra = bool(self.energy_se_j or self.uncertain)
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS + UNCERTAINTY_COLUMNS if extra else COLUMNS)
            for row in self.rows():
                if not extra:
                    writer.writerow(row)
                    continue
                key = (row[0], row[1], row[2])
                se = self.energy_se_j.get(key)
                shown = repr(se) if se is not None and math.isfinite(se) else ""
                writer.writerow((*row, shown, int(key in self.uncertain)))
        return path


def read_profile_csv(path: Union[str, os.PathLike]) -> Profile:
    """Read and validate a profile CSV (extra columns are ignored).

    UTF-8 (a byte-order mark is fine), any line ending, blank lines skipped.

    Raises:
        ProfileError: naming the file, the row (as in a spreadsheet: the header is row 1),
            what was found and how to fix it.
    """
    path = Path(path)
    text = read_text_file(path, what="profile", error=ProfileError, fix=_FIX)
    return parse_profile_csv(text, source=str(path))


def parse_profile_csv(text: str, source: str = "<profile>") -> Profile:
    """Validate the text of a profile CSV (see :func:`read_profile_csv`)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: List[Tuple[int, Tuple[str, ...]]] = []
    se: Dict[RowKey, float] = {}
    uncertain: List[RowKey] = []
    try:
        header = next((row for row in reader if row), None)
        if header is None:
            raise ProfileError(f"{source}: no header; {_FIX}")
        index = column_index(header, f"{source}, row {reader.line_num}", COLUMNS, _FIX_FIRST_ROW)
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise ProfileError(width_problem(source, reader.line_num, fields, header))
            row = tuple(fields[index[c]].strip() for c in COLUMNS)
            rows.append((reader.line_num, row))
            _read_uncertainty(row, fields, index, f"{source}, row {reader.line_num}", se, uncertain)
    except csv.Error as exc:
        raise ProfileError(
            f"{source}, row {reader.line_num}: cannot parse as CSV ({exc}); {_FIX}"
        ) from None
    return Profile.from_numbered_rows(rows, source=source, energy_se_j=se, uncertain=uncertain)


def _read_uncertainty(
    row: Tuple[str, ...],
    fields: List[str],
    index: Dict[str, int],
    where: str,
    se: Dict[RowKey, float],
    uncertain: List[RowKey],
) -> None:
    """The optional ``energy_se`` and ``uncertain`` columns of one row, where present."""
    if "energy_se" not in index and "uncertain" not in index:
        return
    try:
        key = (int(float(row[0])), row[1], int(float(row[2])))
    except ValueError:
        return  # the row itself is reported by the validation of the required columns
    if "energy_se" in index and fields[index["energy_se"]].strip():
        value = checked(
            as_float(fields[index["energy_se"]], where, "energy_se"), ENERGY, where, "energy_se"
        )
        se[key] = value
    if "uncertain" in index:
        flag = fields[index["uncertain"]].strip().lower()
        if flag not in ("", "0", "1", "true", "false"):
            raise ProfileError(
                f"{where}: uncertain {short(repr(flag))} must be 0 or 1 (or true/false)"
            )
        if flag in ("1", "true"):
            uncertain.append(key)


def _missing_kind(table: Dict[Tuple[int, str], List[Measurement]], stage: int) -> str:
    """The kind ``stage`` lacks: forward, and backward or both of its halves (``""``: none)."""
    if (stage, FORWARD) not in table:
        return FORWARD
    halves = [k for k in (BACKWARD_INPUT, BACKWARD_WEIGHT) if (stage, k) in table]
    if (stage, BACKWARD) in table or len(halves) == 2:
        return ""
    return BACKWARD if not halves else ({BACKWARD_INPUT, BACKWARD_WEIGHT} - set(halves)).pop()


_HEADER = ",".join(COLUMNS)
_FIX = f"a profile is a CSV with the header {_HEADER} (written by the profiler)"
_FIX_FIRST_ROW = f"the first row must be the header {_HEADER}"
STAGE = Range(ge=0, lt=1_000_000, integer=True)
FREQUENCY = Range(gt=0, le=100_000, integer=True, unit="MHz")
TIME = Range(gt=0.0, le=1e6, unit="s")
ENERGY = Range(ge=0.0, le=1e12, unit="J")
FINITE_POWER_W = Range(ge=0.0, unit="W")


def _check_row(row: Sequence[Any], source: str, row_no: int) -> Tuple[int, str, int, float, float]:
    where = f"{source}, row {row_no}"
    stage, instruction, freq, time_s, energy_j = row
    stage_i = checked(as_int(stage, where, "stage"), STAGE, where, "stage")
    if instruction not in INSTRUCTIONS:
        raise ProfileError(
            f"{where}: instruction {short(repr(instruction))} must be one of "
            + ", ".join(repr(k) for k in INSTRUCTIONS)
        )
    freq_i = checked(as_int(freq, where, "frequency"), FREQUENCY, where, "frequency")
    t = checked(as_float(time_s, where, "time"), TIME, where, "time")
    e = checked(as_float(energy_j, where, "energy"), ENERGY, where, "energy")
    return stage_i, str(instruction), freq_i, t, e


def blocking_power_per_stage_w(p2p_power_w: Any, num_stages: int) -> List[float]:
    """Expand ``planner.p2p_power_w`` (one value or one per stage) to a per-stage list.

    Raises:
        ProfileError: not a finite power >= 0 W (or a list of them), or a list whose length is
            not the profile's stage count.
    """
    from perseus.config.validation import p2p_power_problems

    # Finite and >= 0 here; the configuration's own range (a realistic power) is checked where
    # the value is read (validate(), the server's job bounds): a planning problem with scaled
    # units is still a planning problem.
    problems = p2p_power_problems(p2p_power_w, allowed=FINITE_POWER_W)
    if problems:
        raise ProfileError("; ".join(problems))
    if isinstance(p2p_power_w, (int, float)):
        return [float(p2p_power_w)] * num_stages
    values = [float(v) for v in p2p_power_w]
    if len(values) != num_stages:
        raise ProfileError(
            f"planner.p2p_power_w has {len(values)} values but the profile has "
            f"{num_stages} stages; give one value or one per stage"
        )
    return values
