"""Perseus: remove energy bloat from large-model training.

``from perseus import PerseusOptimizer`` gives the hook runtime every adapter calls. Heavy
modules load on first use, so importing :mod:`perseus` is cheap inside a training process.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["PerseusOptimizer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "PerseusOptimizer":
        from perseus.runtime.optimizer import PerseusOptimizer

        return PerseusOptimizer
    raise AttributeError(f"module 'perseus' has no attribute {name!r}")
