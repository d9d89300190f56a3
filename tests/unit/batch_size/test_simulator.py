from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.batch_size.trace import expected_costs, load_trace, simulate
from perseus.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "simulate_batch_size.py"
TRACE = ROOT / "perseus" / "batch_size" / "data" / "recurring_job_trace.csv"
LAST_LINE = re.compile(r"^best_batch_size=(\d+) chosen_batch_size=(\d+) regret=([0-9.]+)$")


def _run_script(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout


def test_shipped_trace_converges_to_the_best_batch_size() -> None:
    stdout = _run_script("--trace", str(TRACE))
    match = LAST_LINE.match(stdout.strip().splitlines()[-1])
    assert match, stdout
    best, chosen, regret = int(match[1]), int(match[2]), float(match[3])
    assert regret <= 0.05
    assert chosen == best == 256
    # the script is seeded: the same command prints the same thing
    assert _run_script("--trace", str(TRACE)) == stdout


def test_shipped_trace_has_batch_sizes_that_never_converge() -> None:
    trace = load_trace(TRACE)
    never = [b for b, runs in trace.items() if all(r.epochs_to_target is None for r in runs)]
    assert never == [2048, 4096]
    assert all(len(runs) >= 3 for runs in trace.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_other_seeds_also_converge(tmp_path: Path, seed: int) -> None:
    result = simulate(load_trace(TRACE), tmp_path / "bso.db", seed=seed)
    assert result.regret <= 0.05
    assert result.chosen_batch_size == result.best_batch_size
    tail = result.choices[-10:]
    assert tail.count(result.best_batch_size) >= 8


def test_mostly_unconvergent_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "batch_size,epochs_to_target,time_per_epoch_s,energy_per_epoch_j\n"
        "8,,10,1000\n8,,10,1000\n"
        "16,12,8,900\n16,14,8,900\n"
        "32,,6,800\n32,,6,800\n"
        "64,,5,700\n"
    )
    stdout = _run_script("--trace", str(trace), "--recurrences", "10", "--default-batch-size", "32")
    assert stdout.strip().splitlines()[-1] == (
        "best_batch_size=16 chosen_batch_size=16 regret=0.0000"
    )
    assert "never converges" in stdout
    costs = expected_costs(load_trace(trace), eta=0.5, max_power_w=300, max_epochs=100)
    assert math.isinf(costs[8]) and math.isinf(costs[64])


def test_bad_trace_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("batch_size,epochs_to_target,time_per_epoch_s\n8,1,2\n")
    with pytest.raises(ConfigError, match="missing column"):
        load_trace(trace)
    trace.write_text("batch_size,epochs_to_target,time_per_epoch_s,energy_per_epoch_j\n8,x,2,3\n")
    with pytest.raises(ConfigError, match="row 2"):
        load_trace(trace)


def test_shipped_trace_is_what_the_generator_makes(tmp_path: Path) -> None:
    out = tmp_path / "trace.csv"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_batch_size_trace.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert out.read_text() == TRACE.read_text()
