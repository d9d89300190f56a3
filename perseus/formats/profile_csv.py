"""The profile table: time and energy of one microbatch's instruction per stage per frequency.

CSV contract (``docs/design.md``, "Profile CSV")::

    stage,instruction,frequency,time,energy

``time`` in seconds and ``energy`` in joules of ONE microbatch's forward or backward on that
stage at that SM frequency (MHz). Extra columns are ignored. Read and written with the standard
``csv`` module (the emulated GPU loads profiles inside training processes).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from perseus.errors import ProfileError

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
        """Build from ``(stage, instruction, frequency, time, energy)`` tuples, validating."""
        table: Dict[Tuple[int, str], List[Measurement]] = {}
        seen: Dict[Tuple[int, str, int], int] = {}
        for row_no, row in enumerate(rows, start=2):
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

    Raises:
        ProfileError: naming the file, the row (as in a spreadsheet: the header is row 1)
            and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise ProfileError(
            f"profile {path} does not exist; pass the CSV written by the profiler "
            "(planner.profile=...)"
        )
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ProfileError(
                    f"{path}: missing column(s) {missing}; the header must contain "
                    f"{','.join(COLUMNS)}"
                )
            rows = [tuple(row[c] for c in COLUMNS) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{path}: cannot parse as CSV: {exc}") from exc
    return Profile.from_rows(rows, source=str(path))


def _check_row(row: Sequence[Any], source: str, row_no: int) -> Tuple[int, str, int, float, float]:
    where = f"{source}, row {row_no}"
    stage, instruction, freq, time_s, energy_j = row
    stage_i = _as_int(stage, where, "stage")
    if stage_i < 0:
        raise ProfileError(f"{where}: stage {stage_i} must be >= 0")
    if instruction not in INSTRUCTIONS:
        raise ProfileError(f"{where}: instruction {instruction!r} must be 'forward' or 'backward'")
    freq_i = _as_int(freq, where, "frequency")
    if freq_i <= 0:
        raise ProfileError(f"{where}: frequency {freq_i} must be a positive integer (MHz)")
    t = _as_float(time_s, where, "time")
    if t <= 0:
        raise ProfileError(f"{where}: time {t!r} must be > 0 seconds")
    e = _as_float(energy_j, where, "energy")
    if e < 0:
        raise ProfileError(f"{where}: energy {e!r} must be >= 0 joules")
    return stage_i, str(instruction), freq_i, t, e


def _as_float(value: Any, where: str, column: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ProfileError(f"{where}: {column} is empty; fill in a finite number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: {column} {value!r} is not a number") from None
    if math.isnan(out) or math.isinf(out):
        raise ProfileError(f"{where}: {column} is {out!r}; fill in a finite number")
    return out


def _as_int(value: Any, where: str, column: str) -> int:
    out = _as_float(value, where, column)
    if out != int(out):
        raise ProfileError(f"{where}: {column} {out!r} must be an integer")
    return int(out)


def blocking_power_per_stage_w(p2p_power_w: Any, num_stages: int) -> List[float]:
    """Expand ``planner.p2p_power_w`` (one value or one per stage) to a per-stage list."""
    if isinstance(p2p_power_w, (int, float)) and not isinstance(p2p_power_w, bool):
        values = [float(p2p_power_w)] * num_stages
    else:
        try:
            values = [float(v) for v in p2p_power_w]
        except (TypeError, ValueError):
            raise ProfileError(
                f"planner.p2p_power_w={p2p_power_w!r}: give one number (W) or a list with "
                "one number per stage"
            ) from None
        if len(values) != num_stages:
            raise ProfileError(
                f"planner.p2p_power_w has {len(values)} values but the profile has "
                f"{num_stages} stages; give one value or one per stage"
            )
    if any(v < 0 or math.isnan(v) for v in values):
        raise ProfileError(f"planner.p2p_power_w={p2p_power_w!r}: powers must be >= 0 W")
    return values
