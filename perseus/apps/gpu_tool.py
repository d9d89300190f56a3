"""``perseus-gpu``: GPU housekeeping outside a job.

    perseus-gpu restore [--state-dir DIR ...] [--all-users]   # job epilog
    perseus-gpu doctor [--apply]                              # same as perseus-doctor

``restore`` puts back every GPU that a dead Perseus process left with locked clocks or a
changed power limit (opening each by the UUID its state file recorded, whatever
``CUDA_VISIBLE_DEVICES`` says), removes the dead owners' lock files, and reports and sets aside
damaged state files. GPUs whose owner is alive are left alone. Run it in a scheduler's job
epilog: it covers the case where the whole job, watchdog included, was killed at once.
Exit status 0 when nothing is left to restore, 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import logging
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence


def state_dirs(explicit: Sequence[Path], all_users: bool) -> List[Path]:
    """The state dirs to scan: the given ones, else this user's default (plus every user's)."""
    from perseus.gpu.guard.files import default_state_dir

    dirs = list(explicit) or [default_state_dir()]
    if all_users:
        pattern = [str(Path(tempfile.gettempdir()) / "perseus-*"), "/run/user/*/perseus"]
        dirs += [Path(p) for pat in pattern for p in sorted(glob.glob(pat))]
    unique: List[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def restore(dirs: Sequence[Path]) -> int:
    """Restore what dead owners left in ``dirs``; prints a summary, returns the exit status."""
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU

    left = 0
    for directory in dirs:
        restored = GPUGuard.recover_stale(
            directory, lambda index: NVMLGPU(index), NVMLGPU.from_uuid
        )
        waiting = sorted(directory.glob("*.state.json")) if directory.is_dir() else []
        left += len(waiting)
        note = f"; {len(waiting)} still recorded (owner alive, or restoring failed)"
        print(f"{directory}: restored {restored} GPU(s)" + (note if waiting else ""))
    return 0 if left == 0 else 1


def main(argv: Optional[List[str]] = None) -> int:
    """Console entry point of ``perseus-gpu``."""
    parser = argparse.ArgumentParser(prog="perseus-gpu", description="Perseus GPU housekeeping.")
    sub = parser.add_subparsers(dest="command", required=True)
    rest = sub.add_parser("restore", help="restore GPUs left changed by dead Perseus processes")
    rest.add_argument("--state-dir", type=Path, action="append", default=[])
    rest.add_argument(
        "--all-users", action="store_true", help="also scan every user's default state dir"
    )
    doc = sub.add_parser("doctor", help="check this node's GPUs (perseus-doctor)")
    doc.add_argument("--apply", action="store_true")
    doc.add_argument("--probe-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="perseus-gpu: %(message)s")
    if args.command == "restore":
        return restore(state_dirs(args.state_dir, args.all_users))
    from perseus.apps.doctor import run_doctor

    return run_doctor(apply=args.apply, probe_s=args.probe_s)


if __name__ == "__main__":
    sys.exit(main())
