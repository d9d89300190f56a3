"""perseus-doctor on this machine (no GPU: the emulated one) and on a mocked NVML node.

Virtual time throughout: the energy counters (the emulated one, and the mock's, which moves
every 20 ms of the virtual clock) and the instant power fields are polled on the clock the
doctor is given; on the emulated GPU its own instructions are the load change.
"""

from __future__ import annotations

import io
import math
import sys
from typing import Any, Tuple
from unittest.mock import call

import pynvml
import pytest

from perseus.apps import doctor as doctor_app
from perseus.apps.doctor import run_doctor
from perseus.gpu import doctor as doctor_lib
from perseus.gpu.nvml import support as nvml_support
from perseus.profiler.virtual_run import VirtualClock
from tests.unit.gpu.nvml_mock import (
    field_value,
    make_pynvml_mock,
    no_permission,
    patched_pynvml,
    uuid_of,
    write_dead_owner_state,
)


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))


def privileged(monkeypatch, who: str) -> None:
    monkeypatch.setattr(doctor_lib, "privileges", lambda: who)
    monkeypatch.setattr(doctor_app, "privileges", lambda: who)


def node(clock: VirtualClock, **kwargs: Any) -> Any:
    m = make_pynvml_mock(**kwargs)
    m.nvmlDeviceGetTotalEnergyConsumption.side_effect = lambda h: int(
        90_000 * math.floor(clock.now_s / 0.02) * 0.02
    )
    return m


def doctor(**kwargs: Any) -> Tuple[int, str]:
    out = io.StringIO()
    clock = VirtualClock(100.0)
    nvml = kwargs.pop("nvml", None)
    if nvml is not None:
        clock = kwargs.pop("clock")
    with patched_pynvml(nvml or make_pynvml_mock()) as _:
        if nvml is None:  # no NVIDIA GPU: the real import fails to initialize as here
            sys.modules["pynvml"].nvmlInit.side_effect = pynvml.NVMLError(
                pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
            )
        status = run_doctor(out=out, clock=clock, sleeper=clock.sleep, probe_s=3.0, **kwargs)
    return status, out.getvalue()


def test_without_gpus_it_says_so_and_shows_the_emulated_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml_support, "DEV_DIR", str(tmp_path))
    monkeypatch.setattr(nvml_support, "PROC_DRIVER_DIR", str(tmp_path / "none"))
    status, text = doctor()
    assert status == 0
    assert "no NVIDIA GPU on this machine" in text
    for expected in (
        "GPU 0 (emulated)",
        "gpt3-175b+a100_sxm_bf16.csv: 8 stages",
        "38 supported, 855-1410 MHz",
        # the realistic emulated GPU: an H100's counter, its blocking reads, its lagging field
        "energy counter        present, updates every 100 ms (jitter 89-111 ms over 28 intervals",
        "energy read           blocks 3.",
        "power reading         instant field (emulated)",
        "instant field         updates every 10",
        "shows a load change",
        "(84 -> 4",
        "the emulated GPU's forward/backward instructions)",
        "energy sampler        polls the energy counter (a thread per GPU)",
        "profiling window      >= 0.20 s (2 counter updates; noise of one update interval 1.3",
        # ... and the profile's heaviest instruction (481.5 W) at the cap
        "power limit           482 W (range 100-482 W, default 482 W)",
        "locked 1125 MHz, read back 1125 MHz, reset",
        "verdict               READY",
    ):
        assert expected in text, expected


def test_mocked_node_read_only_by_default(monkeypatch):
    privileged(monkeypatch, "none")
    clock = VirtualClock(100.0)
    m = node(clock, num_gpus=2)
    status, text = doctor(nvml=m, clock=clock)
    assert status == 1  # not READY without the privilege
    assert "2 NVIDIA GPU(s), driver 550.54.15, NVML 12.550.54.15" in text
    for expected in (
        f"GPU 1  NVIDIA A100-SXM4-40GB  {uuid_of(1)}",
        "MIG                   disabled",
        "persistence mode      on",
        "81 supported, 210-1410 MHz (at memory clock 1215 MHz)",
        "energy counter        present, updates every 20 ms (jitter 20-20 ms over 148 intervals",
        "power reading         instant field, 90.0 W now",
        # the mock's field never changes; without CUDA no load can be made
        "instant field         changed 0 time(s) in 3 s: period not measured; lag not measured",
        "energy sampler        polls the energy counter",
        # 2 updates of 20 ms (the counter's steps are exact: no noise at rest)
        "profiling window      >= 0.04 s (2 counter updates; noise of one update interval 0.0%",
        "dry run: would lock 810 MHz, read the clock back and reset",
        "verdict               MEASURE ONLY: changing clocks needs root or CAP_SYS_ADMIN",
    ):
        assert expected in text, expected
    assert not [c for c in m.mock_calls if "Set" in str(c) or "Reset" in str(c)]


def test_mocked_node_apply_does_the_round_trip(monkeypatch):
    privileged(monkeypatch, "root")
    clock = VirtualClock(100.0)
    m = node(clock)
    m.nvmlDeviceSetMemoryLockedClocks.side_effect = pynvml.NVMLError(
        pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    status, text = doctor(nvml=m, clock=clock, apply=True)
    assert status == 0, text
    assert "locked 810 MHz, read back 810 MHz, reset" in text
    assert "clock-change latency  lock 0.00 ms, reset 0.00 ms" in text  # virtual time
    assert "memory-clock lock     not supported (needs Ampere or newer)" in text
    assert "verdict               READY" in text
    changes = [c for c in m.mock_calls if "Set" in str(c) or "Reset" in str(c)]
    assert changes == [
        call.nvmlDeviceSetGpuLockedClocks("handle-0", 810, 810),
        call.nvmlDeviceResetGpuLockedClocks("handle-0"),
        call.nvmlDeviceSetMemoryLockedClocks("handle-0", 1215, 1215),
    ]


def test_verdicts_for_refused_clocks_and_mig(monkeypatch):
    privileged(monkeypatch, "none")
    clock = VirtualClock(100.0)
    m = node(clock, num_gpus=2)
    m.nvmlDeviceSetGpuLockedClocks.side_effect = no_permission()
    m.nvmlDeviceGetMigMode.side_effect = lambda h: (
        [pynvml.NVML_DEVICE_MIG_ENABLE] * 2 if h == "handle-1" else [0, 0]
    )
    status, text = doctor(nvml=m, clock=clock, apply=True)
    assert status == 1
    assert "MEASURE ONLY: changing clocks needs root or CAP_SYS_ADMIN" in text
    assert "NOT READY: MIG is enabled" in text


def test_broken_nvml_with_gpus_present_exits_2(monkeypatch, tmp_path):
    (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(nvml_support, "DEV_DIR", str(tmp_path))
    m = make_pynvml_mock()
    m.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    status, text = doctor(nvml=m, clock=VirtualClock(100.0))
    assert status == 2
    assert "NVML/RM version mismatch" in text and "reboot the node" in text


def test_perseus_gpu_restore_for_job_epilogs(tmp_path, capsys):
    from perseus.apps import gpu_tool

    state = write_dead_owner_state(tmp_path / "state", {"reset_sm_clocks": True})
    (tmp_path / "state" / f"{uuid_of(3)}.lock").touch()  # a dead owner's lock file
    m = make_pynvml_mock()
    with patched_pynvml(m):
        assert gpu_tool.main(["restore", "--state-dir", str(tmp_path / "state")]) == 0
    assert call.nvmlDeviceResetGpuLockedClocks("handle-0") in m.mock_calls
    assert call.nvmlDeviceGetHandleByUUID(uuid_of(0)) in m.mock_calls
    assert not state.exists() and list((tmp_path / "state").iterdir()) == []
    assert "restored 1 GPU(s)" in capsys.readouterr().out


class _PoweredNode:
    """A mocked GPU whose power rises when the doctor's load starts: 90 W, then 400 W.

    Its counter holds the energy at its last 20 ms update; its instant field shows the power
    at its last 100 ms update (so it lags a load change by up to 100 ms), give or take a watt.
    """

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.load_from_s = math.inf
        self.m = make_pynvml_mock()
        self.m.nvmlDeviceGetTotalEnergyConsumption.side_effect = lambda h: int(
            self.energy_j(math.floor(clock.now_s / 0.02) * 0.02) * 1000
        )
        self.m.nvmlDeviceGetFieldValues.side_effect = lambda h, ids: [field_value(self.field_mw())]

    def field_mw(self) -> int:
        """The power at the field's last update, wobbling by a watt (as a real field does)."""
        tick = math.floor(self.clock.now_s / 0.1)
        return int((self.power_w(tick * 0.1) + tick % 2) * 1000)

    def power_w(self, t_s: float) -> float:
        return 400.0 if t_s >= self.load_from_s else 90.0

    def energy_j(self, t_s: float) -> float:
        busy_s = max(0.0, t_s - self.load_from_s)
        return 90.0 * t_s + 310.0 * busy_s

    def load(self, uuid: str) -> Any:
        node = self

        class _Load:
            name = "a test load"

            def start(self) -> None:
                node.load_from_s = node.clock.now_s

            def tick(self) -> None:
                pass

            def stop(self) -> None:
                node.load_from_s = math.inf

        return _Load()


def test_mocked_node_shows_the_field_period_and_its_lag_with_exact_nvml_calls(monkeypatch):
    privileged(monkeypatch, "root")
    clock = VirtualClock(100.0)
    node_ = _PoweredNode(clock)
    monkeypatch.setattr(doctor_app, "cuda_load", node_.load)
    status, text = doctor(nvml=node_.m, clock=clock)
    assert status == 0, text
    for expected in (
        "energy counter        present, updates every 20 ms (jitter 20-20 ms over 148 intervals",
        "energy read           blocks 0.0 ms median, 0.0 ms max (3000 reads;",
        # the field updates every 100 ms and showed the load at its next update
        "instant field         updates every 100 ms (jitter 100-100 ms); shows a load change "
        "100 ms late (90 -> 400 W, a test load)",
        "energy sampler        polls the energy counter",
        "profiling window      >= 0.04 s (2 counter updates",
    ):
        assert expected in text, expected
    h = "handle-0"
    energy = call.nvmlDeviceGetTotalEnergyConsumption(h)
    instant = call.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    opened = [
        call.nvmlInit(),
        call.nvmlDeviceGetCount(),
        call.nvmlShutdown(),
        call.nvmlInit(),
        call.nvmlSystemGetDriverVersion(),
        call.nvmlSystemGetNVMLVersion(),
        call.nvmlDeviceGetCount(),
        call.nvmlDeviceGetHandleByIndex(0),
        call.nvmlDeviceGetName(h),
        call.nvmlDeviceGetUUID(h),
        call.nvmlDeviceGetMigMode(h),
        call.nvmlInit(),
        call.nvmlDeviceGetHandleByUUID(uuid_of(0)),
        call.nvmlDeviceGetMigMode(h),
        call.nvmlDeviceGetName(h),
        call.nvmlDeviceGetUUID(h),
        call.nvmlDeviceGetIndex(h),
        call.nvmlDeviceGetPersistenceMode(h),
        call.nvmlDeviceGetSupportedMemoryClocks(h),
        call.nvmlDeviceGetSupportedGraphicsClocks(h, 1215),
        call.nvmlDeviceGetPowerManagementLimit(h),
        call.nvmlDeviceGetPowerManagementLimitConstraints(h),
        call.nvmlDeviceGetPowerManagementDefaultLimit(h),
    ]
    # The probe: one counter read and one field read per poll (a dry run changes nothing), then
    # the power reading, and NVML is shut down by the GPU and by the doctor.
    probe = [energy, instant] * 3000
    assert node_.m.mock_calls == [
        *opened,
        *probe,
        instant,
        call.nvmlShutdown(),
        call.nvmlShutdown(),
    ]
