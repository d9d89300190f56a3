"""Checking the fields of a CSV table: header, row width, numbers in range, with clear errors.

Shared by the profile CSV reader (:mod:`perseus.formats.profile.table`); every message names the
file and row and says how to fix the problem.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

from perseus.config.numbers import Range
from perseus.errors import ProfileError


def column_index(
    header: List[str], where: str, columns: Sequence[str], fix_header: str
) -> Dict[str, int]:
    """Where each column is (names trimmed); the header as read when it does not fit.

    Spaces around a name carry no meaning (``stage, instruction, ...`` is the same header).
    A header that does not fit is shown with its text and each column as read (``repr``: a
    stray character in a name that looks right is visible), with the fix.

    Args:
        header: The header row read.
        where: File and row, for messages.
        columns: The required columns.
        fix_header: How to fix a header that is not one (the whole line to write).
    """
    expected = ",".join(columns)
    names = [name.strip() for name in header]
    found = short(",".join(header))
    twice = sorted({name for name in names if name in columns and names.count(name) > 1})
    if twice:
        raise ProfileError(f"{where}: column(s) {twice} appear more than once in {found!r}")
    index = {name: i for i, name in enumerate(names)}
    missing = [c for c in columns if c not in index]
    if not missing:
        return index
    if all(c in {name.lower() for name in names} for c in columns):
        fix = "write the column names in lower case"
    elif len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
        sep = next(sep for sep in ";\t|" if sep in header[0])
        fix = f"separate the columns with commas, not {sep!r}"
    elif header and is_number(header[0]):
        fix = fix_header
    else:
        fix = f"missing column(s) {missing}"
    raise ProfileError(
        f"{where}: the header is {found!r}, read as the columns {short(repr(header), 200)}; "
        f"expected the columns {expected} (in any order; extra columns are ignored): {fix}"
    )


def width_problem(source: str, line: int, fields: List[str], header: List[str]) -> str:
    """What is wrong with a row whose field count differs from the header's."""
    found = short(",".join(fields))
    expected = f"the header {short(','.join(header))!r} has {len(header)}"
    hint = "fill in every column"
    if len(fields) > len(header):
        extra = fields[len(header) :]
        hint = (
            "remove the trailing comma(s)"
            if not any(f.strip() for f in extra)
            else "name the extra column(s) in the header"
        )
    return f"{source}, row {line}: {len(fields)} fields ({found!r}) but {expected}: {hint}"


def short(text: str, limit: int = 60) -> str:
    """``text``, shortened for a message (to about ``limit`` characters)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}... ({len(text)} characters)"


def is_number(text: str) -> bool:
    """Whether ``text`` parses as a number."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def checked(value: Any, allowed: Range, where: str, column: str) -> Any:
    """``value`` if ``allowed`` holds it, else a :class:`ProfileError` naming the column."""
    problem = allowed.problem(value)
    if problem:
        raise ProfileError(f"{where}: {column} {value!r} {problem}")
    return value


def as_float(value: Any, where: str, column: str) -> float:
    """A finite number from a field, else a :class:`ProfileError`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ProfileError(f"{where}: {column} is empty; fill in a finite number")
    if isinstance(value, bool):
        raise ProfileError(f"{where}: {column} {value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProfileError(f"{where}: {column} {short(repr(value))} is not a number") from None
    if math.isnan(out) or math.isinf(out):
        shown = short(value.strip()) if isinstance(value, str) else repr(value)
        raise ProfileError(f"{where}: {column} is {shown}; fill in a finite number")
    return out


def as_int(value: Any, where: str, column: str) -> int:
    """An integer from a field, else a :class:`ProfileError`."""
    out = as_float(value, where, column)
    if out != int(out):
        raise ProfileError(f"{where}: {column} {out!r} must be an integer")
    return int(out)
