"""NVMLGPU against an autospec'd pynvml: exact NVML call sequences."""

from __future__ import annotations

import logging
from unittest.mock import call

import pynvml
import pytest

from perseus.errors import (
    GPUError,
    GPUNotFoundError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUValueError,
)
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.nvml.support import visible_devices
from tests.unit.gpu.nvml_mock import (
    A100_SM_CLOCKS_MHZ,
    INSTANT_POWER_MW,
    TEMPERATURE_C,
    field_value,
    make_pynvml_mock,
    no_permission,
    opening_calls,
    patched_pynvml,
    uuid_of,
)

H0 = "handle-0"


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_open_reads_identity():
    m = make_pynvml_mock()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        assert gpu.name == "NVIDIA A100-SXM4-40GB"
        assert gpu.uuid == uuid_of(0)
        assert gpu.ownership_key() == uuid_of(0)
        gpu.close()
    assert m.mock_calls == [*opening_calls(0), call.nvmlShutdown()]


def test_supported_clocks_use_highest_memory_clock():
    m = make_pynvml_mock()
    m.nvmlDeviceGetSupportedMemoryClocks.return_value = [405, 1215, 810]
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        m.reset_mock()
        assert gpu.supported_sm_clocks_mhz() == A100_SM_CLOCKS_MHZ
        assert gpu.supported_sm_clocks_mhz() == A100_SM_CLOCKS_MHZ  # cached
    assert m.mock_calls == [
        call.nvmlDeviceGetSupportedMemoryClocks(H0),
        call.nvmlDeviceGetSupportedGraphicsClocks(H0, 1215),
    ]


def test_changes_call_nvml_exactly():
    m = make_pynvml_mock()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        m.reset_mock()
        gpu.lock_sm_clocks_mhz(1005, 1005)
        gpu.lock_memory_clocks_mhz(1215, 1215)
        gpu.set_power_limit_mw(250_000)
        gpu.reset_sm_clocks()
        gpu.reset_memory_clocks()
        gpu.reset_power_limit()
        assert gpu.total_energy_mj() == 123_456_789
        assert gpu.power_mw() == 90_000  # the instant field
        assert gpu.sm_clock_mhz() == 1410
    assert m.mock_calls == [
        call.nvmlDeviceSetGpuLockedClocks(H0, 1005, 1005),
        call.nvmlDeviceSetMemoryLockedClocks(H0, 1215, 1215),
        call.nvmlDeviceGetPowerManagementLimitConstraints(H0),
        call.nvmlDeviceSetPowerManagementLimit(H0, 250_000),
        call.nvmlDeviceResetGpuLockedClocks(H0),
        call.nvmlDeviceResetMemoryLockedClocks(H0),
        call.nvmlDeviceGetPowerManagementDefaultLimit(H0),
        call.nvmlDeviceSetPowerManagementLimit(H0, 400_000),
        call.nvmlDeviceGetTotalEnergyConsumption(H0),
        call.nvmlDeviceGetFieldValues(H0, [pynvml.NVML_FI_DEV_POWER_INSTANT]),
        call.nvmlDeviceGetClockInfo(H0, pynvml.NVML_CLOCK_SM),
    ]


def test_temperature_is_the_die_sensor_and_none_where_unsupported():
    m = make_pynvml_mock(temperature_c=TEMPERATURE_C)
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        m.reset_mock()
        assert gpu.temperature_c() == 45.0
    plain = make_pynvml_mock()  # a GPU without a sensor
    with patched_pynvml(plain):
        assert NVMLGPU(0).temperature_c() is None
    assert m.mock_calls == [call.nvmlDeviceGetTemperature(H0, pynvml.NVML_TEMPERATURE_GPU)]


def test_dry_run_reads_the_temperature_and_changes_nothing():
    m = make_pynvml_mock(temperature_c=TEMPERATURE_C)
    with patched_pynvml(m):
        gpu = NVMLGPU(0, dry_run=True)
        gpu.lock_sm_clocks_mhz(1005, 1005)
        assert gpu.temperature_c() == 45.0
    assert m.nvmlDeviceSetGpuLockedClocks.call_count == 0


def test_permission_error_says_how_to_fix():
    m = make_pynvml_mock()
    m.nvmlDeviceSetGpuLockedClocks.side_effect = no_permission()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        with pytest.raises(GPUPermissionError) as info:
            gpu.lock_sm_clocks_mhz(1410, 1410)
    message = str(info.value)
    for hint in (
        "nvmlDeviceSetGpuLockedClocks(1410, 1410)",
        "GPU 0",
        "root",
        "CAP_SYS_ADMIN",
        "--cap-add SYS_ADMIN",
        "gpu.dry_run=true",
    ):
        assert hint in message
    assert m.mock_calls == [*opening_calls(0), call.nvmlDeviceSetGpuLockedClocks(H0, 1410, 1410)]


def test_dry_run_logs_and_changes_nothing(caplog):
    m = make_pynvml_mock()
    caplog.set_level(logging.INFO, logger="perseus.gpu.nvml.device")
    with patched_pynvml(m):
        gpu = NVMLGPU(0, dry_run=True)
        m.reset_mock()
        gpu.lock_sm_clocks_mhz(1200, 1200)
        gpu.lock_memory_clocks_mhz(1215, 1215)
        gpu.set_power_limit_mw(300_000)
        gpu.reset_sm_clocks()
        gpu.reset_memory_clocks()
        gpu.reset_power_limit()
        assert gpu.power_limit_mw() == 400_000  # reads still work
    assert m.mock_calls == [
        call.nvmlDeviceGetPowerManagementLimitConstraints(H0),
        call.nvmlDeviceGetPowerManagementDefaultLimit(H0),
        call.nvmlDeviceGetPowerManagementLimit(H0),
    ]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in (
        "would lock SM clocks to [1200, 1200] MHz",
        "would lock memory clocks",
        "would set power limit to 300000 mW",
        "would reset SM clocks",
        "would reset memory clocks",
        "would set power limit to 400000 mW",
    ):
        assert text in logged


@pytest.mark.parametrize(
    ("env", "index", "expected"),
    [
        ("2,3", 1, call.nvmlDeviceGetHandleByIndex(3)),
        (f"{uuid_of(3)},{uuid_of(1)}", 0, call.nvmlDeviceGetHandleByUUID(uuid_of(3))),
    ],
)
def test_respects_cuda_visible_devices(monkeypatch, env, index, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    m = make_pynvml_mock(num_gpus=4)
    with patched_pynvml(m):
        gpu = NVMLGPU(index)
    assert expected in m.mock_calls
    assert gpu.uuid == uuid_of(3)


def test_uuid_prefix_in_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid_of(2))
    m = make_pynvml_mock(num_gpus=3)
    with patched_pynvml(m):
        assert NVMLGPU(0).uuid == uuid_of(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid_of(2)[:-1])  # a prefix of all three
    with (
        patched_pynvml(make_pynvml_mock(num_gpus=3)),
        pytest.raises(GPUNotFoundError, match="matches 3 GPUs"),
    ):
        NVMLGPU(0)
    m = make_pynvml_mock(num_gpus=3)
    m.nvmlDeviceGetHandleByUUID.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-0000-0000-000000000001")
    with patched_pynvml(m):
        assert NVMLGPU(0).uuid == uuid_of(1)
    assert m.mock_calls[:8] == [
        call.nvmlInit(),
        call.nvmlDeviceGetHandleByUUID(uuid_of(1)),
        call.nvmlDeviceGetCount(),
        call.nvmlDeviceGetHandleByIndex(0),
        call.nvmlDeviceGetUUID("handle-0"),
        call.nvmlDeviceGetHandleByIndex(1),
        call.nvmlDeviceGetUUID("handle-1"),
        call.nvmlDeviceGetHandleByIndex(2),
    ]


def test_invisible_index_is_not_found(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    m = make_pynvml_mock(num_gpus=2)
    with patched_pynvml(m), pytest.raises(GPUNotFoundError, match="CUDA_VISIBLE_DEVICES"):
        NVMLGPU(1)
    assert m.mock_calls == [call.nvmlInit(), call.nvmlShutdown()]


def test_index_beyond_count_is_not_found():
    m = make_pynvml_mock(num_gpus=1)
    with patched_pynvml(m), pytest.raises(GPUNotFoundError, match="NVML sees 1 GPU"):
        NVMLGPU(3)


def test_mig_instance_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f3a-1/2/0")
    m = make_pynvml_mock()
    with patched_pynvml(m), pytest.raises(GPUNotSupportedError, match="MIG"):
        NVMLGPU(0)
    assert m.mock_calls == [call.nvmlInit(), call.nvmlShutdown()]


def test_mig_mode_refused():
    m = make_pynvml_mock(mig_enabled=True)
    with patched_pynvml(m), pytest.raises(GPUNotSupportedError, match="disable MIG"):
        NVMLGPU(0)
    assert m.mock_calls[-2:] == [call.nvmlDeviceGetMigMode(H0), call.nvmlShutdown()]


def test_pre_ampere_without_mig_mode_opens():
    m = make_pynvml_mock()
    m.nvmlDeviceGetMigMode.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with patched_pynvml(m):
        assert NVMLGPU(0).name.startswith("NVIDIA")


def test_no_driver_is_not_found():
    m = make_pynvml_mock()
    m.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with patched_pynvml(m), pytest.raises(GPUNotFoundError, match="gpu=emulated"):
        NVMLGPU(0)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (pynvml.NVML_ERROR_NO_PERMISSION, GPUPermissionError),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GPUNotSupportedError),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, GPUNotSupportedError),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, GPUValueError),
        (pynvml.NVML_ERROR_GPU_IS_LOST, GPUNotFoundError),
        (pynvml.NVML_ERROR_UNKNOWN, GPUError),
    ],
)
def test_error_mapping(code, error):
    m = make_pynvml_mock()
    m.nvmlDeviceGetPowerManagementLimit.side_effect = pynvml.NVMLError(code)
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        with pytest.raises(error) as info:
            gpu.power_limit_mw()
    assert type(info.value) is error
    assert "nvmlDeviceGetPowerManagementLimit" in str(info.value)


def test_power_limit_outside_constraints_rejected_before_nvml():
    m = make_pynvml_mock()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        with pytest.raises(GPUValueError, match=r"\[100000, 400000\]"):
            gpu.set_power_limit_mw(500_000)
        with pytest.raises(GPUValueError, match="min <= max"):
            gpu.lock_sm_clocks_mhz(1410, 900)
    m.nvmlDeviceSetPowerManagementLimit.assert_not_called()
    m.nvmlDeviceSetGpuLockedClocks.assert_not_called()


def test_visible_devices_parsing():
    assert visible_devices("") == []
    assert visible_devices("0, 2,x,3") == ["0", "2"]
    assert visible_devices("GPU-ab,MIG-cd") == ["GPU-ab", "MIG-cd"]


def test_instant_power_field_where_available_else_power_usage(caplog):
    fields = call.nvmlDeviceGetFieldValues(H0, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    usage = call.nvmlDeviceGetPowerUsage(H0)
    with_field = make_pynvml_mock()
    with patched_pynvml(with_field):
        gpu = NVMLGPU(0)
        with_field.reset_mock()
        assert [gpu.power_mw(), gpu.power_mw()] == [INSTANT_POWER_MW] * 2
        assert gpu.power_source == "instant field"
    assert with_field.mock_calls == [fields, fields]

    caplog.set_level(logging.INFO, logger="perseus.gpu.nvml.device")
    for broken in (
        # the driver knows the call but not the field (status in the value) ...
        lambda m: setattr(
            m.nvmlDeviceGetFieldValues,
            "side_effect",
            lambda h, ids: [field_value(0, pynvml.NVML_ERROR_NOT_SUPPORTED)],
        ),
        # ... or an old driver lacks the call altogether
        lambda m: setattr(
            m.nvmlDeviceGetFieldValues,
            "side_effect",
            pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        ),
    ):
        m = make_pynvml_mock()
        broken(m)
        with patched_pynvml(m):
            gpu = NVMLGPU(0)
            m.reset_mock()
            assert [gpu.power_mw(), gpu.power_mw()] == [85_000, 85_000]
            assert gpu.power_source == "nvmlDeviceGetPowerUsage"
        assert m.mock_calls == [fields, usage, usage]  # tried once, then the fallback only
    assert "no instant power field" in caplog.text


def test_old_bindings_without_the_field_constant_use_power_usage(monkeypatch):
    m = make_pynvml_mock()
    monkeypatch.delattr(m, "NVML_FI_DEV_POWER_INSTANT")
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        m.reset_mock()
        assert gpu.power_mw() == 85_000
        assert gpu.instant_power_mw() is None  # no field to ask for
    assert m.mock_calls == [call.nvmlDeviceGetPowerUsage(H0)]


def test_instant_power_reads_the_field_or_says_there_is_none():
    fields = call.nvmlDeviceGetFieldValues(H0, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    m = make_pynvml_mock()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        m.reset_mock()
        assert [gpu.instant_power_mw(), gpu.instant_power_mw()] == [INSTANT_POWER_MW] * 2
    assert m.mock_calls == [fields, fields]

    broken = make_pynvml_mock()
    broken.nvmlDeviceGetFieldValues.side_effect = lambda h, ids: [
        field_value(0, pynvml.NVML_ERROR_NOT_SUPPORTED)
    ]
    with patched_pynvml(broken):
        gpu = NVMLGPU(0)
        broken.reset_mock()
        assert [gpu.instant_power_mw(), gpu.instant_power_mw()] == [None, None]
        assert gpu.power_mw() == 85_000  # power_mw falls back to the averaged reading
    # asked once; known missing afterwards, so neither call asks again
    assert broken.mock_calls == [fields, call.nvmlDeviceGetPowerUsage(H0)]
