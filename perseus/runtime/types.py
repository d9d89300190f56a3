"""The runtime's contracts: the hooks adapters call and the frequency sources the hooks ask.

The records they carry (:class:`~perseus.records.RankInfo`, :class:`~perseus.records.StepRecord`)
live in :mod:`perseus.records`, the layer every other one imports.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from perseus.records import StepRecord
from perseus.runtime.launch.endpoint import Endpoint


class Hooks(Protocol):
    """The one hook contract adapters call, and nothing else."""

    def on_step_begin(self) -> None:
        """A training iteration (one optimizer step over all microbatches) starts."""

    def on_step_end(self) -> None:
        """The training iteration ended."""

    def on_instruction_begin(self, name: str) -> None:
        """A ``forward`` or ``backward`` of one microbatch starts on this stage.

        Schedules that split a backward report its halves as ``backward_input`` and
        ``backward_weight`` (:data:`perseus.pipeline_order.KINDS`).
        """

    def on_instruction_end(self, name: str) -> None:
        """That instruction ended (adapters call this in ``finally``)."""


class WaitHooks(Hooks, Protocol):
    """Hooks that can also leave a wait inside an instruction out of its measurement.

    Optional: an adapter calls these only between ``on_instruction_begin`` and
    ``on_instruction_end``, where an engine blocks in the middle of an instruction (Merak's
    ``RecomputeRecvGrad`` recomputes, then waits for the gradient), and only on hook objects
    that have them. Like the other hooks, an implementation synchronizes the device before it
    stamps the wait's begin and end (see ``docs/design.md``, "Hook contract").
    """

    def on_wait_begin(self) -> None:
        """The running instruction blocks on another stage until :meth:`on_wait_end`."""

    def on_wait_end(self) -> None:
        """The wait is over; what follows is the instruction's work again."""


class FrequencySource(Protocol):
    """Decides the SM frequency of every instruction (a plan, a profiler sweep, max speed).

    The optimizer asks once per instruction; ``None`` means "leave the GPU at default
    clocks". Implementations must be cheap: this runs on the training critical path. Everything
    the runtime uses of a source is declared here.
    """

    @property
    def changes_clocks(self) -> bool:
        """Whether the source ever asks for a clock (measuring ones never: no guard needed)."""

    @property
    def endpoint(self) -> Optional[Endpoint]:
        """The coordination server the source talks to (``None``: it talks to none)."""

    def begin_step(self, step: int) -> None:
        """Iteration ``step`` starts."""

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """Frequency for the ``position``-th instruction of iteration ``step`` on this stage."""

    def iteration_clocks(self) -> Optional[Sequence[Optional[int]]]:
        """The clocks of the iteration begun last, position by position, where known ahead.

        The hooks hand them to the clock controller once per iteration, so that a change costs
        the training thread no wake-up of the controller's thread (``docs/design.md``,
        "Hook contract"). ``None``: not known ahead (every change then wakes it). Return the
        same tuple object while the clocks stay the same. :meth:`frequency_mhz` still decides:
        an instruction whose clock differs from this is applied as it says.
        """

    def end_step(self, record: StepRecord) -> None:
        """Iteration ended; ``record`` has what happened (for profilers and watchers)."""

    def close(self) -> None:
        """Release what the source holds (threads, the server link); idempotent."""
