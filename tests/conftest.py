"""Shared test set-up: the parallel runner's workers and groups, and markers that skip cleanly
where the hardware or package is missing.

The suite runs on pytest-xdist (``-n auto --dist loadgroup`` in ``pyproject.toml``). Most of its
time is spent waiting: emulated GPUs sleep through their instructions, ranks wait on each other,
servers wait for requests. So it runs more workers than the machine has cores
(:func:`pytest_xdist_auto_num_workers`). Tests that share one resource run on one worker, one
after the other (an ``xdist_group``): the local Slurm cluster's two nodes. Everything else a test
binds or writes is its own: free ports chosen by the kernel, ``tmp_path`` directories, GPU state
directories under them, job ids made per run. ``-n 0`` runs the suite in one process.
"""

from __future__ import annotations

import os

import pytest

# Workers per CPU core: the tests mostly wait (sleeping emulated GPUs, ranks, servers).
WORKERS_PER_CORE = 2
MAX_WORKERS = 8
# Marker -> the xdist group of the tests that share what it names.
SHARED = {"slurm": "local-slurm-cluster"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core (at least 2, at most 8); PERSEUS_TEST_WORKERS wins."""
    wanted = os.environ.get("PERSEUS_TEST_WORKERS")
    if wanted:
        return max(1, int(wanted))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, min(MAX_WORKERS, WORKERS_PER_CORE * (cores or 1)))


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
    for item in items:
        for marker, group in SHARED.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.xdist_group(group))
    if any(item.get_closest_marker("gpu") for item in items) and not _nvidia_gpu_usable():
        skip = pytest.mark.skip(reason="needs a usable NVIDIA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
