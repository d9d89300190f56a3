"""JSON as Perseus writes and reads it: strict (no NaN or Infinity), UTF-8, errors with positions.

Python's :mod:`json` writes ``NaN`` and ``Infinity`` by default, which other readers (browsers,
``jq``, pydantic in strict mode) refuse; every JSON file Perseus writes goes through
:func:`dumps`, which refuses them and names the key that held one. :func:`loads` reads files
users hand to Perseus (plans, reports): bytes that are not UTF-8, ``NaN``/``Infinity``, nesting
too deep for the parser and integers too long for Python all end in the caller's error class
with the line and column, never in a traceback.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional, Tuple, Type, Union

from perseus.config.numbers import non_finite_paths
from perseus.errors import NonFiniteError
from perseus.formats.text_file import decode_utf8

Default = Optional[Callable[[Any], Any]]


def dumps(
    data: Any,
    *,
    what: str,
    indent: Optional[int] = None,
    sort_keys: bool = False,
    default: Default = str,
) -> str:
    """``data`` as strict JSON text.

    Args:
        data: What to write.
        what: Named in the error (a file name or a description).
        indent: As :func:`json.dumps`.
        sort_keys: As :func:`json.dumps`.
        default: Applied to values JSON has no type for (``str``: paths, enums).

    Raises:
        NonFiniteError: a float in ``data`` is NaN or infinite (its path is named).
    """
    try:
        return json.dumps(
            data, indent=indent, sort_keys=sort_keys, default=default, allow_nan=False
        )
    except ValueError as exc:
        found = next(non_finite_paths(data), None)
        if found is None:
            raise
        path, value = found
        raise NonFiniteError(
            f"{what}: {path} is {value!r}, which strict JSON cannot hold; the value was "
            "computed from non-finite inputs (check the numbers that produced it)"
        ) from exc


def loads(text: Union[str, bytes], *, source: str, error: Type[Exception], fix: str) -> Any:
    """Parse strict JSON, turning every failure into ``error`` with the file and position.

    Args:
        text: The file's content (bytes are decoded as UTF-8; a byte-order mark is skipped).
        source: The file, named in messages.
        error: The exception class to raise (e.g. :class:`~perseus.errors.PlanError`).
        fix: What the user should do, appended to every message.

    Raises:
        error: not UTF-8, not JSON, ``NaN``/``Infinity``, nesting too deep, a number too long.
    """
    if isinstance(text, bytes):
        text = decode_utf8(text, source=source, error=error, fix=fix)
    elif text.startswith("\ufeff"):
        text = text[1:]
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NonStandardConstant as exc:
        line, col = _find(text, rf"(?<![\w\"]){re.escape(exc.name)}(?![\w\"])")
        raise error(
            f"{source}, line {line} column {col}: {exc.name} is not a JSON number (JSON has no "
            f"NaN or Infinity); {fix}"
        ) from None
    except json.JSONDecodeError as exc:
        raise error(
            f"{source}, line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg}); {fix}"
        ) from None
    except RecursionError:
        depth, offset = _deepest(text)
        line, col = line_col(text, offset)
        raise error(
            f"{source}, line {line} column {col}: nested too deeply to be read ({depth} levels "
            f"of brackets); {fix}"
        ) from None
    except ValueError as exc:  # an integer longer than Python converts (4300 digits)
        match = re.search(rf"\d{{{_LONG_DIGITS},}}", text)
        line, col = line_col(text, match.start() if match else 0)
        found = f"a number with {len(match.group())} digits" if match else f"a number ({exc})"
        raise error(f"{source}, line {line} column {col}: {found} cannot be read; {fix}") from None


class _NonStandardConstant(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _refuse_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


_LONG_DIGITS = 1000


def _find(text: str, pattern: str) -> Tuple[int, int]:
    match = re.search(pattern, text)
    return line_col(text, match.start() if match else 0)


def line_col(text: str, offset: int) -> Tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _deepest(text: str) -> Tuple[int, int]:
    """The deepest bracket nesting outside strings, and the offset where it is first reached."""
    depth, in_string, escaped = 0, False, False
    deepest, where = 0, 0
    for offset, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, where = depth, offset
        elif char in "]}":
            depth -= 1
    return deepest, where
