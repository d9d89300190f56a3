"""scripts/bench_hooks.py runs and ends with its contract line (timing is its job, not ours)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import SCRIPTS, load_script

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]
SCRIPT = SCRIPTS / "bench_hooks.py"


def test_bench_hooks_prints_hook_overhead_last() -> None:
    small = ["--iterations", "3", "--microbatches", "4", "--rounds", "2", "--online-s", "15"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *small],
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
    assert re.search(r"^  plan .*best of 2 runs: ", proc.stdout, re.M), proc.stdout
    assert "online job 2, iterations per phase" in proc.stdout
    assert "null GPU, instructions taking their time" in proc.stdout  # the after-wait reference


def test_a_mode_counts_its_best_run_of_enough_iterations() -> None:
    bench = load_script("bench_hooks")
    runs = []
    for hooks_us, num in ((9.0, 6), (4.0, 2), (7.0, 5)):
        costs = bench.Costs()
        for _ in range(num):
            costs.add("running", (hooks_us / 2, hooks_us, 1.0))
        runs.append(costs)
    ((line, figure),) = bench.round_lines("online", runs)
    assert figure == 7.0  # the best run with at least MIN_COUNTED iterations, not the 2-run one
    assert "best of 3 runs: 9.00, (4.00: 2 iterations), 7.00" in line
    ((_, alone),) = bench.round_lines("online", [runs[1]])
    assert alone is None  # too few iterations anywhere: not counted
