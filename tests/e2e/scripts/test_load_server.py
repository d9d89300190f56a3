"""scripts/load_server.py with one small job: it reaches watching with no failed request."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import run_script

pytestmark = pytest.mark.e2e


def test_a_small_job_is_served_to_the_end() -> None:
    args = ["--jobs", "1", "--pp", "2", "--dp", "2", "--microbatches", "4"]
    args += ["--max-iterations", "10", "--iteration-s", "0.1", "--after-steps", "3"]
    proc = run_script("load_server", [*args, "--limit-s", "300"])
    assert re.search(r"requests: \d+ .*failed: 0$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^load-0: .*watching at .*failure None", proc.stdout, re.M), proc.stdout
