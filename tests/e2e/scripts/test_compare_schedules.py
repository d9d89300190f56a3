"""scripts/compare_schedules.py on one schedule."""

from __future__ import annotations

import pytest

from tests.e2e.scripts._run import run_script

pytestmark = pytest.mark.e2e


def test_one_schedule_is_compared(tmp_path) -> None:
    table = tmp_path / "schedules.csv"
    proc = run_script(
        "compare_schedules", ["--microbatches", "16", "--schedules", "1F1B", "--csv", str(table)]
    )
    assert "1f1b" in proc.stdout
    rows = table.read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("1f1b,")
