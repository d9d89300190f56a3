"""scripts/bench_adapter_overhead.py with tiny arguments: every adapter timed, its contract line."""

from __future__ import annotations

import re

import pytest

from tests.e2e.scripts._run import last_line, run_script

pytestmark = pytest.mark.e2e


def test_prints_every_adapters_overhead() -> None:
    proc = run_script("bench_adapter_overhead", ["--microbatches", "2", "--iterations", "20"])
    line = last_line(proc)
    assert re.fullmatch(r"adapter_overhead_us deepspeed=\S+ megatron=\S+ merak=\S+", line), line
