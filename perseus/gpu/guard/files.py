"""Files behind :class:`~perseus.gpu.guard.owner.GPUGuard`: owner locks and restoration state.

``<key>.lock`` holds an advisory ``flock`` while a guard owns the GPU, and a line of JSON
saying who (shown to a second would-be owner). ``<key>.state.json`` says what to restore::

    {"format": "perseus-gpu-state/1", "pid": 4242, "owner": "perseus", "index": 0,
     "uuid": "GPU-...", "key": "GPU-...",
     "restore": {"reset_sm_clocks": true, "reset_memory_clocks": true,
                 "power_limit_mw": 400000}}

State files are written atomically (temporary file + rename) and never contain code. A state
file that cannot be read or does not follow that schema is **damaged**: it is reported, moved
aside to ``<name>.damaged-<time>``, and never blocks a start.

Lock files are removed by whoever holds their ``flock`` (the owner on release, a cleaner that
took a dead owner's lock); :meth:`LockFile.try_acquire` re-checks after locking that the path
still names the file it locked, so a removal can never hand one GPU to two owners.
Recovery opens each GPU by the UUID its state file recorded, whatever
``CUDA_VISIBLE_DEVICES`` says now.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

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


# Locks held by this process. A forked child (a data-loader worker) closes its copies at
# once: a flock lives as long as any copy of its descriptor, and the child is not the owner.
_held: weakref.WeakSet = weakref.WeakSet()


def _drop_in_child() -> None:
    for lock in list(_held):
        lock.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


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
        for _ in range(100):
            fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                removed = not _names(self.path, fd)
                os.close(fd)
                if removed:
                    continue  # its holder removed it meanwhile: lock the new file
                return False
            if _names(self.path, fd):
                self._fd = fd
                _held.add(self)
                return True
            os.close(fd)  # locked a file that was removed meanwhile: try again
        return False

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
            remove: Also delete the file (safe: acquirers check they locked the named file).
        """
        if self._fd is not None:
            import fcntl

            fd, self._fd = self._fd, None
            _held.discard(self)
            try:
                os.ftruncate(fd, 0)
                if remove:
                    self.path.unlink()
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def forget(self) -> None:
        """Close this process's descriptor without unlocking (a forked child's copy)."""
        fd, self._fd = self._fd, None
        _held.discard(self)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

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


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        st = os.stat(str(path))
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (own.st_ino, own.st_dev)


def write_state(path: Path, data: Dict[str, Any]) -> None:
    """Write a state file atomically."""
    _ensure_dir(path.parent)
    payload = dict(data, format=STATE_FORMAT)
    write_text_atomic(path, json.dumps(payload, sort_keys=True))


def read_state(path: Path) -> Optional[Dict[str, Any]]:
    """Read a state file; None when absent, or when damaged (then reported and set aside).

    Call it holding the file's lock (a damaged file is renamed).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        set_aside(path, f"unreadable: {exc}")
        return None
    try:
        return check_state(json.loads(text))
    except ValueError as exc:  # includes JSON errors
        set_aside(path, str(exc))
        return None


def check_state(data: Any) -> Dict[str, Any]:
    """``data`` if it is a valid state record.

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != STATE_FORMAT:
        raise ValueError(f"format is {data.get('format')!r}, not {STATE_FORMAT!r}")
    for key, kind in (("pid", int), ("index", int)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ValueError(f"{key!r} must be an integer, got {data.get(key)!r}")
    if data.get("uuid") is not None and not isinstance(data["uuid"], str):
        raise ValueError(f"'uuid' must be a string, got {data['uuid']!r}")
    restore = data.get("restore")
    if not isinstance(restore, dict):
        raise ValueError(f"'restore' must be an object, got {restore!r}")
    unknown = set(restore) - {"reset_sm_clocks", "reset_memory_clocks", "power_limit_mw"}
    if unknown:
        raise ValueError(f"'restore' has unknown keys {sorted(unknown)}")
    for key in ("reset_sm_clocks", "reset_memory_clocks"):
        if key in restore and not isinstance(restore[key], bool):
            raise ValueError(f"restore.{key} must be true/false, got {restore[key]!r}")
    limit = restore.get("power_limit_mw")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"restore.power_limit_mw must be a positive integer, got {limit!r}")
    return data


def set_aside(path: Path, why: str) -> Optional[Path]:
    """Report a damaged state file and rename it out of the way; returns the new path."""
    stem = f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside, n = path.with_name(stem), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{stem}-{n}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.error("damaged GPU state file %s (%s) cannot be moved aside: %s", path, why, exc)
        return None
    gpu = path.name[: -len(".state.json")] if path.name.endswith(".state.json") else "?"
    logger.error(
        "damaged GPU state file %s (%s): moved to %s and ignored. Perseus cannot tell what it "
        "recorded: check GPU %s with `perseus-doctor` or `nvidia-smi -q -d CLOCK,POWER`, and if "
        "its clocks are still locked or its power limit lowered, reset them (`sudo nvidia-smi "
        "-i %s -rgc -rmc`, `sudo nvidia-smi -i %s -pl <watts>`)",
        path,
        why,
        aside,
        gpu,
        gpu,
        gpu,
    )
    return aside


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


def recover_dir(
    state_dir: Path,
    open_gpu: Callable[[int], GPU],
    open_uuid: Optional[Callable[[str], GPU]] = None,
    owner_pid: Optional[int] = None,
) -> int:
    """Restore every GPU whose state file's owner is gone; returns how many.

    Damaged state files are set aside; lock files of dead owners are removed; a GPU that
    cannot be restored now (driver error) keeps its state file for a later try. Never raises
    for any of these.

    Args:
        state_dir: The guards' state dir.
        open_gpu: Opens a GPU by the index a state file recorded (state files without UUID).
        open_uuid: Opens a GPU by UUID (preferred: right under any ``CUDA_VISIBLE_DEVICES``).
        owner_pid: Only state files of this (dead) process (the watchdog).
    """
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
            if state is not None and owner_pid is not None and state["pid"] != owner_pid:
                continue
            if state is not None and _recover_one(path, state, open_gpu, open_uuid):
                restored += 1
        finally:
            lock.release(remove=True)
    clean_dead_locks(state_dir)
    return restored


def owner_states(state_dir: Path, pid: int) -> List[Path]:
    """State files in ``state_dir`` written by process ``pid`` (read without locking)."""
    found = []
    for path in sorted(state_dir.glob("*.state.json")) if state_dir.is_dir() else []:
        try:
            if json.loads(path.read_text()).get("pid") == pid:
                found.append(path)
        except (OSError, ValueError, AttributeError):
            continue
    return found


def clean_dead_locks(state_dir: Path) -> List[Path]:
    """Remove lock files nobody holds (left by killed owners); returns those removed."""
    removed = []
    for path in sorted(state_dir.glob("*.lock")):
        lock = LockFile(path)
        try:
            if lock.try_acquire():
                lock.release(remove=True)
                removed.append(path)
        except OSError as exc:  # e.g. another user's file in a shared dir
            logger.debug("cannot clean lock file %s: %s", path, exc)
    return removed


def _recover_one(
    path: Path,
    state: Dict[str, Any],
    open_gpu: Callable[[int], GPU],
    open_uuid: Optional[Callable[[str], GPU]],
) -> bool:
    uuid = state.get("uuid")
    try:
        gpu = open_uuid(uuid) if uuid and open_uuid is not None else open_gpu(state["index"])
    except GPUError as exc:
        logger.error("cannot open the GPU of stale state file %s (kept for later): %s", path, exc)
        return False
    try:
        if uuid and gpu.uuid and gpu.uuid != uuid:
            logger.warning(
                "%s: GPU index %s is now %s, not %s; run `perseus-gpu restore` (it opens GPUs "
                "by UUID) to restore it",
                path,
                state["index"],
                gpu.uuid,
                uuid,
            )
            return False
        logger.warning(
            "restoring GPU %s (%s) left changed by dead pid %s",
            state["index"],
            uuid,
            state["pid"],
        )
        try:
            apply_restore(gpu, state["restore"])
        except GPUError as exc:
            logger.error("restoring %s failed (state file kept for later): %s", path, exc)
            return False
        remove_state(path)
        return True
    finally:
        gpu.close()
