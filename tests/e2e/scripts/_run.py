"""Run a script of ``scripts/`` as a user does, with tiny arguments (test support)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def run_script(
    name: str,
    args: List[str],
    *,
    cwd: Optional[Path] = None,
    timeout_s: float = 600.0,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    """``python scripts/<name>.py ARGS``; fails the test with its output unless it exits 0."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    full_env.pop("PERSEUS_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last non-empty line the script printed."""
    return [line for line in proc.stdout.splitlines() if line.strip()][-1]
