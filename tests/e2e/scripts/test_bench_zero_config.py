"""scripts/bench_zero_config.py with one server spawn and a three-step launch of two ranks."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_spawn_and_launch_figures() -> None:
    proc = run_script("bench_zero_config", ["--spawns", "1", "--steps", "3"])
    figures = dict(
        line.split("=", 1) for line in proc.stdout.splitlines() if re.match(r"^\w+=", line)
    )
    for key in ("server_spawn_s_median", "rank0_endpoint_s", "first_hook_to_ranks_registered_s"):
        assert float(figures[key].split()[0]) >= 0, key
    assert last_line(proc).startswith("later_step_s_median_without_perseus=")
