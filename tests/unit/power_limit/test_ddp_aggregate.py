"""Ranks of a data-parallel job agree on one table: energy summed, time of the slowest rank."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.power_limit import PowerLimitOptimizer
from tests.unit.power_limit.fakes import (
    PowerModelGPU,
    RecordingGuard,
    VirtualClock,
    free_port,
    sampled,
)

DEMAND_W = {0: 320.0, 1: 200.0}


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        clock = VirtualClock()
        gpu = PowerModelGPU(clock, demand_w=DEMAND_W[rank])
        cfg = PowerLimitConfig(warmup_s=0.0, step_w=50, warmup_steps=1, profile_steps=2)
        opt = PowerLimitOptimizer([RecordingGuard(gpu)], cfg, eta=0.5, energy=sampled([gpu], clock))
        clock.sleep(0.02)  # the samplers run while the job sets up
        for _ in range(4):
            for _ in opt.steps(range(14)):  # windows cut at epoch ends on every rank alike
                gpu.run_step()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(opt.report()))
    finally:
        dist.destroy_process_group()


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
    assert reports[0]["state"] == "done" and reports[0]["num_retries"] == 3
    assert reports[0]["saving"] == reports[1]["saving"]
    ranks = [PowerModelGPU(VirtualClock(), demand_w=DEMAND_W[r]) for r in (0, 1)]
    for row in reports[0]["measurements"]:
        limit_mw = round(row["power_limit_w"] * 1000)
        costs = [gpu.step_cost(limit_mw) for gpu in ranks]
        assert row["time_per_step_s"] == pytest.approx(max(t for t, _ in costs))
        assert row["energy_per_step_j"] == pytest.approx(sum(e for _, e in costs), rel=5e-3)
