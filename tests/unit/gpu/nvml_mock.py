"""An autospec'd stand-in for pynvml, for NVML call-sequence tests (no GPU here).

``make_pynvml_mock()`` returns ``unittest.mock.create_autospec(pynvml)`` — every NVML function
checks its signature — with pynvml's real constants and exception classes put back (so
``except pynvml.NVMLError`` and ``NVML_DEVICE_MIG_ENABLE`` behave), and plausible A100 answers.
Handles are the strings ``"handle-<index>"``, so ``mock_calls`` compare exactly, even as reprs
written by a child process. The instant power field answers 90 W, ``nvmlDeviceGetPowerUsage``
85 W, no temperature (or 45 °C); the SM clock read back is the one locked (1410 MHz unlocked).
Install it with ``patched_pynvml(m)`` (Perseus imports pynvml lazily, so replacing the module
in ``sys.modules`` is the seam).

Also used by other test packages (runtime NVML-sequence tests): keep the defaults stable.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional
from unittest import mock

import pynvml

A100_SM_CLOCKS_MHZ = list(range(1410, 210 - 1, -15))
A100_MEMORY_CLOCKS_MHZ = [1215]
DEFAULT_LIMIT_MW = 400_000
LIMIT_CONSTRAINTS_MW = [100_000, 400_000]


def uuid_of(index: int) -> str:
    """The fake UUID of physical GPU ``index``."""
    return f"GPU-00000000-0000-0000-0000-00000000000{index}"


INSTANT_POWER_MW = 90_000
TEMPERATURE_C = 45


def field_value(value: int, status: int = pynvml.NVML_SUCCESS) -> Any:
    """A real ``nvmlFieldValue_t`` as nvmlDeviceGetFieldValues returns it."""
    v = pynvml.c_nvmlFieldValue_t()
    v.fieldId = pynvml.NVML_FI_DEV_POWER_INSTANT
    v.nvmlReturn = status
    v.value.uiVal = value
    return v


def make_pynvml_mock(
    num_gpus: int = 1,
    mig_enabled: bool = False,
    power_limit_mw: int = DEFAULT_LIMIT_MW,
    names: Optional[List[str]] = None,
    temperature_c: Optional[int] = None,
) -> Any:
    """An autospec'd pynvml with real constants/exceptions and fixed answers.

    ``names``: the model of each GPU (default: all A100). ``temperature_c``: what the die
    sensor reads (default: no sensor, ``NVML_ERROR_NOT_SUPPORTED``, so that jobs on these GPUs
    are not held for their temperature to settle; :data:`TEMPERATURE_C` for one that reads).
    """
    m = mock.create_autospec(pynvml)
    for name in dir(pynvml):
        if name.startswith(("NVML_", "NVMLError")):
            setattr(m, name, getattr(pynvml, name))
    m.__spec__ = pynvml.__spec__  # the import system inspects it; keep it out of mock_calls
    handles: Dict[str, int] = {f"handle-{i}": i for i in range(num_gpus)}

    def by_uuid(uuid: str) -> str:
        for handle, i in handles.items():
            if uuid_of(i) == uuid:
                return handle
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def by_index(index: int) -> str:
        if not 0 <= index < num_gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return f"handle-{index}"

    m.nvmlDeviceGetCount.return_value = num_gpus
    m.nvmlSystemGetDriverVersion.return_value = "550.54.15"
    m.nvmlSystemGetNVMLVersion.return_value = "12.550.54.15"
    m.nvmlDeviceGetHandleByIndex.side_effect = by_index
    m.nvmlDeviceGetHandleByUUID.side_effect = by_uuid
    mig = pynvml.NVML_DEVICE_MIG_ENABLE if mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    m.nvmlDeviceGetMigMode.return_value = [mig, mig]
    models = names or ["NVIDIA A100-SXM4-40GB"] * num_gpus
    m.nvmlDeviceGetName.side_effect = lambda handle: models[handles[handle]]
    m.nvmlDeviceGetIndex.side_effect = lambda handle: handles[handle]
    m.nvmlDeviceGetUUID.side_effect = lambda handle: uuid_of(handles[handle])
    m.nvmlDeviceGetSupportedMemoryClocks.return_value = list(A100_MEMORY_CLOCKS_MHZ)
    m.nvmlDeviceGetSupportedGraphicsClocks.return_value = list(A100_SM_CLOCKS_MHZ)
    m.nvmlDeviceGetPowerManagementLimit.return_value = power_limit_mw
    m.nvmlDeviceGetPowerManagementLimitConstraints.return_value = list(LIMIT_CONSTRAINTS_MW)
    m.nvmlDeviceGetPowerManagementDefaultLimit.return_value = DEFAULT_LIMIT_MW
    m.nvmlDeviceGetTotalEnergyConsumption.return_value = 123_456_789
    # Who reads the energy counter: the device's sampler thread, never the training thread.
    readers: List[str] = []
    m.energy_read_threads = readers

    def read_energy(handle: str) -> Any:
        readers.append(threading.current_thread().name)
        return mock.DEFAULT

    m.nvmlDeviceGetTotalEnergyConsumption.side_effect = read_energy
    # The die temperature, read (like the counter) only by the device's sampler thread.
    temperature_readers: List[str] = []
    m.temperature_read_threads = temperature_readers

    def read_temperature(handle: str, sensor: int) -> int:
        temperature_readers.append(threading.current_thread().name)
        if temperature_c is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return temperature_c

    m.nvmlDeviceGetTemperature.side_effect = read_temperature
    m.nvmlDeviceGetPowerUsage.return_value = 85_000
    m.nvmlDeviceGetFieldValues.side_effect = lambda handle, ids: [field_value(INSTANT_POWER_MW)]
    m.nvmlDeviceGetPersistenceMode.return_value = pynvml.NVML_FEATURE_ENABLED
    locked: Dict[str, int] = {}

    def lock(handle: str, lo: int, hi: int) -> None:
        locked[handle] = hi

    def unlock(handle: str) -> None:
        locked.pop(handle, None)

    m.nvmlDeviceSetGpuLockedClocks.side_effect = lock
    m.nvmlDeviceResetGpuLockedClocks.side_effect = unlock
    m.nvmlDeviceGetClockInfo.side_effect = lambda handle, kind: locked.get(
        handle, A100_SM_CLOCKS_MHZ[0]
    )
    return m


SAMPLER_THREAD_PREFIX = "perseus-energy-"


def energy_reads_off_sampler(m: Any) -> List[str]:
    """Threads other than a device's energy sampler that read the energy counter of ``m``."""
    return [t for t in m.energy_read_threads if not t.startswith(SAMPLER_THREAD_PREFIX)]


def temperature_reads_off_sampler(m: Any) -> List[str]:
    """Threads other than a device's sampler that read the temperature of ``m``."""
    return [t for t in m.temperature_read_threads if not t.startswith(SAMPLER_THREAD_PREFIX)]


# What a device's sampler reads at times of its own.
SAMPLER_READS = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature")


def calls_except_energy_reads(m: Any) -> List[Any]:
    """``m.mock_calls`` without the sampler's reads (energy counter and temperature, at times
    of its own)."""
    return [c for c in m.mock_calls if c[0] not in SAMPLER_READS]


def patched_pynvml(m: Optional[Any] = None) -> Any:
    """Context manager: ``import pynvml`` yields ``m`` (a fresh mock if None) inside it."""
    return mock.patch.dict(sys.modules, {"pynvml": m if m is not None else make_pynvml_mock()})


def opening_calls(index: int = 0, num_gpus: int = 1) -> list:
    """The exact calls ``NVMLGPU(index)`` makes with CUDA_VISIBLE_DEVICES unset, no CUDA.

    With several GPUs and CUDA_DEVICE_ORDER unset, opening checks they are all one model.
    """
    h = f"handle-{index}"
    model_check = []
    if num_gpus > 1:
        for i in range(num_gpus):
            model_check += [
                mock.call.nvmlDeviceGetHandleByIndex(i),
                mock.call.nvmlDeviceGetName(f"handle-{i}"),
            ]
    return [
        mock.call.nvmlInit(),
        mock.call.nvmlDeviceGetCount(),
        *model_check,
        mock.call.nvmlDeviceGetHandleByIndex(index),
        mock.call.nvmlDeviceGetMigMode(h),
        mock.call.nvmlDeviceGetName(h),
        mock.call.nvmlDeviceGetUUID(h),
    ]


def uuid_opening_calls(index: int) -> list:
    """The exact calls ``NVMLGPU.from_uuid(uuid_of(index))`` makes (recovery by UUID)."""
    h = f"handle-{index}"
    return [
        mock.call.nvmlInit(),
        mock.call.nvmlDeviceGetHandleByUUID(uuid_of(index)),
        mock.call.nvmlDeviceGetMigMode(h),
        mock.call.nvmlDeviceGetName(h),
        mock.call.nvmlDeviceGetUUID(h),
        mock.call.nvmlDeviceGetIndex(h),
    ]


def preflight_calls(index: int = 0, top_mhz: int = 1410) -> list:
    """The start-up check of a rank that locks SM clocks (plan, max_speed, online modes)."""
    h = f"handle-{index}"
    return [
        mock.call.nvmlDeviceGetPersistenceMode(h),
        mock.call.nvmlDeviceGetTotalEnergyConsumption(h),
        mock.call.nvmlDeviceGetSupportedMemoryClocks(h),
        mock.call.nvmlDeviceGetSupportedGraphicsClocks(h, A100_MEMORY_CLOCKS_MHZ[0]),
        mock.call.nvmlDeviceSetGpuLockedClocks(h, top_mhz, top_mhz),
        mock.call.nvmlDeviceResetGpuLockedClocks(h),
    ]


def no_permission() -> Exception:
    """The error NVML raises for a non-root clock or power-limit change."""
    return pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)


def iter_calls(m: Any) -> Iterator[str]:
    """Reprs of ``m.mock_calls`` (what a child process writes)."""
    return (repr(c) for c in m.mock_calls)


def write_dead_owner_state(state_dir: Path, restore: Dict[str, Any]) -> Path:
    """The state file a GPUGuard of a long-dead process left for GPU 0 (SIGKILL recovery)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"{uuid_of(0)}.state.json"
    state = {
        "format": "perseus-gpu-state/1",
        "pid": 999_999_999,
        "index": 0,
        "uuid": uuid_of(0),
        "key": uuid_of(0),
        "restore": restore,
    }
    path.write_text(json.dumps(state))
    return path
