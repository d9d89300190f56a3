"""On a real NVIDIA GPU: the read-only and dry-run paths (skipped cleanly without one).

Nothing here changes a clock or a power limit: NVML is opened in dry-run mode, and the doctor
runs without ``--apply``.
"""

from __future__ import annotations

import io
import threading
import time

import pytest

from perseus.apps.doctor import run_doctor
from perseus.config.schema import GPUConfig
from perseus.gpu.factory import resolve_backend
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.preflight import GPUNeeds, check_capabilities

pytestmark = pytest.mark.gpu


def test_auto_resolves_to_nvml():
    assert resolve_backend(GPUConfig()) == "nvml"


def test_read_only_queries(tmp_path):
    gpu = NVMLGPU(0, dry_run=True)
    try:
        assert gpu.uuid and gpu.uuid.startswith("GPU-")
        sm = gpu.supported_sm_clocks_mhz()
        assert sm == sorted(sm, reverse=True) and sm[-1] > 0
        assert gpu.supported_memory_clocks_mhz()
        lo, hi = gpu.power_limit_constraints_mw()
        assert 0 < lo <= gpu.power_limit_mw() <= hi
        first = gpu.total_energy_mj()
        assert gpu.total_energy_mj() >= first  # monotonic (sampled power without a counter)
        assert gpu.power_mw() > 0
        assert gpu.sm_clock_mhz() is None or gpu.sm_clock_mhz() > 0
        assert gpu.persistence_mode() in (True, False, None)
        temperature_c = gpu.temperature_c()  # the die sensor, whole °C (None: none)
        assert temperature_c is None or 0.0 < temperature_c < 120.0
        # A dry-run guard logs changes and makes none.
        with GPUGuard(gpu, state_dir=tmp_path) as guard:
            guard.lock_sm_clocks_mhz(sm[-1], sm[-1])
            guard.reset_sm_clocks()
        assert list(tmp_path.glob("*.state.json")) == []
    finally:
        gpu.close()


def test_cuda_device_maps_by_uuid_and_synchronizes():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = torch.randn(512, 512, device="cuda:0")
    (x @ x).sum()
    gpu = NVMLGPU(0, dry_run=True)
    try:
        assert gpu.mapping == "CUDA device 0 by UUID"
        gpu.synchronize()  # real torch.cuda.synchronize(0)
    finally:
        gpu.close()


def test_start_up_check_in_dry_run_changes_nothing(tmp_path):
    gpu = NVMLGPU(0, dry_run=True)
    try:
        caps = check_capabilities(
            gpu, GPUNeeds(lock_sm_clocks=True, set_power_limit=True), state_dir=tmp_path
        )
    finally:
        gpu.close()
    assert [c.name for c in caps.checks] == ["measure energy"]
    assert any("dry run" in w for w in caps.warnings)


def test_doctor_read_only():
    out = io.StringIO()
    status = run_doctor(out=out, probe_s=0.5)
    text = out.getvalue()
    assert status in (0, 1), text
    assert "NVIDIA GPU(s), driver" in text and "verdict" in text
    assert "dry run: would lock" in text


def test_the_sampler_records_the_temperature_in_dry_run(tmp_path):
    """A dry-run optimizer on the GPU: its sampler reads the temperature, the training thread
    never does, each step record carries the last reading, nothing is changed."""
    from perseus.records import RankInfo
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import MaxSpeedSource

    gpu = NVMLGPU(0, dry_run=True)
    if gpu.temperature_c() is None:
        gpu.close()
        pytest.skip("this GPU reports no temperature")
    opt = PerseusOptimizer.on_gpu(
        RankInfo(), gpu, MaxSpeedSource(gpu.supported_sm_clocks_mhz()[0]), state_dir=tmp_path
    )
    try:
        temperatures = opt.temperatures
        assert temperatures is not None
        read = threading.Event()
        deadline = time.monotonic() + 10.0  # the sampler reads at once, then about once a second
        while temperatures.latest is None and time.monotonic() < deadline:
            read.wait(0.01)
        opt.on_step_begin()
        opt.on_instruction_begin("forward")
        opt.on_instruction_end("forward")
        opt.on_step_end()
        assert opt.last_step is not None and opt.last_step.temperature_c is not None
        assert 0.0 < opt.last_step.temperature_c < 120.0
    finally:
        opt.close()
    assert list(tmp_path.glob("*.state.json")) == []
