"""The Merak environment (``scripts/merak-env``) for tests that run code in it.

Merak needs Python 3.9, torch 1.10 and a clone of github.com/ml-energy/merak-zeus, which CI cannot
download; ``scripts/merak-env`` builds the environment from a clone. Tests that need it call
:func:`merak_python`: where the environment is incomplete they skip, or with
``PERSEUS_REQUIRE_MERAK=1`` (the test command of docs/frameworks/merak.md, CI when the clone
exists) they fail with what is missing and the fix.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
REQUIRE_ENV = "PERSEUS_REQUIRE_MERAK"
# What a Merak rank imports; a broken pin shows up here with the module's own error.
PROBE = (
    "import Merak, zeus.optimizer.pipeline_frequency, torch, perseus.adapters, pynvml\n"
    "assert torch.__version__.startswith('1.10.'), torch.__version__\n"
)


@functools.lru_cache(maxsize=1)
def _find() -> tuple:
    """``(python, problem)``: the interpreter, or why there is none usable."""
    check = subprocess.run(
        [str(REPO / "scripts" / "merak-env"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        return None, check.stderr.strip() or check.stdout.strip()
    python = check.stdout.strip().splitlines()[-1]
    probe = subprocess.run(
        [python, "-W", "ignore", "-c", PROBE],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        error = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return None, (
            f"the Merak environment {python} cannot import what Merak ranks need: {error}. "
            "Fix: rebuild it (delete that environment's folder, then run scripts/merak-env)"
        )
    return python, ""


def merak_python() -> str:
    """The Merak environment's interpreter; skips (or fails, see module doc) without one."""
    python, problem = _find()
    if python is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"real-Merak tests cannot run: {problem}", pytrace=False)
        pytest.skip(f"no Merak environment ({problem}); {REQUIRE_ENV}=1 makes this a failure")
    return str(python)
