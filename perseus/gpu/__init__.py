"""GPU layer: the abstract :class:`GPU`, the :class:`GPUs` a process drives, and the backends."""

from perseus.gpu.base import GPU
from perseus.gpu.collection import GPUs

__all__ = ["GPU", "GPUs"]
