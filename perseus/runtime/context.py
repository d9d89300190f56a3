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

Optimizers built here share one GPU object, one :class:`~perseus.gpu.guard.GPUGuard` and one
clock controller per local GPU index: several engines of one process (several keys) drive the
same device without fighting over its ownership, and the controller's record of the clock in
force stays true. Optimizers and devices are closed (clocks restored) by :func:`reset` and at
interpreter exit.
Standard library only at import time (OmegaConf is imported only to read ``PERSEUS_CONFIG``);
runs on Python 3.9.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from perseus.errors import ConfigError
from perseus.runtime import lifecycle
from perseus.runtime.types import Hooks, RankInfo

if TYPE_CHECKING:
    from perseus.config import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.gpu.guard import GPUGuard
    from perseus.runtime.controller import ClockController

logger = logging.getLogger(__name__)

CONFIG_ENV = "PERSEUS_CONFIG"

_lock = threading.Lock()
_config: Optional[PerseusConfig] = None
_factory: Optional[Callable[[RankInfo], Hooks]] = None
_optimizers: Dict[Tuple[int, object], Hooks] = {}


@dataclass
class _Device:
    """One GPU shared by the optimizers of this process."""

    gpu: GPU
    guard: Optional[GPUGuard]
    controller: Optional[ClockController]

    def close(self) -> None:
        try:
            if self.controller is not None:
                self.controller.close()
        finally:
            try:
                if self.guard is not None:
                    self.guard.release()  # restores first
            finally:
                self.gpu.close()


_devices: Dict[int, _Device] = {}


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
    """Close every optimizer built here and forget the configuration (tests use this)."""
    global _config, _factory
    with _lock:
        built = list(_optimizers.values())
        devices = list(_devices.values())
        _optimizers.clear()
        _devices.clear()
        _config = None
        _factory = None
    errors = []
    closers = [getattr(h, "close", None) for h in built] + [d.close for d in devices]
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except Exception as exc:
            logger.error("perseus.runtime.context.reset: %r", exc)
            errors.append(exc)
    if errors:
        raise errors[0]


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
    device = _devices.get(rank.local_gpu_index)
    if device is None:
        device = _open_device(cfg, rank)
        _devices[rank.local_gpu_index] = device
    return PerseusOptimizer.from_config(
        cfg, rank, gpu=device.gpu, guard=device.guard, controller=device.controller
    )


def _open_device(cfg: PerseusConfig, rank: RankInfo) -> _Device:
    from perseus.gpu.factory import build_gpu
    from perseus.gpu.preflight import preflight_config
    from perseus.runtime.build import take_guard
    from perseus.runtime.controller import ClockController

    gpu = build_gpu(cfg.gpu, rank.local_gpu_index, num_pipeline_stages=rank.num_stages)
    try:
        cfg = preflight_config(cfg, gpu)  # [gpu preflight] raises, or a measure-only config
    except BaseException:
        gpu.close()
        raise
    if cfg.runtime.mode == "measure":
        return _Device(gpu, None, None)
    try:
        guard = take_guard(cfg, rank, gpu)
    except BaseException:
        gpu.close()
        raise
    controller = ClockController(
        guard, synchronous=gpu.fast_clock_changes, name=f"-gpu{rank.local_gpu_index}"
    )
    # Stop the controller before the guard's own exit hook restores the clocks (optimizers
    # built on this device register later, so they close before this runs).
    lifecycle.move_exit_hook_last(_close_devices_at_exit)
    return _Device(gpu, guard, controller)


def _close_devices_at_exit() -> None:
    try:
        reset()  # optimizers first, then the devices they share
    except Exception as exc:  # pragma: no cover - best effort at interpreter exit
        logger.error("restoring the GPUs at exit failed: %r", exc)
