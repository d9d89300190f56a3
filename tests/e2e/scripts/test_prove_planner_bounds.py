"""scripts/prove_planner_bounds.py on one case for two seconds, into a scratch file."""

from __future__ import annotations

import json

import pytest

from tests.e2e.scripts._run import run_script

pytestmark = pytest.mark.e2e


def test_one_bound_is_proven_and_recorded(tmp_path) -> None:
    out = tmp_path / "bounds.json"
    args = ["--profiles", "gpt3-175b+a100_sxm_bf16", "--microbatches", "12"]
    proc = run_script("prove_planner_bounds", [*args, "--time-limit-s", "2", "--out", str(out)])
    assert "gpt3-175b+a100_sxm_bf16/12" in proc.stdout and "bound" in proc.stdout
    recorded = json.loads(out.read_text())
    assert list(recorded["cases"]) == ["gpt3-175b+a100_sxm_bf16/12"]
