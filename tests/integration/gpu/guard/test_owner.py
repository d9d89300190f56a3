"""GPUGuard in real processes: restored on SIGTERM, SIGINT, SIGKILL and at exit; a forked child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from unittest.mock import call

import pytest

from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from tests.unit.gpu.guard.test_owner import (
    CHANGE_CALLS,
    FORK_CHILD,
    H0,
    HELPERS,
    REPO,
    RESTORE_CALLS,
    STATE_NAME,
    _expected_reprs,
    _start_child,
)
from tests.unit.gpu.nvml_mock import (
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("mode", "signum"), [("chain", signal.SIGTERM), ("sigint", signal.SIGINT)])
def test_restores_on_signal_then_chains_to_previous_handler(tmp_path, mode, signum):
    proc, out, state_dir = _start_child(tmp_path, mode)
    assert (state_dir / STATE_NAME).exists()
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == 0  # the previous handler (or KeyboardInterrupt) ran
    calls = json.loads(out.read_text())
    assert calls == _expected_reprs(opening_calls(0), CHANGE_CALLS, RESTORE_CALLS)
    assert not (state_dir / STATE_NAME).exists()


def test_restores_at_normal_exit(tmp_path):
    proc, out, state_dir = _start_child(tmp_path, "exit")
    assert proc.wait(timeout=60) == 0  # the dump hook ends the process with os._exit(0)
    calls = json.loads(out.read_text())
    assert calls == _expected_reprs(opening_calls(0), CHANGE_CALLS, RESTORE_CALLS)
    assert not (state_dir / STATE_NAME).exists()


def test_sigterm_default_disposition_still_kills(tmp_path):
    proc, _out, state_dir = _start_child(tmp_path, "default")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not (state_dir / STATE_NAME).exists()  # restored before dying


def test_sigkill_leaves_state_that_recover_stale_restores(tmp_path):
    proc, _out, state_dir = _start_child(tmp_path, "default")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    state = json.loads((state_dir / STATE_NAME).read_text())
    assert state["pid"] == proc.pid

    m = make_pynvml_mock(power_limit_mw=300_000)
    with patched_pynvml(m):
        assert GPUGuard.recover_stale(state_dir, lambda i: NVMLGPU(i)) == 1
        assert GPUGuard.recover_stale(state_dir, lambda i: NVMLGPU(i)) == 0
    assert m.mock_calls == [
        *opening_calls(0),
        call.nvmlDeviceResetGpuLockedClocks(H0),
        call.nvmlDeviceGetPowerManagementLimitConstraints(H0),
        call.nvmlDeviceSetPowerManagementLimit(H0, 350_000),
        call.nvmlShutdown(),
    ]
    assert not (state_dir / STATE_NAME).exists()


def test_forked_child_neither_owns_nor_restores_the_gpu(tmp_path):
    script, seen = tmp_path / "fork.py", tmp_path / "child.json"
    script.write_text(FORK_CHILD.format(helpers=str(HELPERS), repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "state"), str(seen)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(seen.read_text()) == {"acquired": False, "live": 0, "closers": 0}
    assert json.loads(proc.stdout) == {"parent_acquired": True, "other": False}
