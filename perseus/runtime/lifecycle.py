"""Closing runtime objects at interpreter exit, before the GPU guards restore the clocks.

``atexit`` runs hooks last-registered first. The GPU guards register their own exit hook when
the first guard is acquired; the runtime's hooks must run before it, so that clock-controller
threads are stopped (and can no longer apply a pending clock) when the guards restore. Hence
:func:`move_exit_hook_last` re-registers a hook every time a new object is tracked, after its
guard was acquired. Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import Any, Callable

logger = logging.getLogger(__name__)

_live: weakref.WeakSet[Any] = weakref.WeakSet()


def move_exit_hook_last(hook: Callable[[], None]) -> None:
    """(Re-)register ``hook`` so that it runs before every exit hook registered so far."""
    atexit.unregister(hook)
    atexit.register(hook)


def close_at_exit(obj: Any) -> None:
    """Call ``obj.close()`` at interpreter exit unless :func:`forget` was called first."""
    _live.add(obj)
    move_exit_hook_last(_close_live)


def forget(obj: Any) -> None:
    """``obj`` was closed: nothing to do for it at exit."""
    _live.discard(obj)


def _close_live() -> None:
    for obj in list(_live):
        try:
            obj.close()
        except Exception as exc:  # pragma: no cover - best effort at interpreter exit
            logger.error("closing %r at exit failed: %r", obj, exc)
