"""Where to cut a model's layer sequence into pipeline stages.

Methods (``model.partition``):

* ``uniform``: the same number of layers per stage (earlier stages take the remainder).
* ``uniform_transformer``: the same number of transformer blocks per stage; the embedding goes
  with the first stage and the output layers with the last (transformer models only).
* ``custom:0,8,14,20,26``: explicit stage starts by layer id; the last number is the layer count.

Boundaries are returned as ``num_stages + 1`` ascending layer ids starting at 0 and ending at the
number of layers: stage ``s`` runs layers ``[parts[s], parts[s+1])``.
"""

from __future__ import annotations

from typing import List

from perseus.errors import ConfigError
from perseus.models.zoo import ModelDescription


def partition(description: ModelDescription, method: str, num_stages: int) -> List[int]:
    """Stage boundaries of ``description`` over ``num_stages`` stages.

    Raises:
        ConfigError: unknown method, malformed custom list, or a stage left without layers.
    """
    num_layers = description.num_layers
    if num_stages > num_layers:
        raise ConfigError(
            f"parallelism.pp={num_stages} exceeds the {num_layers} layers of model "
            f"{description.name!r}: use fewer stages or a deeper model"
        )
    if method == "uniform":
        return _even(num_layers, num_stages)
    if method == "uniform_transformer":
        return _uniform_transformer(description, num_stages)
    if method.startswith("custom:"):
        return _custom(description, method, num_stages)
    raise ConfigError(
        f"model.partition={method!r}: choose uniform, uniform_transformer or "
        "custom:<stage start ids>,<number of layers> (e.g. custom:0,8,14,20,26)"
    )


def _even(num_items: int, num_parts: int) -> List[int]:
    base, extra = divmod(num_items, num_parts)
    parts = [0]
    for stage in range(num_parts):
        parts.append(parts[-1] + base + (1 if stage < extra else 0))
    return parts


def _uniform_transformer(description: ModelDescription, num_stages: int) -> List[int]:
    blocks = description.block_ids
    if description.family not in ("gpt", "bert", "t5", "bloom") or not blocks:
        raise ConfigError(
            f"model.partition=uniform_transformer needs a transformer model; "
            f"{description.name!r} is {description.family}: use uniform or custom:..."
        )
    if num_stages > len(blocks):
        raise ConfigError(
            f"parallelism.pp={num_stages} exceeds the {len(blocks)} transformer blocks of "
            f"{description.name!r}: use fewer stages"
        )
    per_stage = _even(len(blocks), num_stages)
    parts = [0] + [blocks[per_stage[s]] for s in range(1, num_stages)]
    return [*parts, description.num_layers]


def _custom(description: ModelDescription, method: str, num_stages: int) -> List[int]:
    text = method[len("custom:") :]
    try:
        parts = [int(item) for item in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"model.partition={method!r}: expected comma-separated integers such as "
            "custom:0,8,14,20,26"
        ) from None
    problem = None
    if len(parts) != num_stages + 1:
        problem = f"has {len(parts)} numbers; parallelism.pp={num_stages} needs {num_stages + 1}"
    elif parts[0] != 0:
        problem = "must start at layer 0"
    elif parts[-1] != description.num_layers:
        problem = f"must end with the layer count of {description.name!r}, {description.num_layers}"
    elif any(b <= a for a, b in zip(parts, parts[1:])):
        problem = "must be strictly increasing (every stage needs at least one layer)"
    if problem:
        raise ConfigError(f"model.partition={method!r} {problem}")
    return parts
