"""Files behind :class:`~perseus.gpu.guard.GPUGuard`: owner locks and restoration state.

``<key>.lock`` holds an advisory ``flock`` while a guard owns the GPU, and a line of JSON
saying who (shown to a second would-be owner). ``<key>.state.json`` says what to restore::

    {"format": "perseus-gpu-state/1", "pid": 4242, "owner": "perseus", "index": 0,
     "uuid": "GPU-...", "key": "GPU-...",
     "restore": {"reset_sm_clocks": true, "reset_memory_clocks": true,
                 "power_limit_mw": 400000}}

State files are written atomically (temporary file + rename) and never contain code.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from perseus.errors import GPUError, GPUOwnershipError
from perseus.formats.atomic_file import write_text_atomic
from perseus.gpu.base import GPU

logger = logging.getLogger(__name__)

STATE_FORMAT = "perseus-gpu-state/1"


def default_state_dir() -> Path:
    """``$XDG_RUNTIME_DIR/perseus`` if that variable is set, else ``/tmp/perseus-<uid>``."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return Path(runtime_dir) / "perseus"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"perseus-{uid}"


def _ensure_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


class LockFile:
    """An advisory, non-blocking, exclusive ``flock`` on one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; returns whether it was taken."""
        import fcntl

        _ensure_dir(self.path.parent)
        fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(self, what: str, owner: str) -> None:
        """Take the lock and record ``owner`` in it.

        Raises:
            GPUOwnershipError: naming the current holder.
        """
        if not self.try_acquire():
            raise GPUOwnershipError(
                f"{what} is already owned by {self._holder()}; only one controller may set "
                "a GPU's clocks and power limit: stop the other one, or share its guard "
                f"(lock file {self.path})"
            )
        assert self._fd is not None
        info = {
            "owner": owner,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(info) + "\n").encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Drop the lock.

        Args:
            remove: Also delete the file. Only for keys no other process can use: removing a
                shared lock file would race with the next owner.
        """
        if self._fd is not None:
            import fcntl

            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
                if remove:
                    self.path.unlink()
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info:
            return "another process"
        return (
            f"{info.get('owner', '?')!r} (pid {info.get('pid', '?')} on "
            f"{info.get('host', '?')}, since {info.get('since', '?')})"
        )


def write_state(path: Path, data: Dict[str, Any]) -> None:
    """Write a state file atomically."""
    _ensure_dir(path.parent)
    payload = dict(data, format=STATE_FORMAT)
    write_text_atomic(path, json.dumps(payload, sort_keys=True))


def read_state(path: Path) -> Optional[Dict[str, Any]]:
    """Read a state file; None when absent or unreadable (logged)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable GPU state file %s: %s", path, exc)
        return None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        logger.warning("ignoring %s: not a %s file", path, STATE_FORMAT)
        return None
    return data


def remove_state(path: Path) -> None:
    """Remove a state file if present."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def apply_restore(gpu: GPU, restore: Dict[str, Any]) -> None:
    """Undo what a state file's ``restore`` section lists, on ``gpu``."""
    if restore.get("reset_sm_clocks"):
        gpu.reset_sm_clocks()
    if restore.get("reset_memory_clocks"):
        gpu.reset_memory_clocks()
    if restore.get("power_limit_mw") is not None:
        gpu.set_power_limit_mw(int(restore["power_limit_mw"]))


def recover_dir(state_dir: Path, open_gpu: Callable[[int], GPU]) -> int:
    """Restore every GPU whose state file's owner is gone; returns how many."""
    if not state_dir.is_dir():
        return 0
    restored = 0
    for path in sorted(state_dir.glob("*.state.json")):
        lock = LockFile(path.with_name(path.name[: -len(".state.json")] + ".lock"))
        if not lock.try_acquire():
            continue  # the owner is alive (or another process is recovering it)
        try:
            # Read under the lock: a process that recovered it just before may have removed it.
            state = read_state(path)
            if state is not None and _recover_one(path, state, open_gpu):
                restored += 1
        finally:
            lock.release()
    return restored


def _recover_one(path: Path, state: Dict[str, Any], open_gpu: Callable[[int], GPU]) -> bool:
    try:
        gpu = open_gpu(int(state["index"]))
    except (GPUError, KeyError, ValueError) as exc:
        logger.error("cannot open the GPU of stale state file %s: %s", path, exc)
        return False
    try:
        if state.get("uuid") and gpu.uuid and gpu.uuid != state["uuid"]:
            logger.warning(
                "%s: GPU index %s is now %s, not %s; open it with the same "
                "CUDA_VISIBLE_DEVICES to restore it",
                path,
                state["index"],
                gpu.uuid,
                state["uuid"],
            )
            return False
        logger.warning(
            "restoring GPU %s (%s) left changed by dead pid %s",
            state["index"],
            state.get("uuid"),
            state.get("pid"),
        )
        apply_restore(gpu, state.get("restore", {}))
        remove_state(path)
        return True
    finally:
        gpu.close()
