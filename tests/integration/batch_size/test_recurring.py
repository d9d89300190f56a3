"""A recurring job's data-parallel ranks in real processes follow rank 0's choice."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.unit.batch_size.test_recurring import _rank_main
from tests.unit.power_limit.fakes import free_port

pytestmark = pytest.mark.integration


@pytest.mark.integration
def test_data_parallel_ranks_follow_rank_zero(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    args = (port, str(tmp_path / "bso.db"), str(tmp_path))
    procs = [ctx.Process(target=_rank_main, args=(r, *args)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["seen"] == ranks[1]["seen"] == [[64, 32], [32, 16], [128, 64]]
    assert ranks[0]["last"] == ranks[1]["last"]  # every rank gets the run's record
    last = ranks[0]["last"]
    assert last["status"] == "reached" and last["power_limit"]["num_gpus"] == 2
