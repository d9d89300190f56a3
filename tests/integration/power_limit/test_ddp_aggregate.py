"""Two real gloo ranks aggregate their power-limit windows."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.unit.power_limit.fakes import (
    PowerModelGPU,
    VirtualClock,
    free_port,
)
from tests.unit.power_limit.test_ddp_aggregate import DEMAND_W, _rank_main

pytestmark = pytest.mark.integration


@pytest.mark.integration
def test_two_gloo_ranks_aggregate(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0]["measurements"] == reports[1]["measurements"]
    assert reports[0]["chosen_power_limit_w"] == reports[1]["chosen_power_limit_w"]
    assert reports[0]["num_gpus"] == 2 and reports[0]["max_power_w"] == 600.0
    assert reports[0]["state"] == reports[1]["state"] == "done"
    assert reports[0]["epochs"] == reports[1]["epochs"]
    assert reports[0]["num_retries"] == reports[1]["num_retries"] >= 1
    assert reports[0]["search"] == reports[1]["search"]
    assert reports[0]["saving"] == reports[1]["saving"]
    ranks = [PowerModelGPU(VirtualClock(), demand_w=DEMAND_W[r]) for r in (0, 1)]
    for row in reports[0]["measurements"]:
        limit_mw = round(row["power_limit_w"] * 1000)
        costs = [gpu.step_cost(limit_mw) for gpu in ranks]
        assert row["time_per_step_s"] == pytest.approx(max(t for t, _ in costs))
        assert row["energy_per_step_j"] == pytest.approx(sum(e for _, e in costs), rel=5e-3)
