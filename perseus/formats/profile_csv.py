"""The profile table: time and energy of one microbatch's instruction per stage per frequency.

CSV contract (``docs/design.md``, "Profile CSV")::

    stage,instruction,frequency,time,energy

``time`` in seconds and ``energy`` in joules of ONE microbatch's forward or backward on that
stage at that SM frequency (MHz). Extra columns are ignored; spaces around column names and
values (``stage, instruction, ...``) are trimmed. Read and written with the standard ``csv``
module (the emulated GPU loads profiles inside training processes).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from perseus.errors import ProfileError
from perseus.formats.text_file import read_text_file
from perseus.numbers import Range

COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
INSTRUCTIONS = ("forward", "backward")


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
    """

    def __init__(
        self, table: Dict[Tuple[int, str], List[Measurement]], source: str = "<profile>"
    ) -> None:
        """Wrap an already-validated table; use :func:`read_profile_csv` or :meth:`from_rows`."""
        self._table = {k: sorted(v, key=lambda m: -m.frequency_mhz) for k, v in table.items()}
        self.source = source
        self.num_stages = 1 + max(stage for stage, _ in self._table)
        self._index = {k: {m.frequency_mhz: m for m in v} for k, v in self._table.items()}

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]], source: str = "<profile>") -> Profile:
        """Build from ``(stage, instruction, frequency, time, energy)`` tuples, validating.

        Rows are numbered as in a spreadsheet under a header (the first is row 2).
        """
        return cls.from_numbered_rows(enumerate(rows, start=2), source)

    @classmethod
    def from_numbered_rows(
        cls, rows: Iterable[Tuple[int, Sequence[Any]]], source: str = "<profile>"
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
            for instruction in INSTRUCTIONS:
                if (stage, instruction) not in table:
                    raise ProfileError(
                        f"{source}: stage {stage} has no {instruction} rows; every stage "
                        f"0..{num_stages - 1} needs forward and backward measurements"
                    )
        return cls(table, source)

    # -- queries ----------------------------------------------------------------------------
    def stages(self) -> range:
        """The stage indices."""
        return range(self.num_stages)

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

    def restrict(self, min_frequency_mhz: int) -> Profile:
        """A copy keeping frequencies >= ``min_frequency_mhz`` (at least the highest one)."""
        table = {}
        for key, ms in self._table.items():
            kept = [m for m in ms if m.frequency_mhz >= min_frequency_mhz]
            table[key] = kept or ms[:1]
        return Profile(table, f"{self.source} (>= {min_frequency_mhz} MHz)")

    def scaled(self, time_scale: float, energy_scale: float) -> Profile:
        """A copy with every time and energy multiplied by the given factors."""
        table = {
            key: [
                Measurement(m.frequency_mhz, m.time_s * time_scale, m.energy_j * energy_scale)
                for m in ms
            ]
            for key, ms in self._table.items()
        }
        return Profile(table, self.source)

    def rows(self) -> List[Tuple[int, str, int, float, float]]:
        """All rows as ``(stage, instruction, frequency, time, energy)``, sorted."""
        return [
            (stage, instruction, m.frequency_mhz, m.time_s, m.energy_j)
            for (stage, instruction) in sorted(self._table)
            for m in self._table[(stage, instruction)]
        ]

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Write the profile CSV; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            writer.writerows(self.rows())
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
    try:
        header = next((row for row in reader if row), None)
        if header is None:
            raise ProfileError(f"{source}: no header; {_FIX}")
        index = _column_index(header, f"{source}, row {reader.line_num}")
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise ProfileError(_width_problem(source, reader.line_num, fields, header))
            rows.append((reader.line_num, tuple(fields[index[c]].strip() for c in COLUMNS)))
    except csv.Error as exc:
        raise ProfileError(
            f"{source}, row {reader.line_num}: cannot parse as CSV ({exc}); {_FIX}"
        ) from None
    return Profile.from_numbered_rows(rows, source=source)


_HEADER = ",".join(COLUMNS)
_FIX = f"a profile is a CSV with the header {_HEADER} (written by the profiler)"
STAGE = Range(ge=0, lt=1_000_000, integer=True)
FREQUENCY = Range(gt=0, le=100_000, integer=True, unit="MHz")
TIME = Range(gt=0.0, le=1e6, unit="s")
ENERGY = Range(ge=0.0, le=1e12, unit="J")
FINITE_POWER_W = Range(ge=0.0, unit="W")


def _column_index(header: List[str], where: str) -> Dict[str, int]:
    """Where each column is (names trimmed); the header as read and the fix when it does not fit.

    The message shows the header's text and each column name as read (``repr``: a stray
    character in a name that looks right is visible).
    """
    names = [name.strip() for name in header]
    found = _short(",".join(header))
    twice = sorted({name for name in names if name in COLUMNS and names.count(name) > 1})
    if twice:
        raise ProfileError(f"{where}: column(s) {twice} appear more than once in {found!r}")
    index = {name: i for i, name in enumerate(names)}
    missing = [c for c in COLUMNS if c not in index]
    if not missing:
        return index
    if all(c in {name.lower() for name in names} for c in COLUMNS):
        fix = "write the column names in lower case"
    elif len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
        sep = next(sep for sep in ";\t|" if sep in header[0])
        fix = f"separate the columns with commas, not {sep!r}"
    elif header and _number(header[0]):
        fix = f"the first row must be the header {_HEADER}"
    else:
        fix = f"missing column(s) {missing}"
    raise ProfileError(
        f"{where}: the header is {found!r}, read as the columns {_short(repr(header), 200)}; "
        f"expected the columns {_HEADER} (in any order; extra columns are ignored): {fix}"
    )


def _width_problem(source: str, line: int, fields: List[str], header: List[str]) -> str:
    found = _short(",".join(fields))
    expected = f"the header {_short(','.join(header))!r} has {len(header)}"
    hint = "fill in every column"
    if len(fields) > len(header):
        extra = fields[len(header) :]
        hint = (
            "remove the trailing comma(s)"
            if not any(f.strip() for f in extra)
            else "name the extra column(s) in the header"
        )
    return f"{source}, row {line}: {len(fields)} fields ({found!r}) but {expected}: {hint}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_row(row: Sequence[Any], source: str, row_no: int) -> Tuple[int, str, int, float, float]:
    where = f"{source}, row {row_no}"
    stage, instruction, freq, time_s, energy_j = row
    stage_i = _checked(_as_int(stage, where, "stage"), STAGE, where, "stage")
    if instruction not in INSTRUCTIONS:
        raise ProfileError(
            f"{where}: instruction {_short(repr(instruction))} must be 'forward' or 'backward'"
        )
    freq_i = _checked(_as_int(freq, where, "frequency"), FREQUENCY, where, "frequency")
    t = _checked(_as_float(time_s, where, "time"), TIME, where, "time")
    e = _checked(_as_float(energy_j, where, "energy"), ENERGY, where, "energy")
    return stage_i, str(instruction), freq_i, t, e


def _checked(value: Any, allowed: Range, where: str, column: str) -> Any:
    problem = allowed.problem(value)
    if problem:
        raise ProfileError(f"{where}: {column} {value!r} {problem}")
    return value


def _as_float(value: Any, where: str, column: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ProfileError(f"{where}: {column} is empty; fill in a finite number")
    if isinstance(value, bool):
        raise ProfileError(f"{where}: {column} {value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProfileError(f"{where}: {column} {_short(repr(value))} is not a number") from None
    if math.isnan(out) or math.isinf(out):
        shown = _short(value.strip()) if isinstance(value, str) else repr(value)
        raise ProfileError(f"{where}: {column} is {shown}; fill in a finite number")
    return out


def _as_int(value: Any, where: str, column: str) -> int:
    out = _as_float(value, where, column)
    if out != int(out):
        raise ProfileError(f"{where}: {column} {out!r} must be an integer")
    return int(out)


def blocking_power_per_stage_w(p2p_power_w: Any, num_stages: int) -> List[float]:
    """Expand ``planner.p2p_power_w`` (one value or one per stage) to a per-stage list.

    Raises:
        ProfileError: not a finite power >= 0 W (or a list of them), or a list whose length is
            not the profile's stage count.
    """
    from perseus.config import p2p_power_problems

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
