"""An autospec'd stand-in for pynvml, for NVML call-sequence tests (no GPU here).

``make_pynvml_mock()`` returns ``unittest.mock.create_autospec(pynvml)`` — every NVML function
checks its signature — with pynvml's real constants and exception classes put back (so
``except pynvml.NVMLError`` and ``NVML_DEVICE_MIG_ENABLE`` behave), and plausible A100 answers.
Handles are the strings ``"handle-<index>"``, so ``mock_calls`` compare exactly, even as reprs
written by a child process. Install it with ``patched_pynvml(m)`` (Perseus imports pynvml
lazily, so replacing the module in ``sys.modules`` is the seam).

Also used by other test packages (runtime NVML-sequence tests): keep the defaults stable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Optional
from unittest import mock

import pynvml

A100_SM_CLOCKS_MHZ = list(range(1410, 210 - 1, -15))
A100_MEMORY_CLOCKS_MHZ = [1215]
DEFAULT_LIMIT_MW = 400_000
LIMIT_CONSTRAINTS_MW = [100_000, 400_000]


def uuid_of(index: int) -> str:
    """The fake UUID of physical GPU ``index``."""
    return f"GPU-00000000-0000-0000-0000-00000000000{index}"


def make_pynvml_mock(
    num_gpus: int = 1, mig_enabled: bool = False, power_limit_mw: int = DEFAULT_LIMIT_MW
) -> Any:
    """An autospec'd pynvml with real constants/exceptions and fixed answers."""
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
    m.nvmlDeviceGetHandleByIndex.side_effect = by_index
    m.nvmlDeviceGetHandleByUUID.side_effect = by_uuid
    mig = pynvml.NVML_DEVICE_MIG_ENABLE if mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    m.nvmlDeviceGetMigMode.return_value = [mig, mig]
    m.nvmlDeviceGetName.return_value = "NVIDIA A100-SXM4-40GB"
    m.nvmlDeviceGetUUID.side_effect = lambda handle: uuid_of(handles[handle])
    m.nvmlDeviceGetSupportedMemoryClocks.return_value = list(A100_MEMORY_CLOCKS_MHZ)
    m.nvmlDeviceGetSupportedGraphicsClocks.return_value = list(A100_SM_CLOCKS_MHZ)
    m.nvmlDeviceGetPowerManagementLimit.return_value = power_limit_mw
    m.nvmlDeviceGetPowerManagementLimitConstraints.return_value = list(LIMIT_CONSTRAINTS_MW)
    m.nvmlDeviceGetPowerManagementDefaultLimit.return_value = DEFAULT_LIMIT_MW
    m.nvmlDeviceGetTotalEnergyConsumption.return_value = 123_456_789
    m.nvmlDeviceGetPowerUsage.return_value = 85_000
    return m


def patched_pynvml(m: Optional[Any] = None) -> Any:
    """Context manager: ``import pynvml`` yields ``m`` (a fresh mock if None) inside it."""
    return mock.patch.dict(sys.modules, {"pynvml": m if m is not None else make_pynvml_mock()})


def opening_calls(index: int = 0) -> list:
    """The exact calls ``NVMLGPU(index)`` makes with CUDA_VISIBLE_DEVICES unset."""
    h = f"handle-{index}"
    return [
        mock.call.nvmlInit(),
        mock.call.nvmlDeviceGetCount(),
        mock.call.nvmlDeviceGetHandleByIndex(index),
        mock.call.nvmlDeviceGetMigMode(h),
        mock.call.nvmlDeviceGetName(h),
        mock.call.nvmlDeviceGetUUID(h),
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
