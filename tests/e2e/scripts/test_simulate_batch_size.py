"""scripts/simulate_batch_size.py with tiny arguments: it runs and prints its figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.batch_size.test_replay import POWER, TRAIN, _script

pytestmark = pytest.mark.e2e


def test_simulate_script_prints_recurrences_totals_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "trajectory.png"
    stdout = _script(
        "scripts/simulate_batch_size.py",
        "--train-trace",
        str(TRAIN),
        "--power-trace",
        str(POWER),
        "--job",
        "sentiment140",
        "--policy",
        "both",
        "--plot",
        str(plot),
    )
    rows = [line for line in stdout.splitlines() if re.match(r"^\s+\d+\s+\d+@\d+", line)]
    assert len(rows) == 2 * 70
    assert "best fixed choice: batch size 64 at 175 W" in stdout
    assert "default: batch size 128 at 250 W" in stdout
    assert re.search(r"^perseus: total cost .* regret vs best fixed \+0\.\d+", stdout, re.M)
    assert re.search(r"^zeus-nsdi23: total cost", stdout, re.M)
    assert plot.stat().st_size > 10_000
    # a job given by its fields, totals only
    stdout = _script(
        "scripts/simulate_batch_size.py",
        "--train-trace",
        str(TRAIN),
        "--power-trace",
        str(POWER),
        "--dataset",
        "squad",
        "--network",
        "bert_base_uncased",
        "--optimizer",
        "adamw",
        "--target-metric",
        "84",
        "--max-epochs",
        "6",
        "--default-batch-size",
        "32",
        "--quiet",
    )
    assert "perseus: total cost" in stdout and "98 recurrences" in stdout
