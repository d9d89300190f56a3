"""PerseusOptimizer: the hook runtime every framework adapter calls.

The adapters call four hooks per rank: ``on_step_begin`` / ``on_step_end`` around a training
iteration and ``on_instruction_begin(name)`` / ``on_instruction_end(name)`` around every
forward and backward of one microbatch; where an engine blocks in the middle of an instruction
(Merak's recomputation, then the gradient receive), ``on_wait_begin`` / ``on_wait_end`` leave
that wait out of the instruction's time and energy. For each instruction the optimizer asks its
:class:`~perseus.runtime.types.FrequencySource` for a clock, hands changes to the
:class:`~perseus.runtime.controller.ClockController`, tells the GPU object where instructions
start and end (the emulated device uses that), and records times (and energy counter readings
when the source wants them) into :class:`~perseus.runtime.types.StepRecord` objects.

Closing the optimizer (``close()``, a ``with`` block, or interpreter exit) stops the controller
and puts the GPU's clocks back through the :class:`~perseus.gpu.guard.GPUGuard`.

Standard library only at import time; runs on Python 3.9 (the Merak runtime path).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from perseus.errors import GPUError, GPUNotSupportedError, PlanError, ScheduleMismatchError
from perseus.runtime import lifecycle
from perseus.runtime.controller import ClockController
from perseus.runtime.trace import TraceWriter, trace_path
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
        gpu: This rank's GPU.
        source: Decides each instruction's clock (measure, max speed, plan, online).
        guard: The owner of the GPU's clocks. ``None`` with a source that changes clocks (and
            no ``controller``): the optimizer creates, acquires and (on close) restores and
            releases its own guard. A guard passed in stays the caller's unless
            ``owns_guard``: on close the optimizer only resets the SM clock it locked.
        controller: A clock controller shared with other optimizers on the same GPU (several
            engines in one process); it stays the caller's. ``None``: the optimizer drives
            ``guard`` with a controller of its own.
        trace_dir: Write ``trace-rank{R}.csv`` there (``None``: no trace).
        synchronous_clocks: Apply clock changes in the calling thread. ``None``: only when
            the GPU's clock changes are free (``gpu.fast_clock_changes``).
        max_steps_kept: How many recent :class:`StepRecord` objects :attr:`steps` keeps.
        owns_gpu: Close ``gpu`` when the optimizer closes.
        owns_guard: Restore and release ``guard`` when the optimizer closes.

    Attributes:
        steps: The most recent iterations (at most ``max_steps_kept``), oldest first.
        last_step: The last finished iteration, or ``None``.
    """

    def __init__(
        self,
        rank: RankInfo,
        gpu: GPU,
        source: FrequencySource,
        *,
        guard: Optional[GPUGuard] = None,
        controller: Optional[ClockController] = None,
        trace_dir: Optional[Path] = None,
        synchronous_clocks: Optional[bool] = None,
        max_steps_kept: int = 100,
        owns_gpu: bool = False,
        owns_guard: bool = False,
    ) -> None:
        """Set up the controller (and a guard if needed); see the class docstring."""
        self.rank = rank
        self.gpu = gpu
        self.source = source
        self.steps: List[StepRecord] = []
        self.last_step: Optional[StepRecord] = None
        self.max_steps_kept = max(1, max_steps_kept)
        self._owns_gpu = owns_gpu
        self._closed = False
        self._trace: Optional[TraceWriter] = None
        if trace_dir is not None:
            offset_s = time.time() - time.perf_counter()
            self._trace = TraceWriter(trace_path(trace_dir, rank.rank), offset_s)
        self._changes_clocks = bool(getattr(source, "changes_clocks", True))
        self._owns_controller = False
        if controller is None and self._changes_clocks:
            if guard is None:
                guard = _acquire_guard(gpu, owner=f"perseus rank {rank.rank}")
                owns_guard = True
            sync = gpu.fast_clock_changes if synchronous_clocks is None else synchronous_clocks
            controller = ClockController(guard, synchronous=sync, name=f"-rank{rank.rank}")
            self._owns_controller = True
        self.guard = guard
        self._owns_guard = owns_guard and guard is not None
        self._controller = controller
        self._energy_ok = True
        # Hot-path state, reset every iteration.
        self._stage = rank.stage
        self._step = -1
        self._in_step = False
        self._position = 0
        self._counts: Dict[str, int] = {"forward": 0, "backward": 0}
        self._open: Optional[Tuple[int, str, int, Optional[int], Optional[float]]] = None
        self._t_open = 0.0
        # A wait inside the open instruction: (start time, energy counter or None).
        self._wait: Optional[Tuple[float, Optional[float]]] = None
        self._raw: List[_Raw] = []
        self._step_t0 = 0.0
        self._step_e0: Optional[float] = None
        self._freq_of = source.frequency_mhz
        self._wants_energy = bool(getattr(source, "wants_energy", False))
        self._gpu_begin = gpu.instruction_begin
        self._gpu_end = gpu.instruction_end
        lifecycle.close_at_exit(self)  # before the guards' own exit hook restores
        logger.debug(
            "PerseusOptimizer rank %d stage %d: source %s, clocks %s",
            rank.rank,
            rank.stage,
            type(source).__name__,
            "off"
            if self._controller is None
            else ("synchronous" if self._controller.synchronous else "background thread"),
        )

    # -- construction from the configuration ---------------------------------------------------
    @classmethod
    def from_config(
        cls,
        cfg: PerseusConfig,
        rank: RankInfo,
        *,
        gpu: Optional[GPU] = None,
        guard: Optional[GPUGuard] = None,
        controller: Optional[ClockController] = None,
    ) -> PerseusOptimizer:
        """Build the GPU, its guard, the frequency source and the trace from ``cfg``.

        ``cfg.runtime.mode`` picks the source: ``measure``, ``max_speed`` (the GPU's highest
        SM clock), ``plan`` (``cfg.runtime.plan``: a plan JSON or a reference
        ``freqs_pipeline_%05d.py``) or ``online`` (the coordination server's profiler and
        plans). With ``cfg.runtime.trace`` the trace goes to ``cfg.output_dir`` (or the
        working directory). ``gpu`` / ``guard`` / ``controller`` given: shared with other
        optimizers and left to the caller (see :mod:`perseus.runtime.context`); otherwise
        built here and owned by the optimizer.
        """
        from perseus.runtime.build import build_from_config

        return build_from_config(cls, cfg, rank, gpu=gpu, guard=guard, controller=controller)

    # -- hooks --------------------------------------------------------------------------------
    def on_step_begin(self) -> None:
        """A training iteration starts: reset the per-iteration counters, read the energy."""
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None:
            ctrl.check()
        self._check_open()
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
        self._step_e0 = self._energy_mj()
        self._step_t0 = time.perf_counter()

    def on_instruction_begin(self, name: str) -> None:
        """``name`` (forward/backward) of the next microbatch starts on this stage."""
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None:
            ctrl.check()
        if not self._in_step or self._open is not None:
            self._misuse(name)
        counts = self._counts
        mb = counts.get(name)
        if mb is None:
            raise ScheduleMismatchError(
                f"on_instruction_begin({name!r}): the instruction must be 'forward' or "
                "'backward'; fix the adapter's call"
            )
        counts[name] = mb + 1
        pos = self._position
        self._position = pos + 1
        freq = self._freq_of(self._step, pos, name, mb)
        if ctrl is not None:
            ctrl.request(freq)  # a repeat of the last request returns at once
        elif freq is not None:
            self._no_controller(freq)
        e0 = self.gpu.total_energy_mj() if self._wants_energy else None
        self._gpu_begin(self._stage, name)
        self._open = (pos, name, mb, freq, e0)
        self._t_open = time.perf_counter()

    def on_wait_begin(self) -> None:
        """The running instruction blocks on another stage (e.g. for its incoming gradient).

        Until :meth:`on_wait_end` (or the instruction's end), time and energy are not the
        instruction's: its record covers only its own work, as if it had started that much
        later. Outside an instruction, or while already waiting, nothing happens.
        """
        if self._open is None or self._wait is not None:
            return
        e0 = self.gpu.total_energy_mj() if self._open[4] is not None else None
        self._wait = (time.perf_counter(), e0)

    def on_wait_end(self) -> None:
        """The wait begun by :meth:`on_wait_begin` is over; the instruction's work goes on."""
        wait = self._wait
        if wait is None:
            return
        self._wait = None
        self._t_open += time.perf_counter() - wait[0]
        opened = self._open
        if opened is not None and wait[1] is not None and opened[4] is not None:
            waited_mj = self.gpu.total_energy_mj() - wait[1]
            self._open = (*opened[:4], opened[4] + waited_mj)

    def on_instruction_end(self, name: str) -> None:
        """The instruction begun last ended (adapters call this in ``finally``)."""
        if self._wait is not None:
            self.on_wait_end()  # waited until the end: none of that was the instruction's
        opened = self._open
        if opened is None or opened[1] != name:
            self._unmatched_end(name)
            return
        self._gpu_end(name)
        t_end = time.perf_counter()
        e1 = self.gpu.total_energy_mj() if self._wants_energy else None
        self._open = None
        self._raw.append(
            (opened[0], name, opened[2], opened[3], self._t_open, t_end, opened[4], e1)
        )
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None and sys.exc_info()[0] is None:
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
        t_end = time.perf_counter()
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

        In order: the source's ``close`` (if it has one), the controller, the GPU's clocks
        (through the guard), the trace, the GPU if owned. Every step runs; the first failure
        is raised at the end.
        """
        if self._closed:
            return
        self._closed = True
        lifecycle.forget(self)
        errors: List[BaseException] = []
        ctrl = self._controller
        for action in (
            getattr(self.source, "close", None),  # e.g. the online source's reporter thread
            self._reset_shared_clocks,
            ctrl.close if ctrl is not None and self._owns_controller else None,
            self._release_guard if self._owns_guard else None,
            self._trace.close if self._trace is not None else None,
            self.gpu.close if self._owns_gpu else None,
        ):
            if action is None:
                continue
            try:
                action()
            except Exception as exc:
                logger.error("PerseusOptimizer.close: %s failed: %r", action, exc)
                errors.append(exc)
        if errors:
            raise errors[0]

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
    def _no_controller(self, freq: int) -> None:
        raise PlanError(
            f"{type(self.source).__name__} asked for {freq} MHz but this optimizer does not "
            "control clocks (its source declared changes_clocks=False)"
        )

    def _reset_shared_clocks(self) -> None:
        """With a borrowed guard, unlock the SM clock through the controller (keeps its state)."""
        ctrl = self._controller
        if ctrl is None or self._owns_guard or ctrl.requested_mhz is None:
            return
        ctrl.request(None)
        ctrl.flush()

    def _release_guard(self) -> None:
        guard = self.guard
        assert guard is not None
        try:
            guard.restore()
        finally:
            guard.release()

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

    def _check_open(self) -> None:
        opened = self._open
        if self._in_step and opened is not None:
            self._open = None  # report once; the next iteration starts clean
            raise ScheduleMismatchError(
                f"stage {self._stage}: a new iteration began while {opened[1]} of "
                f"microbatch {opened[2]} had not ended; adapters must call "
                "on_instruction_end in a finally block"
            )

    def _misuse(self, name: str) -> None:
        if self._closed:
            raise GPUError("on_instruction_begin on a closed PerseusOptimizer")
        if not self._in_step:
            raise ScheduleMismatchError(
                f"stage {self._stage}: on_instruction_begin({name!r}) outside a training "
                "iteration; call on_step_begin() first (adapters: wrap the training step)"
            )
        assert self._open is not None
        raise ScheduleMismatchError(
            f"stage {self._stage}, iteration {self._step}: {name} began while "
            f"{self._open[1]} of microbatch {self._open[2]} was still running; instructions "
            "must not nest (call on_instruction_end first)"
        )

    def _unmatched_end(self, name: str) -> None:
        opened = self._open
        if opened is None:
            # on_instruction_begin raised (e.g. a schedule mismatch) and the adapter's finally
            # still ends the instruction: nothing began, so there is nothing to end.
            logger.debug("on_instruction_end(%r) with no instruction running; ignored", name)
            return
        self._open = None
        self._gpu_end(opened[1])
        raise ScheduleMismatchError(
            f"stage {self._stage}, iteration {self._step}: on_instruction_end({name!r}) but "
            f"{opened[1]} of microbatch {opened[2]} was running"
        )


def _acquire_guard(gpu: GPU, owner: str) -> GPUGuard:
    from perseus.gpu.guard import GPUGuard

    return GPUGuard(gpu, owner=owner).acquire()
