"""scripts/bench_planner.py on one small published case at the fast effort."""

from __future__ import annotations

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_one_case_is_planned_and_judged() -> None:
    proc = run_script(
        "bench_planner",
        [
            "--cases",
            "published",
            "--profiles",
            "gpt3-175b+a100_sxm_bf16",
            "--microbatches",
            "12",
            "--efforts",
            "fast",
        ],
    )
    assert "gpt3-175b+a100_sxm_bf16 8x12" in proc.stdout
    assert last_line(proc).startswith("cases missing a target:")
