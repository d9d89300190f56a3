"""Wire models to and from JSON: what the client sends and how it reads the server's answers.

Part of :mod:`perseus.wire` (see there). Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import Enum
from typing import (
    Annotated,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Type,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

M = TypeVar("M")
# How a decoded JSON value becomes a field's value (``None``: as it is, no conversion).
Converter = Optional[Callable[[Any], Any]]
# Per model: its fields' converters, built once (type hints are slow to resolve; the link's
# thread decodes a schedule every iteration).
_PLANS: Dict[type, Dict[str, Converter]] = {}
# Values ``to_json`` hands on as they are.
_SCALARS = frozenset({int, float, str, bool, type(None)})


def to_json(message: Any) -> Dict[str, Any]:
    """A model as a JSON-ready dict: nested models as dicts, containers copied.

    The same result as :func:`dataclasses.asdict`, without its deep copy of every value: the
    values of wire models are numbers, strings, enums and containers of them.
    """
    return _encode(message)  # type: ignore[no-any-return]


def _encode(value: Any) -> Any:
    cls = type(value)
    if cls in _SCALARS:
        return value
    if cls is list:
        if all(type(v) in _SCALARS for v in value):
            return list(value)
        return [_encode(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        items = [_encode(v) for v in value]
        return cls(*items) if hasattr(value, "_fields") else cls(items)
    if isinstance(value, dict):
        return cls((_encode(k), _encode(v)) for k, v in value.items())
    return value


def from_json(model: Type[M], data: Any) -> M:
    """Build ``model`` from decoded JSON (nested models, enums and lists converted).

    Used by the client on the server's answers; the server validates requests with their
    bounds instead. Unknown keys are ignored (a newer server may send more).

    Raises:
        TypeError, ValueError, KeyError: ``data`` does not fit ``model``.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{model.__name__}: expected a JSON object, got {type(data).__name__}")
    plan = _PLANS.get(model)
    if plan is None:
        hints = get_type_hints(model, include_extras=True)
        plan = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(model)}  # type: ignore[arg-type]
        _PLANS[model] = plan
    kwargs = {}
    for key, value in data.items():
        if key in plan:
            convert = plan[key]
            kwargs[key] = value if convert is None else convert(value)
    return model(**kwargs)


def _converter(hint: Any) -> Converter:
    """How a JSON value becomes a value of type ``hint`` (``None``: as it is)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _converter(args[0])
    if origin is Union:
        options = [a for a in args if a is not type(None)]
        # An object becomes the member that is a model (the first option otherwise).
        models = [a for a in options if dataclasses.is_dataclass(a)]
        plain = _converter(options[0])
        of_dict = _converter(models[0]) if models else plain
        if plain is None and of_dict is None:
            return None

        def union(value: Any) -> Any:
            if value is None:
                return None
            convert = of_dict if isinstance(value, dict) else plain
            return value if convert is None else convert(value)

        return union
    if origin in (list, List):
        item = _converter(args[0])
        if item is None:
            return list
        return lambda value: [item(v) for v in value]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return functools.partial(from_json, hint)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    return None
