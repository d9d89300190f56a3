"""scripts/main_job_figures.py on a small main job: its figures."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import run_script

pytestmark = pytest.mark.e2e

SMALL = [
    "parallelism.pp=2",
    "parallelism.num_microbatches=4",
    "gpu=emulated",
    "gpu.emulated.time_scale=0.3",
    "profiler.baseline_steps=3",
    "profiler.measure_steps=4",
]


def test_prints_the_small_jobs_figures() -> None:
    proc = run_script("main_job_figures", SMALL)
    assert re.search(r"^wall_s=\d+\.\d$", proc.stdout, re.M), proc.stdout
    assert "baseline: {" in proc.stdout and "plan: {" in proc.stdout
