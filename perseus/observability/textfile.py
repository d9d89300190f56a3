"""A job without a coordination server publishes its live snapshot as files, from a thread.

:class:`TextfilePublisher` calls its source every ``interval_s`` on a thread of its own and
writes, atomically, into one directory (``metrics.textfile_dir``):

* ``<name>.prom``: the snapshot's Prometheus metrics (:mod:`perseus.observability.prometheus`)
  for node_exporter's textfile collector (``--collector.textfile.directory``);
* ``<name>.live.json``: the snapshot itself, for a server started with ``server.live_dir`` on
  the same directory (its ``/metrics`` and live page show the job).

``<name>`` is the job's name made safe for a file name (letters, digits, ``.``, ``_``, ``-``)
with a short hash of the name, so that two names never share a file. A source that raises skips
that write. A directory that cannot be written, or a missing ``prometheus_client`` (the
``metrics`` extra, for the ``.prom`` file), costs one warning naming the fix; the JSON file is
still written where it can be, and whatever is published never affects the job itself. At
:meth:`~TextfilePublisher.close` the last snapshot is written once more, marked retired.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Callable, Optional

from perseus.errors import ExtraMissingError
from perseus.formats.atomic_file import write_json_atomic
from perseus.observability.snapshot import JobSnapshot, snapshot_from_json, snapshot_to_json

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "perseus-live/1"
SNAPSHOT_SUFFIX = ".live.json"
TEXTFILE_SUFFIX = ".prom"


def file_stem(name: str) -> str:
    """A file name for ``name``: its safe characters and a hash of the whole name."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"perseus_{safe[:80]}_{digest}"


def write_snapshot_file(path: Path, snapshot: JobSnapshot) -> Path:
    """Write ``snapshot`` as ``{"format": ..., "snapshot": ...}`` (atomically).

    World-readable, as the textfile beside it: a server or node_exporter of another user reads
    them.
    """
    body = {"format": SNAPSHOT_FORMAT, "snapshot": snapshot_to_json(snapshot)}
    written = write_json_atomic(path, body)
    written.chmod(0o644)
    return written


def read_snapshot_file(path: Path) -> JobSnapshot:
    """The snapshot :func:`write_snapshot_file` wrote.

    Raises:
        ValueError: not such a file (the reason names the field).
        OSError: it cannot be read.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"not a {SNAPSHOT_FORMAT} file (its 'format' key)")
    return snapshot_from_json(data.get("snapshot"))


class TextfilePublisher:
    """Writes a job's snapshot into ``directory`` every ``interval_s`` (see the module).

    Args:
        directory: Where the files go (``metrics.textfile_dir``).
        name: The job's name (the files are named after it).
        source: The snapshot now (``None``: nothing to publish yet).
        interval_s: Seconds between writes.
        start: Start the thread now (tests call :meth:`publish` themselves).
    """

    def __init__(
        self,
        directory: Path,
        name: str,
        source: Callable[[], Optional[JobSnapshot]],
        interval_s: float = 5.0,
        *,
        start: bool = True,
    ) -> None:
        self.directory = Path(directory)
        stem = file_stem(name)
        self.textfile = self.directory / (stem + TEXTFILE_SUFFIX)
        self.jsonfile = self.directory / (stem + SNAPSHOT_SUFFIX)
        self.source = source
        self.interval_s = max(0.05, float(interval_s))
        self.writes = 0
        self.warned = False
        self._no_client = False
        self._last: Optional[JobSnapshot] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if start:
            self._thread = threading.Thread(
                target=self._run, daemon=True, name=f"perseus-textfile-{stem}"
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()

    def publish(self, snapshot: Optional[JobSnapshot] = None) -> bool:
        """Write ``snapshot`` (default: the source's) now; False when nothing was written."""
        if snapshot is None:
            try:
                snapshot = self.source()
            except Exception as exc:  # the job's state mid-change: the next write will do
                logger.debug("live snapshot not taken: %s", exc)
                return False
        if snapshot is None:
            return False
        self._last = snapshot
        wrote = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_snapshot_file(self.jsonfile, snapshot)
            wrote = True
            if not self._no_client:
                from perseus.observability.prometheus import write_textfile

                write_textfile(self.textfile, [snapshot])
        except ExtraMissingError as exc:
            self._no_client = True
            self._warn(f"{exc}; only {self.jsonfile.name} is written")
        except OSError as exc:
            self._warn(
                f"cannot write into {self.directory} ({exc}); make it writable for this "
                "process or set metrics.textfile_dir elsewhere"
            )
        self.writes += int(wrote)
        return wrote

    def _warn(self, what: str) -> None:
        if not self.warned:
            self.warned = True
            logger.warning("Perseus metrics textfile: %s (the job goes on)", what)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and write the last snapshot once more, marked retired."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        last = None
        try:
            last = self.source()
        except Exception as exc:
            logger.debug("last live snapshot not taken: %s", exc)
        last = last or self._last
        if last is not None:
            gpus = tuple(dataclasses.replace(g, power_w=None) for g in last.gpus)
            self.publish(dataclasses.replace(last, retired=True, gpus=gpus))
