"""Where adapters get their optimizer: the process's rank session.

Adapters call :func:`optimizer_for` with the rank's :class:`~perseus.records.RankInfo` and a key
(e.g. the engine object, so several engines in one process each get their own) and only ever
call the hook methods of what comes back. Everything behind it (devices, optimizers, the launch's
server, the warning) belongs to the process's one :class:`~perseus.runtime.session.RankSession`,
which closes it in one order, at :func:`reset` or at interpreter exit (see there for the start-up
walk).

Where the configuration comes from, first match wins:

1. An explicit :func:`configure` call in the training script: ``configure(cfg)`` with a
   :class:`~perseus.config.schema.PerseusConfig`, or ``configure(factory=...)`` with a callable
   ``RankInfo -> Hooks`` (tests and custom set-ups).
2. Under ``perseus-train``: the launcher writes the resolved configuration as YAML into the run
   directory and sets the environment variable ``PERSEUS_CONFIG`` to its path in every rank.
3. Otherwise the defaults of :class:`~perseus.config.schema.PerseusConfig`.

The job's shape (stages, microbatches, data- and tensor-parallel sizes, schedule) is the
engine's: the adapters read it into the :class:`~perseus.records.RankInfo`, and
:mod:`perseus.runtime.job_shape` fills the keys the user did not set from it and rejects those
set to other values.

Never break the user's training: in the user's own script, whatever stops Perseus from
starting (a shape mismatch, no server, a broken configuration or GPU driver) becomes one
warning and hooks that do nothing (default clocks). Under ``perseus-train`` (``configure(cfg,
managed=True)``) the same problems are errors before step 1. The GPU's start-up check keeps
its own switch (``gpu.on_unsupported``: ``error`` stops before step 1 with every problem and the
fix, ``measure_only`` trains on, measuring). Global rank 0 prints a line saying that Perseus is
active and how (:mod:`perseus.runtime.announce`). OmegaConf is imported only to read
``PERSEUS_CONFIG``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from perseus.records import RankInfo
from perseus.runtime.session import (
    CONFIG_ENV,
    DisabledHooks,
    HooksFactory,
    RankSession,
    Settings,
    read_config_file,
)
from perseus.runtime.types import Hooks

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

__all__ = [
    "CONFIG_ENV",
    "DisabledHooks",
    "active_optimizers",
    "configure",
    "current_config",
    "load_config_file",
    "optimizer_for",
    "reset",
]

_lock = threading.Lock()
# The process's session: made here, before any hook, and made anew by reset().
_session = RankSession()


def configure(
    cfg: Optional[PerseusConfig] = None,
    *,
    factory: Optional[HooksFactory] = None,
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
    with _lock:
        _session.settings = Settings(cfg, factory, managed)


def optimizer_for(rank: RankInfo, key: object = None) -> Hooks:
    """The hooks of ``rank``'s stage for ``key``, built on the first call."""
    return _session.hooks_for(rank, key)


def active_optimizers() -> List[Hooks]:
    """The optimizers built so far (for reports and tests)."""
    return _session.hooks


def reset() -> None:
    """Close the process's session (optimizers, the launch's server, devices) and start anew.

    The configuration goes with it. Tests call this; the session also closes at interpreter
    exit.
    """
    global _session
    with _lock:
        old, _session = _session, RankSession()
    old.close()


def launch_timings() -> Dict[str, float]:
    """Seconds this process spent setting up its launch's job, for benchmarks.

    Keys ``endpoint_s``, ``server_start_s`` (rank 0) and ``agree_s``; empty before the first hook.
    """
    return dict(_session.launch.timings)


def current_config() -> PerseusConfig:
    """The configuration optimizers are built from (see the module docstring for the order)."""
    return _session.settings.resolve()[0]


def load_config_file(path: Path) -> PerseusConfig:
    """Read a resolved configuration YAML (as the launcher writes it) and validate it."""
    return read_config_file(path)[0]
