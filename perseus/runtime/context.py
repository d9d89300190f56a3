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

The job's shape (stages, microbatches, data- and tensor-parallel sizes, schedule) is the
engine's: the adapters read it into the :class:`~perseus.runtime.types.RankInfo`, and
:mod:`perseus.runtime.job_shape` fills the keys the user did not set from it and rejects those
set to other values.

Never break the user's training: in the user's own script, whatever stops Perseus from
starting (a shape mismatch, no server, a broken configuration or GPU driver) becomes one
warning and hooks that do nothing (default clocks). Under ``perseus-train`` (``configure(cfg,
managed=True)``) the same problems are errors before step 1. The GPU's start-up check keeps
its own switch (``gpu.on_unsupported``: ``error`` stops before step 1 with every problem and the
fix, ``measure_only`` trains on, measuring). Global rank 0 prints a line
saying that Perseus is active and how (:mod:`perseus.runtime.announce`).

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
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, List, Optional, Tuple

from perseus.errors import ConfigError, GPUPreflightError
from perseus.records import RankInfo
from perseus.runtime import announce, job_shape, rendezvous
from perseus.runtime.device import DeviceTable
from perseus.runtime.types import Hooks

if TYPE_CHECKING:
    from perseus.config import PerseusConfig

CONFIG_ENV = "PERSEUS_CONFIG"

_lock = threading.Lock()
_config: Optional[PerseusConfig] = None
_factory: Optional[Callable[[RankInfo], Hooks]] = None
_managed = False
_optimizers: Dict[Tuple[int, object], Hooks] = {}


_devices = DeviceTable()


def configure(
    cfg: Optional[PerseusConfig] = None,
    *,
    factory: Optional[Callable[[RankInfo], Hooks]] = None,
    managed: bool = False,
) -> None:
    """Set how optimizers are built from now on (already built ones are kept).

    Args:
        cfg: The configuration to build :class:`PerseusOptimizer` objects from. Its
            ``parallelism`` keys that differ from the defaults must agree with the engine;
            the others are filled from it.
        factory: Builds the hooks of one rank instead (takes precedence over ``cfg``).
        managed: ``perseus-train`` runs this process: every key of ``cfg`` must agree with
            the engine, and a problem building the optimizer is an error, not a warning.
    """
    global _config, _factory, _managed
    with _lock:
        _config = cfg
        _factory = factory
        _managed = managed


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
    global _config, _factory, _managed
    with _lock:
        built = list(_optimizers.values())
        _optimizers.clear()
        _config = None
        _factory = None
        _managed = False
    with ExitStack() as stack:
        stack.callback(announce.reset)
        stack.callback(rendezvous.reset)  # after the optimizers: stops a server started here
        stack.callback(_devices.close)  # last: the optimizers drive the devices
        for hooks in built:
            close = getattr(hooks, "close", None)
            if close is not None:
                stack.callback(close)


def current_config() -> PerseusConfig:
    """The configuration optimizers are built from (see the module docstring for the order)."""
    return _current()[0]


def _current() -> Tuple[PerseusConfig, Optional[FrozenSet[str]], str]:
    """The configuration, the shape keys the user set in it (``None``: all), and its origin."""
    if _config is not None:
        if _managed:
            return _config, None, "perseus-train's configuration"
        return _config, job_shape.keys_off_default(_config), "the configure() call"
    path = os.environ.get(CONFIG_ENV)
    if path:
        return load_config_file(Path(path)), _keys_in_file(Path(path)), f"{CONFIG_ENV}={path}"
    from perseus.config import PerseusConfig
    from perseus.config_validation import validate

    cfg = PerseusConfig()
    validate(cfg)
    return cfg, frozenset(), "the defaults"


def _keys_in_file(path: Path) -> FrozenSet[str]:
    from omegaconf import OmegaConf

    return job_shape.keys_in_yaml(OmegaConf.to_container(OmegaConf.load(path)))


def load_config_file(path: Path) -> PerseusConfig:
    """Read a resolved configuration YAML (as the launcher writes it) and validate it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from perseus.config import PerseusConfig
    from perseus.config_validation import to_object

    if not path.is_file():
        raise ConfigError(
            f"{CONFIG_ENV}={path}: no such file; point {CONFIG_ENV} at a YAML file with the "
            "keys to change (a partial configuration is fine), or unset it to use the defaults"
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

    try:
        cfg, explicit, where = _current()
        cfg = job_shape.apply_engine_shape(cfg, rank, explicit, where)
        # The optimizer registers its exit closer after the device's: at exit it closes first.
        hooks = PerseusOptimizer.from_config(cfg, rank, device=_devices.get(cfg, rank))
    except Exception as exc:
        rendezvous.give_up(rank, str(exc))
        # The GPU's start-up check has its own switch: gpu.on_unsupported=error (the default)
        # stops before step 1 with every problem and the fix, measure_only trains on.
        if _managed or isinstance(exc, GPUPreflightError):
            raise
        return _disabled(rank, exc)
    if rank.rank == 0:
        endpoint = hooks.source.endpoint
        served = None if endpoint is None else f"{endpoint.where}, job {endpoint.job_id}"
        announce.say(announce.start_line(str(cfg.runtime.mode), hooks.gpu, served))
    return hooks


class DisabledHooks:
    """The hooks of a rank Perseus could not start on: training runs at default clocks."""

    def __init__(self, rank: RankInfo, reason: str) -> None:
        self.rank = rank
        self.reason = reason

    def on_step_begin(self) -> None:
        """Nothing: default clocks."""

    def on_step_end(self) -> None:
        """Nothing: default clocks."""

    def on_instruction_begin(self, name: str) -> None:
        """Nothing: default clocks."""

    def on_instruction_end(self, name: str) -> None:
        """Nothing: default clocks."""


def _disabled(rank: RankInfo, exc: Exception) -> DisabledHooks:
    """One warning (on rank 0 when every rank has the problem), then hooks that do nothing."""
    shared = bool(getattr(exc, "shared", False)) or isinstance(exc, job_shape.JobShapeError)
    reason = str(exc) or type(exc).__name__
    if rank.rank == 0 or not shared:
        announce.warn_once(
            f"Perseus is off for this run: {reason}. Training goes on unchanged at default GPU "
            "clocks. Fix the problem above; settings go in a YAML file named by "
            f"{CONFIG_ENV} (only the keys to change) — see the README, 'Your own training "
            "script'."
        )
    return DisabledHooks(rank, reason)
