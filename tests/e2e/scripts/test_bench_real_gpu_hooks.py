"""scripts/bench_real_gpu_hooks.py as a command: without CUDA it says it needs a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.gpu.test_bench_real_gpu_hooks import REPO, SCRIPT

pytestmark = pytest.mark.e2e


def test_without_cuda_it_says_it_needs_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is usable here")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=str(REPO)
    )
    assert proc.returncode == 2
    assert "needs a real NVIDIA GPU" in proc.stderr
