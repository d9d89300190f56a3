"""The console scripts run as installed: perseus-doctor, perseus-gpu, perseus-train."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


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


def test_the_installed_perseus_train_prints_an_experiment() -> None:
    """The console script itself (every experiment is checked in-process by
    ``tests/unit/test_experiments.py``)."""
    exe = Path(sys.executable).parent / "perseus-train"
    proc = subprocess.run(
        [str(exe), "+experiment=sosp24/a100-gpt3-xl", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "name: gpt3-xl" in proc.stdout and "num_microbatches: 128" in proc.stdout
