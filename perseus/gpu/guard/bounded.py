"""Driver calls with a deadline: a hung NVML call must not hang an exit path.

A GPU whose driver stopped answering blocks every NVML call forever. On the paths that end a
process — restoring clocks at close, in a signal handler, at interpreter exit, shutting NVML
down — :func:`run_bounded` runs the work in a daemon thread and stops waiting after a timeout.
The blocked thread is left behind (a daemon thread does not keep the process alive); what it
was restoring stays recorded in the guard's state file, so the watchdog or the next start
restores it once the driver answers again.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, TypeVar

from perseus.errors import GPUTimeoutError

T = TypeVar("T")

# Default bound for restoring a GPU's settings (a healthy driver needs milliseconds).
RESTORE_TIMEOUT_S = 10.0


def run_bounded(fn: Callable[[], T], timeout_s: Optional[float], what: str) -> T:
    """Run ``fn()`` and return its result, or raise if it does not finish in ``timeout_s``.

    Args:
        fn: The work (typically NVML calls).
        timeout_s: The bound; ``None`` runs ``fn`` in the calling thread without one.
        what: What ``fn`` does, for the error message.

    Raises:
        GPUTimeoutError: ``fn`` did not finish in time (it goes on in a daemon thread).
        BaseException: whatever ``fn`` raised.
    """
    if timeout_s is None:
        return fn()
    done = threading.Event()
    result: List[Any] = []
    error: List[BaseException] = []

    def work() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=work, name="perseus-bounded", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        raise GPUTimeoutError(
            f"{what} did not finish within {timeout_s:g} s: the GPU driver is not responding "
            "(check `nvidia-smi`); what could not be restored stays in the GPU state file and "
            "is restored by the watchdog, `perseus-gpu restore` or the next start"
        )
    if error:
        raise error[0]
    return result[0]
