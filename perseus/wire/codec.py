"""Wire models to and from JSON: what the client sends and how it reads the server's answers.

Part of :mod:`perseus.wire` (see there). Standard library only.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import (
    Annotated,
    Any,
    Dict,
    List,
    Type,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

M = TypeVar("M")


def to_json(message: Any) -> Dict[str, Any]:
    """A model as a JSON-ready dict (enums become their values)."""
    return dataclasses.asdict(message)


def from_json(model: Type[M], data: Any) -> M:
    """Build ``model`` from decoded JSON (nested models, enums and lists converted).

    Used by the client on the server's answers; the server validates requests with their
    bounds instead. Unknown keys are ignored (a newer server may send more).

    Raises:
        TypeError, ValueError, KeyError: ``data`` does not fit ``model``.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{model.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = get_type_hints(model)
    names = {f.name for f in dataclasses.fields(model)}  # type: ignore[arg-type]
    kwargs = {k: _convert(hints[k], v) for k, v in data.items() if k in names}
    return model(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _convert(args[0], value)
    if origin is Union:
        if value is None:
            return None
        options = [a for a in args if a is not type(None)]
        if isinstance(value, dict):  # an object: the member that is a model
            options = [a for a in options if dataclasses.is_dataclass(a)] or options
        return _convert(options[0], value)
    if origin in (list, List):
        return [_convert(args[0], v) for v in value]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return value
