"""The examples under examples/ run as a user runs them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.batch_size.test_recurring import ROOT

pytestmark = pytest.mark.e2e


def test_the_example_script_runs_on_the_emulated_gpu(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "recurring_training.py"),
            "--db",
            str(tmp_path / "example.db"),
            "--runs",
            "3",
            "--gpu-backend",
            "emulated",
            "--time-scale",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    # The example measures real time: which batch sizes follow the default depends on this
    # machine's speed, so only the shape of its report is checked here.
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("run 1: batch size 64,")
    for i, line in enumerate(lines[1:], start=2):
        assert re.match(rf"run {i}: batch size (16|32|128|256),", line), line
    assert (tmp_path / "example.db").exists()
    assert (tmp_path / "example.db.power_limits.json").exists()
