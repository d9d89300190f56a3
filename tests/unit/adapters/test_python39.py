"""The adapters import and run on Python 3.9 (Merak's interpreter), where one is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _python39() -> str:
    found = os.environ.get("PERSEUS_PYTHON39") or shutil.which("python3.9")
    if not found:
        pytest.skip("no python3.9 interpreter (set PERSEUS_PYTHON39 to one)")
    env = dict(os.environ, PYENV_VERSION=os.environ.get("PYENV_VERSION", "3.9.18"))
    probe = subprocess.run(
        [found, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if probe.returncode != 0 or "(3, 9)" not in probe.stdout:
        pytest.skip(f"{found} is not a working Python 3.9")
    return found


def test_adapters_run_on_python39() -> None:
    python = _python39()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYENV_VERSION="3.9.18")
    done = subprocess.run(
        [python, str(Path(__file__).with_name("py39_smoke.py")), str(REPO)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()[:2]
    assert first.startswith("3.9.")
    assert "['S', '+forward', '-forward', '+backward', '-backward', 'E']" in first
    assert "stage=1, num_stages=2" in first
    assert second == "ok ['deepspeed', 'megatron', 'merak']"
