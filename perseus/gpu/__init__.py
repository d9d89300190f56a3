"""GPU layer: the abstract :class:`GPU` and its backends (NVML, emulated)."""

from perseus.gpu.base import GPU

__all__ = ["GPU"]
