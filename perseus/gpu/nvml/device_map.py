"""Which NVML device is this process's CUDA device ``i``.

NVML numbers GPUs in PCI bus order; CUDA numbers them fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and then renumbers what ``CUDA_VISIBLE_DEVICES`` leaves. On a
node with mixed GPU models the same number names different GPUs. So a rank's device is found
by identity, first match wins:

1. **UUID from CUDA** — where this process uses CUDA through torch:
   ``torch.cuda.get_device_properties(i).uuid`` names the device whatever the environment
   says; NVML opens it with ``nvmlDeviceGetHandleByUUID``.
2. **PCI bus id from CUDA** — torch builds without ``uuid`` but with ``pci_bus_id``.
3. **The environment** — no CUDA here (the doctor, a monitoring script, a CPU-only torch):
   a ``GPU-`` UUID in ``CUDA_VISIBLE_DEVICES`` opens by UUID; an index is an NVML index when
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when every GPU of the node is the same model (CUDA then
   breaks the "fastest" tie by PCI bus id). Mixed models without ``PCI_BUS_ID`` are refused
   with the fix, never guessed.

MIG instances are refused (clocks and power limits belong to the whole GPU). Torch is never
imported here: a process that did not import it has no CUDA numbering to follow.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from perseus.errors import GPUNotFoundError, GPUNotSupportedError
from perseus.gpu.nvml.support import as_text, call, mig_message, translate, visible_devices


@dataclass(frozen=True)
class CudaDevice:
    """What CUDA says about one of its devices.

    Attributes:
        index: The CUDA device index.
        uuid: NVML-style UUID (``GPU-...``), None when torch does not expose it.
        pci_bus_id: NVML-style PCI bus id (``00000000:65:00.0``), None when unknown.
        name: The device name.
    """

    index: int
    uuid: Optional[str]
    pci_bus_id: Optional[str]
    name: Optional[str]


def normalize_uuid(raw: Any) -> str:
    """CUDA prints UUIDs bare (``0b42632a-...``); NVML prefixes them (``GPU-0b42632a-...``)."""
    text = str(raw).strip()
    if text.startswith("UUID('") and text.endswith("')"):
        text = text[6:-2]
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def cuda_device(index: int) -> Optional[CudaDevice]:
    """CUDA's identity of device ``index``; None where this process does not use CUDA.

    Raises:
        GPUNotFoundError: CUDA is usable but has no device ``index``.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        if not cuda.is_available():
            return None
        count = int(cuda.device_count())
    except Exception:  # a broken CUDA install: fall back to the environment
        return None
    if not 0 <= index < count:
        raise GPUNotFoundError(
            f"CUDA device {index} does not exist: this process sees {count} CUDA device(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
            "use a local rank below that"
        )
    props = cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    bus = getattr(props, "pci_bus_id", None)
    pci = None
    if bus is not None:
        domain = int(getattr(props, "pci_domain_id", 0) or 0)
        device = int(getattr(props, "pci_device_id", 0) or 0)
        pci = f"{domain:08x}:{int(bus):02x}:{device:02x}.0"
    return CudaDevice(
        index=index,
        uuid=normalize_uuid(uuid) if uuid is not None else None,
        pci_bus_id=pci,
        name=getattr(props, "name", None),
    )


def resolve_handle(nvml: Any, index: int, where: str) -> Tuple[Any, str]:
    """The NVML handle of this process's CUDA device ``index``, and how it was found.

    Raises:
        GPUNotFoundError: no such device, or the mapping is ambiguous (the message says why).
        GPUNotSupportedError: the device is a MIG instance.
    """
    visible = visible_devices()
    entry: Optional[str] = None
    if visible is not None:
        if not 0 <= index < len(visible):
            raise GPUNotFoundError(
                f"GPU {index} is not visible: CUDA_VISIBLE_DEVICES lists {len(visible)} "
                f"device(s) ({','.join(visible) or 'none'}); use an index below that or "
                "change CUDA_VISIBLE_DEVICES"
            )
        entry = visible[index]
        if entry.startswith("MIG-"):
            raise GPUNotSupportedError(mig_message(f"GPU {index} is MIG instance {entry}"))
    cuda = cuda_device(index)
    if cuda is not None and cuda.uuid is not None:
        if cuda.uuid.startswith("MIG-"):
            raise GPUNotSupportedError(mig_message(f"CUDA device {index} is a MIG instance"))
        return handle_by_uuid(nvml, cuda.uuid, where), f"CUDA device {index} by UUID"
    if cuda is not None and cuda.pci_bus_id is not None:
        handle = call(nvml, where, "nvmlDeviceGetHandleByPciBusId", cuda.pci_bus_id)
        return handle, f"CUDA device {index} by PCI bus id {cuda.pci_bus_id}"
    if entry is not None and entry.startswith("GPU-"):
        return handle_by_uuid(nvml, entry, where), f"CUDA_VISIBLE_DEVICES entry {entry}"
    physical = int(entry) if entry is not None else index
    count = int(call(nvml, where, "nvmlDeviceGetCount"))
    if not 0 <= physical < count:
        raise GPUNotFoundError(
            f"GPU {physical} does not exist: NVML sees {count} GPU(s); check the GPU index "
            "(gpu local index / CUDA_VISIBLE_DEVICES)"
        )
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if order == "PCI_BUS_ID":
        how = f"index {physical} (CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    else:
        _check_one_model(nvml, count, where, physical)
        how = f"index {physical} (all {count} GPU(s) are one model)"
    return call(nvml, where, "nvmlDeviceGetHandleByIndex", physical), how


def handle_by_uuid(nvml: Any, uuid: str, where: str) -> Any:
    """Handle of the GPU with this UUID, or (as CUDA allows) this unique UUID prefix."""
    try:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) not in (
            nvml.NVML_ERROR_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        ):
            raise translate(nvml, exc, f"nvmlDeviceGetHandleByUUID({uuid!r}) failed") from exc
    matches = []
    for i in range(call(nvml, where, "nvmlDeviceGetCount")):
        handle = call(nvml, where, "nvmlDeviceGetHandleByIndex", i)
        if as_text(call(nvml, where, "nvmlDeviceGetUUID", handle)).startswith(uuid):
            matches.append(handle)
    if len(matches) != 1:
        raise GPUNotFoundError(
            f"GPU UUID {uuid} matches {len(matches)} GPUs on this node; give a full "
            "GPU UUID (`nvidia-smi -L`) or an index"
        )
    return matches[0]


def _check_one_model(nvml: Any, count: int, where: str, physical: int) -> None:
    """Refuse to guess CUDA's order on a node with several GPU models."""
    if count < 2:
        return
    names = []
    for i in range(count):
        handle = call(nvml, where, "nvmlDeviceGetHandleByIndex", i)
        names.append(as_text(call(nvml, where, "nvmlDeviceGetName", handle)))
    if len(set(names)) > 1:
        raise GPUNotFoundError(
            f"cannot tell which GPU is CUDA device {physical}: this node mixes GPU models "
            f"({', '.join(sorted(set(names)))}) and CUDA numbers them fastest first, NVML by "
            "PCI bus. Set CUDA_DEVICE_ORDER=PCI_BUS_ID for the job (so both agree), list GPU "
            "UUIDs in CUDA_VISIBLE_DEVICES, or run where torch uses CUDA (Perseus then maps "
            "by UUID)"
        )
