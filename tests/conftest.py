"""Shared test set-up: markers that skip cleanly where the hardware or package is missing."""

from __future__ import annotations

import pytest


def _nvidia_gpu_usable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _nvidia_gpu_usable():
        skip = pytest.mark.skip(reason="needs a usable NVIDIA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
