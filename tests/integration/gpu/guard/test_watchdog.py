"""The watchdog restores a rank's GPU when the rank dies by SIGKILL or SIGABRT.

The rank is a child process that takes its GPU through a guard, which starts the real
watchdog process (``python -m perseus.gpu.guard.watchdog``). Both processes get the autospec'd
pynvml through a ``sitecustomize`` module on ``PYTHONPATH`` (the standard start-up hook), and
each writes the NVML calls it made when it exits. The rank is then killed; the watchdog alone
must restore the GPU, with exact calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List
from unittest.mock import call

import pytest

from tests.unit.gpu.nvml_mock import uuid_of, uuid_opening_calls

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
HELPERS = REPO / "tests" / "unit" / "gpu"  # nvml_mock.py

SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, json, os, sys
    out = os.environ.get("PERSEUS_TEST_NVML_CALLS")
    if out:
        sys.path[:0] = [{helpers!r}, {repo!r}]
        from nvml_mock import make_pynvml_mock
        nvml = make_pynvml_mock(power_limit_mw=350_000)
        sys.modules["pynvml"] = nvml

        def _dump():
            with open(os.path.join(out, "calls-%d.json" % os.getpid()), "w") as f:
                json.dump([repr(c) for c in nvml.mock_calls], f)

        atexit.register(_dump)
    """
)

RANK = textwrap.dedent(
    """
    import sys, time
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU
    from perseus.gpu.guard import watchdog
    state_dir, ready, mode = sys.argv[1:4]
    guard = GPUGuard(NVMLGPU(0), state_dir=state_dir).acquire()
    guard.lock_sm_clocks_mhz(1005, 1005)
    guard.set_power_limit_mw(300_000)
    with open(ready, "w") as f:
        f.write(str(watchdog._watchdogs[__import__("os").getpid()][0].pid))
    if mode == "exit":
        guard.release()
        sys.exit(0)
    time.sleep(120)
    """
)


def _start_rank(tmp_path: Path, mode: str):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(helpers=str(HELPERS), repo=str(REPO))
    )
    calls, state, ready = tmp_path / "calls", tmp_path / "state", tmp_path / "ready"
    calls.mkdir()
    (tmp_path / "rank.py").write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["PERSEUS_TEST_NVML_CALLS"] = str(calls)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "rank.py"), str(state), str(ready), mode], env=env
    )
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        assert proc.poll() is None or mode == "exit", "the rank died before it was ready"
        assert time.monotonic() < deadline, "the rank never became ready"
        time.sleep(0.02)
    return proc, int(ready.read_text()), calls, state


def _watchdog_calls(calls: Path, pid: int) -> List[str]:
    out = calls / f"calls-{pid}.json"
    deadline = time.monotonic() + 60  # a hang guard only
    while True:  # until the writer has closed it: a file seen mid-write does not parse yet
        try:
            return json.loads(out.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            assert time.monotonic() < deadline, "the watchdog never finished"
            time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGABRT], ids=["SIGKILL", "SIGABRT"])
def test_watchdog_restores_after_the_rank_is_killed(tmp_path, signum):
    proc, watchdog_pid, calls, state = _start_rank(tmp_path, "sleep")
    assert (state / f"{uuid_of(0)}.state.json").exists()
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == -signum
    expected = [
        *uuid_opening_calls(0),
        call.nvmlDeviceResetGpuLockedClocks("handle-0"),
        call.nvmlDeviceGetPowerManagementLimitConstraints("handle-0"),
        call.nvmlDeviceSetPowerManagementLimit("handle-0", 350_000),
        call.nvmlShutdown(),
    ]
    assert _watchdog_calls(calls, watchdog_pid) == [repr(c) for c in expected]
    assert list(state.iterdir()) == []  # state restored, the dead rank's lock file removed


def test_watchdog_does_nothing_after_a_clean_exit(tmp_path):
    proc, watchdog_pid, calls, state = _start_rank(tmp_path, "exit")
    assert proc.wait(timeout=60) == 0
    assert _watchdog_calls(calls, watchdog_pid) == []
    assert list(state.iterdir()) == []
