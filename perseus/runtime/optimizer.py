"""PerseusOptimizer: the hook runtime every framework adapter calls, and what it owns.

:class:`PerseusOptimizer` is the :class:`~perseus.runtime.hook_runtime.HookRuntime` of one rank
(the hooks, their synchronization and their records are described there) with its ownership:
it is built from the configuration (:meth:`PerseusOptimizer.from_config`) or on a GPU object at
hand (:meth:`PerseusOptimizer.on_gpu`), opens its trace, and closes through one exit stack.

The optimizer drives a :class:`~perseus.runtime.device.RankDevice` it does not own: closing the
optimizer closes its source and trace and unlocks the SM clock it locked; the device's owner
restores and releases the GPU (see :mod:`perseus.runtime.device`).
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from perseus import process_exit
from perseus.errors import GPUError
from perseus.formats.trace_csv import TraceWriter, trace_path
from perseus.records import RankInfo
from perseus.runtime.device import RankDevice, build_device, open_device
from perseus.runtime.hook_runtime import HookRuntime
from perseus.runtime.launch.rendezvous import Launch
from perseus.runtime.sources import build_source
from perseus.runtime.types import FrequencySource

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.gpu.guard.owner import GPUGuard

logger = logging.getLogger(__name__)


class PerseusOptimizer(HookRuntime):
    """Per-rank hook runtime: frequencies in, measurements out; owner of its trace and source.

    Args:
        rank: Where this process sits in the job.
        device: This rank's GPU with its guard and clock controller (a device without a
            controller only measures). It stays its owner's; several optimizers may share it.
        source: Decides each instruction's clock (measure, max speed, plan, online).
        trace_dir: Write ``trace-rank{R}.csv`` there (``None``: no trace).
        max_steps_kept: How many recent :class:`StepRecord` objects :attr:`steps` keeps.
        closing: What to close after the optimizer itself (e.g. the device
            :meth:`from_config` built for it). An optimizer that owns something this way also
            closes at interpreter exit; one that owns nothing is its owner's to close (the
            process's rank session).

    Attributes:
        device: As given.
        steps, last_step: The recent iterations (see :class:`HookRuntime`).
    """

    def __init__(
        self,
        rank: RankInfo,
        device: RankDevice,
        source: FrequencySource,
        *,
        trace_dir: Optional[Path] = None,
        max_steps_kept: int = 100,
        closing: Optional[ExitStack] = None,
    ) -> None:
        """Open the trace and register the closers; see the class docstring."""
        self.device = device
        # Closed last-registered first: trace, clocks, source, then what was handed in.
        self._exit = ExitStack()
        if closing is not None:
            self._exit.enter_context(closing)
        try:
            controller = device.controller
            if controller is None and source.changes_clocks:
                raise GPUError(
                    f"{type(source).__name__} changes clocks but the device was opened to "
                    "measure only; open it with control_clocks=True (runtime.mode other than "
                    "measure)"
                )
            self._exit.callback(source.close)  # e.g. the online reporter thread
            self._exit.callback(self._reset_clocks)
            trace: Optional[TraceWriter] = None
            if trace_dir is not None:
                offset_s = time.time() - device.gpu.now_s()
                trace = TraceWriter(trace_path(trace_dir, rank.rank), offset_s)
                self._exit.callback(trace.close)
        except BaseException:
            self._exit.close()  # what was handed in to close is closed, not leaked
            raise
        super().__init__(
            rank,
            device.gpu,
            source,
            controller=controller,
            trace=trace,
            energy=device.energy,
            temperatures=device.temperatures,
            max_steps_kept=max_steps_kept,
        )
        if closing is not None:  # it owns something (its device): it closes at exit too
            process_exit.at_exit(self.close)
        logger.debug(
            "PerseusOptimizer rank %d stage %d: source %s, clocks %s",
            rank.rank,
            rank.stage,
            type(source).__name__,
            "off"
            if controller is None
            else ("synchronous" if controller.synchronous else "background thread"),
        )

    @property
    def guard(self) -> Optional[GPUGuard]:
        """The guard of this optimizer's device (``None``: the device only measures)."""
        return self.device.guard

    # -- construction from the configuration ---------------------------------------------------
    @classmethod
    def from_config(
        cls,
        cfg: PerseusConfig,
        rank: RankInfo,
        *,
        device: Optional[RankDevice] = None,
        launch: Optional[Launch] = None,
    ) -> PerseusOptimizer:
        """Build the frequency source and the trace from ``cfg``, and the device if not given.

        ``cfg.runtime.mode`` picks the source (:func:`~perseus.runtime.sources.build_source`;
        online, it joins ``launch``, the process's launch, or one of its own, closed with it),
        measure-only where the GPU's start-up check said so (``device.measure_only``: checked
        once, when the device was built); the trace goes to ``cfg.output_dir`` (or the working
        directory). A ``device`` given stays the caller's; otherwise one is built
        (``build_device``) and closed with the optimizer.
        """
        owns = device is None or launch is None
        with ExitStack() as owned:
            if device is None:
                device = owned.enter_context(build_device(cfg, rank))
            if device.measure_only:  # gpu.on_unsupported=measure_only on a GPU that cannot
                from perseus.gpu.preflight import measure_only_config

                cfg = measure_only_config(cfg)
            if launch is None:
                launch = Launch()
                owned.callback(launch.close)
            source = build_source(cfg, rank, device.gpu, launch)
            trace_dir = None
            if cfg.runtime.trace:
                trace_dir = Path(cfg.output_dir) if cfg.output_dir else Path.cwd()
            closing = owned.pop_all() if owns else None
            return cls(rank, device, source, trace_dir=trace_dir, closing=closing)
        raise AssertionError("unreachable")  # pragma: no cover - the with block returns

    @classmethod
    def on_gpu(
        cls,
        rank: RankInfo,
        gpu: GPU,
        source: FrequencySource,
        *,
        state_dir: Optional[Path] = None,
        synchronous_clocks: Optional[bool] = None,
        trace_dir: Optional[Path] = None,
        max_steps_kept: int = 100,
        sample_energy: bool = True,
    ) -> PerseusOptimizer:
        """An optimizer on a GPU object at hand, with a device opened for it (and closed with it).

        The device takes a guard and a clock controller when ``source`` changes clocks (see
        :func:`~perseus.runtime.device.open_device` for ``state_dir``, ``synchronous_clocks``
        and ``sample_energy``); ``gpu`` is closed when the optimizer closes.
        """
        with ExitStack() as owned:
            device = owned.enter_context(
                open_device(
                    gpu,
                    control_clocks=source.changes_clocks,
                    state_dir=state_dir,
                    owner=f"perseus rank {rank.rank}",
                    synchronous_clocks=synchronous_clocks,
                    name=f"-rank{rank.rank}",
                    sample_energy=sample_energy,
                )
            )
            return cls(
                rank,
                device,
                source,
                trace_dir=trace_dir,
                max_steps_kept=max_steps_kept,
                closing=owned.pop_all(),
            )
        raise AssertionError("unreachable")  # pragma: no cover - the with block returns

    # -- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release everything; idempotent.

        In order: the trace, the SM clock this optimizer locked (unlocked through the
        controller), the source's ``close`` (if it has one), then whatever was handed in to
        close with it. Every step runs; a failure is raised at the end.
        """
        if self._closed:
            return
        self._closed = True
        process_exit.cancel(self.close)
        self._exit.close()

    def flush_clocks(self, timeout_s: float = 10.0) -> None:
        """Wait until the controller applied every clock change requested so far."""
        if self._controller is not None:
            self._controller.flush(timeout_s)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def __enter__(self) -> PerseusOptimizer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------------
    def _reset_clocks(self) -> None:
        """Unlock the SM clock through the controller (keeps the controller's record true).

        A controller that failed is left alone: the device's guard restores the clocks. Raises
        :class:`~perseus.errors.GPUTimeoutError` when the driver does not answer in time.
        """
        ctrl = self.device.controller
        if ctrl is None or ctrl.error is not None or ctrl.requested_mhz is None:
            return
        # Bounded like the guard's restore: a hung driver must not hang the close.
        guard = self.device.guard
        ctrl.unlock(None if guard is None else guard.restore_timeout_s)
