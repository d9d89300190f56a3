"""Ranks of a data-parallel job agree on one table: energy summed, time of the slowest rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

from perseus.config.schema import PowerLimitConfig
from perseus.power_limit import PowerLimitOptimizer
from tests.unit.power_limit.fakes import (
    PowerModelGPU,
    RecordingGuard,
    VirtualClock,
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
        epochs = 0
        while opt.state != "done" and epochs < 50:  # the same on every rank
            for _ in opt.steps(range(14)):  # windows cut at epoch ends on every rank alike
                gpu.run_step()
            epochs += 1
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({**opt.report(), "epochs": epochs}))
    finally:
        dist.destroy_process_group()
