"""The real device: one NVIDIA GPU driven through NVML (pynvml, imported lazily).

* **Which GPU.** ``index`` is the CUDA device index of this process; it is mapped to the NVML
  device by identity (CUDA's UUID where this process uses CUDA, else ``CUDA_VISIBLE_DEVICES``
  and ``CUDA_DEVICE_ORDER``; see :mod:`perseus.gpu.nvml.device_map`). :meth:`NVMLGPU.from_uuid`
  opens a GPU by UUID whatever the environment (recovery of a killed owner's settings).
* MIG: a MIG instance (``MIG-`` UUID) or a GPU with MIG mode on is refused; clocks and power
  limits of a partitioned GPU are shared by all its instances.
* ``dry_run``: every change is logged and not made; reads still go to the device.
* Supported SM clocks are those NVML lists for the highest memory clock.
* **Synchronize.** :meth:`synchronize` waits for the work this process queued on the CUDA
  device (``torch.cuda.synchronize``; a no-op where CUDA is not in use).
* **Energy.** The cumulative counter (Volta or newer) where it exists; a counter that goes
  backwards (reset by a driver reload) is continued, not subtracted. Without a counter
  (``NOT_SUPPORTED``), energy is integrated from power samples
  (:class:`~perseus.gpu.energy.power_sampler.SampledEnergy`), with one warning.
* **Power.** The instant power field (``NVML_FI_DEV_POWER_INSTANT``) where the driver has it,
  else ``nvmlDeviceGetPowerUsage`` (averaged over about a second on A40 and Hopper).
* **Temperature.** ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``, read (like the energy
  counter) only by the device's sampler thread.

Every NVML failure raises a :mod:`perseus.errors` ``GPU*`` error (see
:mod:`perseus.gpu.nvml.support`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from perseus.errors import GPUError, GPUNotSupportedError, GPUValueError
from perseus.gpu.base import GPU
from perseus.gpu.energy.power_sampler import SampledEnergy
from perseus.gpu.guard.bounded import run_bounded
from perseus.gpu.nvml.device_map import handle_by_uuid, resolve_handle
from perseus.gpu.nvml.support import as_text, call, load_pynvml, mig_message
from perseus.gpu.sync import CudaSynchronizer

logger = logging.getLogger(__name__)

# Bound on nvmlShutdown at close (a hung driver must not hang the exit).
CLOSE_TIMEOUT_S = 5.0


class NVMLGPU(GPU):
    """One NVIDIA GPU.

    Args:
        index: The GPU's CUDA device index in this process (after ``CUDA_VISIBLE_DEVICES``).
        dry_run: Log clock / power-limit changes instead of making them.
        uuid: Open the GPU with this UUID instead (``index`` is then only reported).
        power_sample_period_s: Background power sampling period where energy has to be
            integrated from power (no counter); 0 samples only when energy is read.
        clock: Monotonic clock of that integration (tests inject a fake one).

    Attributes:
        mapping: How the NVML device was found (e.g. "CUDA device 0 by UUID").

    Raises:
        GPUNotFoundError: no driver, no such GPU, or an ambiguous mapping.
        GPUNotSupportedError: the GPU is a MIG instance or has MIG mode enabled.
    """

    persistent_settings = True

    def __init__(
        self,
        index: int,
        *,
        dry_run: bool = False,
        uuid: Optional[str] = None,
        power_sample_period_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.index = index
        self.dry_run = dry_run
        self._nvml = load_pynvml()
        self._where = f"GPU {index}" if uuid is None else f"GPU {uuid}"
        call(self._nvml, self._where, "nvmlInit")
        self._open = True
        try:
            if uuid is None:
                self._handle, self.mapping = resolve_handle(self._nvml, index, self._where)
            else:
                self._handle = handle_by_uuid(self._nvml, uuid, self._where)
                self.mapping = f"by UUID {uuid}"
            self._refuse_mig()
            self.name = as_text(self._call("nvmlDeviceGetName"))
            self.uuid = as_text(self._call("nvmlDeviceGetUUID"))
        except BaseException:
            self.close()
            raise
        self._where = f"GPU {index} ({self.name}, {self.uuid})"
        # Only a device opened by CUDA index has queued work of this process to wait for.
        self._sync: Optional[CudaSynchronizer] = CudaSynchronizer(index) if uuid is None else None
        self._sm_clocks: Optional[List[int]] = None
        self._mem_clocks: Optional[List[int]] = None
        self._constraints: Optional[Tuple[int, int]] = None
        self._energy_lock = threading.Lock()
        self._last_raw_mj: Optional[int] = None
        self._energy_offset_mj = 0
        self._sampled: Optional[SampledEnergy] = None
        self._sample_period_s = power_sample_period_s
        self._clock = clock
        self._instant_field: Optional[bool] = None  # unknown until the first power reading

    @classmethod
    def from_uuid(cls, uuid: str, *, dry_run: bool = False) -> NVMLGPU:
        """Open the GPU with this UUID, whatever ``CUDA_VISIBLE_DEVICES`` says.

        ``index`` is then NVML's index of the device (PCI bus order).
        """
        gpu = cls(-1, dry_run=dry_run, uuid=uuid)
        try:
            gpu.index = int(gpu._call("nvmlDeviceGetIndex"))
        except GPUError:
            pass
        return gpu

    # -- opening ----------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        return call(self._nvml, self._where, name, *args, handle=self._handle)

    def _refuse_mig(self) -> None:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(self._handle)
        except nvml.NVMLError:
            return  # pre-Ampere GPUs have no MIG mode
        if current == nvml.NVML_DEVICE_MIG_ENABLE:
            raise GPUNotSupportedError(mig_message(f"{self._where} has MIG mode enabled"))

    # -- clocks -----------------------------------------------------------------------------
    def supported_memory_clocks_mhz(self) -> List[int]:
        """Memory clocks the device supports, highest first."""
        if self._mem_clocks is None:
            clocks = self._call("nvmlDeviceGetSupportedMemoryClocks")
            self._mem_clocks = sorted((int(c) for c in clocks), reverse=True)
        return list(self._mem_clocks)

    def supported_sm_clocks_mhz(self) -> List[int]:
        """SM clocks supported at the highest memory clock, highest first."""
        if self._sm_clocks is None:
            mem_mhz = self.supported_memory_clocks_mhz()[0]
            clocks = self._call("nvmlDeviceGetSupportedGraphicsClocks", mem_mhz)
            self._sm_clocks = sorted((int(c) for c in clocks), reverse=True)
        return list(self._sm_clocks)

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into ``[min_mhz, max_mhz]``."""
        _check_range(min_mhz, max_mhz, "SM clock", self._where)
        self._change(
            f"lock SM clocks to [{min_mhz}, {max_mhz}] MHz",
            "nvmlDeviceSetGpuLockedClocks",
            min_mhz,
            max_mhz,
        )

    def reset_sm_clocks(self) -> None:
        """Unlock the SM clock."""
        self._change("reset SM clocks", "nvmlDeviceResetGpuLockedClocks")

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock into ``[min_mhz, max_mhz]``."""
        _check_range(min_mhz, max_mhz, "memory clock", self._where)
        self._change(
            f"lock memory clocks to [{min_mhz}, {max_mhz}] MHz",
            "nvmlDeviceSetMemoryLockedClocks",
            min_mhz,
            max_mhz,
        )

    def reset_memory_clocks(self) -> None:
        """Unlock the memory clock."""
        self._change("reset memory clocks", "nvmlDeviceResetMemoryLockedClocks")

    # -- power limit ------------------------------------------------------------------------
    def power_limit_mw(self) -> int:
        """The power limit in force (mW)."""
        return int(self._call("nvmlDeviceGetPowerManagementLimit"))

    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        """``(min_mw, max_mw)`` allowed for the power limit."""
        if self._constraints is None:
            lo, hi = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
            self._constraints = (int(lo), int(hi))
        return self._constraints

    def default_power_limit_mw(self) -> int:
        """The default power limit (mW)."""
        return int(self._call("nvmlDeviceGetPowerManagementDefaultLimit"))

    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the power limit (mW); outside the constraints raises GPUValueError."""
        lo, hi = self.power_limit_constraints_mw()
        if not lo <= limit_mw <= hi:
            raise GPUValueError(
                f"power limit {limit_mw} mW is outside what {self._where} allows "
                f"[{lo}, {hi}] mW; pick a value in that range"
            )
        self._change(
            f"set power limit to {limit_mw} mW", "nvmlDeviceSetPowerManagementLimit", int(limit_mw)
        )

    # -- measurement ------------------------------------------------------------------------
    @property
    def energy_source(self) -> str:  # type: ignore[override]
        """``counter`` or, on GPUs without one, ``sampled power``."""
        return "counter" if self._sampled is None else "sampled power"

    def total_energy_mj(self) -> int:
        """Energy (mJ): the counter, continued across resets; sampled power without one."""
        sampled = self._sampled
        if sampled is not None:
            return sampled.energy_mj()
        try:
            raw = int(self._call("nvmlDeviceGetTotalEnergyConsumption"))
        except GPUNotSupportedError as exc:
            return self._fall_back_to_power(exc).energy_mj()
        with self._energy_lock:
            last = self._last_raw_mj
            if last is not None and raw < last:
                logger.warning(
                    "%s: the energy counter went back from %d to %d mJ (reset by a driver "
                    "reload?); continuing from %d mJ",
                    self._where,
                    last,
                    raw,
                    last + self._energy_offset_mj,
                )
                self._energy_offset_mj += last
            self._last_raw_mj = raw
            return raw + self._energy_offset_mj

    def power_mw(self) -> int:
        """Power draw (mW): the instant field where available, else NVML's power usage."""
        if self._instant_field is not False:
            instant = self._instant_power_mw()
            if instant is not None:
                return instant
        return int(self._call("nvmlDeviceGetPowerUsage"))

    def instant_power_mw(self) -> Optional[int]:
        """``NVML_FI_DEV_POWER_INSTANT`` (mW); None where the driver or pynvml lacks it."""
        if self._instant_field is False:
            return None
        return self._instant_power_mw()

    @property
    def power_source(self) -> str:
        """Which NVML reading :meth:`power_mw` uses (known after the first reading)."""
        if self._instant_field is None:
            return "unknown (not read yet)"
        return "instant field" if self._instant_field else "nvmlDeviceGetPowerUsage"

    def sm_clock_mhz(self) -> Optional[int]:
        """The current SM clock (``nvmlDeviceGetClockInfo``); None where unsupported."""
        try:
            return int(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM))
        except GPUNotSupportedError:
            return None

    def temperature_c(self) -> Optional[float]:
        """The die temperature (``NVML_TEMPERATURE_GPU``, whole °C); None where unsupported."""
        try:
            return float(self._call("nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU))
        except GPUNotSupportedError:
            return None

    def persistence_mode(self) -> Optional[bool]:
        """Whether persistence mode is on (None where NVML cannot say)."""
        try:
            mode = self._call("nvmlDeviceGetPersistenceMode")
        except GPUNotSupportedError:
            return None
        return bool(mode == self._nvml.NVML_FEATURE_ENABLED)

    def synchronize(self) -> None:
        """Wait for the CUDA work this process queued on the device (no-op without CUDA)."""
        if self._sync is not None:
            self._sync()

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Release NVML (settings are left alone: restoring them is the guard's job).

        Bounded: a driver that does not answer cannot hang the caller (see
        :mod:`perseus.gpu.guard.bounded`).
        """
        sampled = getattr(self, "_sampled", None)
        if sampled is not None:
            sampled.close()
        if getattr(self, "_open", False):
            self._open = False
            try:
                run_bounded(
                    self._nvml.nvmlShutdown, CLOSE_TIMEOUT_S, f"nvmlShutdown ({self._where})"
                )
            except (self._nvml.NVMLError, GPUError) as exc:  # closing must not fail
                logger.warning("%s: nvmlShutdown failed: %s", self._where, exc)

    def __repr__(self) -> str:
        return f"NVMLGPU(index={self.index}, uuid={self.uuid!r}, dry_run={self.dry_run})"

    def _fall_back_to_power(self, exc: GPUNotSupportedError) -> SampledEnergy:
        with self._energy_lock:
            if self._sampled is None:
                self.power_mw()  # fails here (with its own error) if power cannot be read either
                logger.warning(
                    "%s has no energy counter (%s); integrating sampled power instead "
                    "(%s every %g s): energy of windows shorter than ~0.1 s is less accurate",
                    self._where,
                    "NVML_ERROR_NOT_SUPPORTED" if "Not Supported" in str(exc) else exc,
                    self.power_source,
                    self._sample_period_s,
                )
                self._sampled = SampledEnergy(
                    self.power_mw,
                    clock=self._clock,
                    period_s=self._sample_period_s,
                    name=f"gpu{self.index}",
                )
            return self._sampled

    def _instant_power_mw(self) -> Optional[int]:
        nvml = self._nvml
        field = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        ok = getattr(nvml, "NVML_SUCCESS", 0)
        try:
            if field is None:
                raise LookupError("pynvml has no NVML_FI_DEV_POWER_INSTANT")
            value = nvml.nvmlDeviceGetFieldValues(self._handle, [field])[0]
            if value.nvmlReturn != ok:
                raise LookupError(f"field status {value.nvmlReturn}")
            self._instant_field = True
            return int(value.value.uiVal)
        except (nvml.NVMLError, LookupError) as exc:
            if self._instant_field is None:
                logger.info(
                    "%s: no instant power field (%s); using nvmlDeviceGetPowerUsage",
                    self._where,
                    exc,
                )
            self._instant_field = False
            return None

    def _change(self, description: str, name: str, *args: Any) -> None:
        if self.dry_run:
            self.log_dry_run(logger, self._where, description)
            return
        logger.debug("%s: %s", self._where, description)
        self._call(name, *args)


def _check_range(min_mhz: int, max_mhz: int, what: str, where: str) -> None:
    if min_mhz <= 0 or min_mhz > max_mhz:
        raise GPUValueError(
            f"{what} range [{min_mhz}, {max_mhz}] MHz for {where} is invalid; give "
            "0 < min <= max (equal values pin one frequency)"
        )
