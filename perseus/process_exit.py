"""The one process-wide exit registry: what Perseus must close or undo when the process ends.

Everything that must not outlive the process registers its closer here: GPU guards (restore
clocks and power limits), rank devices and optimizers (stop clock threads, flush traces), the
online source (send the last reports), a locally started coordination server (terminate it).

* **Interpreter exit.** One ``atexit`` hook runs the registered closers last-registered first,
  like a :class:`contextlib.ExitStack`: an optimizer built on a device closes before the device,
  and a device closes (its clock thread stopped) before its guard restores the clocks. A closer
  that fails is logged; the others still run.
* **SIGINT / SIGTERM.** Closers registered with ``on_signal=True`` (the guards' quick restores)
  also run from the signal handler, which then hands the signal on: to the handler installed
  before (Python's ``KeyboardInterrupt`` for SIGINT, a framework's own handler), or, when that
  was the default disposition, re-delivers it so the process ends as it would have without
  Perseus. A signal the process ignores (SIGINT in a background job) is left alone: it does
  not end the process, so nothing is restored. Handlers can only be installed from the main
  thread; elsewhere ``atexit`` and the owners' context managers remain.
* **SIGKILL** cannot be caught: the guards' state files cover it (see
  :mod:`perseus.gpu.guard.owner`).

A forked child (a data-loader worker) starts with no closers: what its parent registered is
the parent's to close. A closer is removed with :func:`cancel` once its owner closed normally. See
``docs/design.md`` ("Ownership and exit").
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

Closer = Callable[[], Any]

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_lock = threading.RLock()
# (closer, also on SIGINT/SIGTERM), in registration order.
_closers: List[Tuple[Closer, bool]] = []
_previous: Dict[int, Any] = {}
_atexit_registered = False


def _forget_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    _closers.clear()
    # The inherited handlers stay (they only run closers, and there are none), so that a
    # signal still reaches the parent's previous handler.


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def at_exit(closer: Closer, *, on_signal: bool = False) -> Closer:
    """Run ``closer`` when the process ends (before everything registered earlier).

    Args:
        closer: A callable without arguments; registering the same one again moves it last.
        on_signal: Also run it on SIGINT / SIGTERM (quick, non-blocking closers only).

    Returns:
        ``closer`` (pass it to :func:`cancel`).
    """
    global _atexit_registered
    with _lock:
        _remove(closer)
        _closers.append((closer, on_signal))
        if not _atexit_registered:
            atexit.register(run_all)
            _atexit_registered = True
        if on_signal:
            _install_signal_handlers()
    return closer


def cancel(closer: Closer) -> None:
    """Forget ``closer`` (its owner closed); the last signal closer out restores the handlers."""
    with _lock:
        _remove(closer)
        if not any(sig for _, sig in _closers):
            _uninstall_signal_handlers()


def run_all() -> None:
    """Run and forget every registered closer, last registered first (failures are logged)."""
    while True:
        with _lock:
            if not _closers:
                return
            closer, _ = _closers.pop()
        _run(closer)


def run_signal_closers() -> None:
    """Run the closers registered with ``on_signal=True`` (they stay registered)."""
    with _lock:
        closers = [c for c, sig in reversed(_closers) if sig]
    for closer in closers:
        _run(closer)


def _run(closer: Closer) -> None:
    try:
        closer()
    except Exception as exc:  # an exit path must not raise over the others
        logger.error("closing %r at exit failed: %r", closer, exc)


def _remove(closer: Closer) -> None:
    _closers[:] = [(c, sig) for c, sig in _closers if c != closer]


def exit_with_parent(parent_pid: Optional[int] = None, period_s: float = 1.0) -> None:
    """End this process (at once, from a daemon thread) once its parent process is gone.

    For helper processes (a server started by a training rank, the server's workers) whose
    parent may die without stopping them (SIGKILL, or a shutdown that does not reach them):
    they never outlive it as orphans.

    Args:
        parent_pid: The parent to watch (default: the current parent).
        period_s: How often to look.
    """
    parent = os.getppid() if parent_pid is None else parent_pid

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="perseus-parent-watch").start()


def exit_without_finalizing(code: int = 0) -> None:
    """End a training process after its clean teardown, without interpreter finalization.

    torch's gloo backend runs worker threads per process group for the group's whole life
    (DeepSpeed keeps its groups referenced until the process ends, so ``destroy_process_group``
    does not stop them). After a collective returns, its worker thread may still hold the last
    reference to a tensor that Python has already dropped; releasing it takes the GIL. Once
    the interpreter is finalizing, CPython ends any thread that asks for the GIL by unwinding
    it, which through that C++ destructor calls ``std::terminate``: the process dies with
    SIGABRT ("terminate called without an active exception") after a successful run, and the
    elastic agent fails the job. So the process joins its non-daemon threads and runs the exit
    hooks (these closers included) while the interpreter is fully alive, so that threads get
    the GIL as usual, flushes its output, and leaves with ``os._exit``.

    Args:
        code: Exit status of the process.
    """
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()  # as interpreter shutdown would
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        logger.debug("registered outside the main thread: no signal handlers installed")
        return
    for signum in SIGNALS:
        if signum not in _previous:
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN:
                continue  # the process outlives this signal (e.g. SIGINT in a background job)
            _previous[signum] = previous
            signal.signal(signum, _handle)


def _uninstall_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _handle:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        del _previous[signum]


def _handle(signum: int, frame: Any) -> None:
    logger.warning("signal %d: restoring GPU clocks and power limits", signum)
    run_signal_closers()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:  # set to ignore since Perseus installed its handler
        return
    else:  # SIG_DFL (or unknown, set from C): die the default way
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
