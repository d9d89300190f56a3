"""A process that exits restores the clocks (pynvml autospec'd in the child)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.unit.gpu.nvml_mock import (
    opening_calls,
)
from tests.unit.runtime.test_nvml_sequence import CHILD_EXIT, REPO, H

pytestmark = pytest.mark.integration


def test_interpreter_exit_restores_clocks(tmp_path: Path) -> None:
    out = tmp_path / "calls.txt"
    code = CHILD_EXIT.format(repo=str(REPO), out=str(out), state=str(tmp_path / "state"))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = [
        *opening_calls(0),
        mock.call.nvmlDeviceSetGpuLockedClocks(H, 1410, 1410),
        mock.call.nvmlDeviceResetGpuLockedClocks(H),
        mock.call.nvmlShutdown(),
    ]
    assert out.read_text().splitlines() == [repr(c) for c in expected] + [
        "off-sampler energy reads: []"
    ]
    assert list((tmp_path / "state").glob("*.state.json")) == []
