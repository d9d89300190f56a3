"""scripts/bench_preflight.py on its first two problems: each refused before any rank starts."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_two_problems_are_refused_before_launch() -> None:
    proc = run_script("bench_preflight", ["--cases", "2"])
    rows = [line for line in proc.stdout.splitlines() if " s  exit " in line]
    assert len(rows) == 2 and all("exit 2  started=no" in row for row in rows), rows
    assert re.fullmatch(r"slowest_preflight_s=\d+\.\d\d", last_line(proc))
