"""The job's shape comes from the training engine; the configuration may only agree with it.

An adapter reads where its engine sits and what it runs (stages, microbatches per iteration,
data- and tensor-parallel sizes, schedule, model chunks) into
:class:`~perseus.runtime.types.RankInfo`. Before an optimizer is built from the configuration,
:func:`apply_engine_shape` fills every ``parallelism.*`` key the user did not set from the
engine, and rejects every key the user set to another value, naming both values: a plan or a
server job for 8 microbatches must never be applied to an engine that runs 4.

Which keys count as set depends on where the configuration came from (:class:`Origin`): under
``perseus-train`` all of them (the launcher built the engine from them); with ``PERSEUS_CONFIG``
the keys that file names; with ``perseus.runtime.context.configure(cfg)`` the keys whose value
differs from the default; with the defaults none.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from typing import TYPE_CHECKING, Any, FrozenSet, List, Mapping, NamedTuple, Optional, Tuple

from perseus.errors import JobShapeError
from perseus.records import RankInfo

__all__ = ["JobShapeError", "Origin", "apply_engine_shape", "keys_in_yaml", "keys_off_default"]

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

# (parallelism key, RankInfo field, what the engine runs, in words)
SHAPE_KEYS: Tuple[Tuple[str, str, str], ...] = (
    ("pp", "num_stages", "pipeline stages"),
    ("dp", "dp", "data-parallel replicas"),
    ("tp", "tp", "tensor-parallel ranks per stage"),
    ("num_microbatches", "num_microbatches", "microbatches per iteration"),
    ("schedule", "schedule", "pipeline schedule"),
    ("num_model_chunks", "num_model_chunks", "model chunks per stage"),
)
ALL_KEYS: FrozenSet[str] = frozenset(key for key, _, _ in SHAPE_KEYS)


def keys_in_yaml(data: Any) -> FrozenSet[str]:
    """The ``parallelism.*`` shape keys a loaded YAML mapping sets."""
    section = data.get("parallelism") if isinstance(data, Mapping) else None
    if not isinstance(section, Mapping):
        return frozenset()
    return frozenset(str(k) for k in section if str(k) in ALL_KEYS)


def keys_off_default(cfg: PerseusConfig) -> FrozenSet[str]:
    """The shape keys of ``cfg`` whose value differs from the configuration's default."""
    from perseus.config.schema import ParallelismConfig

    defaults = ParallelismConfig()
    return frozenset(
        f.name
        for f in fields(ParallelismConfig)
        if f.name in ALL_KEYS and getattr(cfg.parallelism, f.name) != getattr(defaults, f.name)
    )


class Origin(NamedTuple):
    """Where a configuration came from, which says which shape keys its user set.

    Attributes:
        where: In words, for messages (``"perseus-train's configuration"``).
        managed: ``perseus-train`` built the engine from it: every key counts as set.
        file_content: The loaded ``PERSEUS_CONFIG`` file: the keys it names are set.
        configured: ``configure(cfg)``: the keys off their default are set.
    """

    where: str
    managed: bool = False
    file_content: Any = None
    configured: bool = False


def explicit_keys(cfg: PerseusConfig, origin: Origin) -> Optional[FrozenSet[str]]:
    """The shape keys the user of ``cfg`` set (``None``: every key)."""
    if origin.managed:
        return None
    if origin.file_content is not None:
        return keys_in_yaml(origin.file_content)
    if origin.configured:
        return keys_off_default(cfg)
    return frozenset()


def apply_engine_shape(cfg: PerseusConfig, rank: RankInfo, origin: Origin) -> PerseusConfig:
    """``cfg`` with its job shape taken from the engine (a copy when anything changes).

    Args:
        cfg: The configuration optimizers are built from.
        rank: What the adapter read from the engine (``None`` fields: the engine did not say).
        origin: Where the configuration came from (which keys the user set, for messages).

    Raises:
        JobShapeError: naming every key set to another value than the engine runs, both
            values, and the fix.
    """
    explicit, where = explicit_keys(cfg, origin), origin.where
    problems: List[str] = []
    updates: List[Tuple[str, Any]] = []
    for key, attr, words in SHAPE_KEYS:
        engine_value = getattr(rank, attr)
        if engine_value is None:
            continue
        configured = getattr(cfg.parallelism, key)
        if configured == engine_value:
            continue
        if explicit is None or key in explicit:
            problems.append(
                f"parallelism.{key}={configured} in {where}, but the training engine runs "
                f"{engine_value} {words} ({key}={engine_value})"
            )
        else:
            updates.append((key, engine_value))
    if problems:
        raise JobShapeError(
            "the job's shape disagrees with the training engine: "
            + "; ".join(problems)
            + ". Perseus plans for what the engine runs: remove these keys (they are then "
            "read from the engine) or set them to the engine's values"
        )
    if not updates:
        return cfg
    cfg = copy.deepcopy(cfg)
    for key, value in updates:
        setattr(cfg.parallelism, key, value)
    return cfg
