"""The clock controller: applies SM-clock requests off the training critical path.

A request names the clock the next instruction should run at (``None``: let the driver pick).
On a real GPU a clock change is a driver call of a few hundred microseconds to milliseconds, so
a background thread applies it while the instruction starts. Requests coalesce: the thread
applies only the latest pending one. A request identical to the previous one costs one
comparison and no driver call.

Devices whose clock changes are free (``GPU.fast_clock_changes``, the emulated device) are
driven synchronously in the calling thread, so the device sees the new clock before the
instruction begins. ``synchronous=True`` forces that (tests that assert exact driver calls).

An error in the thread is kept and raised by :meth:`ClockController.check` (the optimizer calls
it in every hook), and again by every later request: the controller never goes on silently with
clocks it could not set.
"""

from __future__ import annotations

import threading
from typing import Optional, Protocol, Tuple

from perseus.errors import GPUError, PerseusError


class ClockTarget(Protocol):
    """What the controller drives: a :class:`~perseus.gpu.guard.owner.GPUGuard` (or a bare GPU)."""

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock."""

    def reset_sm_clocks(self) -> None:
        """Let the driver pick SM clocks again."""


class ClockController:
    """Apply SM-clock requests through one owner of the GPU's clocks.

    Args:
        target: The GPU guard (or GPU) whose ``lock_sm_clocks_mhz`` / ``reset_sm_clocks``
            change the clock.
        synchronous: Apply in the calling thread instead of a background thread.
        name: Thread name suffix (for debugging).
    """

    def __init__(self, target: ClockTarget, *, synchronous: bool = False, name: str = "") -> None:
        """Start the background thread unless ``synchronous``."""
        self._target = target
        self.synchronous = synchronous
        self.error: Optional[BaseException] = None
        self.num_applied = 0
        # The GPU starts at default clocks (None): a first request for None is a no-op.
        self._requested: Optional[int] = None  # last value requested (caller thread only)
        self._applied: Optional[int] = None  # last value applied (applier only)
        self._seq = 0  # number of requests handed to the thread
        self._pending: Tuple[int, Optional[int]] = (0, None)
        self._done_seq = 0
        self._closed = False
        # The thread's wake-up: a bare lock, held while the thread has nothing to do and released
        # by a request (half the cost of an Event's set on the training thread, ~5 vs ~11 us).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._done = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        if not synchronous:
            self._thread = threading.Thread(
                target=self._run, name=f"perseus-clocks{name}", daemon=True
            )
            self._thread.start()

    # -- caller side (training thread) ---------------------------------------------------------
    def request(self, frequency_mhz: Optional[int]) -> None:
        """Ask for ``frequency_mhz`` (``None``: default clocks); skips repeats of the last one."""
        if frequency_mhz == self._requested:
            return
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
        self._seq += 1
        self._pending = (self._seq, frequency_mhz)  # one atomic store
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
        """Wait until every request so far has been applied (or failed), then :meth:`check`."""
        if self._thread is not None:
            target = self._seq
            with self._done:
                ok = self._done.wait_for(
                    lambda: self._done_seq >= target or self.error is not None, timeout_s
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
            self._wake.acquire()  # until a request (or close) releases it
            seq, frequency_mhz = self._pending
            if seq > self._done_seq:
                try:
                    self._apply(frequency_mhz)
                except BaseException:
                    self._notify(seq)
                    return
                self._notify(seq)
            if self._closed and self._done_seq >= self._seq:
                return

    def _signal(self) -> None:
        """Wake the thread; a wake-up already pending covers this one (it reads the latest)."""
        try:
            self._wake.release()
        except RuntimeError:
            pass  # released before and not yet taken: the thread will see the latest request

    def _notify(self, seq: int) -> None:
        with self._done:
            self._done_seq = seq
            self._done.notify_all()
