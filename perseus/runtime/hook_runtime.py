"""The hook state machine of a rank: hook calls in, clock requests and step records out.

The adapters call four hooks per rank: ``on_step_begin`` / ``on_step_end`` around a training
iteration and ``on_instruction_begin(name)`` / ``on_instruction_end(name)`` around every
forward and backward of one microbatch; where an engine blocks in the middle of an instruction
(Merak's recomputation, then the gradient receive), the optional ``on_wait_begin`` /
``on_wait_end`` leave that wait out of the instruction's time and energy (see
:class:`~perseus.runtime.types.WaitHooks`). For each instruction :class:`HookRuntime` asks its
:class:`~perseus.runtime.types.FrequencySource` for a clock, hands the iteration's clocks to its
device's :class:`~perseus.runtime.controller.ClockController` once when the iteration begins and
marks each instruction's start for it (a change costs the training thread no wake-up of the
controller's thread), tells the GPU object where instructions start and end (the emulated device
uses that), and records times into :class:`~perseus.records.StepRecord` objects.

Real GPUs are asynchronous: a framework's forward returns once its kernels are queued. So every
hook first synchronizes the device (:meth:`~perseus.gpu.base.GPU.synchronize`:
``torch.cuda.synchronize`` of the rank's device, a no-op without CUDA), then changes the clock
and stamps time (:meth:`~perseus.gpu.base.GPU.now_s`): clocks apply to the instruction they are
meant for, and times are the device's, not the queueing's. Hooks synchronize at those boundaries
and nowhere else. With a trace, the SM clock read back from the device at the end of each
clock-locked instruction is recorded too (``applied_mhz``).

No hook reads the energy counter (a read blocks ~3 ms on a real GPU, and the counter moves only
every ~100 ms). The device's energy sampler watches it from its own thread
(:mod:`perseus.gpu.energy.sampler`); at the end of every iteration the hooks attach the counter
updates seen since the previous one and the energies of earlier iterations that the updates now
cover (:attr:`~perseus.records.StepRecord.earlier_energies`), and fill those iterations'
``energy_j`` in place: a step's energy is known once an update after its end has arrived.

Building, owning and closing what the hooks use is the job of the subclass,
:class:`~perseus.runtime.optimizer.PerseusOptimizer`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from itertools import starmap
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Tuple

from perseus.pipeline_order import KINDS
from perseus.records import (
    EnergySeries,
    InstructionRecord,
    RankInfo,
    StepEnergy,
    StepRecord,
    TemperatureSeries,
)
from perseus.runtime import hook_errors
from perseus.runtime.types import FrequencySource

if TYPE_CHECKING:
    from perseus.formats.trace_csv import TraceWriter
    from perseus.gpu.base import GPU
    from perseus.runtime.controller import ClockController

logger = logging.getLogger(__name__)

# (position, instruction, microbatch, frequency_mhz, start_s, end_s)
_Raw = Tuple[int, str, int, Optional[int], float, float]
# Iterations waiting for the counter to cover them, at most (beyond: the oldest go unmeasured).
MAX_AWAITING_ENERGY = 100_000


class HookRuntime:
    """Per-rank hook runtime: frequencies in, measurements out (see the module docstring).

    Args:
        rank: Where this process sits in the job.
        gpu: The rank's GPU: synchronized and stamped by the hooks, told where instructions
            begin and end.
        source: Decides each instruction's clock (measure, max speed, plan, online).
        controller: Applies the source's clocks (``None``: the device only measures).
        trace: Where every iteration's record is written (``None``: no trace).
        energy: The GPU's energy counter updates, kept by its sampler (``None``: energy is
            not measured).
        temperatures: The GPU's temperature readings, kept by its sampler (``None``: not
            read); each iteration's record carries the last one.
        max_steps_kept: How many recent :class:`StepRecord` objects :attr:`steps` keeps.

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
        controller: Optional[ClockController],
        trace: Optional[TraceWriter],
        energy: Optional[EnergySeries] = None,
        temperatures: Optional[TemperatureSeries] = None,
        max_steps_kept: int = 100,
    ) -> None:
        """Set up the per-iteration state; see the class docstring."""
        self.rank = rank
        self.gpu: GPU = gpu
        self.source = source
        self.steps: List[StepRecord] = []
        self.last_step: Optional[StepRecord] = None
        self.max_steps_kept = max(1, max_steps_kept)
        self._controller = controller
        self._trace = trace
        self._closed = False  # set by the owner's close: hooks after it are errors
        self.energy = energy
        self.temperatures = temperatures
        self._energy_cursor = 0
        self._awaiting: Deque[StepRecord] = deque()
        # Hot-path state, reset every iteration.
        self._stage = rank.stage
        self._step = -1
        self._in_step = False
        self._position = 0
        self._counts: Dict[str, int] = dict.fromkeys(KINDS, 0)
        self._open: Optional[hook_errors.Opened] = None
        self._t_open = 0.0
        self._wait_t0: Optional[float] = None  # a wait inside the open instruction began then
        self._raw: List[_Raw] = []
        self._applied: List[Optional[int]] = []
        self._step_t0 = 0.0
        self._freq_of = source.frequency_mhz
        self._clocks_of = source.iteration_clocks
        self._ticket = 0  # the controller's ticket of this iteration
        self._gpu_begin = self.gpu.instruction_begin
        self._gpu_end = self.gpu.instruction_end
        # The device's time base and synchronization (see the module docstring).
        self._sync = self.gpu.synchronize
        self._now = self.gpu.now_s
        self._read_clock = self.gpu.sm_clock_mhz if self._trace is not None else None

    # -- hooks --------------------------------------------------------------------------------
    def on_step_begin(self) -> None:
        """A training iteration starts: reset the per-iteration counters, stamp its start."""
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None:
            ctrl.check()
        opened = self._open
        if self._in_step and opened is not None:
            self._open = None  # report once; the next iteration starts clean
            raise hook_errors.unended_at_step_begin(self._stage, opened)
        self._step += 1
        self.source.begin_step(self._step)
        self._in_step = True
        self._wait_t0 = None
        self._position = 0
        self._counts = dict.fromkeys(KINDS, 0)
        self._raw = []
        self._applied = []
        self._sync()  # the stamp below sees the device's finished work
        if ctrl is not None:  # the iteration's clocks, handed over once (no wake per change)
            self._ticket = ctrl.begin_iteration(self._clocks_of())
        self._step_t0 = self._now()

    def on_instruction_begin(self, name: str) -> None:
        """``name`` (an instruction kind) of the next microbatch starts on this stage."""
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
            ctrl.at_instruction(self._ticket, pos, freq)  # a repeat returns at once
        elif freq is not None:
            raise hook_errors.no_controller(self.source, freq)
        self._gpu_begin(self._stage, name)
        self._open = (pos, name, mb, freq)
        self._t_open = self._now()

    def on_wait_begin(self) -> None:
        """The running instruction blocks on another stage (e.g. for its incoming gradient).

        Until :meth:`on_wait_end` (or the instruction's end), time is not the instruction's:
        its record covers only its own work, as if it had started that much later (so the
        wait shows as blocking time before it). The device is synchronized first, so the
        instruction's queued work (the recomputation) counts as its own. Outside an
        instruction, or while already waiting, nothing happens.
        """
        if self._open is None or self._wait_t0 is not None:
            return
        self._sync()
        self._wait_t0 = self._now()

    def on_wait_end(self) -> None:
        """The wait begun by :meth:`on_wait_begin` is over; the instruction's work goes on.

        The device is synchronized first: work queued during the wait (the receive) is the
        wait's.
        """
        if self._wait_t0 is not None:
            self._end_wait(sync=True)

    def on_instruction_end(self, name: str) -> None:
        """The instruction begun last ended (adapters call this in ``finally``)."""
        ok = sys.exc_info()[0] is None  # no sync over the instruction's own error
        if self._wait_t0 is not None:
            self._end_wait(sync=ok)  # waited until the end: none of that was the instruction's
        opened = self._open
        if opened is None or opened[1] != name:
            self._unmatched_end(name)
            return
        self._gpu_end(name)
        if ok:
            self._sync()
        t_end = self._now()
        if self._read_clock is not None:  # the clock the instruction ran at, read back
            self._applied.append(self._read_clock() if opened[3] is not None else None)
        self._open = None
        self._raw.append((opened[0], name, opened[2], opened[3], self._t_open, t_end))
        ctrl = self._controller
        if ctrl is not None and ctrl.error is not None and ok:
            ctrl.check()  # not over an exception the instruction itself raised

    def on_step_end(self) -> None:
        """The iteration ended: build its record, attach energies, hand it on, write the trace.

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
        self._in_step = False
        self._open = None
        record = StepRecord(
            step=self._step,
            stage=self._stage,
            start_s=self._step_t0,
            end_s=t_end,
            instructions=list(starmap(InstructionRecord, self._raw)),
            applied_mhz=self._applied,
        )
        aborted = sys.exc_info()[0] is not None
        temperatures = self.temperatures
        if temperatures is not None:  # the sampler's last reading: no driver call here
            latest = temperatures.latest
            record.temperature_c = None if latest is None else latest.temperature_c
        if self.energy is not None:
            record.energy_updates, self._energy_cursor = self.energy.since(self._energy_cursor)
            record.earlier_energies = self._resolve_energies()
            if not aborted:
                self._awaiting.append(record)
                if len(self._awaiting) > MAX_AWAITING_ENERGY:
                    self._awaiting.popleft()
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

    # -- helpers ------------------------------------------------------------------------------
    def _end_wait(self, *, sync: bool) -> None:
        wait_t0 = self._wait_t0
        assert wait_t0 is not None
        self._wait_t0 = None
        if sync:
            self._sync()
        self._t_open += self._now() - wait_t0

    def _resolve_energies(self) -> List[StepEnergy]:
        """Fill in the energy of every waiting iteration the counter now covers (oldest first)."""
        series = self.energy
        awaiting = self._awaiting
        if series is None or not awaiting:
            return []
        covered_s = series.last_time_s
        out: List[StepEnergy] = []
        while awaiting and covered_s is not None and awaiting[0].end_s <= covered_s:
            record = awaiting.popleft()
            record.energy_j = series.energy_j_between(record.start_s, record.end_s)
            if record.energy_j is not None:
                out.append(StepEnergy(record.step, record.energy_j))
        return out

    def settle_energy(self, timeout_s: float = 1.0) -> List[StepEnergy]:
        """Wait (at most ``timeout_s``) until the counter covers the last iteration; resolve.

        For the end of a run: the last iterations' energies arrive with the next counter
        update. Never called from a hook. Returns the energies resolved by this call.
        """
        series = self.energy
        if series is None or not self._awaiting:
            return []
        deadline = time.monotonic() + max(0.0, timeout_s)
        last_end_s = self._awaiting[-1].end_s
        while not series.covers(last_end_s) and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._resolve_energies()

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
