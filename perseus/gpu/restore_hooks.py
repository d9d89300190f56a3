"""Process-wide restoration hooks for live :class:`~perseus.gpu.guard.GPUGuard` objects.

One ``atexit`` hook and one handler per signal (SIGINT, SIGTERM) serve every guard of the
process. A handler restores every live guard, then hands the signal on: to the handler that was
installed before (Python's ``KeyboardInterrupt`` for SIGINT, a framework's own handler, ...), or,
when that was the default disposition, re-delivers the signal with the default disposition so
the process ends as it would have without Perseus. Handlers can only be installed from the main
thread; a guard acquired in another thread relies on ``atexit`` and its context manager.

Each guard's restore is bounded by its ``restore_timeout_s`` (a hung driver cannot keep a
signal from ending the process). A forked child (a data-loader worker) inherits the handlers
but not the guards: it never restores its parent's GPUs.

Runs on Python 3.9 (the Merak runtime path).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Any, Dict, List, Protocol

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Restorable(Protocol):
    """What the hooks need from a guard."""

    def restore_quietly(self) -> None:
        """Restore the GPU, logging (not raising) failures."""


_lock = threading.RLock()
_live: List[Restorable] = []
_previous: Dict[int, Any] = {}
_atexit_registered = False


def _forget_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def register(guard: Restorable) -> None:
    """Track ``guard`` so it is restored at exit and on SIGINT / SIGTERM."""
    global _atexit_registered
    with _lock:
        if guard not in _live:
            _live.append(guard)
        if not _atexit_registered:
            atexit.register(restore_all)
            _atexit_registered = True
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signum not in _previous:
                    _previous[signum] = signal.getsignal(signum)
                    signal.signal(signum, _handle)
        else:
            logger.debug("guard acquired outside the main thread: no signal handlers installed")


def unregister(guard: Restorable) -> None:
    """Stop tracking ``guard``; the last one out puts the previous signal handlers back."""
    with _lock:
        if guard in _live:
            _live.remove(guard)
        if _live or threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(_previous.items()):
            if signal.getsignal(signum) is _handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del _previous[signum]


def restore_all() -> None:
    """Restore every live guard (failures are logged, never raised)."""
    with _lock:
        guards = list(_live)
    for guard in guards:
        guard.restore_quietly()


def _handle(signum: int, frame: Any) -> None:
    logger.warning("signal %d: restoring GPU clocks and power limits", signum)
    restore_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or unknown, set from C): die the default way
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
