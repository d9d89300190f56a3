"""PerseusOptimizer: the hook runtime every framework adapter calls.

The adapters call four hooks per rank: ``on_step_begin`` / ``on_step_end`` around a training
iteration and ``on_instruction_begin(name)`` / ``on_instruction_end(name)`` around every
forward and backward of one microbatch; where an engine blocks in the middle of an instruction
(Merak's recomputation, then the gradient receive), the optional ``on_wait_begin`` /
``on_wait_end`` leave that wait out of the instruction's time and energy (see
:class:`~perseus.runtime.types.WaitHooks`). For each instruction the optimizer asks its
:class:`~perseus.runtime.types.FrequencySource` for a clock, hands changes to its device's
:class:`~perseus.runtime.controller.ClockController`, tells the GPU object where instructions
start and end (the emulated device uses that), and records times (and energy counter readings
when the source wants them) into :class:`~perseus.runtime.types.StepRecord` objects.

Real GPUs are asynchronous: a framework's forward returns once its kernels are queued. So every
hook first synchronizes the device (:meth:`~perseus.gpu.base.GPU.synchronize`:
``torch.cuda.synchronize`` of the rank's device, a no-op without CUDA), then changes the clock
and stamps time (:meth:`~perseus.gpu.base.GPU.now_s`) and energy: clocks apply to the
instruction they are meant for, and times and energies are the device's, not the queueing's.
Hooks synchronize at those boundaries and nowhere else. With a trace, the SM clock read back
from the device at the end of each clock-locked instruction is recorded too (``applied_mhz``).

The optimizer drives a :class:`~perseus.runtime.device.RankDevice` it does not own: closing the
optimizer closes its source and trace and unlocks the SM clock it locked; the device's owner
restores and releases the GPU (see :mod:`perseus.runtime.device`).
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from perseus import process_exit
from perseus.errors import GPUError, GPUNotSupportedError
from perseus.formats.trace_csv import TraceWriter, trace_path
from perseus.runtime import hook_errors
from perseus.runtime.device import RankDevice, build_device, open_device
from perseus.runtime.sources import build_source
from perseus.runtime.types import FrequencySource, InstructionRecord, RankInfo, StepRecord

if TYPE_CHECKING:
    from perseus.config import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.gpu.guard import GPUGuard

logger = logging.getLogger(__name__)

# (position, instruction, microbatch, frequency_mhz, start_s, end_s, energy_begin, energy_end)
_Raw = Tuple[int, str, int, Optional[int], float, float, Optional[float], Optional[float]]


class PerseusOptimizer:
    """Per-rank hook runtime: frequencies in, measurements out.

    Args:
        rank: Where this process sits in the job.
        device: This rank's GPU with its guard and clock controller (a device without a
            controller only measures). It stays its owner's; several optimizers may share it.
        source: Decides each instruction's clock (measure, max speed, plan, online).
        trace_dir: Write ``trace-rank{R}.csv`` there (``None``: no trace).
        max_steps_kept: How many recent :class:`StepRecord` objects :attr:`steps` keeps.
        closing: What to close after the optimizer itself (e.g. the device
            :meth:`from_config` built for it).

    Attributes:
        steps: The most recent iterations (at most ``max_steps_kept``), oldest first.
        last_step: The last finished iteration, or ``None``.
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
        self.rank = rank
        self.device = device
        self.gpu: GPU = device.gpu
        self.source = source
        self.steps: List[StepRecord] = []
        self.last_step: Optional[StepRecord] = None
        self.max_steps_kept = max(1, max_steps_kept)
        self._closed = False
        # Closed last-registered first: trace, clocks, source, then what was handed in.
        self._exit = ExitStack()
        if closing is not None:
            self._exit.enter_context(closing)
        try:
            controller = device.controller
            if controller is None and getattr(source, "changes_clocks", True):
                raise GPUError(
                    f"{type(source).__name__} changes clocks but the device was opened to "
                    "measure only; open it with control_clocks=True (runtime.mode other than "
                    "measure)"
                )
            self._controller = controller
            source_close = getattr(source, "close", None)  # e.g. the online reporter thread
            if source_close is not None:
                self._exit.callback(source_close)
            self._exit.callback(self._reset_clocks)
            self._trace: Optional[TraceWriter] = None
            if trace_dir is not None:
                offset_s = time.time() - self.gpu.now_s()
                self._trace = TraceWriter(trace_path(trace_dir, rank.rank), offset_s)
                self._exit.callback(self._trace.close)
        except BaseException:
            self._exit.close()  # what was handed in to close is closed, not leaked
            raise
        self._energy_ok = True
        # Hot-path state, reset every iteration.
        self._stage = rank.stage
        self._step = -1
        self._in_step = False
        self._position = 0
        self._counts: Dict[str, int] = {"forward": 0, "backward": 0}
        self._open: Optional[hook_errors.Opened] = None
        self._t_open = 0.0
        # A wait inside the open instruction: (start time, energy counter or None).
        self._wait: Optional[Tuple[float, Optional[float]]] = None
        self._raw: List[_Raw] = []
        self._applied: List[Optional[int]] = []
        self._step_t0 = 0.0
        self._step_e0: Optional[float] = None
        self._freq_of = source.frequency_mhz
        self._wants_energy = bool(getattr(source, "wants_energy", False))
        self._gpu_begin = self.gpu.instruction_begin
        self._gpu_end = self.gpu.instruction_end
        # The device's time base and synchronization (see the module docstring).
        self._sync = self.gpu.synchronize
        self._now = self.gpu.now_s
        self._read_clock = self.gpu.sm_clock_mhz if self._trace is not None else None
        process_exit.at_exit(self.close)  # before its device closes
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
        cls, cfg: PerseusConfig, rank: RankInfo, *, device: Optional[RankDevice] = None
    ) -> PerseusOptimizer:
        """Build the frequency source and the trace from ``cfg``, and the device if not given.

        ``cfg.runtime.mode`` picks the source (:func:`~perseus.runtime.sources.build_source`),
        after the GPU's start-up check (:func:`~perseus.gpu.preflight.preflight_config`);
        the trace goes to ``cfg.output_dir`` (or the working directory). A ``device`` given stays
        the caller's; otherwise one is built (``build_device``) and closed with the optimizer.
        """
        from perseus.gpu.preflight import preflight_config

        with ExitStack() as owned:
            if device is None:
                device = owned.enter_context(build_device(cfg, rank))
            # The start-up check (once per GPU; build_device ran it already) may turn the run
            # measure-only: gpu.on_unsupported=measure_only on a GPU that cannot change clocks.
            cfg = preflight_config(cfg, device.gpu, device.guard)
            source = build_source(cfg, rank, device.gpu)
            trace_dir = None
            if cfg.runtime.trace:
                trace_dir = Path(cfg.output_dir) if cfg.output_dir else Path.cwd()
            return cls(rank, device, source, trace_dir=trace_dir, closing=owned.pop_all())
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
    ) -> PerseusOptimizer:
        """An optimizer on a GPU object at hand, with a device opened for it (and closed with it).

        The device takes a guard and a clock controller when ``source`` changes clocks (see
        :func:`~perseus.runtime.device.open_device` for ``state_dir`` and
        ``synchronous_clocks``); ``gpu`` is closed when the optimizer closes.
        """
        with ExitStack() as owned:
            device = owned.enter_context(
                open_device(
                    gpu,
                    control_clocks=bool(getattr(source, "changes_clocks", True)),
                    state_dir=state_dir,
                    owner=f"perseus rank {rank.rank}",
                    synchronous_clocks=synchronous_clocks,
                    name=f"-rank{rank.rank}",
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

    # -- hooks --------------------------------------------------------------------------------
    def on_step_begin(self) -> None:
        """A training iteration starts: reset the per-iteration counters, read the energy."""
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None:
            ctrl.check()
        opened = self._open
        if self._in_step and opened is not None:
            self._open = None  # report once; the next iteration starts clean
            raise hook_errors.unended_at_step_begin(self._stage, opened)
        self._step += 1
        self.source.begin_step(self._step)
        # Re-read every iteration (cheap): a source may need per-instruction energy readings
        # only for a while (the online source: while it profiles), and reading the counter at
        # every instruction costs driver calls.
        self._wants_energy = self._energy_ok and bool(getattr(self.source, "wants_energy", False))
        self._in_step = True
        self._wait = None
        self._position = 0
        self._counts = {"forward": 0, "backward": 0}
        self._raw = []
        self._applied = []
        self._sync()  # the stamps below see the device's finished work
        self._step_e0 = self._energy_mj()
        self._step_t0 = self._now()

    def on_instruction_begin(self, name: str) -> None:
        """``name`` (forward/backward) of the next microbatch starts on this stage."""
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None:
            ctrl.check()
        if not self._in_step or self._open is not None:
            raise hook_errors.bad_begin(
                self._stage,
                self._step,
                name,
                closed=self._closed,
                in_step=self._in_step,
                opened=self._open,
            )
        counts = self._counts
        mb = counts.get(name)
        if mb is None:
            raise hook_errors.unknown_instruction(name)
        counts[name] = mb + 1
        pos = self._position
        self._position = pos + 1
        freq = self._freq_of(self._step, pos, name, mb)
        self._sync()  # before the clock change and the stamps
        if ctrl is not None:
            ctrl.request(freq)  # a repeat of the last request returns at once
        elif freq is not None:
            raise hook_errors.no_controller(self.source, freq)
        e0 = self.gpu.total_energy_mj() if self._wants_energy else None
        self._gpu_begin(self._stage, name)
        self._open = (pos, name, mb, freq, e0)
        self._t_open = self._now()

    def on_wait_begin(self) -> None:
        """The running instruction blocks on another stage (e.g. for its incoming gradient).

        Until :meth:`on_wait_end` (or the instruction's end), time and energy are not the
        instruction's: its record covers only its own work, as if it had started that much
        later. The device is synchronized first, so the instruction's queued work (the
        recomputation) counts as its own. Outside an instruction, or while already waiting,
        nothing happens.
        """
        if self._open is None or self._wait is not None:
            return
        self._sync()
        e0 = self.gpu.total_energy_mj() if self._open[4] is not None else None
        self._wait = (self._now(), e0)

    def on_wait_end(self) -> None:
        """The wait begun by :meth:`on_wait_begin` is over; the instruction's work goes on.

        The device is synchronized first: work queued during the wait (the receive) is the
        wait's.
        """
        if self._wait is not None:
            self._end_wait(sync=True)

    def on_instruction_end(self, name: str) -> None:
        """The instruction begun last ended (adapters call this in ``finally``)."""
        ok = sys.exc_info()[0] is None  # no sync over the instruction's own error
        if self._wait is not None:
            self._end_wait(sync=ok)  # waited until the end: none of that was the instruction's
        opened = self._open
        if opened is None or opened[1] != name:
            self._unmatched_end(name)
            return
        self._gpu_end(name)
        if ok:
            self._sync()
        t_end = self._now()
        e1 = self.gpu.total_energy_mj() if self._wants_energy else None
        if self._read_clock is not None:  # the clock the instruction ran at, read back
            self._applied.append(self._read_clock() if opened[3] is not None else None)
        self._open = None
        self._raw.append(
            (opened[0], name, opened[2], opened[3], self._t_open, t_end, opened[4], e1)
        )
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None and ok:
            ctrl.check()  # not over an exception the instruction itself raised

    def on_step_end(self) -> None:
        """The iteration ended: build its record, let the source check/learn, write the trace.

        Called from an adapter's ``finally`` while an exception propagates, it only writes the
        trace: the aborted iteration is not handed to the source (no schedule checks, no
        measurements) nor kept in :attr:`steps`, and nothing is raised over the real error.
        """
        if not self._in_step:
            logger.warning("on_step_end without on_step_begin on rank %d; ignored", self.rank.rank)
            return
        if sys.exc_info()[0] is None:
            self._sync()
        t_end = self._now()
        e_end = self._energy_mj()
        self._in_step = False
        self._open = None
        energy_j = None
        if e_end is not None and self._step_e0 is not None:
            energy_j = (e_end - self._step_e0) / 1000.0
        record = StepRecord(
            step=self._step,
            stage=self._stage,
            start_s=self._step_t0,
            end_s=t_end,
            energy_j=energy_j,
            instructions=[InstructionRecord(*raw) for raw in self._raw],
            applied_mhz=self._applied,
        )
        aborted = sys.exc_info()[0] is not None
        try:
            if not aborted:
                self.last_step = record
                self.steps.append(record)
                if len(self.steps) > self.max_steps_kept:
                    del self.steps[: len(self.steps) - self.max_steps_kept]
                self.source.end_step(record)
        finally:
            if self._trace is not None:
                self._trace.add(record)
                self._trace.flush()
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None and not aborted:
            ctrl.check()

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
    def _end_wait(self, *, sync: bool) -> None:
        wait = self._wait
        assert wait is not None
        self._wait = None
        if sync:
            self._sync()
        self._t_open += self._now() - wait[0]
        opened = self._open
        if opened is not None and wait[1] is not None and opened[4] is not None:
            waited_mj = self.gpu.total_energy_mj() - wait[1]
            self._open = (*opened[:4], opened[4] + waited_mj)

    def _reset_clocks(self) -> None:
        """Unlock the SM clock through the controller (keeps the controller's record true).

        A controller that failed is left alone: the device's guard restores the clocks. Raises
        :class:`~perseus.errors.GPUTimeoutError` when the driver does not answer in time.
        """
        ctrl = self._controller
        if ctrl is None or ctrl.error is not None or ctrl.requested_mhz is None:
            return
        # Bounded like the guard's restore: a hung driver must not hang the close.
        ctrl.unlock(getattr(self.device.guard, "restore_timeout_s", None))

    def _energy_mj(self) -> Optional[float]:
        if not self._energy_ok:
            return None
        try:
            return float(self.gpu.total_energy_mj())
        except GPUNotSupportedError as exc:
            logger.warning(
                "GPU %d has no energy counter (%s); energy not measured", self.gpu.index, exc
            )
            self._energy_ok = False
            return None

    def _unmatched_end(self, name: str) -> None:
        opened = self._open
        if opened is None:
            # on_instruction_begin raised (e.g. a schedule mismatch) and the adapter's finally
            # still ends the instruction: nothing began, so there is nothing to end.
            logger.debug("on_instruction_end(%r) with no instruction running; ignored", name)
            return
        self._open = None
        self._gpu_end(opened[1])
        raise hook_errors.unmatched_end(self._stage, self._step, name, opened)
