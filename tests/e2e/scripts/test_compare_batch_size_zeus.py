"""scripts/compare_batch_size_zeus.py with tiny arguments: it runs and prints its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.batch_size.test_replay import DATA, _script

pytestmark = pytest.mark.e2e


def test_compare_script_prints_the_table(tmp_path: Path) -> None:
    stdout = _script(
        "scripts/compare_batch_size_zeus.py",
        "--trace-dir",
        str(DATA),
        "--jobs",
        "sentiment140",
        "movielens-1m",
        "--seeds",
        "2",
    )
    lines = stdout.strip().splitlines()
    assert lines[-1] == "all_at_or_below_zeus=True broken=0"
    assert any(line.startswith("sentiment140") and "2/2" in line for line in lines)
