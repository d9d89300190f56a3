"""The real device: one NVIDIA GPU driven through NVML (pynvml, imported lazily).

* ``index`` is the GPU as this process sees it: ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-``
  UUIDs or unique UUID prefixes) is honoured, so rank ``i`` opens the same device as
  ``torch.cuda.device(i)``.
* MIG: a MIG instance (``MIG-`` UUID) or a GPU with MIG mode on is refused; clocks and power
  limits of a partitioned GPU are shared by all its instances.
* ``dry_run``: every change is logged and not made; reads still go to the device.
* Supported SM clocks are those NVML lists for the highest memory clock.

Every NVML failure raises a :mod:`perseus.errors` ``GPU*`` error (see
:mod:`perseus.gpu.nvml_support`).
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

from perseus.errors import GPUNotFoundError, GPUNotSupportedError, GPUValueError
from perseus.gpu.base import GPU
from perseus.gpu.nvml_support import as_text, call, load_pynvml, translate, visible_devices

logger = logging.getLogger(__name__)


class NVMLGPU(GPU):
    """One NVIDIA GPU.

    Args:
        index: The GPU's index as this process sees it (after ``CUDA_VISIBLE_DEVICES``).
        dry_run: Log clock / power-limit changes instead of making them.

    Raises:
        GPUNotFoundError: no driver, no such GPU.
        GPUNotSupportedError: the GPU is a MIG instance or has MIG mode enabled.
    """

    persistent_settings = True

    def __init__(self, index: int, *, dry_run: bool = False) -> None:
        self.index = index
        self.dry_run = dry_run
        self._nvml = load_pynvml()
        self._where = f"GPU {index}"
        call(self._nvml, self._where, "nvmlInit")
        self._open = True
        try:
            self._handle = self._resolve_handle(index)
            self._refuse_mig()
            self.name = as_text(self._call("nvmlDeviceGetName"))
            self.uuid = as_text(self._call("nvmlDeviceGetUUID"))
        except BaseException:
            self.close()
            raise
        self._where = f"GPU {index} ({self.name}, {self.uuid})"
        self._sm_clocks: Optional[List[int]] = None
        self._mem_clocks: Optional[List[int]] = None
        self._constraints: Optional[Tuple[int, int]] = None

    # -- opening ----------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        return call(self._nvml, self._where, name, *args, handle=self._handle)

    def _resolve_handle(self, index: int) -> Any:
        nvml = self._nvml
        visible = visible_devices()
        if visible is not None:
            if not 0 <= index < len(visible):
                raise GPUNotFoundError(
                    f"GPU {index} is not visible: CUDA_VISIBLE_DEVICES lists {len(visible)} "
                    f"device(s) ({','.join(visible) or 'none'}); use an index below that or "
                    "change CUDA_VISIBLE_DEVICES"
                )
            entry = visible[index]
            if entry.startswith("MIG-"):
                raise GPUNotSupportedError(_mig_message(f"GPU {index} is MIG instance {entry}"))
            if entry.startswith("GPU-"):
                return self._handle_by_uuid(entry)
            index = int(entry)
        count = call(nvml, self._where, "nvmlDeviceGetCount")
        if not 0 <= index < count:
            raise GPUNotFoundError(
                f"GPU {index} does not exist: NVML sees {count} GPU(s); check the GPU index "
                "(gpu local index / CUDA_VISIBLE_DEVICES)"
            )
        return call(nvml, self._where, "nvmlDeviceGetHandleByIndex", index)

    def _handle_by_uuid(self, uuid: str) -> Any:
        """Handle of the GPU with this UUID, or (as CUDA allows) this unique UUID prefix."""
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in (
                nvml.NVML_ERROR_NOT_FOUND,
                nvml.NVML_ERROR_INVALID_ARGUMENT,
            ):
                raise translate(nvml, exc, f"nvmlDeviceGetHandleByUUID({uuid!r}) failed") from exc
        matches = []
        for i in range(call(nvml, self._where, "nvmlDeviceGetCount")):
            handle = call(nvml, self._where, "nvmlDeviceGetHandleByIndex", i)
            if as_text(call(nvml, self._where, "nvmlDeviceGetUUID", handle)).startswith(uuid):
                matches.append(handle)
        if len(matches) != 1:
            raise GPUNotFoundError(
                f"CUDA_VISIBLE_DEVICES entry {uuid} matches {len(matches)} GPUs; give a full "
                "GPU UUID (`nvidia-smi -L`) or an index"
            )
        return matches[0]

    def _refuse_mig(self) -> None:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(self._handle)
        except nvml.NVMLError:
            return  # pre-Ampere GPUs have no MIG mode
        if current == nvml.NVML_DEVICE_MIG_ENABLE:
            raise GPUNotSupportedError(_mig_message(f"{self._where} has MIG mode enabled"))

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
    def total_energy_mj(self) -> int:
        """Energy since the driver loaded (mJ)."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption"))

    def power_mw(self) -> int:
        """Current power draw (mW)."""
        return int(self._call("nvmlDeviceGetPowerUsage"))

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Release NVML (settings are left alone: restoring them is the guard's job)."""
        if getattr(self, "_open", False):
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:  # closing must not fail
                logger.debug("nvmlShutdown failed: %s", exc)

    def __repr__(self) -> str:
        return f"NVMLGPU(index={self.index}, uuid={self.uuid!r}, dry_run={self.dry_run})"

    def _change(self, description: str, name: str, *args: Any) -> None:
        if self.dry_run:
            logger.info("[dry run] %s: would %s", self._where, description)
            return
        logger.debug("%s: %s", self._where, description)
        self._call(name, *args)


def _check_range(min_mhz: int, max_mhz: int, what: str, where: str) -> None:
    if min_mhz <= 0 or min_mhz > max_mhz:
        raise GPUValueError(
            f"{what} range [{min_mhz}, {max_mhz}] MHz for {where} is invalid; give "
            "0 < min <= max (equal values pin one frequency)"
        )


def _mig_message(what: str) -> str:
    return (
        f"{what}: Perseus needs a whole GPU because clocks and power limits are shared by "
        "all MIG instances; disable MIG (`sudo nvidia-smi -i <gpu> -mig 0`), pick a GPU "
        "without MIG, or use gpu=emulated"
    )
