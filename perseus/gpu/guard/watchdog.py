"""The watchdog: a separate process that restores a rank's GPUs when the rank dies.

SIGKILL (an out-of-memory killer, a scheduler) and SIGABRT (NCCL's watchdog, a C++ assertion)
end a process without running any Python: its guards cannot restore. So the first guard a
process acquires on a real GPU starts one watchdog for that process (:func:`watch`):

    python -m perseus.gpu.guard.watchdog --owner <pid> --state-dir <dir>

It waits for the owner to end (``pidfd_open``; where that is missing, it notices being
re-parented), then restores what the owner's state files in its state dirs still list
(:func:`perseus.gpu.guard.files.recover_dir`, by GPU UUID) and removes the dead owner's lock
files. After a clean exit there is nothing left to do and it ends at once. It runs in its own
session, so a signal sent to the job's process group does not reach it; more state dirs are
sent on its standard input, one per line. A kill of the whole job's cgroup (some schedulers)
takes the watchdog too: run ``perseus-gpu restore`` in the job epilog for that case.

If the owner's forked children still hold its locks for a moment, the watchdog retries for
``--patience-s`` seconds.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

logger = logging.getLogger(__name__)

WATCHDOG_ENV = "PERSEUS_GPU_WATCHDOG"
"""Set to ``0`` to start no watchdog (where the job's epilog runs ``perseus-gpu restore``)."""

_lock = threading.Lock()
# Per owner pid: the watchdog process and the state dirs it was told about.
_watchdogs: Dict[int, Tuple[subprocess.Popen, Set[str]]] = {}


def watch(state_dir: Path) -> Optional[subprocess.Popen]:
    """Make sure this process has a watchdog that covers ``state_dir``; returns it.

    Never raises: without a watchdog, a killed process's GPUs are restored by the next start
    or by ``perseus-gpu restore`` (the failure is logged). With ``PERSEUS_GPU_WATCHDOG=0`` in
    the environment no watchdog is started (``None``).
    """
    if os.environ.get(WATCHDOG_ENV) == "0":
        return None
    pid, directory = os.getpid(), str(Path(state_dir).resolve())
    with _lock:
        known = _watchdogs.get(pid)
        try:
            if known is None or known[0].poll() is not None:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "perseus.gpu.guard.watchdog",
                        "--owner",
                        str(pid),
                        "--state-dir",
                        directory,
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
                _watchdogs[pid] = (proc, {directory})
                return proc
            proc, dirs = known
            if directory not in dirs:
                assert proc.stdin is not None
                proc.stdin.write(f"{directory}\n".encode())
                proc.stdin.flush()
                dirs.add(directory)
            return proc
        except (OSError, ValueError) as exc:
            logger.warning(
                "cannot start the GPU watchdog (%s): if this process is killed, its GPU "
                "settings are restored by the next start or by `perseus-gpu restore`",
                exc,
            )
            return None


def wait_for_exit(pid: int, poll_s: float = 0.2) -> None:
    """Return once process ``pid`` (this process's parent) has ended."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return  # already gone
        else:
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
            return
    while os.getppid() == pid:  # re-parented once the owner ends
        time.sleep(poll_s)


def restore_after(owner: int, dirs: Set[str], patience_s: float, retry_s: float = 0.5) -> int:
    """Restore what ``owner`` left in ``dirs``; retries while its locks are still held."""
    from perseus.gpu.guard.files import owner_states, recover_dir
    from perseus.gpu.nvml.device import NVMLGPU

    deadline = time.monotonic() + patience_s
    restored = 0
    while True:
        for directory in sorted(dirs):
            restored += recover_dir(
                Path(directory),
                lambda index: NVMLGPU(index),
                NVMLGPU.from_uuid,
                owner_pid=owner,
            )
        left: List[Path] = [p for d in sorted(dirs) for p in owner_states(Path(d), owner)]
        if not left or time.monotonic() >= deadline:
            if left:
                logger.error(
                    "could not restore %s after %g s (still locked, or the driver failed); run "
                    "`perseus-gpu restore` once the GPU is free",
                    ", ".join(str(p) for p in left),
                    patience_s,
                )
            return restored
        time.sleep(retry_s)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the watchdog process."""
    parser = argparse.ArgumentParser(prog="perseus-gpu-watchdog", description=__doc__)
    parser.add_argument("--owner", type=int, required=True, help="pid of the process to watch")
    parser.add_argument("--state-dir", action="append", required=True, help="guard state dir")
    parser.add_argument("--patience-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"perseus GPU watchdog (pid {os.getpid()}, owner {args.owner}): %(message)s",
    )
    dirs: Set[str] = set(args.state_dir)

    def read_more_dirs() -> None:
        for line in sys.stdin:
            if line.strip():
                dirs.add(line.strip())

    reader = threading.Thread(target=read_more_dirs, daemon=True)
    reader.start()
    wait_for_exit(args.owner)
    reader.join(0.5)  # take the last directories sent before the owner ended
    restored = restore_after(args.owner, set(dirs), args.patience_s)
    if restored:
        logger.warning("restored %d GPU(s) left changed by pid %d", restored, args.owner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
