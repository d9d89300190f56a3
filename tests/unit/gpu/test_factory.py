"""build_gpu / nvml_usable: auto-detection against an autospec'd pynvml."""

from __future__ import annotations

import logging
from unittest.mock import call

import pynvml
import pytest

from perseus.config.schema import EmulatedGPUConfig, GPUConfig
from perseus.errors import ConfigError, GPUNotFoundError, GPUNotSupportedError
from perseus.gpu.emulated.device import EmulatedGPU, bundled_profile_path
from perseus.gpu.factory import build_gpu, nvml_usable
from perseus.gpu.nvml.device import NVMLGPU

from .nvml_mock import (
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
    uuid_opening_calls,
    write_dead_owner_state,
)


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))  # default state dir


def no_driver():
    m = make_pynvml_mock()
    m.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    return m


def test_nvml_usable_with_a_gpu():
    m = make_pynvml_mock()
    with patched_pynvml(m):
        assert nvml_usable()
    assert m.mock_calls == [call.nvmlInit(), call.nvmlDeviceGetCount(), call.nvmlShutdown()]


def test_nvml_unusable_without_driver_or_gpus(monkeypatch):
    with patched_pynvml(no_driver()):
        assert not nvml_usable()
    with patched_pynvml(make_pynvml_mock(num_gpus=0)):
        assert not nvml_usable()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    m = make_pynvml_mock()
    with patched_pynvml(m):
        assert not nvml_usable()
    assert m.mock_calls == []


def test_auto_picks_emulated_without_gpu_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="perseus.gpu.factory")
    with patched_pynvml(no_driver()):
        gpu = build_gpu(GPUConfig(), local_index=1, num_pipeline_stages=4)
    assert isinstance(gpu, EmulatedGPU)
    assert gpu.index == 1
    assert gpu.num_pipeline_stages == 4
    assert gpu.blocking_power_w == 83.64
    assert "using the emulated backend" in caplog.text


def test_auto_picks_nvml_with_gpu(caplog):
    caplog.set_level(logging.INFO, logger="perseus.gpu.factory")
    with patched_pynvml(make_pynvml_mock(num_gpus=2)):
        gpu = build_gpu(GPUConfig(dry_run=True), local_index=1)
    assert isinstance(gpu, NVMLGPU)
    assert gpu.index == 1 and gpu.dry_run
    assert "using the nvml backend" in caplog.text


def test_explicit_nvml_surfaces_errors():
    with patched_pynvml(make_pynvml_mock(mig_enabled=True)), pytest.raises(GPUNotSupportedError):
        build_gpu(GPUConfig(backend="nvml"))


def test_emulated_settings_pass_through(tmp_path):
    em = EmulatedGPUConfig(
        profile="bloom+a40_bf16", time_scale=0.1, energy_noise=0.03, sleep=False, seed=5
    )
    gpu = build_gpu(GPUConfig(backend="emulated", emulated=em))
    assert isinstance(gpu, EmulatedGPU)
    assert gpu.blocking_power_w == 70.38
    assert gpu.time_scale == 0.1 and not gpu.sleep
    assert gpu.supported_sm_clocks_mhz()[0] == 1740
    # the configuration's default readings are the realistic ones: an A40 profile's heaviest
    # instruction (296.6 W) sets its cap, idle is 17.6 % of that, the counter updates every 100 ms
    assert gpu.counter == "realistic" and not gpu.dry_run
    assert gpu.power_limit_mw() == gpu.default_power_limit_mw() == 297_000
    assert gpu.idle_power_w == pytest.approx(0.176 * 297)
    assert gpu.energy_update_period_s == 0.1

    ideal = EmulatedGPUConfig(profile="bloom+a40_bf16", counter="ideal")
    gpu = build_gpu(GPUConfig(backend="emulated", dry_run=True, emulated=ideal))
    assert isinstance(gpu, EmulatedGPU)
    assert gpu.counter == "ideal" and gpu.dry_run
    assert gpu.default_power_limit_mw() == 400_000 and gpu.energy_update_period_s == 0.02
    assert gpu.idle_power_w == 70.38

    own = tmp_path / "mine.csv"
    own.write_text(bundled_profile_path("bloom+a40_bf16").read_text())
    with pytest.raises(ConfigError, match="blocking_power_w"):
        build_gpu(GPUConfig(backend="emulated", emulated=EmulatedGPUConfig(profile=str(own))))
    em2 = EmulatedGPUConfig(profile=str(own), blocking_power_w=60.0)
    assert build_gpu(GPUConfig(backend="emulated", emulated=em2)).blocking_power_w == 60.0


def test_the_thermal_model_is_off_unless_asked_for():
    plain = build_gpu(GPUConfig(backend="emulated", emulated=EmulatedGPUConfig(sleep=False)))
    assert isinstance(plain, EmulatedGPU)
    assert plain.thermal is None and plain.temperature_c() is None
    em = EmulatedGPUConfig(sleep=False, thermal=True)
    gpu = build_gpu(GPUConfig(backend="emulated", emulated=em))
    assert isinstance(gpu, EmulatedGPU) and gpu.thermal is not None
    # The defaults for its power limit: ~45 °C above a 30 °C inlet at that limit, the card
    # starting at its idle temperature.
    limit_w = gpu.default_power_limit_mw() / 1000
    assert gpu.thermal.steady_c(limit_w) == pytest.approx(75.0)
    assert gpu.temperature_c() == round(gpu.thermal.steady_c(gpu.idle_power_w))


def test_unknown_backend():
    with pytest.raises(ConfigError, match="auto, nvml or emulated"):
        build_gpu(GPUConfig(backend="rocm"))


def test_nvml_start_restores_what_a_killed_owner_left(tmp_path):
    state = write_dead_owner_state(
        tmp_path / "state", {"reset_sm_clocks": True, "power_limit_mw": 350_000}
    )
    m = make_pynvml_mock(power_limit_mw=200_000)
    with patched_pynvml(m):
        gpu = build_gpu(GPUConfig(backend="nvml", state_dir=str(tmp_path / "state")))
    assert isinstance(gpu, NVMLGPU)
    assert m.mock_calls == [
        *uuid_opening_calls(0),  # the recovery opens the recorded GPU by UUID ...
        call.nvmlDeviceResetGpuLockedClocks("handle-0"),
        call.nvmlDeviceGetPowerManagementLimitConstraints("handle-0"),
        call.nvmlDeviceSetPowerManagementLimit("handle-0", 350_000),
        call.nvmlShutdown(),
        *opening_calls(0),  # ... then the rank opens its own
    ]
    assert not state.exists()


def test_dry_run_start_keeps_a_killed_owners_state(tmp_path):
    from perseus.gpu.guard.owner import GPUGuard

    state = write_dead_owner_state(
        tmp_path / "state", {"reset_sm_clocks": True, "power_limit_mw": 350_000}
    )
    m = make_pynvml_mock()
    cfg = GPUConfig(backend="nvml", dry_run=True, state_dir=str(tmp_path / "state"))
    with patched_pynvml(m):
        gpu = build_gpu(cfg)
        GPUGuard(gpu, state_dir=tmp_path / "state").acquire().release()
    assert m.mock_calls == opening_calls(0)  # nothing restored, nothing changed
    assert state.exists()  # a later real start restores it


@pytest.fixture
def nvidia_devices(tmp_path, monkeypatch):
    """This machine has an NVIDIA GPU device file (a folder standing in for /dev)."""
    from perseus.gpu.nvml import support as nvml_support

    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    monkeypatch.setattr(nvml_support, "DEV_DIR", str(dev))
    monkeypatch.setattr(nvml_support, "PROC_DRIVER_DIR", str(tmp_path / "no-proc"))


def test_auto_with_a_library_mismatch_stops_with_the_fix(nvidia_devices):
    m = make_pynvml_mock()
    m.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with patched_pynvml(m), pytest.raises(GPUNotFoundError) as info:
        build_gpu(GPUConfig())
    message = str(info.value)
    assert "NVML/RM version mismatch" in message  # NVML's own error
    assert "reboot the node" in message and "modprobe nvidia" in message  # the fix
    assert "set gpu=emulated" in message  # the way to emulate on purpose
    assert m.mock_calls == [call.nvmlInit()]


def test_auto_without_any_nvidia_device_emulates(monkeypatch, tmp_path):
    from perseus.gpu.nvml import support as nvml_support

    monkeypatch.setattr(nvml_support, "DEV_DIR", str(tmp_path))  # no nvidia* here
    monkeypatch.setattr(nvml_support, "PROC_DRIVER_DIR", str(tmp_path / "no-proc"))
    m = make_pynvml_mock()
    m.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with patched_pynvml(m):
        assert isinstance(build_gpu(GPUConfig()), EmulatedGPU)


def test_auto_with_devices_but_no_pynvml_says_install_it(nvidia_devices, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(GPUNotFoundError, match="install nvidia-ml-py"):
        build_gpu(GPUConfig())
