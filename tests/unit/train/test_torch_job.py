"""framework=torch: each DDP rank on its local GPU, its model there, Perseus on the same GPU.

CUDA cannot run here: its device queries are stand-ins (``torch.cuda.set_device`` autospec'd).
The CPU path runs for real: one gloo rank trains a step, with the hooks seeing its local rank.
"""

from __future__ import annotations

import socket
from typing import Any, List
from unittest import mock

import pytest
import torch

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.train.jobs import torch as torch_job


@pytest.fixture
def cuda_with(monkeypatch):
    def install(count: int) -> Any:
        set_device = mock.create_autospec(torch.cuda.set_device)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", set_device)
        return set_device

    return install


def test_each_rank_uses_its_local_gpu(cuda_with):
    set_device = cuda_with(4)
    device = torch_job.rank_device(3)
    assert device == torch.device("cuda", 3)
    assert set_device.call_args_list == [mock.call(3)]  # before NCCL starts
    assert torch_job.ddp_options(device) == {"device_ids": [3], "output_device": 3}


def test_a_rank_beyond_the_visible_gpus_is_refused(cuda_with):
    cuda_with(2)
    with pytest.raises(ConfigError, match="local rank 2 has no GPU: .* 2 CUDA device"):
        torch_job.rank_device(2)


def test_cpu_ranks_stay_on_the_cpu():
    device = torch_job.rank_device(1)
    assert device == torch.device("cpu")
    assert torch_job.ddp_options(device) == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_hooks_drive_the_ranks_local_gpu(monkeypatch, tmp_path):
    seen: List[RankInfo] = []
    real = context.optimizer_for

    def spy(rank: RankInfo, key: object = None) -> Any:
        seen.append(rank)
        return real(rank, key)

    monkeypatch.setattr(context, "optimizer_for", spy)
    monkeypatch.delenv(context.CONFIG_ENV, raising=False)
    for key, value in {
        "LOCAL_RANK": "2",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }.items():
        monkeypatch.setenv(key, value)
    cfg = PerseusConfig()
    cfg.framework.name = "torch"
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 1, 2
    cfg.gpu.backend = "emulated"
    cfg.gpu.emulated.sleep = False
    cfg.runtime.mode = "measure"
    cfg.train.max_steps = 1
    context.reset()
    context.configure(cfg)
    try:
        assert torch_job.run(cfg) == 1
    finally:
        context.reset()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert [r.local_gpu_index for r in seen] == [2]
