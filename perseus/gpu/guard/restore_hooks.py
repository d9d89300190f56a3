"""Restoring live :class:`~perseus.gpu.guard.owner.GPUGuard` objects however the process ends.

A guard registers itself when acquired and unregisters when released; its ``restore_quietly``
then sits in the process-wide exit registry (:mod:`perseus.process_exit`), which runs it at
interpreter exit (after the runtime objects registered later, e.g. the clock controller that
drives the guard) and from the SIGINT / SIGTERM handler.

Each guard's restore is bounded by its ``restore_timeout_s`` (a hung driver cannot keep a
signal from ending the process). A forked child (a data-loader worker) inherits neither the
guards nor the exit registry's closers: it never restores its parent's GPUs.
"""

from __future__ import annotations

import os
import threading
from typing import List, Protocol

from perseus import process_exit

SIGNALS = process_exit.SIGNALS


class Restorable(Protocol):
    """What the hooks need from a guard."""

    def restore_quietly(self) -> None:
        """Restore the GPU, logging (not raising) failures."""


_lock = threading.RLock()
_live: List[Restorable] = []


def _forget_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def register(guard: Restorable) -> None:
    """Track ``guard`` so it is restored at exit and on SIGINT / SIGTERM."""
    with _lock:
        if guard not in _live:
            _live.append(guard)
    process_exit.at_exit(guard.restore_quietly, on_signal=True)


def unregister(guard: Restorable) -> None:
    """Stop tracking ``guard`` (it was released)."""
    with _lock:
        if guard in _live:
            _live.remove(guard)
    process_exit.cancel(guard.restore_quietly)


def restore_all() -> None:
    """Restore every live guard now (failures are logged, never raised)."""
    with _lock:
        guards = list(_live)
    for guard in guards:
        guard.restore_quietly()
