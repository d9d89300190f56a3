"""On a real GPU every hook synchronizes the rank's CUDA device before clock changes and stamps.

NVML is an autospec'd pynvml; CUDA cannot run here, so ``torch.cuda.synchronize`` is an
autospec'd stand-in (and ``torch.cuda.is_initialized`` says CUDA is in use). Each sync records
how many NVML calls preceded it, which gives the exact interleaving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List
from unittest import mock

import pytest
import torch

from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.sync import CudaSynchronizer
from perseus.records import RankInfo
from perseus.runtime.sources import PlanSource
from tests.unit.gpu.nvml_mock import make_pynvml_mock, opening_calls, patched_pynvml
from tests.unit.runtime.fakes import make_plan, one_f_one_b, owning_optimizer

H = "handle-0"
SYNC = "cuda.synchronize(0)"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _interleaved(nvml: Any, sync_positions: List[int]) -> List[Any]:
    calls: List[Any] = list(nvml.mock_calls)
    for pos in reversed(sync_positions):
        calls.insert(pos, SYNC)
    return calls


@pytest.mark.parametrize("synchronous", [True, False], ids=["sync-clocks", "clock-thread"])
def test_sync_precedes_every_clock_change_and_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synchronous: bool
) -> None:
    nvml = make_pynvml_mock()
    positions: List[int] = []
    cuda_sync = mock.create_autospec(torch.cuda.synchronize)
    cuda_sync.side_effect = lambda device=None: positions.append(len(nvml.mock_calls))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", cuda_sync)
    plan = make_plan(1, 2, clocks_mhz=(1410, 1200, 1005))  # F0 B0 F1 B1: 1410 1200 1005 1410
    with patched_pynvml(nvml):
        gpu = NVMLGPU(0)
        guard = GPUGuard(gpu, state_dir=tmp_path, watchdog=False).acquire()
        opt = owning_optimizer(
            RankInfo(),
            gpu,
            PlanSource(plan, 0),
            guard,
            synchronous_clocks=synchronous,
            trace_dir=tmp_path,  # the applied clock is read back at each instruction's end
        )
        opt.on_step_begin()
        for name, _ in one_f_one_b(1, 0, 2):
            opt.on_instruction_begin(name)
            opt.flush_clocks()  # the clock thread applies the request (no-op when synchronous)
            opt.on_instruction_end(name)
        opt.on_step_end()
        opt.close()
    assert cuda_sync.call_args_list == [mock.call(0)] * 10  # step 2 + 4 instructions x 2
    lock, clock_info = mock.call.nvmlDeviceSetGpuLockedClocks, mock.call.nvmlDeviceGetClockInfo
    sm = nvml.NVML_CLOCK_SM
    assert _interleaved(nvml, positions) == [
        *opening_calls(0),
        SYNC,  # step begin: stamps after the device drained (no energy read: the sampler's)
        SYNC,  # forward 0 begins: sync, then its clock
        lock(H, 1410, 1410),
        SYNC,  # forward 0 ends: sync, then the stamp and the clock read back
        clock_info(H, sm),
        SYNC,
        lock(H, 1200, 1200),
        SYNC,
        clock_info(H, sm),
        SYNC,
        lock(H, 1005, 1005),
        SYNC,
        clock_info(H, sm),
        SYNC,
        lock(H, 1410, 1410),
        SYNC,
        clock_info(H, sm),
        SYNC,  # step end
        mock.call.nvmlDeviceResetGpuLockedClocks(H),
        mock.call.nvmlShutdown(),
    ]
    rows = (tmp_path / "trace-rank0.csv").read_text().splitlines()[1:]
    assert [int(r.rsplit(",", 1)[1]) for r in rows] == [1410, 1200, 1005, 1410]


def test_no_sync_without_cuda_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_sync = mock.create_autospec(torch.cuda.synchronize)
    monkeypatch.setattr(torch.cuda, "synchronize", cuda_sync)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a CPU run
    CudaSynchronizer(0)()
    assert cuda_sync.call_count == 0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    CudaSynchronizer(3)()
    assert cuda_sync.call_args_list == [mock.call(3)]
