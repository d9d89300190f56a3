"""Synchronizing a rank's CUDA device before a clock change or a time / energy stamp.

CUDA is asynchronous: ``forward`` returns when its kernels are queued. Perseus stamps an
instruction's start and end and changes the SM clock between instructions; done at queue time,
the stamps measure launch time and the clock lands on whatever kernels are running then. So
every such boundary first waits for the device: ``torch.cuda.synchronize(device)``.

It is a no-op — and costs one dictionary lookup and one call — where nothing can be queued:
torch was never imported, or this process never initialized CUDA (a CPU run, the emulated
GPU). Perseus never imports torch or initializes CUDA for this.
"""

from __future__ import annotations

import sys


class CudaSynchronizer:
    """Waits for the work queued on one CUDA device.

    Args:
        device_index: The CUDA device (as this process numbers them).
    """

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index

    def in_use(self) -> bool:
        """Whether this process initialized CUDA (only then can work be queued)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        cuda = getattr(torch, "cuda", None)
        return cuda is not None and bool(cuda.is_initialized())

    def __call__(self) -> None:
        """Block until the device finished everything queued so far (no-op without CUDA)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        cuda = torch.cuda
        if cuda.is_initialized():
            cuda.synchronize(self.device_index)

    def __repr__(self) -> str:
        return f"CudaSynchronizer(device_index={self.device_index})"
