"""perseus-doctor on this machine (no GPU: the emulated one) and on a mocked NVML node.

Virtual time throughout: the energy counters (the emulated one, and the mock's, which moves
every 20 ms of the virtual clock) are polled on the clock the doctor is given.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
from typing import Any, Tuple
from unittest.mock import call

import pynvml
import pytest

from perseus.apps import doctor as doctor_app
from perseus.apps.doctor import run_doctor
from perseus.gpu import doctor as doctor_lib
from perseus.gpu import nvml_support
from perseus.profiler.virtual_run import VirtualClock
from tests.unit.gpu.nvml_mock import (
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
        status = run_doctor(out=out, clock=clock, sleeper=clock.sleep, probe_s=1.0, **kwargs)
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
        "present, updates every 100 ms",  # the realistic emulated GPU: an H100's counter ...
        "power reading         instant field (emulated)",
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
        "energy counter        present, updates every 20 ms (measured over 1 s)",
        "power reading         instant field, 90.0 W now",
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


@pytest.mark.parametrize(
    ("module", "prog"), [("doctor", "perseus-doctor"), ("gpu_tool", "perseus-gpu")]
)
def test_console_scripts_run(module, prog):
    proc = subprocess.run(
        [sys.executable, "-m", f"perseus.apps.{module}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and prog in proc.stdout


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
