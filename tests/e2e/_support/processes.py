"""Which processes are still alive for a run (Linux /proc), for "nothing left running" checks."""

from __future__ import annotations

from pathlib import Path
from typing import List


def processes_mentioning(text: str) -> List[str]:
    """Live processes whose command line or environment contains ``text``."""
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        for name in ("cmdline", "environ"):
            try:
                data = (proc_dir / name).read_bytes()
            except OSError:
                continue
            if text.encode() in data:
                found.append(proc_dir.name)
                break
    return found
