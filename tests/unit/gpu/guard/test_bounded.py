"""A blocking NVML call cannot hang close() or a signal's restore past a timeout.

A driver that stopped answering is an autospec'd pynvml whose call waits on an event the test
sets only at the end. The bounds under test are small; pytest's timeout is the hang guard.
"""

from __future__ import annotations

import logging
import textwrap
import threading
from pathlib import Path
from unittest.mock import call

import pytest

from perseus.errors import GPUTimeoutError
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml import device as nvml_module
from perseus.gpu.nvml.device import NVMLGPU
from perseus.records import RankInfo
from perseus.runtime.sources import MaxSpeedSource
from tests.unit.gpu.nvml_mock import make_pynvml_mock, patched_pynvml, uuid_of
from tests.unit.runtime.fakes import owning_optimizer

REPO = Path(__file__).resolve().parents[4]
HELPERS = Path(__file__).resolve().parents[1]  # nvml_mock.py


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def hung():
    """An event a blocked driver call waits on; set at the end so the threads finish."""
    event = threading.Event()
    yield event
    event.set()


def test_restore_gives_up_after_its_timeout_and_keeps_the_state(tmp_path, hung):
    m = make_pynvml_mock()
    m.nvmlDeviceResetGpuLockedClocks.side_effect = lambda h: hung.wait()
    with patched_pynvml(m):
        guard = GPUGuard(NVMLGPU(0), state_dir=tmp_path, restore_timeout_s=0.2, watchdog=False)
        guard.acquire().lock_sm_clocks_mhz(1005, 1005)
        with pytest.raises(GPUTimeoutError, match="did not finish within 0.2 s"):
            guard.release()
        guard.restore_quietly()  # the exit hooks' path: logs, returns
    assert guard.acquired  # the lock stays held until the process ends (for the watchdog)
    assert (tmp_path / f"{uuid_of(0)}.state.json").exists()  # what to restore is kept


def test_restore_from_a_thread_inside_the_guard_does_not_wait_for_itself(tmp_path):
    """A signal handler runs on the thread it interrupted: inside one of the guard's own methods
    (a synchronous clock change), that thread holds the guard. The restore must not wait for it
    (it never goes on before the process ends): the clocks are reset at once, not left changed
    after the timeout."""
    m = make_pynvml_mock()
    with patched_pynvml(m):
        guard = GPUGuard(NVMLGPU(0), state_dir=tmp_path, restore_timeout_s=1.0, watchdog=False)
        guard.acquire().lock_sm_clocks_mhz(1005, 1005)
        m.reset_mock()
        with guard._mutex:  # interrupted inside a guard method, as a signal handler finds it
            guard.restore_quietly()
            # Done while this thread still holds the guard (before: nothing, after the timeout).
            assert m.mock_calls == [call.nvmlDeviceResetGpuLockedClocks("handle-0")]
        guard.release()
    assert not (tmp_path / f"{uuid_of(0)}.state.json").exists()


def test_optimizer_close_and_gpu_close_are_bounded(tmp_path, hung, monkeypatch, caplog):
    monkeypatch.setattr(nvml_module, "CLOSE_TIMEOUT_S", 0.2)
    m = make_pynvml_mock()
    m.nvmlDeviceResetGpuLockedClocks.side_effect = lambda h: hung.wait()
    m.nvmlShutdown.side_effect = lambda: hung.wait()
    caplog.set_level(logging.WARNING)
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        guard = GPUGuard(gpu, state_dir=tmp_path, restore_timeout_s=0.2, watchdog=False)
        opt = owning_optimizer(RankInfo(), gpu, MaxSpeedSource(1410), guard.acquire())
        opt.on_step_begin()
        opt.on_instruction_begin("forward")
        opt.on_instruction_end("forward")
        opt.on_step_end()
        with pytest.raises(GPUTimeoutError):
            opt.close()  # every step ran; the first failure is raised at the end
    assert opt.closed
    assert "nvmlShutdown" in caplog.text  # the GPU's close gave up on the hung shutdown too


CHILD = textwrap.dedent(
    """
    import sys, threading, time
    sys.path[:0] = [{helpers!r}, {repo!r}]
    from nvml_mock import make_pynvml_mock
    m = make_pynvml_mock()
    m.nvmlDeviceResetGpuLockedClocks.side_effect = lambda h: threading.Event().wait()
    sys.modules["pynvml"] = m
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU
    guard = GPUGuard(NVMLGPU(0), state_dir=sys.argv[1], restore_timeout_s=0.5, watchdog=False)
    guard.acquire().lock_sm_clocks_mhz(1005, 1005)
    open(sys.argv[2], "w").close()
    time.sleep(120)
    """
)
