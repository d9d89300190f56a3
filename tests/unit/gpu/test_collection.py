"""GPUs: the GPUs a process drives, against an autospec'd pynvml and the emulated device.

Their energy comes from one sampler per GPU (its own thread), never from a read where it is
asked for.
"""

from __future__ import annotations

import time
from typing import Any, List
from unittest.mock import call

import pynvml
import pytest

from perseus.config.schema import EmulatedGPUConfig, GPUConfig
from perseus.errors import GPUNotSupportedError
from perseus.gpu.collection import GPUs
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.gpu.factory import build_emulated
from perseus.gpu.nvml.device import NVMLGPU
from perseus.profiler.virtual_run import VirtualClock, attach_meter

from .nvml_mock import (
    INSTANT_POWER_MW,
    calls_except_energy_reads,
    energy_reads_off_sampler,
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
        assert gpus.power_mw() == 2 * INSTANT_POWER_MW
        meter = gpus.energy_meter()
        assert gpus.energy_meter() is meter and len(meter.samplers) == 2
        deadline = time.monotonic() + 30.0
        while len(set(m.energy_read_threads)) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # each sampler's thread reads its GPU's counter ...
        gpus.close()  # ... and stops before its GPU closes
    assert len(set(m.energy_read_threads)) == 2
    assert not any(s.running for s in meter.samplers)
    assert energy_reads_off_sampler(m) == []  # never read where the energy is asked for
    assert calls_except_energy_reads(m) == [
        call.nvmlInit(),
        call.nvmlDeviceGetCount(),
        call.nvmlShutdown(),
        *opening_calls(0, num_gpus=2),
        *opening_calls(1, num_gpus=2),
        call.nvmlDeviceGetFieldValues("handle-0", [pynvml.NVML_FI_DEV_POWER_INSTANT]),
        call.nvmlDeviceGetFieldValues("handle-1", [pynvml.NVML_FI_DEV_POWER_INSTANT]),
        call.nvmlShutdown(),
        call.nvmlShutdown(),
    ]
    assert len(gpus) == 0


def test_the_energy_of_several_gpus_is_the_sum_of_their_samplers():
    clock = VirtualClock()
    cfg = EmulatedGPUConfig(sleep=True, counter="ideal", energy_update_period_s=0.02)
    devices: List[Any] = [
        build_emulated(
            GPUConfig(backend="emulated", emulated=cfg), i, clock=clock, sleeper=clock.sleep
        )
        for i in range(2)
    ]
    meter = attach_meter(devices, clock)
    clock.sleep(0.1)
    t0, e0 = clock(), [d.true_energy_j() for d in devices]
    devices[0].instruction_begin(0, "forward")
    devices[0].instruction_end("forward")  # only the first GPU works
    clock.sleep(1.0)
    t1, e1 = clock(), [d.true_energy_j() for d in devices]
    assert meter.wait_until_covered(t1)
    assert meter.energy_j_between(t0, t1) == pytest.approx(sum(e1) - sum(e0), rel=0.01)


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


def test_emulated_default_is_one_device():
    cfg = GPUConfig(backend="emulated", emulated=EmulatedGPUConfig(sleep=False))
    with GPUs.open(cfg) as gpus:
        assert len(gpus) == 1 and isinstance(gpus[0], EmulatedGPU)
    with GPUs.open(cfg, indices=[0, 1]) as two:
        assert [g.index for g in two] == [0, 1]
