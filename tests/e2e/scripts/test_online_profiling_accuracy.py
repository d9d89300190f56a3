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


def test_the_iterations_the_target_needs() -> None:
    """--target-ms: the realistic counter, one length, a tiny pipeline: one line and a summary."""
    args = ["--target-ms", "200", "--pp", "2", "--microbatches", "2", "--frequency-step", "10"]
    proc = run_script("online_profiling_accuracy", args)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("forward 200 ms seed 0:")]
    assert "target reached" in line and "rows above 2 %: 0 of" in line
    assert last_line(proc).startswith("TARGET: at most")
