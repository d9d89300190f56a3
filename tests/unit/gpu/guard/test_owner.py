"""GPUGuard: ownership, state files, restoration on exception / SIGTERM / SIGINT / SIGKILL.

NVML is an autospec'd pynvml (tests/unit/gpu/nvml_mock.py); the exact call sequence is checked.
Signal paths run in child processes that patch pynvml themselves and write their mock calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from unittest.mock import call

import pytest

from perseus.errors import GPUOwnershipError, GPUPermissionError
from perseus.gpu.guard.files import default_state_dir
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from tests.unit.gpu.nvml_mock import (
    make_pynvml_mock,
    no_permission,
    opening_calls,
    patched_pynvml,
    uuid_of,
    write_dead_owner_state,
)

H0 = "handle-0"
REPO = Path(__file__).resolve().parents[4]
HELPERS = Path(__file__).resolve().parents[1]  # nvml_mock.py
STATE_NAME = f"{uuid_of(0)}.state.json"

# What a guard that locked 1410 MHz and set 300 W does, then what restoring does.
CHANGE_CALLS = [
    call.nvmlDeviceSetGpuLockedClocks(H0, 1410, 1410),
    call.nvmlDeviceGetPowerManagementLimit(H0),
    call.nvmlDeviceGetPowerManagementLimitConstraints(H0),
    call.nvmlDeviceSetPowerManagementLimit(H0, 300_000),
]
RESTORE_CALLS = [
    call.nvmlDeviceResetGpuLockedClocks(H0),
    call.nvmlDeviceSetPowerManagementLimit(H0, 350_000),
]


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_restores_after_exception(tmp_path):
    m = make_pynvml_mock(power_limit_mw=350_000)
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        with pytest.raises(RuntimeError, match="boom"), GPUGuard(gpu, state_dir=tmp_path) as g:
            g.lock_sm_clocks_mhz(1410, 1410)
            g.set_power_limit_mw(300_000)
            state = json.loads((tmp_path / STATE_NAME).read_text())
            raise RuntimeError("boom")
    assert m.mock_calls == [*opening_calls(0), *CHANGE_CALLS, *RESTORE_CALLS]
    assert state["pid"] == os.getpid()
    assert state["uuid"] == uuid_of(0)
    assert state["restore"] == {"reset_sm_clocks": True, "power_limit_mw": 350_000}
    assert not (tmp_path / STATE_NAME).exists()


def test_clock_changes_after_the_first_only_change_the_clock(tmp_path, monkeypatch):
    """A plan's per-instruction locks: one state file written before the first, none after,
    each later change exactly one NVML call; restoring still undoes the lock."""
    import perseus.gpu.guard.owner as guard_module

    writes = []
    real_write = guard_module.write_state

    def write_state(path, data):
        writes.append(data)
        real_write(path, data)

    monkeypatch.setattr(guard_module, "write_state", write_state)
    m = make_pynvml_mock(power_limit_mw=350_000)
    with patched_pynvml(m), GPUGuard(NVMLGPU(0), state_dir=tmp_path) as g:
        for mhz in (1410, 1200, 1005, 1200):
            g.lock_sm_clocks_mhz(mhz, mhz)
        state = json.loads((tmp_path / STATE_NAME).read_text())
    assert len(writes) == 1
    assert state["restore"] == {"reset_sm_clocks": True}
    assert m.mock_calls == [
        *opening_calls(0),
        *(call.nvmlDeviceSetGpuLockedClocks(H0, f, f) for f in (1410, 1200, 1005, 1200)),
        call.nvmlDeviceResetGpuLockedClocks(H0),
    ]
    assert not (tmp_path / STATE_NAME).exists()


def test_a_guard_that_let_go_owns_the_gpu_again_before_a_change(tmp_path):
    """Restoring failed, so the guard gave up the GPU with the SM lock still recorded: the
    next change takes the GPU again (another owner is refused) instead of changing it unowned."""
    m = make_pynvml_mock()
    with patched_pynvml(m):
        g = GPUGuard(NVMLGPU(0), state_dir=tmp_path)
        g.lock_sm_clocks_mhz(1410, 1410)
        m.nvmlDeviceResetGpuLockedClocks.side_effect = no_permission()
        with pytest.raises(GPUPermissionError):
            g.release()
        assert not g.acquired
        m.nvmlDeviceResetGpuLockedClocks.side_effect = None
        g.lock_sm_clocks_mhz(1200, 1200)
        assert g.acquired
        with pytest.raises(GPUOwnershipError):
            GPUGuard(NVMLGPU(0), state_dir=tmp_path).acquire()
        g.release()
    assert not (tmp_path / STATE_NAME).exists()


def test_second_owner_is_refused_with_holder_named(tmp_path):
    with patched_pynvml():
        first = GPUGuard(NVMLGPU(0), state_dir=tmp_path, owner="clock-controller").acquire()
        second = GPUGuard(NVMLGPU(0), state_dir=tmp_path, owner="power-limit-optimizer")
        with pytest.raises(GPUOwnershipError) as info:
            second.set_power_limit_mw(200_000)
        assert "'clock-controller'" in str(info.value)
        assert f"pid {os.getpid()}" in str(info.value)
        first.release()
        second.acquire()
        assert second.acquired
        second.release()


def test_permission_error_leaves_nothing_to_restore(tmp_path):
    m = make_pynvml_mock()
    m.nvmlDeviceSetGpuLockedClocks.side_effect = no_permission()
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        guard = GPUGuard(gpu, state_dir=tmp_path)
        with pytest.raises(GPUPermissionError, match="CAP_SYS_ADMIN"):
            guard.lock_sm_clocks_mhz(1410, 1410)
        assert not (tmp_path / STATE_NAME).exists()
        guard.release()
    assert m.mock_calls == [*opening_calls(0), call.nvmlDeviceSetGpuLockedClocks(H0, 1410, 1410)]


def test_dry_run_guard_makes_only_reads(tmp_path):
    m = make_pynvml_mock()
    with patched_pynvml(m), GPUGuard(NVMLGPU(0, dry_run=True), state_dir=tmp_path) as guard:
        guard.lock_sm_clocks_mhz(1200, 1200)
        guard.set_power_limit_mw(250_000)
        assert not (tmp_path / STATE_NAME).exists()
    assert m.mock_calls == [
        *opening_calls(0),
        call.nvmlDeviceGetPowerManagementLimit(H0),
        call.nvmlDeviceGetPowerManagementLimitConstraints(H0),
    ]


def test_emulated_gpu_guard_leaves_no_files(tmp_path):
    from perseus.gpu.emulated.device import (
        EmulatedGPU,
        default_device_profile_path,
        load_device_profile,
    )

    gpu = EmulatedGPU(load_device_profile(default_device_profile_path()), blocking_power_w=80.0)
    with GPUGuard(gpu, state_dir=tmp_path) as guard:
        guard.lock_sm_clocks_mhz(1005, 1005)
        guard.set_power_limit_mw(250_000)
        with pytest.raises(GPUOwnershipError):
            GPUGuard(gpu, state_dir=tmp_path).acquire()
        assert gpu.locked_sm_clocks_mhz == (1005, 1005)
    assert gpu.locked_sm_clocks_mhz is None
    assert gpu.power_limit_mw() == 482_000  # the default: the profile's heaviest instruction
    assert list(tmp_path.iterdir()) == []


def test_default_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_state_dir() == tmp_path / "perseus"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_state_dir().name == f"perseus-{os.getuid()}"


# -- child processes ---------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    sys.path[:0] = [{helpers!r}, {repo!r}]
    from nvml_mock import make_pynvml_mock
    m = make_pynvml_mock(power_limit_mw=350_000)
    sys.modules["pynvml"] = m
    mode, out, ready, state_dir = sys.argv[1:5]

    def dump(*_):
        with open(out, "w") as f:
            json.dump([repr(c) for c in m.mock_calls], f)
        os._exit(0)

    if mode == "chain":
        signal.signal(signal.SIGTERM, dump)
    if mode == "sigint":  # as in a terminal: a background job may have inherited SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "exit":  # registered first, so it runs after Perseus' own exit hook
        import atexit
        atexit.register(dump)
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU
    # No watchdog here: these tests check the in-process paths and recover_stale themselves
    # (tests/unit/gpu/guard/test_watchdog.py covers the watchdog).
    guard = GPUGuard(NVMLGPU(0), state_dir=state_dir, watchdog=False).acquire()
    guard.lock_sm_clocks_mhz(1410, 1410)
    guard.set_power_limit_mw(300_000)
    if mode == "exit":
        open(ready, "w").close()
        sys.exit(3)  # a normal exit without releasing the guard
    try:  # ready is announced inside: a signal that comes as the file appears is caught too
        open(ready, "w").close()
        time.sleep(60)
    except KeyboardInterrupt:
        dump()
    """
)


def _start_child(tmp_path: Path, mode: str):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(helpers=str(HELPERS), repo=str(REPO)))
    out, ready, state_dir = tmp_path / "calls.json", tmp_path / "ready", tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(out), str(ready), str(state_dir)], env=env
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None or mode == "exit", "child died before it was ready"
        assert time.monotonic() < deadline, "child never became ready"
        time.sleep(0.02)
    return proc, out, state_dir


def _expected_reprs(*groups):
    return [repr(c) for group in groups for c in group]


def test_guard_acquired_outside_main_thread_installs_no_handlers(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    errors = []

    def work():
        try:
            with patched_pynvml(), GPUGuard(NVMLGPU(0), state_dir=tmp_path) as guard:
                guard.lock_sm_clocks_mhz(1005, 1005)
                assert signal.getsignal(signal.SIGTERM) is before
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors
    assert not (tmp_path / STATE_NAME).exists()


def test_signal_handlers_installed_and_removed_in_main_thread(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with patched_pynvml(), GPUGuard(NVMLGPU(0), state_dir=tmp_path):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_recover_stale_skips_live_owner(tmp_path):
    m = make_pynvml_mock()
    with patched_pynvml(m):
        guard = GPUGuard(NVMLGPU(0), state_dir=tmp_path).acquire()
        guard.lock_sm_clocks_mhz(1005, 1005)
        assert GPUGuard.recover_stale(tmp_path, lambda i: NVMLGPU(i)) == 0
        assert (tmp_path / STATE_NAME).exists()
        guard.release()
        assert not (tmp_path / STATE_NAME).exists()


def test_acquire_restores_dead_owners_leftovers(tmp_path):
    write_dead_owner_state(tmp_path, {"reset_sm_clocks": True, "reset_memory_clocks": True})
    m = make_pynvml_mock()
    with patched_pynvml(m):
        GPUGuard(NVMLGPU(0), state_dir=tmp_path).acquire().release()
    assert m.mock_calls == [
        *opening_calls(0),
        call.nvmlDeviceResetGpuLockedClocks(H0),
        call.nvmlDeviceResetMemoryLockedClocks(H0),
    ]
    assert not (tmp_path / STATE_NAME).exists()


FORK_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{helpers!r}, {repo!r}]
    from nvml_mock import make_pynvml_mock
    sys.modules["pynvml"] = make_pynvml_mock()
    from perseus import process_exit
    from perseus.gpu.guard import restore_hooks
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.guard.files import LockFile
    from perseus.gpu.nvml.device import NVMLGPU
    guard = GPUGuard(NVMLGPU(0), state_dir=sys.argv[1], watchdog=False).acquire()
    guard.lock_sm_clocks_mhz(1005, 1005)
    pid = os.fork()
    if pid == 0:  # a data-loader worker: not the owner
        seen = {{
            "acquired": guard.acquired,
            "live": len(restore_hooks._live),
            "closers": len(process_exit._closers),
        }}
        with open(sys.argv[2], "w") as f:
            json.dump(seen, f)
        os._exit(0)
    os.waitpid(pid, 0)
    # The parent still owns the GPU: a second owner is refused.
    other = LockFile(guard._lock_file.path)
    print(json.dumps({{"parent_acquired": guard.acquired, "other": other.try_acquire()}}))
    guard.release()
    """
)
