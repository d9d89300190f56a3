"""Concurrent runs of the batch-size optimizer in separate processes share one state file."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from perseus.batch_size import BatchSizeOptimizer
from tests.unit.batch_size.test_optimizer import SIZES, _start_run

pytestmark = pytest.mark.integration


def test_concurrent_runs_continue_one_walk(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    BatchSizeOptimizer(Path(path), "job", SIZES, 64).close()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.map(_start_run, [(path, "job")] * 4)
    # four simultaneous starts take four different steps of the walk, none twice
    assert sorted(got) == [32, 64, 128, 256]
