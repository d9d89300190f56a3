"""Before a sweep goes to Slurm: the cluster must have accounting, or the sweep never ends.

Hydra's submitit launcher (``hydra/launcher=perseus_slurm``) sees a run end when its result
file appears, or through ``sacct`` when it ended without one (cancelled, out of time or memory,
a node lost). Where Slurm keeps no accounting, ``sacct`` fails on every call, the launcher
ignores the failure and polls again with growing intervals: one run that ends without its
result keeps ``perseus-train -m`` waiting forever, and ``sweep_summary.csv`` is never written.
:class:`SlurmAccountingCheck` (a Hydra callback in ``perseus_train.yaml``) asks ``sacct`` once
before anything is submitted and stops the sweep with one message and what to do instead.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Optional

from hydra.experimental.callback import Callback

SACCT_TIMEOUT_S = 60.0
EXIT_CODE = 2  # as every refusal of perseus-train


def uses_slurm(config: Any) -> bool:
    """Whether the multirun's launcher submits to Slurm (submitit's Slurm launcher)."""
    target = str(config.hydra.launcher.get("_target_", "") or "")
    return "submitit" in target and target.endswith("SlurmLauncher")


def accounting_problem(timeout_s: float = SACCT_TIMEOUT_S) -> Optional[str]:
    """Why ``sacct`` cannot follow jobs here, or ``None`` when it answers."""
    command = ["sacct", "--noheader", "--parsable2", "--allocations", "-j", "1", "-o", "JobID"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return "there is no `sacct` command on this machine (submit from a Slurm login node)"
    except subprocess.TimeoutExpired:
        return f"`sacct` did not answer within {timeout_s:g} s"
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout).strip().splitlines()
    return f"`sacct` fails ({said[0] if said else f'exit status {done.returncode}'})"


def refusal(problem: str) -> str:
    """The message that stops a sweep submitted where jobs cannot be followed."""
    return (
        f"hydra/launcher=perseus_slurm cannot follow its jobs on this cluster: {problem}. Hydra's "
        "submitit launcher learns from Slurm's accounting that a job ended without its result "
        "(cancelled, out of time or memory, a node lost): without it, one such run keeps the "
        "sweep waiting forever and sweep_summary.csv is never written. Nothing was submitted. "
        "Ask the cluster's administrators to enable accounting (slurmdbd, "
        "AccountingStorageType=accounting_storage/slurmdbd in slurm.conf), or run the whole "
        "sweep inside one allocation with Hydra's default launcher, the runs one after another: "
        "sbatch --gpus-per-node=<GPUs> --wrap 'perseus-train -m ...'"
    )


class SlurmAccountingCheck(Callback):  # type: ignore[misc]
    """Hydra callback: refuse a Slurm sweep where ``sacct`` does not answer."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        """Ask ``sacct`` once before the launcher submits anything."""
        if not uses_slurm(config):
            return
        problem = accounting_problem()
        if problem is None:
            return
        sys.stderr.write(f"perseus-train: error: {refusal(problem)}\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CODE)
