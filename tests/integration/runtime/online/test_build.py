"""runtime.mode=online through PerseusOptimizer.from_config, against a real server process."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.config.schema import PerseusConfig, ServerConfig
from perseus.records import RankInfo
from perseus.runtime.online.client import ServerClient
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.schedule import stage_order
from perseus.server.process import start_local_server
from tests.unit.server.stage_ranks import wait_prefetched

pytestmark = pytest.mark.integration


def test_from_config_online_mode_talks_to_the_server(tmp_path: Path) -> None:
    handle = start_local_server(ServerConfig(), tmp_path / "dump")
    try:
        cfg = PerseusConfig()
        cfg.runtime.mode = "online"
        cfg.gpu.backend = "emulated"
        cfg.gpu.emulated.time_scale = 0.01
        cfg.gpu.state_dir = str(tmp_path / "state")
        cfg.parallelism.pp, cfg.parallelism.num_microbatches = 2, 2
        cfg.server.url, cfg.server.job_id = handle.url, "built"
        rank = RankInfo(stage=1, num_stages=2, rank=1, world_size=2)
        opt = PerseusOptimizer.from_config(cfg, rank)
        for step in range(3):
            opt.on_step_begin()
            for name, _mb in stage_order("1f1b", 2, 2)[1]:
                opt.on_instruction_begin(name)
                opt.on_instruction_end(name)
            wait_prefetched(opt.source, step + 1)  # the test's pace: nothing waits in training
            opt.on_step_end()
        top = max(opt.gpu.supported_sm_clocks_mhz())
        assert [i.frequency_mhz for i in opt.last_step.instructions] == [top] * 4
        assert opt.device.sampler is not None and opt.device.sampler.running  # its own thread
        opt.close()
        opt.source.close()
        status = ServerClient(handle.url).get("/jobs/built")
        assert status["phase"] == "baseline"
        assert status["ranks"] == {"1": "finished"}
    finally:
        handle.stop()
