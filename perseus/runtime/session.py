"""A training process's rank session: everything Perseus builds in the process, closed in one order.

The session owns, and is the only owner of:

* the **devices** (one per local GPU index: the GPU, its guard, clock controller and energy
  sampler, :class:`~perseus.runtime.device.DeviceTable`), shared by every optimizer of the
  process so that several engines drive one device without fighting over it;
* the **optimizers** (one per ``(stage, key)``; each owns its frequency source, and an online
  source its server link);
* the **launch** (:class:`~perseus.runtime.launch.rendezvous.Launch`: the job's server and id found
  through the job's store, the server global rank 0 started, the ranks' agreement);
* the **announcer** (:class:`~perseus.runtime.announce.Announcer`: the one warning, the start
  line);
* the **outlets** (:class:`~perseus.runtime.outlets.RankOutlets`: global rank 0's experiment
  tracker, and the metrics textfiles of ranks without a server), each on a thread of its own.

A rank starts in one walk (:meth:`RankSession.hooks_for`): the configuration and where it came
from (an explicit one, else the file ``PERSEUS_CONFIG`` names, else the defaults), the engine's
shape (:mod:`perseus.runtime.job_shape`), the device with its start-up check
(:func:`~perseus.runtime.device.build_device`, once per GPU, its verdict kept on the device), the
optimizer with its source (:meth:`~perseus.runtime.optimizer.PerseusOptimizer.from_config`;
online: :mod:`perseus.runtime.online.build`, joining the launch once), the start line. The
session registers one closer with :mod:`perseus.process_exit` and closes in this order:
optimizers (sources send their last reports, ranks say they finished), the outlets (the tracker
logs the job's summary), the launch (the server started here stops after the reports), the
devices (clocks and power limits restored, guards
released, samplers stopped, GPUs closed).
"""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from perseus import process_exit
from perseus.errors import ConfigError, GPUPreflightError, RendezvousError
from perseus.records import RankInfo
from perseus.runtime import job_shape
from perseus.runtime.announce import Announcer
from perseus.runtime.device import DeviceTable
from perseus.runtime.launch.rendezvous import Launch
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.outlets import RankOutlets
from perseus.runtime.types import Hooks

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

# Builds one rank's hooks instead of a PerseusOptimizer (tests, custom set-ups).
HooksFactory = Callable[[RankInfo], Hooks]
# The YAML file with a user's settings (only the keys to change), when no configure() call says.
CONFIG_ENV = "PERSEUS_CONFIG"


@dataclass(frozen=True)
class Settings:
    """How a session builds hooks.

    Attributes:
        config: The configuration (``None``: the file ``PERSEUS_CONFIG`` names, else the
            defaults).
        factory: Builds the hooks instead (takes precedence).
        managed: ``perseus-train`` runs this process: every key of ``config`` is set, and a
            problem is an error before step 1, not a warning.
    """

    config: Optional[PerseusConfig] = None
    factory: Optional[HooksFactory] = None
    managed: bool = False

    def resolve(self) -> Tuple[PerseusConfig, job_shape.Origin]:
        """The configuration hooks are built from, and where it came from."""
        if self.config is not None:
            if self.managed:
                return self.config, job_shape.Origin("perseus-train's configuration", managed=True)
            return self.config, job_shape.Origin("the configure() call", configured=True)
        path = os.environ.get(CONFIG_ENV)
        if path:
            cfg, content = read_config_file(Path(path))
            return cfg, job_shape.Origin(f"{CONFIG_ENV}={path}", file_content=content)
        from perseus.config.schema import PerseusConfig
        from perseus.config.validation import validate

        cfg = PerseusConfig()
        validate(cfg)
        return cfg, job_shape.Origin("the defaults")


def read_config_file(path: Path) -> Tuple[PerseusConfig, Any]:
    """A resolved (or partial) configuration YAML, validated, and the file's own content."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from perseus.config.schema import PerseusConfig
    from perseus.config.validation import to_object

    if not path.is_file():
        raise ConfigError(
            f"{CONFIG_ENV}={path}: no such file; point {CONFIG_ENV} at a YAML file with the "
            "keys to change (a partial configuration is fine), or unset it to use the defaults"
        )
    try:
        loaded = OmegaConf.load(path)
        merged = OmegaConf.merge(OmegaConf.structured(PerseusConfig), loaded)
    except (OmegaConfBaseException, OSError, ValueError) as exc:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot read the configuration: {exc}") from exc
    return to_object(merged), OmegaConf.to_container(loaded)


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


class RankSession:
    """What one training process builds for Perseus (see the module docstring).

    Args:
        settings: How hooks are built (:attr:`settings` may be replaced until the first ones
            are).
    """

    def __init__(self, settings: Optional[Settings] = None) -> None:
        self.settings = settings or Settings()
        self.devices = DeviceTable()
        self.launch = Launch()
        self.announcer = Announcer()
        self.outlets = RankOutlets()
        self._lock = threading.Lock()
        self._hooks: Dict[Tuple[int, object], Hooks] = {}
        self._closed = False
        process_exit.at_exit(self.close)

    def hooks_for(self, rank: RankInfo, key: object = None) -> Hooks:
        """The hooks of ``rank``'s stage for ``key``, built on the first call (thread-safe)."""
        ident = (rank.stage, key)
        hooks = self._hooks.get(ident)
        if hooks is not None:
            return hooks
        with self._lock:
            hooks = self._hooks.get(ident)
            if hooks is None:
                hooks = self._hooks[ident] = self._start(rank)
        return hooks

    @property
    def hooks(self) -> List[Hooks]:
        """The hooks built so far."""
        return list(self._hooks.values())

    def _start(self, rank: RankInfo) -> Hooks:
        """The start-up walk of one rank (see the module docstring)."""
        settings = self.settings
        if settings.factory is not None:
            return settings.factory(rank)
        try:
            cfg, origin = settings.resolve()
            cfg = job_shape.apply_engine_shape(cfg, rank, origin)
            device = self.devices.get(cfg, rank)
            hooks = PerseusOptimizer.from_config(cfg, rank, device=device, launch=self.launch)
        except Exception as exc:
            self.launch.give_up(rank, str(exc))
            # The GPU's start-up check has its own switch: gpu.on_unsupported=error (the
            # default) stops before step 1 with every problem and the fix, measure_only trains.
            if settings.managed or isinstance(exc, GPUPreflightError):
                raise
            return self._disabled(rank, exc)
        if rank.rank == 0:
            endpoint = hooks.source.endpoint
            served = None if endpoint is None else f"{endpoint.where}, job {endpoint.job_id}"
            self.announcer.started(str(cfg.runtime.mode), hooks.gpu, served)
        self.outlets.started(cfg, rank, hooks)
        return hooks

    def _disabled(self, rank: RankInfo, exc: Exception) -> DisabledHooks:
        """One warning (on rank 0 when every rank has the problem), then hooks doing nothing."""
        shared = (isinstance(exc, RendezvousError) and exc.shared) or isinstance(
            exc, job_shape.JobShapeError
        )
        reason = str(exc) or type(exc).__name__
        if rank.rank == 0 or not shared:
            self.announcer.warn_once(
                f"Perseus is off for this run: {reason}. Training goes on unchanged at default "
                "GPU clocks. Fix the problem above; settings go in a YAML file named by "
                f"{CONFIG_ENV} (only the keys to change) — see the documentation, 'Your "
                "own training script' (docs/own-script.md)."
            )
        return DisabledHooks(rank, reason)

    def close(self) -> None:
        """Close everything, in order (see the module docstring); idempotent.

        Every part is closed even when another fails; a failure is raised at the end.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            built = list(self._hooks.values())
            self._hooks.clear()
        process_exit.cancel(self.close)
        with ExitStack() as stack:
            stack.callback(self.devices.close)  # last: the optimizers drive the devices
            stack.callback(self.launch.close)  # after the sources' last reports
            stack.callback(self.outlets.close)  # the tracker asks the server for the summary
            for hooks in built:
                if isinstance(hooks, PerseusOptimizer):  # a factory's hooks are the factory's
                    stack.callback(hooks.close)
