"""scripts/bench_real_gpu_hooks.py: its statistics here; on a real GPU, its contract line."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import SCRIPTS, load_script

REPO = Path(__file__).resolve().parents[3]
SCRIPT = SCRIPTS / "bench_real_gpu_hooks.py"


@pytest.mark.parametrize("n", [24, 400])
def test_median_interval_covers_the_median_with_95_percent(n: int) -> None:
    median_ci95 = load_script("bench_real_gpu_hooks").median_ci95
    samples = [float(x) for x in range(n, 0, -1)]  # any order
    mid, low, high = median_ci95(samples)
    assert low < mid < high and mid == (n + 1) / 2
    # The interval [x(j), x(k)] holds the true median with probability P(j <= B < k) for
    # B ~ Binomial(n, 1/2) (j, k 1-based order statistics): at least 95 %, not far above.
    j, k = int(low), int(high)
    coverage = sum(math.comb(n, b) for b in range(j, k)) / 2**n
    assert 0.95 <= coverage < 0.99


@pytest.mark.gpu
def test_on_a_real_gpu_no_counter_read_comes_from_the_training_thread() -> None:
    small = ["--pairs-tiny", "20", "--pairs-big", "2", "--blocks", "1"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *small],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    pattern = (
        r"real_gpu_hook_overhead_us tiny=-?\d+\.\d big=-?\d+\.\d training_thread_reads=(\d+)"
        r" temperature_readings=(\d+)"
    )
    match = re.fullmatch(pattern, last)
    assert match, last
    assert match.group(1) == "0"  # neither the counter nor the temperature on that thread
    assert int(match.group(2)) > 0  # the sampler recorded the temperature


def test_the_sampler_reads_are_counted_by_thread() -> None:
    from tests.unit.gpu.nvml_mock import make_pynvml_mock

    bench = load_script("bench_real_gpu_hooks")
    nvml = make_pynvml_mock(temperature_c=45)
    reads = bench.count_sampler_reads(nvml)
    nvml.nvmlDeviceGetTotalEnergyConsumption("handle-0")
    assert nvml.nvmlDeviceGetTemperature("handle-0", 0) == 45
    assert reads == {"MainThread": 2}
