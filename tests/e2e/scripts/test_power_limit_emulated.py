"""scripts/power_limit_emulated.py: its choice matches the exhaustive best (one profile here)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_script_matches_exhaustive_best_on_a_bundled_profile() -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[3] / "scripts" / "power_limit_emulated.py"
    out = subprocess.run(
        [sys.executable, str(script), "--profiles", "gpt3-175b+a100_sxm_bf16"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "all_match=True cases=8"
    assert lines[-2] == "kept_highest=0" and lines[-3].startswith("intervals_hold=")
