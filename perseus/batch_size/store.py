"""SQLite state of the batch-size optimizer: jobs, runs and epochs, shared across runs/machines.

One database file holds any number of recurring jobs. Every run of a job adds a row to ``runs``
(and one per epoch to ``epochs``); the optimizer derives its whole state — pruning progress,
bandit observations, the best cost so far — from those rows, so any process that opens the file
(another run, another machine on a shared file system) continues where the last one stopped.

Nothing is ever deleted: resetting a job starts a new *generation* (older runs stay for the
record but no longer count), and retrying failed batch sizes marks those runs *superseded*.

Each run and epoch keeps what was measured (``time_s``, ``energy_j``) and what it would have
cost at the batch size's chosen power limit (``steady_time_s``, ``steady_energy_j``; they differ
while power limits are being profiled). The run's ``cost`` is computed from the steady values:
that is what the optimizer judges a batch size by.

The file is opened in WAL mode (readers never block the writer); every decision that reads state
and then adds a run happens in one ``BEGIN IMMEDIATE`` transaction, so two processes starting runs
at the same moment see each other's rows. Files written by earlier versions gain the new columns
when opened. Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from perseus.errors import ConfigError
from perseus.formats import strict_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    settings TEXT NOT NULL,
    created_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    batch_size INTEGER NOT NULL,
    phase TEXT NOT NULL,
    pruning_round INTEGER,
    status TEXT NOT NULL,
    reason TEXT,
    num_epochs INTEGER NOT NULL DEFAULT 0,
    time_s REAL NOT NULL DEFAULT 0,
    energy_j REAL NOT NULL DEFAULT 0,
    cost REAL,
    last_metric REAL,
    started_s REAL NOT NULL,
    ended_s REAL
);
CREATE INDEX IF NOT EXISTS runs_by_job ON runs(job_id, run_id);
CREATE TABLE IF NOT EXISTS epochs (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    epoch INTEGER NOT NULL,
    metric REAL,
    time_s REAL NOT NULL,
    energy_j REAL NOT NULL,
    PRIMARY KEY (run_id, epoch)
);
"""

# Columns added after the first release; ALTER TABLE adds them to older files.
_ADDED_COLUMNS: Dict[str, List[Tuple[str, str]]] = {
    "jobs": [("generation", "INTEGER NOT NULL DEFAULT 0")],
    "runs": [
        ("generation", "INTEGER NOT NULL DEFAULT 0"),
        ("superseded", "INTEGER NOT NULL DEFAULT 0"),
        ("steady_time_s", "REAL NOT NULL DEFAULT 0"),
        ("steady_energy_j", "REAL NOT NULL DEFAULT 0"),
        # Why the optimizer chose the run's batch size, and why the run stopped (explain()).
        ("why_chosen", "TEXT"),
        ("why_stopped", "TEXT"),
        # One epoch's cost at the chosen power limit, priced before the first epoch ended.
        ("priced_epoch_cost", "REAL"),
    ],
    "epochs": [("steady_time_s", "REAL"), ("steady_energy_j", "REAL")],
}

RUNNING = "running"
REACHED = "reached"
FAILED = "failed"

_RUN_COLUMNS = (
    "run_id, batch_size, phase, pruning_round, status, reason, num_epochs, time_s, energy_j,"
    " cost, last_metric, steady_time_s, steady_energy_j, priced_epoch_cost"
)


@dataclass(frozen=True)
class RunRow:
    """One run of a recurring job as stored.

    Attributes:
        run_id: Unique id of the run in the file.
        batch_size: The batch size it trained with.
        phase: ``pruning`` or ``bandit``: the stage that chose it.
        pruning_round: The pruning round (0-based) it belonged to, None for bandit runs.
        status: ``running``, ``reached`` (converged within the cost bound) or ``failed``.
        reason: Why a failed run failed (``target_missed``, ``cost_exceeded``, ...).
        num_epochs: Epochs reported so far.
        time_s: Measured wall time (s).
        energy_j: Measured energy of the job's GPUs (J).
        cost: The cost the optimizer judges the run by (at the batch size's chosen power limit).
        last_metric: The metric of the last reported epoch.
        steady_time_s: Wall time at the chosen power limit (s).
        steady_energy_j: Energy at the chosen power limit (J).
        priced_epoch_cost: One epoch's cost at the chosen power limit as priced before the
            run's first epoch ended (from its power-limit profile or first steps); None when
            it was not.
    """

    run_id: int
    batch_size: int
    phase: str
    pruning_round: Optional[int]
    status: str
    reason: Optional[str]
    num_epochs: int
    time_s: float
    energy_j: float
    cost: Optional[float]
    last_metric: Optional[float]
    steady_time_s: float = 0.0
    steady_energy_j: float = 0.0
    priced_epoch_cost: Optional[float] = None

    @property
    def epoch_cost(self) -> Optional[float]:
        """Mean cost of one epoch: of its epochs, else as priced (None when neither is known).

        None for runs reported as totals only.
        """
        if self.cost is not None and self.num_epochs >= 1:
            return self.cost / self.num_epochs
        if self.priced_epoch_cost is not None and self.priced_epoch_cost > 0:
            return self.priced_epoch_cost
        return None


class Store:
    """The database file of one or more recurring jobs.

    Args:
        path: SQLite file (created with its folder when missing).
        timeout_s: How long to wait for another process's write transaction.
    """

    def __init__(self, path: Path, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: never corrupt; a power cut may lose the last commit only.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(SCHEMA)
            self._add_missing_columns()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"{self.path}: not a usable batch-size optimizer database ({exc}); "
                "point db_path at another file"
            ) from exc

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error): one writer at a time."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _add_missing_columns(self) -> None:
        with self.transaction() as conn:
            for table, columns in _ADDED_COLUMNS.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for name, decl in columns:
                    if name not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")

    # -- jobs ------------------------------------------------------------------------------------
    def ensure_job(self, job_id: str, settings: Dict[str, Any]) -> None:
        """Register ``job_id`` with ``settings``, or check they match the registered ones.

        Raises:
            ConfigError: When the job exists with other settings.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT settings FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO jobs(job_id, settings, created_s) VALUES (?, ?, ?)",
                    (job_id, _settings_json(job_id, settings), time.time()),
                )
                return
        stored = json.loads(row[0])
        if stored != json.loads(_settings_json(job_id, settings)):
            changed = sorted(
                k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k)
            )
            diffs = ", ".join(
                f"{k}: stored {stored.get(k)!r} vs now {settings.get(k)!r}" for k in changed
            )
            raise ConfigError(
                f"{self.path}: job {job_id!r} was registered with other settings ({diffs}); "
                "use the same settings, a new job_id, or a new database file"
            )

    def job_settings(self, job_id: str) -> Dict[str, Any]:
        """The settings ``job_id`` was registered with.

        Raises:
            ConfigError: When the file has no such job.
        """
        row = self._conn.execute("SELECT settings FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None:
            raise ConfigError(
                f"{self.path}: no job {job_id!r}; create it with BatchSizeOptimizer(...) first"
            )
        return dict(json.loads(row[0]))

    def generation(self, conn: Optional[sqlite3.Connection], job_id: str) -> int:
        """The job's current generation (0 until the first reset)."""
        row = (
            (conn or self._conn)
            .execute("SELECT generation FROM jobs WHERE job_id=?", (job_id,))
            .fetchone()
        )
        return int(row[0]) if row else 0

    def new_generation(self, job_id: str) -> int:
        """Start the job over: runs so far stay in the file but no longer count."""
        with self.transaction() as conn:
            conn.execute(
                "UPDATE runs SET status=?, reason=?, ended_s=? WHERE job_id=? AND status=?",
                (FAILED, "reset", time.time(), job_id, RUNNING),
            )
            conn.execute("UPDATE jobs SET generation=generation+1 WHERE job_id=?", (job_id,))
            return self.generation(conn, job_id)

    def supersede(self, run_ids: Sequence[int]) -> None:
        """Stop counting these runs (their batch sizes are tried again)."""
        with self.transaction() as conn:
            conn.executemany("UPDATE runs SET superseded=1 WHERE run_id=?", [(r,) for r in run_ids])

    # -- runs ------------------------------------------------------------------------------------
    def runs(self, conn: Optional[sqlite3.Connection], job_id: str) -> List[RunRow]:
        """The runs that count for ``job_id`` (this generation, not superseded), oldest first."""
        conn = conn or self._conn
        rows = conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE job_id=? AND superseded=0 AND generation="
            "(SELECT generation FROM jobs WHERE job_id=?) ORDER BY run_id",
            (job_id, job_id),
        ).fetchall()
        return [RunRow(*row) for row in rows]

    def run(self, run_id: int) -> RunRow:
        """One run by id."""
        row = self._conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,)
        ).fetchone()
        if row is None:
            raise ConfigError(
                f"{self.path}: no run with id {run_id}; start a run with next_batch_size() "
                "(or pass the id the sweeper gave this job)"
            )
        return RunRow(*row)

    def add_run(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        batch_size: int,
        phase: str,
        pruning_round: Optional[int],
        why: Optional[str] = None,
    ) -> int:
        """Start a run (inside the caller's transaction); returns its id.

        ``why`` says why its batch size was chosen (kept for :meth:`explanations`).
        """
        cur = conn.execute(
            "INSERT INTO runs(job_id, batch_size, phase, pruning_round, status, started_s,"
            " generation, why_chosen) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                batch_size,
                phase,
                pruning_round,
                RUNNING,
                time.time(),
                self.generation(conn, job_id),
                why,
            ),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def add_skipped(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        batch_size: int,
        phase: str,
        pruning_round: Optional[int],
        *,
        reason: str,
        why_chosen: str,
        why_stopped: str,
    ) -> int:
        """Record a step decided and not run (inside the caller's transaction); returns its id.

        It is a failed run of no epochs and no cost: it counts where failures count (a
        pruning direction ends at it) and never as an observation.
        """
        now = time.time()
        cur = conn.execute(
            "INSERT INTO runs(job_id, batch_size, phase, pruning_round, status, reason,"
            " started_s, ended_s, generation, why_chosen, why_stopped)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                batch_size,
                phase,
                pruning_round,
                FAILED,
                reason,
                now,
                now,
                self.generation(conn, job_id),
                why_chosen,
                why_stopped,
            ),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def expire_runs(self, conn: sqlite3.Connection, job_id: str, started_before_s: float) -> int:
        """Fail unreported runs of ``job_id`` started before a time; returns how many.

        Such runs' processes died without reporting (a crash, a lost machine).
        """
        cur = conn.execute(
            "UPDATE runs SET status=?, reason=?, ended_s=? WHERE job_id=? AND status=?"
            " AND started_s<?",
            (FAILED, "not_reported", time.time(), job_id, RUNNING, started_before_s),
        )
        return int(cur.rowcount)

    def add_epoch(
        self,
        run_id: int,
        metric: Optional[float],
        measured: Tuple[float, float],
        steady: Tuple[float, float],
        cost: float,
    ) -> int:
        """Record the next epoch of a running run and its totals; returns the epoch number.

        Args:
            run_id: The run.
            metric: Validation metric after the epoch.
            measured: ``(time_s, energy_j)`` measured.
            steady: ``(time_s, energy_j)`` at the batch size's chosen power limit.
            cost: The run's cost so far, this epoch included.
        """
        with self.transaction() as conn:
            status = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if status is None or status[0] != RUNNING:
                raise ConfigError(
                    f"{self.path}: run {run_id} is not running; start one with next_batch_size()"
                )
            conn.execute(
                "UPDATE runs SET num_epochs=num_epochs+1, time_s=time_s+?, energy_j=energy_j+?,"
                " steady_time_s=steady_time_s+?, steady_energy_j=steady_energy_j+?, cost=?,"
                " last_metric=? WHERE run_id=?",
                (*measured, *steady, cost, metric, run_id),
            )
            epoch = conn.execute("SELECT num_epochs FROM runs WHERE run_id=?", (run_id,)).fetchone()
            conn.execute(
                "INSERT INTO epochs(run_id, epoch, metric, time_s, energy_j, steady_time_s,"
                " steady_energy_j) VALUES (?,?,?,?,?,?,?)",
                (run_id, int(epoch[0]), metric, *measured, *steady),
            )
        return int(epoch[0])

    def price_run(self, run_id: int, epoch_cost: float) -> None:
        """Record a running run's epoch cost, priced before its first epoch ended."""
        with self.transaction() as conn:
            status = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if status is None or status[0] != RUNNING:
                raise ConfigError(
                    f"{self.path}: run {run_id} is not running; start one with next_batch_size()"
                )
            conn.execute("UPDATE runs SET priced_epoch_cost=? WHERE run_id=?", (epoch_cost, run_id))

    def finish_run(
        self,
        run_id: int,
        *,
        status: str,
        reason: Optional[str],
        measured: Tuple[float, float],
        steady: Tuple[float, float],
        cost: float,
        why: Optional[str] = None,
    ) -> None:
        """Close a run with its final totals (``measured`` and ``steady`` as in add_epoch).

        ``why`` says why it stopped where the reason alone does not (kept for
        :meth:`explanations`).
        """
        with self.transaction() as conn:
            conn.execute(
                "UPDATE runs SET status=?, reason=?, time_s=?, energy_j=?, steady_time_s=?,"
                " steady_energy_j=?, cost=?, ended_s=?, why_stopped=? WHERE run_id=? AND status=?",
                (status, reason, *measured, *steady, cost, time.time(), why, run_id, RUNNING),
            )

    def explanations(self, job_id: str) -> Dict[int, Tuple[Optional[str], Optional[str]]]:
        """``{run_id: (why chosen, why stopped)}`` of the runs that count for ``job_id``.

        Runs recorded before these were kept have ``(None, None)``.
        """
        rows = self._conn.execute(
            "SELECT run_id, why_chosen, why_stopped FROM runs WHERE job_id=? AND superseded=0"
            " AND generation=(SELECT generation FROM jobs WHERE job_id=?)",
            (job_id, job_id),
        ).fetchall()
        return {int(r[0]): (r[1], r[2]) for r in rows}

    def epochs(self, run_id: int) -> List[Dict[str, Any]]:
        """The epochs of a run, in order."""
        keys = ("epoch", "metric", "time_s", "energy_j", "steady_time_s", "steady_energy_j")
        rows = self._conn.execute(
            f"SELECT {', '.join(keys)} FROM epochs WHERE run_id=? ORDER BY epoch", (run_id,)
        ).fetchall()
        return [dict(zip(keys, r)) for r in rows]


def batch_sizes_key(batch_sizes: Sequence[int]) -> List[int]:
    """The canonical (sorted, unique) list of candidate batch sizes."""
    return sorted({int(b) for b in batch_sizes})


def _settings_json(job_id: str, settings: Dict[str, Any]) -> str:
    """The job's settings as strict JSON (NaN or infinity is refused, naming the setting)."""
    return strict_json.dumps(
        settings, what=f"settings of job {job_id!r}", sort_keys=True, default=None
    )
