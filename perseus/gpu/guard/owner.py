"""GPUGuard: the one owner of a GPU's clocks and power limit, and the promise to undo them.

* **One owner per physical GPU.** ``acquire`` takes an advisory ``flock`` on
  ``<state_dir>/<gpu key>.lock`` (the key is the GPU's UUID, so the same device opened under a
  different ``CUDA_VISIBLE_DEVICES`` collides as it should). A second owner — in this process
  or another — gets :class:`~perseus.errors.GPUOwnershipError` naming the holder. The kernel
  drops the lock when its holder dies, however it dies.
* **Back to as found.** Before the first change the guard records what it is about to change
  (the power limit in force; clocks are assumed unlocked, NVML cannot read a lock) and writes
  ``<gpu key>.state.json`` (pid, GPU index and UUID, what to restore) *before* changing
  anything. :meth:`restore` undoes the changes and removes the file.
* **Whatever ends the process.** Context-manager exit (exceptions), ``atexit``, SIGINT and
  SIGTERM (see :mod:`perseus.gpu.guard.restore_hooks`) restore. SIGKILL and SIGABRT cannot be
  handled: the state file stays behind, and the **watchdog** (:mod:`perseus.gpu.guard.watchdog`, a
  separate process started with the first guard of a process on a real GPU) restores it the
  moment its owner is gone. The next start (:meth:`GPUGuard.recover_stale`, and ``acquire``
  for its own GPU) and ``perseus-gpu restore`` (job epilogs) do the same.
* **Bounded.** Restoring runs under a timeout (``restore_timeout_s``): a driver that stopped
  answering cannot hang a close, an exit hook or a signal handler; what was not restored stays
  in the state file (and the lock stays held until the process ends, so nobody else takes the
  GPU meanwhile).

State dir: ``gpu.state_dir``, else ``$XDG_RUNTIME_DIR/perseus``, else ``/tmp/perseus-<uid>``.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from perseus.errors import GPUError, GPUTimeoutError
from perseus.gpu.base import GPU
from perseus.gpu.guard import restore_hooks
from perseus.gpu.guard.bounded import RESTORE_TIMEOUT_S, run_bounded
from perseus.gpu.guard.files import (
    LockFile,
    apply_restore,
    default_state_dir,
    read_state,
    remove_state,
    write_state,
)

logger = logging.getLogger(__name__)


class GPUGuard:
    """Single owner of one GPU's clocks and power limit; restores them as found.

    Args:
        gpu: The device.
        state_dir: Where lock and state files live (default: see the module docstring).
        owner: Who holds the GPU, shown to a second would-be owner.
        restore_timeout_s: Bound on restoring (None: unbounded).
        watchdog: Start the watchdog process on acquire. None: for devices whose settings
            outlive the process (real GPUs), not in a dry run.
    """

    def __init__(
        self,
        gpu: GPU,
        *,
        state_dir: Optional[Path] = None,
        owner: str = "perseus",
        restore_timeout_s: Optional[float] = RESTORE_TIMEOUT_S,
        watchdog: Optional[bool] = None,
    ) -> None:
        self.gpu = gpu
        self.owner = owner
        self.restore_timeout_s = restore_timeout_s
        if watchdog is None:
            watchdog = gpu.persistent_settings and not gpu.dry_run
        self._watchdog = watchdog
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        key = gpu.ownership_key()
        self._lock_file = LockFile(self.state_dir / f"{key}.lock")
        self._state_path = self.state_dir / f"{key}.state.json"
        self._mutex = threading.RLock()
        self._sm_locked = False
        self._memory_locked = False
        self._found_power_limit_mw: Optional[int] = None
        self._state_written: Dict[str, Any] = {}  # what the state file on disk says

    # -- ownership --------------------------------------------------------------------------
    @property
    def acquired(self) -> bool:
        """Whether this guard owns its GPU now."""
        return self._lock_file.held

    def acquire(self) -> GPUGuard:
        """Become the GPU's owner (idempotent); restores a dead owner's leftovers first.

        Raises:
            GPUOwnershipError: another live owner holds the GPU.
        """
        with self._mutex:
            if self.acquired:
                return self
            self._lock_file.acquire(self._describe_gpu(), self.owner)
            try:
                leftover = read_state(self._state_path)
                if leftover is not None:
                    self._restore_leftover(leftover)
            except BaseException:
                self._lock_file.release(remove=True)
                raise
            if self._watchdog:
                from perseus.gpu.guard import watchdog

                watchdog.watch(self.state_dir)
            restore_hooks.register(self)
            return self

    def release(self) -> None:
        """Restore the GPU and give up ownership.

        Raises:
            GPUTimeoutError: restoring did not finish in time; the guard then keeps the GPU's
                lock (and its state file) until the process ends, for the watchdog.
        """
        if not self.acquired:
            return
        try:
            self.restore()
        except GPUTimeoutError:
            restore_hooks.unregister(self)
            raise
        except BaseException:
            self._let_go()
            raise
        self._let_go()

    def _let_go(self) -> None:
        with self._mutex:
            restore_hooks.unregister(self)
            self._lock_file.release(remove=True)

    def __enter__(self) -> GPUGuard:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- changes ----------------------------------------------------------------------------
    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock (acquires the GPU if needed).

        Once the SM clock is locked, the GPU is owned and its state file already lists the SM
        clock: a plan's per-instruction changes then only make the change (nothing to record,
        and a failed change leaves that record as it should be).
        """
        with self._mutex:
            if self._sm_locked and self._lock_file.held:
                self.gpu.lock_sm_clocks_mhz(min_mhz, max_mhz)
                return
            self._before_change(sm=True)
            self._attempt(lambda: self.gpu.lock_sm_clocks_mhz(min_mhz, max_mhz), "_sm_locked")

    def reset_sm_clocks(self) -> None:
        """Unlock the SM clock (acquires the GPU if needed)."""
        with self._mutex:
            self.acquire()
            self._reset_sm_clocks()

    def _reset_sm_clocks(self) -> None:
        self.gpu.reset_sm_clocks()
        self._sm_locked = False
        self._write_or_remove_state()

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock (acquires the GPU if needed)."""
        with self._mutex:
            self._before_change(memory=True)
            self._attempt(
                lambda: self.gpu.lock_memory_clocks_mhz(min_mhz, max_mhz), "_memory_locked"
            )

    def reset_memory_clocks(self) -> None:
        """Unlock the memory clock (acquires the GPU if needed)."""
        with self._mutex:
            self.acquire()
            self._reset_memory_clocks()

    def _reset_memory_clocks(self) -> None:
        self.gpu.reset_memory_clocks()
        self._memory_locked = False
        self._write_or_remove_state()

    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the power limit (acquires the GPU if needed; remembers the one found)."""
        with self._mutex:
            first = self._found_power_limit_mw is None
            self._before_change(power=True)
            try:
                self.gpu.set_power_limit_mw(limit_mw)
            except BaseException:
                if first:
                    self._found_power_limit_mw = None
                    self._write_or_remove_state()
                raise

    def reset_power_limit(self) -> None:
        """Put back the power limit found before the first change (default if none)."""
        with self._mutex:
            self.acquire()
            self._reset_power_limit()

    def _reset_power_limit(self) -> None:
        found = self._found_power_limit_mw
        if found is None:
            self.gpu.reset_power_limit()
            return
        self.gpu.set_power_limit_mw(found)
        self._found_power_limit_mw = None
        self._write_or_remove_state()

    def restore(self) -> None:
        """Undo every change this guard made; raises the first failure after trying all.

        Raises:
            GPUTimeoutError: not done within ``restore_timeout_s`` (a hung driver).
        """
        if not (self._sm_locked or self._memory_locked or self._found_power_limit_mw is not None):
            return
        what = f"restoring {self._describe_gpu()}"
        if self._mutex.acquire(blocking=False):
            # This thread holds the guard now, and may have held it already: a signal handler
            # that interrupted one of the guard's own methods on this thread (a synchronous
            # clock change) runs here, and that method cannot go on before the process ends.
            # The bounded worker then undoes the changes without taking the lock again (it
            # would wait for this thread until the timeout and leave the GPU changed); no
            # other thread can change the GPU meanwhile.
            try:
                run_bounded(self._undo_changes, self.restore_timeout_s, what)
            finally:
                self._mutex.release()
            return
        run_bounded(self._restore_now, self.restore_timeout_s, what)  # after the holder's change

    def _restore_now(self) -> None:
        with self._mutex:
            self._undo_changes()

    def _undo_changes(self) -> None:
        """Undo every recorded change (the caller holds the mutex for this thread's use)."""
        failures = []
        for changed, undo in (
            (self._sm_locked, self._reset_sm_clocks),
            (self._memory_locked, self._reset_memory_clocks),
            (self._found_power_limit_mw is not None, self._reset_power_limit),
        ):
            if changed:
                try:
                    undo()
                except GPUError as exc:
                    failures.append(exc)
        if failures:
            raise failures[0]

    def restore_quietly(self) -> None:
        """Restore, logging failures (for exit paths that must not raise)."""
        try:
            self.restore()
        except Exception as exc:
            logger.error("%s: could not restore GPU settings: %s", self._describe_gpu(), exc)

    # -- SIGKILL recovery -------------------------------------------------------------------
    @staticmethod
    def recover_stale(
        state_dir: Optional[Path],
        open_gpu: Callable[[int], GPU],
        open_uuid: Optional[Callable[[str], GPU]] = None,
    ) -> int:
        """Restore GPUs whose owner died without restoring (state file left, lock free).

        Args:
            state_dir: The guards' state dir (None = the default).
            open_gpu: Opens the GPU with the index recorded in a state file; a device whose
                UUID differs from the recorded one is left alone (with a warning).
            open_uuid: Opens a GPU by the UUID recorded in a state file (preferred: right
                whatever ``CUDA_VISIBLE_DEVICES`` says now).

        Returns:
            How many GPUs were restored. Damaged state files are set aside, never raised.
        """
        from perseus.gpu.guard.files import recover_dir

        path = Path(state_dir) if state_dir else default_state_dir()
        return recover_dir(path, open_gpu, open_uuid)

    # -- internals --------------------------------------------------------------------------
    def _restore_leftover(self, leftover: Dict[str, Any]) -> None:
        """Undo what a dead owner's state file lists (kept as is in dry-run mode)."""
        if self.gpu.dry_run:
            logger.warning(
                "%s: dead owner pid %s left settings changed; a dry run does not restore them "
                "(state file %s kept): start once without gpu.dry_run to restore them",
                self._describe_gpu(),
                leftover.get("pid"),
                self._state_path,
            )
            return
        logger.warning(
            "%s: restoring settings left by dead owner pid %s",
            self._describe_gpu(),
            leftover.get("pid"),
        )
        apply_restore(self.gpu, leftover.get("restore", {}))
        remove_state(self._state_path)

    def _before_change(self, sm: bool = False, memory: bool = False, power: bool = False) -> None:
        self.acquire()
        if power and self._found_power_limit_mw is None:
            self._found_power_limit_mw = self.gpu.power_limit_mw()
        self._write_or_remove_state(sm=sm, memory=memory)

    def _attempt(self, change: Callable[[], None], flag: str) -> None:
        was = getattr(self, flag)
        try:
            change()
        except BaseException:
            if not was:
                self._write_or_remove_state()
            raise
        setattr(self, flag, True)

    def _write_or_remove_state(self, sm: bool = False, memory: bool = False) -> None:
        if not self.gpu.persistent_settings or self.gpu.dry_run:
            return
        restore: Dict[str, Any] = {}
        if sm or self._sm_locked:
            restore["reset_sm_clocks"] = True
        if memory or self._memory_locked:
            restore["reset_memory_clocks"] = True
        if self._found_power_limit_mw is not None:
            restore["power_limit_mw"] = self._found_power_limit_mw
        if restore == self._state_written:
            return  # unchanged: the per-instruction clock path writes no file
        self._state_written = restore
        if not restore:
            remove_state(self._state_path)
            return
        write_state(
            self._state_path,
            {
                "pid": os.getpid(),
                "owner": self.owner,
                "index": self.gpu.index,
                "uuid": self.gpu.uuid,
                "key": self.gpu.ownership_key(),
                "restore": restore,
            },
        )

    def _describe_gpu(self) -> str:
        uuid = f", {self.gpu.uuid}" if self.gpu.uuid else ""
        return f"GPU {self.gpu.index} ({getattr(self.gpu, 'name', '?')}{uuid})"
