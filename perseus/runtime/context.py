"""Where adapters get their optimizer: one per (stage, key), built on first use.

Adapters call :func:`optimizer_for` with the rank's :class:`~perseus.runtime.types.RankInfo`
and a key (e.g. the engine object, so several engines in one process each get their own) and
only ever call the hook methods of what comes back.

Where the configuration comes from, first match wins:

1. An explicit :func:`configure` call in the training script: ``configure(cfg)`` with a
   :class:`~perseus.config.PerseusConfig`, or ``configure(factory=...)`` with a callable
   ``RankInfo -> Hooks`` (tests and custom set-ups).
2. Under ``perseus-train``: the launcher writes the resolved configuration as YAML into the run
   directory and sets the environment variable ``PERSEUS_CONFIG`` to its path in every rank.
3. Otherwise the defaults of :class:`~perseus.config.PerseusConfig`.

Optimizers built here share one :class:`~perseus.runtime.device.RankDevice` (GPU, guard, clock
controller) per local GPU index, kept in the process's
:class:`~perseus.runtime.device.DeviceTable`: several engines of one process (several keys)
drive the same device without fighting over its ownership, and the controller's record of the
clock in force stays true. Optimizers, then devices, are closed (clocks restored) by
:func:`reset` and at interpreter exit. OmegaConf is imported only to read ``PERSEUS_CONFIG``.
"""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from perseus.errors import ConfigError
from perseus.runtime.device import DeviceTable
from perseus.runtime.types import Hooks, RankInfo

if TYPE_CHECKING:
    from perseus.config import PerseusConfig

CONFIG_ENV = "PERSEUS_CONFIG"

_lock = threading.Lock()
_config: Optional[PerseusConfig] = None
_factory: Optional[Callable[[RankInfo], Hooks]] = None
_optimizers: Dict[Tuple[int, object], Hooks] = {}


_devices = DeviceTable()


def configure(
    cfg: Optional[PerseusConfig] = None,
    *,
    factory: Optional[Callable[[RankInfo], Hooks]] = None,
) -> None:
    """Set how optimizers are built from now on (already built ones are kept).

    Args:
        cfg: The configuration to build :class:`PerseusOptimizer` objects from.
        factory: Builds the hooks of one rank instead (takes precedence over ``cfg``).
    """
    global _config, _factory
    with _lock:
        _config = cfg
        _factory = factory


def optimizer_for(rank: RankInfo, key: object = None) -> Hooks:
    """The hooks of ``rank``'s stage for ``key``, built on the first call."""
    ident = (rank.stage, key)
    hooks = _optimizers.get(ident)
    if hooks is not None:
        return hooks
    with _lock:
        hooks = _optimizers.get(ident)
        if hooks is None:
            hooks = _build(rank)
            _optimizers[ident] = hooks
    return hooks


def active_optimizers() -> List[Hooks]:
    """The optimizers built so far (for reports and tests)."""
    return list(_optimizers.values())


def reset() -> None:
    """Close every optimizer built here, then the devices, and forget the configuration.

    Every optimizer and device is closed even when one fails; a failure is raised at the end.
    Tests call this; it also runs at interpreter exit.
    """
    global _config, _factory
    with _lock:
        built = list(_optimizers.values())
        _optimizers.clear()
        _config = None
        _factory = None
    with ExitStack() as stack:
        stack.callback(_devices.close)  # last: the optimizers drive the devices
        for hooks in built:
            close = getattr(hooks, "close", None)
            if close is not None:
                stack.callback(close)


def current_config() -> PerseusConfig:
    """The configuration optimizers are built from (see the module docstring for the order)."""
    if _config is not None:
        return _config
    path = os.environ.get(CONFIG_ENV)
    if path:
        return load_config_file(Path(path))
    from perseus.config import PerseusConfig, validate

    cfg = PerseusConfig()
    validate(cfg)
    return cfg


def load_config_file(path: Path) -> PerseusConfig:
    """Read a resolved configuration YAML (as the launcher writes it) and validate it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from perseus.config import PerseusConfig, to_object

    if not path.is_file():
        raise ConfigError(
            f"{CONFIG_ENV}={path}: no such file; the launcher writes it into the run "
            f"directory — unset {CONFIG_ENV} when running without perseus-train"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PerseusConfig), OmegaConf.load(path))
    except (OmegaConfBaseException, OSError, ValueError) as exc:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot read the configuration: {exc}") from exc
    return to_object(merged)


def _build(rank: RankInfo) -> Hooks:
    if _factory is not None:
        return _factory(rank)
    from perseus.runtime.optimizer import PerseusOptimizer

    cfg = current_config()
    # The optimizer registers its exit closer after the device's: at exit it closes first.
    return PerseusOptimizer.from_config(cfg, rank, device=_devices.get(cfg, rank))
