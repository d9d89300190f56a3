"""Jobs without a coordination server, as they publish themselves into ``server.live_dir``.

A job without a server (runtime modes ``plan``, ``measure``, ``max_speed``; the power-limit
optimizer; a recurring job) writes its snapshot as ``<name>.json`` beside its node_exporter
textfile (``metrics.textfile_dir``, :mod:`perseus.observability.textfile`). A server started
with ``server.live_dir`` on that directory shows those jobs read-only on ``/metrics`` and the
live page. Files are read when asked and kept until they change (modification time and size);
a file that is too large, not JSON or not a snapshot is skipped with one warning per version of
it; a snapshot older than ``server.live_retired_s`` is no longer shown.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from perseus.observability.snapshot import JobSnapshot
from perseus.observability.textfile import SNAPSHOT_FORMAT, SNAPSHOT_SUFFIX, read_snapshot_file

logger = logging.getLogger(__name__)

# Files read at most, and the largest file read (bytes).
MAX_FILES = 1000
MAX_FILE_BYTES = 1 << 20
# A local job's key on the page: this prefix and its file's name.
KEY_PREFIX = "local:"

Version = Tuple[int, int]


class LocalJobs:
    """The snapshots in one directory.

    Args:
        directory: ``server.live_dir`` (``None``: none).
        retired_s: Snapshots older than this are no longer shown.
    """

    def __init__(self, directory: Optional[Path], retired_s: float) -> None:
        self.directory = directory
        self.retired_s = retired_s
        self._kept: Dict[str, Tuple[Version, Optional[JobSnapshot]]] = {}
        self._warned: Set[Tuple[str, Version]] = set()
        self._lock = threading.Lock()  # scrapes and page polls read from worker threads

    def snapshots(self, now_s: float) -> List[Tuple[str, JobSnapshot]]:
        """``(key, snapshot)`` of every current file, by file name."""
        if self.directory is None:
            return []
        with self._lock:
            return self._snapshots(self.directory, now_s)

    def _snapshots(self, directory: Path, now_s: float) -> List[Tuple[str, JobSnapshot]]:
        try:
            entries = sorted(
                (e for e in os.scandir(directory) if e.name.endswith(SNAPSHOT_SUFFIX)),
                key=lambda e: e.name,
            )[:MAX_FILES]
        except OSError as exc:
            self._warn_once(str(directory), (0, 0), f"cannot list it: {exc}")
            return []
        out: List[Tuple[str, JobSnapshot]] = []
        seen = set()
        for entry in entries:
            seen.add(entry.name)
            snap = self._read(entry)
            if snap is not None and now_s - snap.updated_s <= self.retired_s:
                out.append((KEY_PREFIX + entry.name[: -len(SNAPSHOT_SUFFIX)], snap))
        for gone in set(self._kept) - seen:
            del self._kept[gone]
        return out

    def _read(self, entry: os.DirEntry) -> Optional[JobSnapshot]:  # type: ignore[type-arg]
        try:
            stat = entry.stat()
        except OSError:
            return None
        version = (stat.st_mtime_ns, stat.st_size)
        kept = self._kept.get(entry.name)
        if kept is not None and kept[0] == version:
            return kept[1]
        snap: Optional[JobSnapshot] = None
        if stat.st_size > MAX_FILE_BYTES:
            self._warn_once(entry.name, version, f"larger than {MAX_FILE_BYTES} bytes")
        else:
            try:
                snap = read_snapshot_file(Path(entry.path))
            except (OSError, ValueError, json.JSONDecodeError) as exc:
                self._warn_once(entry.name, version, str(exc))
        self._kept[entry.name] = (version, snap)
        return snap

    def _warn_once(self, name: str, version: Version, why: str) -> None:
        if (name, version) in self._warned:
            return
        self._warned.add((name, version))
        logger.warning(
            "server.live_dir: skipped %s (%s); it must be a %s snapshot as "
            "metrics.textfile_dir writes it",
            name,
            why,
            SNAPSHOT_FORMAT,
        )
