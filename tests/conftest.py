"""Shared test set-up: the parallel runner's workers and groups, and markers that skip cleanly
where the hardware or package is missing.

The suite runs on pytest-xdist (``-n auto --dist loadgroup`` in ``pyproject.toml``). Most of its
time is spent waiting: emulated GPUs sleep through their instructions, ranks wait on each other,
servers wait for requests. So it runs more workers than the machine has cores
(:func:`pytest_xdist_auto_num_workers`); except the unit tier run alone, which waits on nothing
(fake clocks, no processes) and computes: one worker per core there, since every worker also
imports and collects the whole tier again. Tests that share one resource run on one worker, one
after the other (an ``xdist_group``): the local Slurm cluster's two nodes; and the tests of a
module marked ``one_worker``, which share what a fixture of that module builds once per module
(a main job that a real Prometheus scrapes, a wheel, a Python 3.9 environment, ranks launched
once): spread over the workers, each worker would build it again. Everything else a test
binds or writes is its own: free ports chosen by the kernel, ``tmp_path`` directories, GPU state
directories under them, job ids made per run. ``-n 0`` runs the suite in one process.

More workers than cores, each with OpenMP's or a BLAS's own pool of a thread per core, spinning
while it waits for work, made CPU-bound tests hundreds of times slower (a tiny model's training
step: 0.2 s alone, 112 s beside seven other workers). Each test process and what it starts uses one
such thread unless the caller set the variable: the workers run side by side instead.
"""

from __future__ import annotations

import os
from pathlib import Path

for _pool in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

import pytest  # noqa: E402

# Workers per CPU core: the tests mostly wait (sleeping emulated GPUs, ranks, servers).
WORKERS_PER_CORE = 2
# ... and when only the unit tier runs: it computes (planner solves, virtual clocks).
UNIT_WORKERS_PER_CORE = 1
MAX_WORKERS = 8
UNIT_TIER = Path(__file__).resolve().parent / "unit"
# Marker -> the xdist group of the tests that share what it names.
SHARED = {"slurm": "local-slurm-cluster"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core, one when only unit tests run (at least 2, at most 8);
    PERSEUS_TEST_WORKERS wins."""
    wanted = os.environ.get("PERSEUS_TEST_WORKERS")
    if wanted:
        return max(1, int(wanted))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_core = UNIT_WORKERS_PER_CORE if unit_tier_only(config) else WORKERS_PER_CORE
    return max(2, min(MAX_WORKERS, per_core * (cores or 1)))


def unit_tier_only(config: pytest.Config) -> bool:
    """Whether every path the command names lies in ``tests/unit`` (none named: the whole suite)."""
    base = config.invocation_params.dir
    paths = [(base / arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(p == UNIT_TIER or UNIT_TIER in p.parents for p in paths)


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, group in SHARED.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("one_worker") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if any(item.get_closest_marker("gpu") for item in items) and not _nvidia_gpu_usable():
        skip = pytest.mark.skip(reason="needs a usable NVIDIA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
