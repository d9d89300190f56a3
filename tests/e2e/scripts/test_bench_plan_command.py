"""scripts/bench_plan_command.py on the smallest published case: the real command, timed."""

from __future__ import annotations

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_one_case_runs_the_command_and_reads_its_progress() -> None:
    args = ["--profiles", "bloom+a100_sxm_bf16", "--microbatches", "12"]
    proc = run_script("bench_plan_command", args)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("bloom+a100_sxm_bf16"))
    assert "12.32" in row and "10.5" in row  # the saving at no slowdown and the paper's
    assert "progress of bloom+a100_sxm_bf16 8x12" in proc.stdout
    assert last_line(proc).startswith("cases missing a target:")
