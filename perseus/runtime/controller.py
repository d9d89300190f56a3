"""The clock controller: applies SM-clock changes off the training critical path.

A clock change on a real GPU is a driver call of a few hundred microseconds to milliseconds, so a
thread of the controller's own makes it. The training thread never wakes that thread per
change: the clocks of a whole iteration are handed over once, when the iteration begins (a
*timeline*: one clock per instruction position, :meth:`ClockController.begin_iteration`), and
each instruction's start is then only marked (:meth:`ClockController.at_instruction`):

* a clock that does not change costs one comparison;
* a change the timeline foresaw costs one attribute store: the controller's thread, which knows
  from the timeline that a change is ahead, looks for that mark (asleep, the interpreter lock
  free, in between) and makes the change as soon as it sees it. It looks every :data:`POLL_S`,
  or every :data:`LATE_SHARE` of the time since its last change where that is longer (at most
  :data:`MAX_SLEEP_S`): a change comes at most 1 % of its instruction's time late, and a long
  instruction, or a stalled one, costs it a look a millisecond. Where the same timeline ran
  before, it first sleeps until shortly before the mark is due (:data:`EARLY_SHARE` of the
  soonest it came after the hand-over, in sleeps of at most :data:`MAX_SLEEP_S`). With no
  change ahead it sleeps until the next hand-over;
* a change the timeline did not foresee (a source without a timeline, a schedule that departs
  from its plan, an explicit :meth:`ClockController.request`) also wakes the thread.

**What is guaranteed.** The hooks mark an instruction only after synchronizing the device (the
previous instruction's work has finished), so a change never lands on the work of the
instruction before the one it is meant for. It takes effect once the driver call returns: on a
real GPU a few hundred microseconds to milliseconds into the instruction's work, plus at most
about one poll interval for the thread to see the mark (the driver call's own latency is the
larger part; the same as when the thread was woken per change). The first clock of an iteration
is applied when the iteration is handed over, after the device drained, ahead of its first
instruction. Changes coalesce: a thread that falls behind applies only the latest clock asked
for. A request identical to the clock last asked for costs one comparison and no driver call.

Devices whose clock changes are free (``GPU.fast_clock_changes``, the emulated device) are
driven synchronously in the calling thread, so the device sees the new clock before the
instruction begins. ``synchronous=True`` forces that (tests that assert exact driver calls).

An error in the thread is kept and raised by :meth:`ClockController.check` (the optimizer calls
it in every hook), and again by every later request: the controller never goes on silently with
clocks it could not set.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from perseus.errors import GPUError, PerseusError

# How long the controller's thread sleeps between looks for an instruction's mark while a
# foreseen change is ahead (s). Linux sleeps at least ~50 us longer (timer slack).
POLL_S = 100e-6
# Where the same timeline ran before, the thread sleeps until this share of the shortest time
# the mark took to come (from the hand-over), then looks every POLL_S.
EARLY_SHARE = 0.8
# Between looks it sleeps at most this (s): an iteration faster than any before finds it late
# by no more, and a long or stalled instruction costs a look a millisecond (a few us each).
MAX_SLEEP_S = 1e-3
# ... and at least this share of the time since its last change (at least POLL_S).
LATE_SHARE = 0.01
# Timelines whose next-change tables the thread keeps (one per distinct clock sequence).
MAX_TIMELINES = 8

# What the training thread hands the thread: (change number, iteration ticket, instruction
# position, clock); position -1: before the iteration's first instruction, or outside one.
_Due = Tuple[int, int, int, Optional[int]]
Timeline = Tuple[Optional[int], ...]


class ClockTarget(Protocol):
    """What the controller drives: a :class:`~perseus.gpu.guard.owner.GPUGuard` (or a bare GPU)."""

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock."""

    def reset_sm_clocks(self) -> None:
        """Let the driver pick SM clocks again."""


class ClockController:
    """Apply SM-clock changes through one owner of the GPU's clocks (see the module docstring).

    Args:
        target: The GPU guard (or GPU) whose ``lock_sm_clocks_mhz`` / ``reset_sm_clocks``
            change the clock.
        synchronous: Apply in the calling thread instead of a thread of its own.
        name: Thread name suffix (for debugging).
        poll_s: The thread's pause between looks for a foreseen change's instruction.

    Attributes:
        error: The error the thread hit, if any (raised by :meth:`check`).
        num_applied: Clock changes made (driver calls).
        num_wakes: Times the training thread woke the thread (hand-overs with changes ahead,
            unforeseen changes, flushes, close): none per foreseen change.
    """

    def __init__(
        self,
        target: ClockTarget,
        *,
        synchronous: bool = False,
        name: str = "",
        poll_s: float = POLL_S,
    ) -> None:
        """Start the thread unless ``synchronous``."""
        self._target = target
        self.synchronous = synchronous
        self.poll_s = max(0.0, poll_s)
        self.error: Optional[BaseException] = None
        self.num_applied = 0
        self.num_wakes = 0
        # The GPU starts at default clocks (None): a first request for None is a no-op.
        self._requested: Optional[int] = None  # last clock asked for (caller thread only)
        self._applied: Optional[int] = None  # last clock applied (applier only)
        self._ticket = 0  # iterations handed over
        # (ticket, clocks, when handed over) of the last one
        self._timeline: Tuple[int, Timeline, float] = (0, (), 0.0)
        # The thread's: how soon after the hand-over each position's mark came at the soonest,
        # for the last timeline it followed.
        self._seen_s: Dict[int, float] = {}
        self._seen_of: Timeline = ()
        self._changed_s = 0.0  # the thread's: when it made its last change
        self._last_clocks: Timeline = ()
        self._last_changes = False
        self._n = 0  # changes handed to the thread
        self._due: _Due = (0, 0, -1, None)  # the latest of them, one atomic store
        self._done_n = 0
        self._closed = False
        # The thread's wake-up: a bare lock, held while the thread has nothing to do and released
        # by a hand-over with changes ahead or an unforeseen change (half the cost of an
        # Event's set on the training thread).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._done = threading.Condition()
        self._next_change: Dict[int, Tuple[Timeline, List[int]]] = {}
        self._thread: Optional[threading.Thread] = None
        if not synchronous:
            self._thread = threading.Thread(
                target=self._run, name=f"perseus-clocks{name}", daemon=True
            )
            self._thread.start()

    # -- caller side (training thread) ---------------------------------------------------------
    def begin_iteration(self, clocks: Optional[Sequence[Optional[int]]]) -> int:
        """An iteration begins (the device has drained): hand over its clocks, if known.

        Args:
            clocks: The clock of each instruction position of the iteration (``None``: default
                clocks there), or ``None`` where the source cannot tell in advance (its
                changes then wake the thread). Pass the same tuple object while the clocks
                stay the same: what it holds is then not looked at again.

        Returns:
            The iteration's ticket, for :meth:`at_instruction`.
        """
        self._ticket = ticket = self._ticket + 1
        if self.synchronous:
            return ticket
        timeline: Timeline = () if clocks is None else tuple(clocks)
        self._timeline = (ticket, timeline, time.perf_counter())
        if not timeline:
            return ticket
        if timeline is not self._last_clocks:  # a new sequence: does it change clock inside?
            self._last_clocks = timeline
            first = timeline[0]
            self._last_changes = any(c != first for c in timeline)
        first = timeline[0]
        if first != self._requested:  # applied now, ahead of the first instruction's work
            self._hand(ticket, -1, first)
            self._signal()
        elif self._last_changes:  # the thread follows the iteration's changes
            self._signal()
        return ticket

    def at_instruction(self, ticket: int, position: int, frequency_mhz: Optional[int]) -> None:
        """Instruction ``position`` of iteration ``ticket`` starts at ``frequency_mhz``.

        Call it after synchronizing the device. Free when the clock does not change; an
        attribute store when the iteration's timeline foresaw the change; a wake otherwise.
        """
        if frequency_mhz == self._requested:
            return
        self._hand(ticket, position, frequency_mhz)
        if self.synchronous:
            return
        timeline_ticket, timeline, _ = self._timeline
        if (
            timeline_ticket != ticket
            or position >= len(timeline)
            or timeline[position] != frequency_mhz
        ):
            self._signal()  # not foreseen: the thread may be asleep

    def request(self, frequency_mhz: Optional[int]) -> None:
        """Ask for ``frequency_mhz`` now (``None``: default clocks); skips a repeat of the last."""
        if frequency_mhz == self._requested:
            return
        # Outside the timeline: the rest of the iteration's marks wake the thread.
        self._timeline = (0, (), 0.0)
        self._hand(self._ticket, -1, frequency_mhz)
        if not self.synchronous:
            self._signal()

    def check(self) -> None:
        """Raise the error the controller hit, if any."""
        exc = self.error
        if exc is None:
            return
        if isinstance(exc, PerseusError):
            raise exc
        raise GPUError(
            f"the clock controller failed to change the SM clock: {exc!r}; clocks are restored "
            "when the optimizer closes"
        ) from exc

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every change asked for so far has been applied (or failed); :meth:`check`."""
        if self._thread is not None:
            target = self._n
            if self._done_n < target and self.error is None:
                self._signal()  # no need to wait for the thread's next look
            with self._done:
                ok = self._done.wait_for(
                    lambda: self._done_n >= target or self.error is not None, timeout_s
                )
            if not ok:
                raise GPUError(
                    f"the clock controller did not apply a clock change within {timeout_s} s; "
                    "the GPU driver may be hung"
                )
        self.check()

    def unlock(self, timeout_s: Optional[float] = None) -> None:
        """Request default clocks and wait until they are applied, for at most ``timeout_s``.

        Raises:
            GPUTimeoutError: the driver did not answer in time (``None``: the default bound).
        """
        from perseus.gpu.guard.bounded import RESTORE_TIMEOUT_S, run_bounded

        bound_s = RESTORE_TIMEOUT_S if timeout_s is None else timeout_s

        def unlock() -> None:
            self.request(None)
            self.flush(bound_s)

        run_bounded(unlock, bound_s, "unlocking the SM clock")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (after it applied what is pending). Does not restore clocks."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._signal()
            self._thread.join(timeout_s)

    @property
    def requested_mhz(self) -> Optional[int]:
        """The last clock requested (``None``: default clocks)."""
        return self._requested

    def _hand(self, ticket: int, position: int, frequency_mhz: Optional[int]) -> None:
        """Record a change (and apply it here when synchronous)."""
        if self.error is not None:
            self.check()
        if self._closed:
            raise GPUError(
                "the clock controller is closed; create a new PerseusOptimizer to change clocks"
            )
        self._requested = frequency_mhz
        if self.synchronous:
            self._apply(frequency_mhz)
            return
        self._n = n = self._n + 1
        self._due = (n, ticket, position, frequency_mhz)  # one atomic store

    def _signal(self) -> None:
        """Wake the thread; a wake-up already pending covers this one (it reads the latest)."""
        try:
            self._wake.release()
            self.num_wakes += 1
        except RuntimeError:
            pass  # released before and not yet taken: the thread will see the latest change

    # -- applier side -------------------------------------------------------------------------
    def _apply(self, frequency_mhz: Optional[int]) -> None:
        if frequency_mhz == self._applied:
            return
        try:
            if frequency_mhz is None:
                self._target.reset_sm_clocks()
            else:
                self._target.lock_sm_clocks_mhz(frequency_mhz, frequency_mhz)
        except BaseException as exc:
            self.error = exc
            raise
        self._applied = frequency_mhz
        self.num_applied += 1

    def _run(self) -> None:
        while True:
            n, ticket, position, frequency_mhz = self._due
            if n > self._done_n:
                self._saw(ticket, position)
                self._changed_s = time.perf_counter()
                try:
                    self._apply(frequency_mhz)
                except BaseException:
                    self._notify(n)
                    return
                self._notify(n)
                continue  # a newer change may have come meanwhile
            if self._closed:
                return
            wait_s = self._next_look_s(ticket, position)
            if wait_s is None:
                self._wake.acquire()  # until a hand-over, an unforeseen change or close
            else:  # a foreseen change is ahead; a wake (flush, close, ...) cuts this short
                self._wake.acquire(timeout=wait_s)

    def _saw(self, ticket: int, position: int) -> None:
        """Keep when the mark of ``position`` came, for the next run of the same timeline."""
        timeline_ticket, timeline, handed_s = self._timeline
        if timeline_ticket != ticket or position < 0:
            return
        if timeline is not self._seen_of:
            self._seen_of = timeline
            self._seen_s = {}
        took_s = time.perf_counter() - handed_s
        self._seen_s[position] = min(took_s, self._seen_s.get(position, took_s))

    def _next_look_s(self, ticket: int, position: int) -> Optional[float]:
        """How long to sleep before looking for the next foreseen change's mark.

        ``None``: the current iteration's timeline changes clock no more after the last change
        seen (at ``position`` of iteration ``ticket``).
        """
        timeline_ticket, timeline, handed_s = self._timeline
        start = position + 1 if timeline_ticket == ticket else 0
        if start >= len(timeline):
            return None
        if timeline[start] != self._applied:
            change = start
        else:
            change = self._next_change_of(timeline)[start]
            if change >= len(timeline):
                return None
        now_s = time.perf_counter()
        look_s = min(MAX_SLEEP_S, max(self.poll_s, LATE_SHARE * (now_s - self._changed_s)))
        took_s = self._seen_s.get(change) if timeline is self._seen_of else None
        if took_s is None:
            return look_s
        early_s = handed_s + EARLY_SHARE * took_s - now_s
        return min(MAX_SLEEP_S, max(look_s, early_s))

    def _next_change_of(self, timeline: Timeline) -> List[int]:
        """``[i]``: the first position after ``i`` whose clock differs from position ``i``'s."""
        key = id(timeline)
        cached = self._next_change.get(key)
        if cached is not None and cached[0] is timeline:
            return cached[1]
        nxt = [len(timeline)] * len(timeline)
        for i in range(len(timeline) - 2, -1, -1):
            nxt[i] = i + 1 if timeline[i + 1] != timeline[i] else nxt[i + 1]
        if len(self._next_change) >= MAX_TIMELINES:
            self._next_change.clear()
        self._next_change[key] = (timeline, nxt)  # keeps the tuple alive: its id stays its own
        return nxt

    def _notify(self, n: int) -> None:
        with self._done:
            self._done_n = n
            self._done.notify_all()
