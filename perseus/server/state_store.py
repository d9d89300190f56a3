"""The server's state on disk: ``<dump_dir>/state.sqlite``, so that a restart loses nothing.

What is kept, per job: its spec; every rank registration (a leader's with its peers); the job's
state (phase, failure, the baseline and the plan's measurements, the sweeps of every stage with
every assigned step, the plan epochs, the straggler watcher, the job's files) as one JSON
document; every profiling report's readings (:class:`~perseus.server.estimation.ReportReadings`, the
estimates' inputs, one JSON object with its format each; dropped once the job is planned); and
the solved frontier. Events stay in the job's ``events.jsonl``.

One writer thread owns the database. Requests only queue their changes; the thread writes
them in batches, each batch one transaction, in the order they were queued, and a job's state
document is taken (under the job's lock) just before the batch that writes it: everything the
document depends on was queued before it and commits with it or earlier. SQLite commits are
atomic (write-ahead log), so a ``kill -9`` at any moment leaves the last committed batch: at
most the last fraction of a second is lost, and the job goes on from there (lost profiling
steps are measured again).
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from perseus.server.estimation import ReportReadings

logger = logging.getLogger(__name__)

STATE_FILE = "state.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL, rank INTEGER NOT NULL, registration TEXT NOT NULL,
    PRIMARY KEY (job_id, rank));
CREATE TABLE IF NOT EXISTS job_state (job_id TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, args TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_job ON records (job_id, id);
CREATE TABLE IF NOT EXISTS plans (job_id TEXT PRIMARY KEY, result TEXT NOT NULL);
"""
# How long the writer waits for more changes before writing a batch.
BATCH_S = 0.05


@dataclass
class StoredJob:
    """One job as read back from the state file."""

    job_id: str
    spec: Dict[str, Any]
    registrations: List[Dict[str, Any]] = field(default_factory=list)
    state: Optional[Dict[str, Any]] = None
    readings: List[ReportReadings] = field(default_factory=list)
    plan: Optional[Dict[str, Any]] = None


class StateStore:
    """The state file and its writer thread.

    Args:
        path: The SQLite file (created when missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._queue: queue.Queue = queue.Queue()
        self._dirty: Dict[str, Callable[[], Optional[Dict[str, Any]]]] = {}
        self._dirty_lock = threading.Lock()
        self._stopped = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        conn = self._connect()
        conn.executescript(_SCHEMA)
        conn.commit()
        conn.close()
        self._thread = threading.Thread(target=self._run, daemon=True, name="perseus-state")
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # -- reading (at start-up) ------------------------------------------------------------------
    def load(self) -> List[StoredJob]:
        """Every job in the file, with what was kept of it."""
        conn = self._connect()
        try:
            jobs: Dict[str, StoredJob] = {}
            for job_id, spec in conn.execute("SELECT job_id, spec FROM jobs"):
                jobs[job_id] = StoredJob(job_id, json.loads(spec))
            for job_id, reg in conn.execute("SELECT job_id, registration FROM ranks ORDER BY rank"):
                if job_id in jobs:
                    jobs[job_id].registrations.append(json.loads(reg))
            for job_id, state in conn.execute("SELECT job_id, state FROM job_state"):
                if job_id in jobs:
                    jobs[job_id].state = json.loads(state)
            # The column is called ``args`` since the readings were positional (format 1).
            for job_id, args in conn.execute("SELECT job_id, args FROM records ORDER BY id"):
                readings = ReportReadings.from_stored(json.loads(args)) if job_id in jobs else None
                if readings is not None:  # None: an earlier server's, not attributable
                    jobs[job_id].readings.append(readings)
            for job_id, result in conn.execute("SELECT job_id, result FROM plans"):
                if job_id in jobs:
                    jobs[job_id].plan = json.loads(result)
            return list(jobs.values())
        finally:
            conn.close()

    # -- changes (from request handlers: queued, never waited for) -------------------------------
    def put_job(self, job_id: str, spec: Dict[str, Any]) -> None:
        """A new job."""
        self._put(("INSERT OR REPLACE INTO jobs VALUES (?, ?)", (job_id, json.dumps(spec))))

    def put_rank(self, job_id: str, rank: int, registration: Dict[str, Any]) -> None:
        """A rank registered (again)."""
        self._put(
            (
                "INSERT OR REPLACE INTO ranks VALUES (?, ?, ?)",
                (job_id, rank, json.dumps(registration)),
            )
        )

    def add_readings(self, job_id: str, readings: ReportReadings) -> None:
        """One report's readings as they went to the job's estimates."""
        stored = json.dumps(readings.to_stored())
        self._put(("INSERT INTO records (job_id, args) VALUES (?, ?)", (job_id, stored)))

    def drop_records(self, job_id: str) -> None:
        """The job's estimates are no longer needed (it is planned)."""
        self._put(("DELETE FROM records WHERE job_id = ?", (job_id,)))

    def put_plan(self, job_id: str, result: Dict[str, Any]) -> None:
        """The job's solved frontier."""
        self._put(("INSERT OR REPLACE INTO plans VALUES (?, ?)", (job_id, json.dumps(result))))

    def state_changed(self, job_id: str, snapshot: Callable[[], Optional[Dict[str, Any]]]) -> None:
        """The job's state changed: ``snapshot()`` (taking the job's lock) is written soon."""
        with self._dirty_lock:
            self._dirty[job_id] = snapshot
        self._idle.clear()
        self._queue.put(None)  # wake the writer

    def _put(self, item: Tuple[str, Tuple[Any, ...]]) -> None:
        self._idle.clear()
        self._queue.put(item)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is written."""
        self._queue.put(None)
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self.flush()
        self._stopped.set()
        self._queue.put(None)
        self._thread.join(10)

    # -- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        conn = self._connect()
        try:
            while not self._stopped.is_set():
                try:
                    first = self._queue.get(timeout=1.0)
                except queue.Empty:
                    continue
                self._stopped.wait(BATCH_S)
                with self._dirty_lock:
                    dirty, self._dirty = self._dirty, {}
                snapshots: List[Tuple[str, str]] = []
                for job_id, snapshot in dirty.items():
                    try:
                        taken = snapshot()
                    except Exception:  # never let one job stop the writer
                        logger.exception("could not take job %s's state", job_id)
                        continue
                    if taken is not None:
                        snapshots.append((job_id, json.dumps(taken)))
                items = [first]
                while True:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    with conn:
                        for item in items:
                            if item is not None:
                                conn.execute(*item)
                        conn.executemany(
                            "INSERT OR REPLACE INTO job_state VALUES (?, ?)", snapshots
                        )
                except sqlite3.Error:
                    logger.exception("writing the server's state to %s failed", self.path)
                if self._queue.empty():
                    with self._dirty_lock:
                        if not self._dirty:
                            self._idle.set()
        finally:
            conn.close()
