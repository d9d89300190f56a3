"""NVML plumbing: lazy import of pynvml, error translation, ``CUDA_VISIBLE_DEVICES``.

pynvml (from the ``nvidia-ml-py`` distribution) is imported only when a function here runs, so
importing Perseus never needs it. Every NVML error becomes a :class:`perseus.errors.GPUError`
subclass whose message names the call, the GPU and what to do.
"""

from __future__ import annotations

import glob
import os
from typing import Any, List, Optional, Union

from perseus.errors import (
    GPUError,
    GPUNotFoundError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
)

PERMISSION_HINT = (
    "setting GPU clocks and power limits needs root or CAP_SYS_ADMIN: run as root, grant the "
    "capability (a container: `docker run --cap-add SYS_ADMIN ...`; a host: `sudo setcap "
    "cap_sys_admin+ep $(readlink -f $(which python))`), or use gpu.dry_run=true to log the "
    "changes without making them (gpu=emulated runs without a GPU)"
)

_NOT_FOUND = (
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_GPU_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
)
_NOT_SUPPORTED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
# NVML start-up failures on a machine that has NVIDIA GPUs, and what fixes them.
INIT_FIXES = {
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "the NVIDIA kernel module and the user-space driver library differ (typically a "
        "driver upgrade without a reboot): reboot the node, or reload the kernel modules "
        "(`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`); "
        "in a container, use the host's driver version"
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "the NVIDIA kernel module is not loaded: `sudo modprobe nvidia` (check `dmesg`)"
    ),
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "libnvidia-ml.so is not found although NVIDIA devices exist: install the driver's "
        "user-space libraries, or run the container with the NVIDIA container toolkit "
        "(`--gpus all`)"
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "this user may not open /dev/nvidia*: add it to the group owning those devices"
    ),
}

_VALUE = ("NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_FREQ_NOT_SUPPORTED")


# Where NVIDIA GPUs show up without asking NVML (module attributes so tests can point them
# at a folder of their own).
DEV_DIR = "/dev"
PROC_DRIVER_DIR = "/proc/driver/nvidia"


def nvidia_present() -> bool:
    """Whether this machine has NVIDIA GPUs or an NVIDIA driver, asking neither NVML nor CUDA.

    True when a GPU device file (``/dev/nvidia0`` ...) or the kernel driver's
    ``/proc/driver/nvidia`` exists: then a failing NVML is an error to report, not a reason to
    fall back to the emulated GPU.
    """
    return bool(glob.glob(os.path.join(DEV_DIR, "nvidia[0-9]*"))) or os.path.isdir(PROC_DRIVER_DIR)


def init_failure_fix(nvml: Any, exc: BaseException) -> str:
    """What to do about ``nvmlInit`` failing with ``exc`` on a machine that has NVIDIA GPUs."""
    value = getattr(exc, "value", None)
    for name, fix in INIT_FIXES.items():
        if getattr(nvml, name, object()) == value:
            return fix
    return "check the NVIDIA driver with `nvidia-smi`"


def mig_message(what: str) -> str:
    """The refusal of a MIG device, with the fixes."""
    return (
        f"{what}: Perseus needs a whole GPU because clocks and power limits are shared by "
        "all MIG instances; disable MIG (`sudo nvidia-smi -i <gpu> -mig 0`), pick a GPU "
        "without MIG, or use gpu=emulated"
    )


def load_pynvml() -> Any:
    """Import pynvml.

    Raises:
        GPUNotFoundError: when nvidia-ml-py is not installed.
    """
    try:
        import pynvml
    except ImportError as exc:
        raise GPUNotFoundError(
            "cannot import pynvml: install nvidia-ml-py (`pip install nvidia-ml-py`) or use "
            "gpu=emulated on a machine without an NVIDIA GPU"
        ) from exc
    return pynvml


def translate(nvml: Any, exc: BaseException, what: str) -> GPUError:
    """Turn an ``NVMLError`` raised by ``what`` (a description of the call) into a GPUError."""
    value = getattr(exc, "value", None)

    def is_one_of(names: tuple) -> bool:
        return any(getattr(nvml, n, object()) == value for n in names)

    if value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", object()):
        return GPUPermissionError(f"{what}: {exc}; {PERMISSION_HINT}")
    if is_one_of(_NOT_FOUND):
        return GPUNotFoundError(
            f"{what}: {exc}; check the NVIDIA driver (`nvidia-smi`) and CUDA_VISIBLE_DEVICES, "
            "or use gpu=emulated"
        )
    if is_one_of(_NOT_SUPPORTED):
        return GPUNotSupportedError(
            f"{what}: {exc}; this GPU or driver does not support it (locked clocks need Volta "
            "or newer and a recent driver; the energy counter needs Volta or newer)"
        )
    if is_one_of(_VALUE):
        return GPUValueError(
            f"{what}: {exc}; pick a value the device supports (see nvidia-smi -q -d "
            "SUPPORTED_CLOCKS / POWER)"
        )
    return GPUError(f"{what}: {exc}")


def call(nvml: Any, what: str, name: str, *args: Any, handle: Any = None) -> Any:
    """Call ``nvml.<name>([handle,] *args)``, translating NVML errors.

    ``what`` names the GPU for messages; the message shows the call with its arguments (the
    device handle left out).
    """
    fn = getattr(nvml, name)
    try:
        return fn(*args) if handle is None else fn(handle, *args)
    except nvml.NVMLError as exc:
        shown = ", ".join(repr(a) for a in args)
        raise translate(nvml, exc, f"{name}({shown}) on {what} failed") from exc


def as_text(value: Union[str, bytes]) -> str:
    """NVML strings arrive as ``bytes`` in old bindings and ``str`` in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_devices(env: Optional[str] = None) -> Optional[List[str]]:
    """Parse ``CUDA_VISIBLE_DEVICES``: ``None`` when unset (all devices visible).

    Follows CUDA: entries are indices or ``GPU-``/``MIG-`` UUIDs, separated by commas; the
    list stops at the first entry that is neither.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    if raw is None:
        return None
    out: List[str] = []
    for item in raw.split(","):
        entry = item.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        out.append(entry)
    return out
