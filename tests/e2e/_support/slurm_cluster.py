"""The local two-node Slurm cluster (``scripts/local-slurm up``) for the tests that submit to it.

:func:`cluster` answers where the cluster is; without one the tests skip, or with
``PERSEUS_REQUIRE_SLURM=1`` (CI, where ``scripts/local-slurm up`` succeeded) they fail with what
is missing. Jobs get the test's environment (sbatch passes it on) with this checkout's ``.venv``
first on ``PATH``. Every wait here is bounded by a generous limit and never part of what a test
asserts.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[3]
REQUIRE_ENV = "PERSEUS_REQUIRE_SLURM"
NODES = ("n1", "n2")
VENV_BIN = Path(sys.executable).parent
# The stand-in NVML of the nodes' emulated GPUs (see nvml_driver/sitecustomize.py).
NVML_SITE = Path(__file__).resolve().parent / "nvml_driver"
DONE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
JOB_WAIT_S = 840.0  # a hang guard (pytest stops a test at 900 s); a job here takes minutes


@dataclass(frozen=True)
class Cluster:
    """Where the local cluster keeps what the tests look at.

    Attributes:
        state_dir: ``scripts/local-slurm``'s directory (``LOCAL_SLURM_DIR``).
    """

    state_dir: Path

    @property
    def epilog_log(self) -> Path:
        """What the job epilog wrote."""
        return self.state_dir / "log" / "epilog.log"

    def nvml_dir(self, node: str) -> Path:
        """Where the stand-in NVML keeps node ``node``'s GPU settings."""
        return self.state_dir / "nvml" / node


@functools.lru_cache(maxsize=1)
def _find() -> tuple:
    """``(Cluster, problem)``: the cluster, or why there is none usable."""
    try:
        info = run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        config = run(["scontrol", "show", "config"], check=False)
    except FileNotFoundError:
        return None, "Slurm is not installed (sudo scripts/local-slurm up installs and starts it)"
    if info.returncode != 0:
        return (
            None,
            f"no Slurm controller answers ({info.stderr.strip()}): sudo scripts/local-slurm up",
        )
    states = dict(line.split() for line in info.stdout.splitlines() if line.strip())
    bad = {n: states.get(n, "missing") for n in NODES if not _usable(states.get(n, ""))}
    if bad:
        return None, f"nodes not usable: {bad} (sudo scripts/local-slurm up)"
    epilog = next(
        (
            line.split("=", 1)[1].strip()
            for line in config.stdout.splitlines()
            if line.split("=", 1)[0].strip() == "Epilog"
        ),
        "",
    )
    if "accounting_storage/slurmdbd" not in config.stdout or not epilog.endswith("/epilog"):
        return None, "the cluster is not the one scripts/local-slurm sets up (accounting, epilog)"
    return Cluster(Path(epilog).parent), ""


def _usable(state: str) -> bool:
    return state.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")


def cluster() -> Cluster:
    """The local cluster; skips (or fails, see the module docstring) without one."""
    found, problem = _find()
    if found is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"the Slurm tests cannot run: {problem}", pytrace=False)
        pytest.skip(f"no local Slurm cluster ({problem}); {REQUIRE_ENV}=1 makes this a failure")
    return found


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A user's environment for jobs: this checkout's .venv first, no Perseus settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "SLURM_"))}
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.update(extra or {})
    return env


def run(
    cmd: Sequence[str],
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    timeout_s: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run a command; with ``check`` a failure shows its output."""
    done = subprocess.run(
        list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def sbatch(args: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None) -> str:
    """Submit a batch job; returns its id."""
    return run(["sbatch", "--parsable", *args], cwd=cwd, env=env or job_env()).stdout.strip()


def job_state(job_id: str) -> str:
    """The job's state in Slurm's accounting (``""`` before it is recorded)."""
    out = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False).stdout
    states = [line.split()[0] for line in out.splitlines() if line.strip()]
    return states[0] if states else ""


def wait_for_job(job_id: str, timeout_s: float = JOB_WAIT_S) -> str:
    """Wait until the job ended and left the queue; returns its final state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = job_state(job_id)
        queued = run(["squeue", "-h", "-j", job_id], check=False).stdout.strip()
        if state.startswith(DONE_STATES) and not queued:
            return state
        assert time.monotonic() < deadline, f"job {job_id} still {state or 'unknown'}"
        time.sleep(1.0)


def wait_for(what: str, probe, timeout_s: float = 300.0):  # type: ignore[no-untyped-def]
    """Poll ``probe()`` until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.5)


def epilog_lines(cluster: Cluster, job_id: str) -> List[str]:
    """What the epilog wrote for the job, once it finished (waits for it)."""

    def finished() -> Optional[List[str]]:
        text = cluster.epilog_log.read_text() if cluster.epilog_log.exists() else ""
        lines: List[str] = []
        for line in text.splitlines():  # each epilog writes its lines at once
            if line.startswith(f"epilog: job {job_id} ended"):
                lines = [line]
            elif lines:
                lines.append(line)
                if line.startswith(f"epilog: job {job_id} done"):
                    return lines
        return None

    return wait_for(f"the epilog of job {job_id}", finished)
