"""Bounded fields: dataclass fields that carry their bounds, checked on construction.

:class:`Bound` annotates a field (``Annotated[int, Bound(ge=1, le=512)]``); pydantic (the server,
through FastAPI) reads it as part of the field's schema, and :class:`Checked` models (those the
client builds: job specs, settings, registrations) check it on construction with
:class:`perseus.config.numbers.Range`, so a NaN, an infinity or an out-of-range number never leaves
the client. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import (
    Annotated,
    Any,
    List,
    Optional,
    Tuple,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from perseus.config.numbers import Range

__all__ = ["Bound", "Checked", "bounds_problems"]


class Bound:
    """Bounds of a field: ``Annotated[int, Bound(ge=1, le=512)]``.

    Keys are those of pydantic-core's schemas: ``ge``/``gt``/``le``/``lt`` (numbers),
    ``allow_inf_nan`` (floats; off unless given: a bounded float is finite), ``pattern``
    (strings), ``min_length``/``max_length`` (lists). The server's validation reads them through
    ``__get_pydantic_core_schema__``; the models the client builds check them on construction
    (:func:`bounds_problems`, with :class:`perseus.config.numbers.Range`).
    """

    def __init__(self, **constraints: Any) -> None:
        self.constraints = constraints

    @classmethod
    def of(cls, allowed: Range) -> Bound:
        """The bounds of a :class:`~perseus.config.numbers.Range` (its lower and upper limits)."""
        limits = {"ge": allowed.ge, "gt": allowed.gt, "le": allowed.le, "lt": allowed.lt}
        return cls(**{key: value for key, value in limits.items() if value is not None})

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.constraints.items())
        return f"Bound({inner})"

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        """Add the bounds to the schema pydantic builds for the annotated type."""
        schema = handler(source)
        inner = schema
        while inner.get("type") in ("nullable", "default"):
            inner = inner["schema"]
        if inner.get("type") == "float":
            inner["allow_inf_nan"] = False
        inner.update(self.constraints)
        return schema

    def range(self, integer: bool) -> Range:
        """The numeric bounds as a :class:`~perseus.config.numbers.Range` (no NaN, no infinity)."""
        c = self.constraints
        return Range(
            ge=c.get("ge"), gt=c.get("gt"), le=c.get("le"), lt=c.get("lt"), integer=integer
        )


class Checked:
    """Base of the models the client builds: their :class:`Bound` s are checked on construction.

    So a NaN, an infinity or an out-of-range number never leaves the client (the server checks
    the same bounds again on receipt).

    Raises:
        ValueError: from ``__post_init__``, naming every field outside its bounds.
    """

    def __post_init__(self) -> None:
        problems = bounds_problems(self)
        if problems:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(problems))


def bounds_problems(message: Any) -> List[str]:
    """Every field of ``message`` outside its :class:`Bound` (``"field=value: problem"``).

    Numbers are checked with :class:`perseus.config.numbers.Range` (finite, bounded, integer for
    ``int`` fields), strings against their pattern, lists against their lengths and item bounds.
    """
    problems = []
    for name, hint in _field_hints(type(message)):  # type: ignore[arg-type]
        value = getattr(message, name)
        problem = _hint_problem(hint, value)
        if problem:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            problems.append(f"{name}={shown}: {problem}")
    return problems


@functools.cache
def _field_hints(model: type) -> Tuple[Tuple[str, Any], ...]:
    hints = get_type_hints(model, include_extras=True)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(model))


def _hint_problem(hint: Any, value: Any) -> Optional[str]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        return _hint_problem(next(a for a in args if a is not type(None)), value)
    if origin is Annotated:
        base = args[0]
        for bound in (a for a in args[1:] if isinstance(a, Bound)):
            problem = _bound_problem(base, bound, value)
            if problem:
                return problem
        return _hint_problem(base, value)
    if origin in (list, List) and isinstance(value, list):
        for index, item in enumerate(value):
            problem = _hint_problem(args[0], item)
            if problem:
                return f"item {index} ({item!r}) {problem}"
    return None


def _bound_problem(base: Any, bound: Bound, value: Any) -> Optional[str]:
    c = bound.constraints
    if base in (int, float):
        return bound.range(integer=base is int).problem(value)
    if "pattern" in c and not (isinstance(value, str) and re.fullmatch(c["pattern"], value)):
        return f"must match {c['pattern']}"
    if isinstance(value, list):
        low, high = c.get("min_length", 0), c.get("max_length")
        if len(value) < low or (high is not None and len(value) > high):
            return f"must hold {low}..{high if high is not None else 'any'} items, not {len(value)}"
    return None
