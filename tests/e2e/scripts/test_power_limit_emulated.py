"""scripts/power_limit_emulated.py: its choice matches the exhaustive best on every profile."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_script_matches_exhaustive_best_on_every_bundled_profile() -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[3] / "scripts" / "power_limit_emulated.py"
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1] == "all_match=True cases=32"
