"""scripts/fit_emulated_gpu.py on the H100 recordings: every fit it prints."""

from __future__ import annotations

import pytest

from tests.e2e.scripts._run import run_script

pytestmark = pytest.mark.e2e


def test_fits_the_recordings() -> None:
    proc = run_script("fit_emulated_gpu", [])
    for probe in ("probe3", "probe4"):
        assert f"{probe} steady:" in proc.stdout
