from __future__ import annotations

import threading

import pytest

from perseus.errors import GPUError, GPUPermissionError
from perseus.runtime.controller import ClockController
from tests.unit.runtime.fakes import RecordingGPU


def test_background_thread_coalesces_to_the_latest_request() -> None:
    gpu = RecordingGPU()
    gpu.lock_gate = threading.Event()
    ctrl = ClockController(gpu)
    try:
        ctrl.request(1410)  # the thread picks this up and blocks inside the driver call
        assert gpu.lock_entered.wait(60)
        for f in (1200, 1000, 800, 1000):
            ctrl.request(f)
        gpu.lock_gate.set()
        ctrl.flush()
    finally:
        ctrl.close()
    calls = gpu.clock_calls()
    assert calls[0] == ("lock_sm", 1410, 1410)
    assert calls[-1] == ("lock_sm", 1000, 1000)
    assert len(calls) == 2  # 1200 and 800 were superseded before the thread got to them


def test_identical_requests_skip_the_driver() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu)
    for f in (1410, 1410, 1410, 1200, 1200, None, None, 1410):
        ctrl.request(f)
        ctrl.flush()
    ctrl.close()
    assert gpu.clock_calls() == [
        ("lock_sm", 1410, 1410),
        ("lock_sm", 1200, 1200),
        ("reset_sm",),
        ("lock_sm", 1410, 1410),
    ]
    assert ctrl.num_applied == 4


def test_first_request_for_default_clocks_is_a_no_op() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu, synchronous=True)
    ctrl.request(None)
    assert gpu.calls == []


def test_synchronous_applies_in_the_calling_thread() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu, synchronous=True)
    assert ctrl._thread is None
    ctrl.request(1200)
    assert gpu.locked_mhz == 1200  # no flush needed
    ctrl.request(1200)
    assert gpu.clock_calls() == [("lock_sm", 1200, 1200)]


def test_thread_errors_surface_on_the_next_call() -> None:
    gpu = RecordingGPU()
    gpu.fail_lock = GPUPermissionError("no permission: run as root")
    ctrl = ClockController(gpu)
    ctrl.request(1410)
    with pytest.raises(GPUPermissionError, match="run as root"):
        ctrl.flush()
    with pytest.raises(GPUPermissionError):
        ctrl.check()  # sticky
    with pytest.raises(GPUPermissionError):
        ctrl.request(1200)
    ctrl.close()


def test_foreign_errors_are_wrapped() -> None:
    gpu = RecordingGPU()
    gpu.fail_lock = OSError("driver gone")
    ctrl = ClockController(gpu)
    ctrl.request(1410)
    with pytest.raises(GPUError, match="driver gone") as info:
        ctrl.flush()
    assert isinstance(info.value.__cause__, OSError)
    ctrl.close()


def test_close_joins_after_pending_work_and_refuses_new_requests() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu)
    ctrl.request(800)
    ctrl.close()
    assert ctrl._thread is not None and not ctrl._thread.is_alive()
    assert gpu.clock_calls() == [("lock_sm", 800, 800)]
    with pytest.raises(GPUError, match="closed"):
        ctrl.request(1000)
