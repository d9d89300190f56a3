"""One check for numbers: finite, within a range, integer where counts are meant.

Configuration keys (:func:`perseus.config.validation.validate`), the file formats (profiles, plans)
and the wire models the client builds all describe their numbers with a :class:`Range` and ask it
for the problem with a value, so every surface rejects NaN, infinity, a wrong type or an out-of-
range value with the same words. Standard library only (the training process uses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple, Union

Number = Union[int, float]


def is_number(value: Any) -> bool:
    """``int`` or ``float`` but not ``bool`` (``True`` is an ``int`` to Python, not to users)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Range:
    """Which numbers a value may be: finite, optionally bounded, optionally an integer.

    Args:
        ge: Lower bound (inclusive).
        gt: Lower bound (exclusive).
        le: Upper bound (inclusive).
        lt: Upper bound (exclusive).
        integer: Only whole numbers (``int``; a float such as ``3.0`` is refused too, as
            configuration typing would).
        optional: ``None`` is allowed (the key's "not set").
        unit: Unit named in messages (``"s"``, ``"W"``, ``"MHz"``).

    NaN and infinity are never within a range: every comparison is written so that NaN fails
    it, and an unbounded side still refuses infinity.
    """

    ge: Optional[Number] = None
    gt: Optional[Number] = None
    le: Optional[Number] = None
    lt: Optional[Number] = None
    integer: bool = False
    optional: bool = False
    unit: str = ""

    def describe(self) -> str:
        """What the range accepts: ``"a finite number > 0 s"``, ``"an integer in 1..65535"``."""
        kind = "an integer" if self.integer else "a finite number"
        unit = f" {self.unit}" if self.unit else ""
        if self.integer and self.ge is not None and self.le is not None:
            text = f"{kind} in {_fmt(self.ge)}..{_fmt(self.le)}{unit}"
        else:
            bounds = [
                f"{op} {_fmt(bound)}"
                for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                if bound is not None
            ]
            text = f"{kind} {' and '.join(bounds)}{unit}" if bounds else f"{kind}{unit}"
        return f"{text} (or unset)" if self.optional else text

    def problem(self, value: Any) -> Optional[str]:
        """Why ``value`` is not in this range (``"must be ..."``), or ``None`` when it is."""
        if value is None:
            return None if self.optional else f"must be set to {self.describe()}"
        if not is_number(value) or (self.integer and not isinstance(value, int)):
            return f"must be {self.describe()}, not {type(value).__name__} {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"is not finite; it must be {self.describe()}"
        if (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (self.lt is not None and not value < self.lt)
        ):
            return f"must be {self.describe()}"
        return None


def number_problem(key: str, value: Any, allowed: Range) -> Optional[str]:
    """``"<key>=<value>: <problem>"`` when ``value`` is outside ``allowed``, else ``None``."""
    problem = allowed.problem(value)
    return None if problem is None else f"{key}={_shown(value)}: {problem}"


def finite_or_none(value: Any) -> Optional[float]:
    """``value`` as a float when it is a finite number, else ``None`` (for measured values)."""
    if is_number(value) and math.isfinite(value):
        return float(value)
    return None


def non_finite_paths(data: Any, path: str = "") -> Iterator[Tuple[str, float]]:
    """Every NaN or infinite float inside nested dicts, lists and tuples, with its path.

    Paths read like ``predicted.energy_j`` or ``stages[1][3].frequency_mhz``.
    """
    if isinstance(data, float):
        if not math.isfinite(data):
            yield path or "<value>", data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from non_finite_paths(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from non_finite_paths(value, f"{path}[{index}]")


def ranges_problems(values: Dict[str, Any], ranges: Dict[str, Range]) -> Iterator[str]:
    """The problem of every ``values[key]`` outside ``ranges[key]`` (keys missing are skipped)."""
    for key, allowed in ranges.items():
        if key in values:
            problem = number_problem(key, values[key], allowed)
            if problem:
                yield problem


def _fmt(bound: Number) -> str:
    if isinstance(bound, float) and bound.is_integer() and abs(bound) < 1e15:
        return str(int(bound)) if abs(bound) <= 1e7 else f"{bound:g}"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
