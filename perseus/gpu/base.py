"""The abstract GPU every other layer talks to.

Units are in the names: ``_mhz`` clocks, ``_mw`` power, ``_mj`` energy, ``_s`` time. A backend
(NVML, emulated) implements the abstract methods; nothing above this layer imports pynvml.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from typing import List, Optional, Set, Tuple


class GPU(abc.ABC):
    """One GPU driven by this process.

    Attributes:
        index: The index of the GPU as this process sees it (after ``CUDA_VISIBLE_DEVICES``).
        name: A human-readable device name.
    """

    index: int
    name: str
    # True when clock changes cost next to nothing (the emulated device): the runtime then
    # applies them in the calling thread instead of a background controller.
    fast_clock_changes: bool = False
    # Stable identity of the physical device (NVML UUID); None for devices without one.
    uuid: Optional[str] = None
    # True when changes are only logged, never made (``gpu.dry_run``).
    dry_run: bool = False
    # True when clock / power-limit settings outlive this process (real devices): the guard
    # then keeps a state file so a later start can restore them after a SIGKILL.
    persistent_settings: bool = False
    # Where total_energy_mj() comes from: "counter" (the device's cumulative counter, updated
    # every few tens of ms) or "sampled power" (instant power integrated over time, for
    # devices without a counter). Sampled energy moves at every read: no update to wait for.
    energy_source: str = "counter"
    # True for the emulated device: its times and energies come from a profile, not hardware.
    emulated: bool = False
    # The dry run's changes said so far (see log_dry_run).
    _dry_run_said: Optional[Set[str]] = None

    def ownership_key(self) -> str:
        """A file-name-safe key naming the physical device, for the one-owner lock.

        Real devices use their UUID (the same GPU seen through different
        ``CUDA_VISIBLE_DEVICES`` gets the same key); devices without one are private to this
        object.
        """
        if self.uuid:
            return "".join(c if c.isalnum() or c in "-_" else "_" for c in self.uuid)
        return f"{type(self).__name__.lower()}-{os.getpid()}-{id(self):x}"

    # -- clocks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def supported_sm_clocks_mhz(self) -> List[int]:
        """SM (graphics) clocks the device supports, highest first."""

    @abc.abstractmethod
    def supported_memory_clocks_mhz(self) -> List[int]:
        """Memory clocks the device supports, highest first."""

    @abc.abstractmethod
    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into ``[min_mhz, max_mhz]`` (equal values pin one frequency)."""

    @abc.abstractmethod
    def reset_sm_clocks(self) -> None:
        """Undo :meth:`lock_sm_clocks_mhz`: the driver picks clocks again."""

    @abc.abstractmethod
    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock into ``[min_mhz, max_mhz]``."""

    @abc.abstractmethod
    def reset_memory_clocks(self) -> None:
        """Undo :meth:`lock_memory_clocks_mhz`."""

    # -- power limit ----------------------------------------------------------------------------
    @abc.abstractmethod
    def power_limit_mw(self) -> int:
        """The power limit in force (mW)."""

    @abc.abstractmethod
    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        """``(min_mw, max_mw)`` the power limit may be set to."""

    @abc.abstractmethod
    def default_power_limit_mw(self) -> int:
        """The power limit the device boots with (mW)."""

    @abc.abstractmethod
    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the power limit (mW)."""

    def reset_power_limit(self) -> None:
        """Restore the default power limit."""
        self.set_power_limit_mw(self.default_power_limit_mw())

    # -- measurement ----------------------------------------------------------------------------
    @abc.abstractmethod
    def total_energy_mj(self) -> int:
        """Energy consumed since the driver loaded (mJ); advances in discrete updates."""

    @abc.abstractmethod
    def power_mw(self) -> int:
        """Current power draw (mW)."""

    def instant_power_mw(self) -> Optional[int]:
        """The device's instant power field (mW); None where it has none.

        On NVIDIA GPUs, ``NVML_FI_DEV_POWER_INSTANT``: it updates every ~100 ms and lags a load
        change (on an H100 it shows a short window's average from a few ms before its update).
        """
        return None

    def temperature_c(self) -> Optional[float]:
        """The GPU's temperature (°C; NVIDIA: the die sensor, whole degrees); None: no sensor.

        Read by the device's energy sampler from its own thread, never by a hook.
        """
        return None

    def log_dry_run(self, log: logging.Logger, where: str, description: str) -> None:
        """A change a dry run does not make: logged at INFO the first time, then at DEBUG.

        A plan changes clocks at every instruction; saying each would flood the log from the
        training thread, and saying each kind of change once is what a user reads.
        """
        if self._dry_run_said is None:
            self._dry_run_said = set()
        level = logging.DEBUG if description in self._dry_run_said else logging.INFO
        self._dry_run_said.add(description)
        log.log(level, "[dry run] %s: would %s", where, description)

    def sm_clock_mhz(self) -> Optional[int]:
        """The SM clock the device runs at now, read back from it (None: cannot be read)."""
        return None

    # -- time base ------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait until all work queued on this device so far has finished.

        Real GPUs run kernels asynchronously: a framework's forward returns once its kernels
        are queued. Whoever changes a clock for an instruction, or stamps its time or energy,
        calls this first. A no-op for devices without queued work.
        """

    def now_s(self) -> float:
        """Host time the device's work is measured against (``time.perf_counter``)."""
        return time.perf_counter()

    # -- instruction marks (the emulated device uses them; real devices ignore them) -------------
    def instruction_begin(self, stage: int, instruction: str) -> None:
        """The runtime starts ``instruction`` (an instruction kind) of pipeline ``stage`` now.

        The emulated device runs it at its currently locked SM clock.
        """

    def instruction_end(self, instruction: str) -> None:
        """The runtime finished the instruction begun last (blocks until it is done)."""

    def close(self) -> None:
        """Release the device (restoring settings is the controller's job, not this)."""
