"""A signal's restore in a real process whose driver call hangs still ends the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.unit.gpu.guard.test_bounded import CHILD, HELPERS, REPO
from tests.unit.gpu.nvml_mock import uuid_of

pytestmark = pytest.mark.integration


def test_sigterm_still_ends_the_process_when_the_driver_hangs(tmp_path):
    script, ready = tmp_path / "child.py", tmp_path / "ready"
    script.write_text(CHILD.format(helpers=str(HELPERS), repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "state"), str(ready)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "child died before it was ready"
        assert time.monotonic() < deadline, "child never became ready"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)  # a hang guard: the bound is 0.5 s
    assert proc.returncode == -signal.SIGTERM  # died the default way despite the hung driver
    assert "did not finish within 0.5 s" in stderr
    assert (tmp_path / "state" / f"{uuid_of(0)}.state.json").exists()  # left for recovery
