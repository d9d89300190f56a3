"""scripts/bench_hooks.py runs and ends with its contract line (timing is its job, not ours)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_bench_hooks_prints_hook_overhead_last() -> None:
    script = REPO / "scripts" / "bench_hooks.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--iterations", "3", "--microbatches", "4"],
        capture_output=True,
        text=True,
        timeout=900,  # a hang, never a slow machine: it takes seconds
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"hook_overhead_us=\d+\.\d+", lines[-1]), lines[-1]
    assert float(lines[-1].split("=")[1]) > 0
    assert "8 clock changes/iteration" in proc.stdout  # the plan changes clock at every pair
