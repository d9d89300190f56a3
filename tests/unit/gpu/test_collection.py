"""GPUs: the GPUs a process drives, against an autospec'd pynvml and the emulated device."""

from __future__ import annotations

from unittest.mock import call

import pynvml
import pytest

from perseus.config import EmulatedGPUConfig, GPUConfig
from perseus.errors import GPUNotSupportedError
from perseus.gpu.collection import GPUs
from perseus.gpu.emulated import EmulatedGPU
from perseus.gpu.monitor import EnergyMonitor
from perseus.gpu.nvml import NVMLGPU

from .nvml_mock import (
    INSTANT_POWER_MW,
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
    uuid_of,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no real state files are scanned


def test_opens_every_visible_nvml_gpu_and_sums_them():
    m = make_pynvml_mock(num_gpus=2)
    with patched_pynvml(m):
        gpus = GPUs.open(GPUConfig(backend="nvml"))
        assert [g.uuid for g in gpus] == [uuid_of(0), uuid_of(1)]
        assert all(isinstance(g, NVMLGPU) for g in gpus)
        assert gpus.total_energy_mj() == 2 * 123_456_789
        assert gpus.power_mw() == 2 * INSTANT_POWER_MW
        gpus.close()
    assert m.mock_calls == [
        call.nvmlInit(),
        call.nvmlDeviceGetCount(),
        call.nvmlShutdown(),
        *opening_calls(0, num_gpus=2),
        *opening_calls(1, num_gpus=2),
        call.nvmlDeviceGetTotalEnergyConsumption("handle-0"),
        call.nvmlDeviceGetTotalEnergyConsumption("handle-1"),
        call.nvmlDeviceGetFieldValues("handle-0", [pynvml.NVML_FI_DEV_POWER_INSTANT]),
        call.nvmlDeviceGetFieldValues("handle-1", [pynvml.NVML_FI_DEV_POWER_INSTANT]),
        call.nvmlShutdown(),
        call.nvmlShutdown(),
    ]
    assert len(gpus) == 0


def test_cuda_visible_devices_picks_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    m = make_pynvml_mock(num_gpus=2)
    with patched_pynvml(m), GPUs.open(GPUConfig(backend="nvml")) as gpus:
        assert [(g.index, g.uuid) for g in gpus] == [(0, uuid_of(1))]
    # Counted from the variable (no NVML count first); visible GPU 0 is physical GPU 1.
    assert m.mock_calls == [*opening_calls(1, num_gpus=2), call.nvmlShutdown()]


def test_a_failure_closes_the_gpus_opened_before_it():
    m = make_pynvml_mock(num_gpus=2)
    m.nvmlDeviceGetMigMode.side_effect = [
        [pynvml.NVML_DEVICE_MIG_DISABLE] * 2,
        [pynvml.NVML_DEVICE_MIG_ENABLE] * 2,
    ]
    with patched_pynvml(m), pytest.raises(GPUNotSupportedError, match="MIG"):
        GPUs.open(GPUConfig(backend="nvml"), indices=[0, 1])
    assert m.mock_calls.count(call.nvmlShutdown()) == 2  # both opened NVML; both closed it


def test_emulated_default_is_one_device_and_feeds_the_monitor():
    cfg = GPUConfig(backend="emulated", emulated=EmulatedGPUConfig(sleep=False))
    with GPUs.open(cfg) as gpus:
        assert len(gpus) == 1 and isinstance(gpus[0], EmulatedGPU)
        monitor = EnergyMonitor(gpus, hold_below_s=0.0)
        monitor.begin_window("w")
        gpus[0].instruction_begin(0, "forward")
        gpus[0].instruction_end("forward")
        assert monitor.end_window("w").time_s >= 0.0
    with GPUs.open(cfg, indices=[0, 1]) as two:
        assert [g.index for g in two] == [0, 1]
