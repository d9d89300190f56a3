"""Recovery after a killed owner process, under another CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
from unittest.mock import call

import pytest

from perseus.config.schema import GPUConfig
from perseus.gpu.factory import build_gpu
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from tests.unit.gpu.guard.test_recovery import _killed_owner
from tests.unit.gpu.nvml_mock import (
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
    uuid_of,
    uuid_opening_calls,
)

pytestmark = pytest.mark.integration


def test_recovery_under_another_cuda_visible_devices_restores_the_right_gpu(tmp_path, monkeypatch):
    state_dir = _killed_owner(tmp_path, visible="1")  # its GPU 0 was physical GPU 1
    (state_file,) = state_dir.glob("*.state.json")
    recorded = json.loads(state_file.read_text())
    assert (recorded["index"], recorded["uuid"]) == (0, uuid_of(1))
    assert (state_dir / f"{uuid_of(1)}.lock").exists()  # the dead owner's lock file

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # now GPU 0 is physical GPU 0
    m = make_pynvml_mock(num_gpus=2, power_limit_mw=300_000)
    with patched_pynvml(m):
        gpu = build_gpu(GPUConfig(backend="nvml", state_dir=str(state_dir)))
    assert gpu.uuid == uuid_of(0)
    assert m.mock_calls == [
        *uuid_opening_calls(1),  # the recorded GPU, by UUID
        call.nvmlDeviceResetGpuLockedClocks("handle-1"),
        call.nvmlDeviceGetPowerManagementLimitConstraints("handle-1"),
        call.nvmlDeviceSetPowerManagementLimit("handle-1", 350_000),
        call.nvmlShutdown(),
        *opening_calls(0, num_gpus=2),  # then this rank's own GPU
    ]
    assert list(state_dir.iterdir()) == []  # state restored, dead lock file cleaned


def test_old_index_recovery_would_have_hit_the_wrong_gpu(tmp_path, monkeypatch, caplog):
    state_dir = _killed_owner(tmp_path, visible="1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    m = make_pynvml_mock(num_gpus=2)
    with patched_pynvml(m):
        assert GPUGuard.recover_stale(state_dir, lambda i: NVMLGPU(i)) == 0  # no UUID opener
    assert not [c for c in m.mock_calls if "Set" in str(c) or "Reset" in str(c)]
    assert "perseus-gpu restore" in caplog.text  # told what does it right
