"""scripts/compare_batch_size_zeus.py with tiny arguments: it prints the regret table and its
summary line."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import last_line, run_script
from tests.unit.batch_size.test_replay import DATA

pytestmark = pytest.mark.e2e

LAST = re.compile(
    r"mean_regret=(?P<mean>\d\.\d{4}) worst_regret=(?P<worst>\d\.\d{4}) "
    r"worst_case_mean=(?P<case>\d\.\d{4}) "
    r"zeus_mean_regret=(?P<zmean>\d\.\d{4}) zeus_worst_regret=(?P<zworst>\d\.\d{4}) "
    r"max_cost_vs_zeus=(?P<ratio>[+-]\d\.\d{4}) broken=(?P<broken>\d+)"
)


def test_compare_script_prints_the_regret_table() -> None:
    proc = run_script(
        "compare_batch_size_zeus",
        [
            "--trace-dir",
            str(DATA),
            "--jobs",
            "sentiment140",
            "--seeds",
            "2",
            "--held-out",
            "sentiment140",
            "--synthetic-gpus",
            "1",
        ],
    )
    rows = [line for line in proc.stdout.splitlines() if line.startswith("sentiment140 (h)")]
    assert len(rows) == 2  # the recorded GPU and one synthetic GPU
    assert "64@175W" in rows[0]  # the best fixed choice of that job on the V100
    assert "== synthetic-1 (synthetic GPU 1: limits x" in proc.stdout
    assert "all 2 (GPU, job) cases" in proc.stdout
    match = LAST.fullmatch(last_line(proc))
    assert match, last_line(proc)
    assert match["broken"] == "0"
    # a case's mean is never above the worst seed of all, nor the mean of cases above the worst
    assert 1.0 <= float(match["mean"]) <= float(match["case"]) <= float(match["worst"])
    assert float(match["zmean"]) <= float(match["zworst"])
