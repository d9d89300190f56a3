"""scripts/online_profiling_accuracy.py on a tiny pipeline: every bundled profile and a summary."""

from __future__ import annotations

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_every_profile_and_the_summary() -> None:
    args = ["--pp", "2", "--microbatches", "2", "--max-iterations", "10"]
    proc = run_script("online_profiling_accuracy", args)
    assert sum(" seed 0 iterations " in line for line in proc.stdout.splitlines()) >= 3
    assert last_line(proc).startswith("SUMMARY: max row error")
