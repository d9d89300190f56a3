from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Dict, Optional

import pytest

from perseus.batch_size import BatchSizeOptimizer
from perseus.batch_size.store import Store
from perseus.errors import BatchSizeError, ConfigError

SIZES = [32, 64, 128, 256]


def _bso(path: Path, **kwargs) -> BatchSizeOptimizer:  # type: ignore[no-untyped-def]
    args = dict(eta=0.5, beta=2.0, max_epochs=10, max_power_w=100.0)
    args.update(kwargs)
    return BatchSizeOptimizer(path / "bso.db", "job", SIZES, 64, **args)


# epochs to reach the target per batch size (None: never); every epoch costs 1 s and 100 J
EPOCHS: Dict[int, Optional[int]] = {32: 6, 64: 4, 128: 3, 256: None}


def _run_once(bso: BatchSizeOptimizer, epochs: Optional[Dict[int, Optional[int]]] = None) -> dict:
    batch_size = bso.next_batch_size()
    needed = (epochs or EPOCHS)[batch_size]
    for epoch in range(1, bso.max_epochs + 1):
        bso.report_epoch(1.0 if needed is not None and epoch >= needed else 0.0, 1.0, 100.0)
        if bso.should_stop():
            break
    return bso.report_run()


def test_cost_is_zeus_cost(tmp_path: Path) -> None:
    bso = _bso(tmp_path, eta=0.3, max_power_w=250.0)
    assert bso.cost_j(2.0, 100.0) == pytest.approx(0.3 * 100 + 0.7 * 250 * 2)


def test_pruning_then_bandit_over_runs(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    first = [_run_once(bso) for _ in range(4)]
    # 64 (400); 32 has not converged after as many epochs as 64's whole run, at the same epoch
    # cost: it is deferred (a run of 128 will likely rule it out) and the walk turns up: 128
    # (300), 256 (never converges); 32 is then ruled out before it runs again
    assert [r["batch_size"] for r in first] == [64, 32, 128, 256]
    assert [r["status"] for r in first] == ["reached", "failed", "reached", "failed"]
    assert [r["reason"] for r in first] == [None, "deferred", None, "cost_exceeded"]
    assert first[1]["cost"] == pytest.approx(400.0)  # 4 of the 6 epochs it would have taken
    assert first[2]["cost"] == pytest.approx(300.0)
    assert all(r["phase"] == "pruning" for r in first)
    later = [_run_once(bso) for _ in range(12)]
    assert {r["phase"] for r in later} == {"bandit"}
    assert [r["batch_size"] for r in later] == [128] * 12
    assert bso.best_batch_size() == 128
    summary = bso.summary()
    assert summary["stage"] == "bandit" and summary["arms"] == [64, 128]
    assert summary["mean_cost"][128] == pytest.approx(300.0)
    # the deferred run still counts: 32 needs more than 4 epochs, so it is out without a run
    lines = bso.explain()
    assert any(
        line.startswith("run 5: batch size 32") and "not run: ruled out before it ran" in line
        for line in lines
    )


def test_early_stop_predicts_the_next_epoch(tmp_path: Path) -> None:
    bso = _bso(tmp_path, rule_out_probability=0.0)  # the beta bound alone
    for _ in range(3):
        _run_once(bso)  # best converged run: 128 at 300 -> bound 600
    result = _run_once(bso)
    # 6 epochs cost 600 (= the bound); a 7th would pass it, so the run stops after 6
    assert result["batch_size"] == 256
    assert result["reason"] == "cost_exceeded" and result["cost"] == pytest.approx(600.0)


def test_a_run_reaching_the_target_above_the_bound_does_not_count(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    for _ in range(3):
        _run_once(bso)
    bso.next_batch_size()
    for _ in range(3):
        bso.report_epoch(0.0, 1.0, 100.0)  # 100 per epoch: not stopped
        assert not bso.should_stop()
    bso.report_epoch(1.0, 4.0, 400.0)  # one long epoch reaches the target at 700 > 600
    assert bso.should_stop()
    result = bso.report_run()
    assert result["status"] == "failed" and result["reason"] == "cost_exceeded"
    # totals-only reports are judged the same way
    bso.next_batch_size()
    result = bso.report_run(time_s=7.0, energy_j=700.0, reached_target=True)
    assert (result["status"], result["reason"]) == ("failed", "cost_exceeded")
    assert bso.summary()["mean_cost"][128] == pytest.approx(300.0)


def test_cost_is_judged_at_the_chosen_power_limit(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    bso.next_batch_size()
    # the first epoch profiled power limits: it cost 150, but 100 at the chosen limit
    bso.report_epoch(0.0, 1.5, 150.0, steady_time_s=1.0, steady_energy_j=100.0)
    for _ in range(3):
        bso.report_epoch(1.0, 1.0, 100.0)
    result = bso.report_run()
    assert result["cost"] == pytest.approx(400.0)
    assert result["measured_cost"] == pytest.approx(450.0)
    assert result["time_s"] == pytest.approx(4.5) and result["energy_j"] == pytest.approx(450.0)
    epochs = bso.store.epochs(result["run_id"])
    assert epochs[0]["steady_time_s"] == 1.0 and epochs[0]["time_s"] == 1.5


def test_round_two_starts_from_the_cheapest_batch_size(tmp_path: Path) -> None:
    # Round 1 from 64 finds 128 cheapest; round 2 must start there (not at the default), so
    # the bound is 2 x 300 before the default runs again.
    bso = _bso(tmp_path, num_pruning_rounds=2)
    tried = [_run_once(bso) for _ in range(8)]
    assert [(r["batch_size"], r["phase"]) for r in tried[:4]] == [
        (64, "pruning"),
        (32, "pruning"),
        (128, "pruning"),
        (256, "pruning"),
    ]
    assert [(r["batch_size"], r["phase"]) for r in tried[4:6]] == [
        (128, "pruning"),
        (64, "pruning"),
    ]
    # Round 1's survivors are 64 and 128 (32 was deferred, then ruled out); round 2 walks them
    # again from 128, and the bandit then takes 128: the default 64 took 4 epochs twice to
    # 128's 3 at the same epoch cost, too large a gap for chance (a 10 % run-to-run spread).
    assert bso.summary()["arms"] == [64, 128]
    assert [r["batch_size"] for r in tried[6:]] == [128, 128]
    assert bso.standings()[64].ruled_out


def test_every_batch_size_failing_is_explained_and_recoverable(tmp_path: Path) -> None:
    slow: Dict[int, Optional[int]] = {32: 12, 64: 11, 128: 12, 256: None}
    bso = _bso(tmp_path, max_epochs=10)
    for _ in range(4):  # nothing reaches the target: the walk tries every batch size
        result = _run_once(bso, slow)
        assert result["status"] == "failed"
    with pytest.raises(BatchSizeError) as err:
        bso.next_batch_size()
    message = str(err.value)
    assert "every batch size tried in pruning round 1 failed" in message
    assert "batch size 64 (run 1): missed the target metric within max_epochs" in message
    assert "retry_failed()" in message and "reset()" in message
    # the state stays readable
    summary = bso.summary()
    assert summary["stage"] == "exhausted" and summary["failed"][64] == "target_missed"
    assert bso.best_batch_size() is None
    with pytest.raises(BatchSizeError):  # and says the same thing again, nothing changed
        bso.next_batch_size()
    bso.close()
    # continue: a larger epoch budget, the failed batch sizes are tried again
    again = _bso(tmp_path, max_epochs=20)
    assert again.retry_failed() == 4
    results = [_run_once(again, slow) for _ in range(5)]
    assert [r["batch_size"] for r in results[:4]] == [64, 32, 128, 256]
    assert again.summary()["stage"] == "bandit"
    assert again.best_batch_size() == 64
    # reset: the search starts over; the old runs stay in the file
    again.reset()
    assert again.summary()["num_runs"] == 0
    assert again.next_batch_size() == 64
    con = sqlite3.connect(tmp_path / "bso.db")
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 4 + 5 + 1


def test_missing_the_target_within_max_epochs_fails_the_run(tmp_path: Path) -> None:
    bso = _bso(tmp_path, max_epochs=5)
    assert bso.next_batch_size() == 64
    for _ in range(5):
        bso.report_epoch(0.1, 1.0, 100.0)
    assert bso.should_stop()
    result = bso.report_run()
    assert result["status"] == "failed" and result["reason"] == "target_missed"


def test_state_survives_new_processes_and_objects(tmp_path: Path) -> None:
    for _ in range(3):
        bso = _bso(tmp_path)
        _run_once(bso)
        bso.close()
    con = sqlite3.connect(tmp_path / "bso.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = [r[0] for r in con.execute("SELECT batch_size FROM runs ORDER BY run_id")]
    assert rows == [64, 32, 128]
    # 32 deferred after 4 epochs (as many as 64's whole run, at the same epoch cost)
    assert con.execute("SELECT COUNT(*) FROM epochs").fetchone()[0] == 4 + 4 + 3


def test_files_of_the_first_version_are_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, settings TEXT NOT NULL, created_s REAL);
        CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL,
            batch_size INTEGER NOT NULL, phase TEXT NOT NULL, pruning_round INTEGER,
            status TEXT NOT NULL, reason TEXT, num_epochs INTEGER NOT NULL DEFAULT 0,
            time_s REAL NOT NULL DEFAULT 0, energy_j REAL NOT NULL DEFAULT 0, cost REAL,
            last_metric REAL, started_s REAL NOT NULL, ended_s REAL);
        CREATE TABLE epochs (run_id INTEGER NOT NULL, epoch INTEGER NOT NULL, metric REAL,
            time_s REAL NOT NULL, energy_j REAL NOT NULL, PRIMARY KEY (run_id, epoch));
        INSERT INTO jobs VALUES ('job', '{}', 0);
        INSERT INTO runs(job_id, batch_size, phase, pruning_round, status, num_epochs, time_s,
            energy_j, cost, started_s) VALUES ('job', 64, 'pruning', 0, 'reached', 4, 4, 400,
            400, 0);
        """
    )
    con.commit()
    con.close()
    store = Store(path)
    assert [r.batch_size for r in store.runs(None, "job")] == [64]
    assert store.runs(None, "job")[0].epoch_cost == pytest.approx(100.0)
    store.close()


def test_totals_only_reporting(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    bso.next_batch_size()
    result = bso.report_run(time_s=10.0, energy_j=500.0, reached_target=True)
    assert result["status"] == "reached" and result["cost"] == pytest.approx(750.0)


def test_lower_is_better_metric(tmp_path: Path) -> None:
    bso = _bso(tmp_path, target_metric=0.5, higher_is_better=False)
    bso.next_batch_size()
    bso.report_epoch(0.9, 1.0, 1.0)
    assert not bso.should_stop()
    bso.report_epoch(0.4, 1.0, 1.0)
    assert bso.should_stop()
    assert bso.report_run()["status"] == "reached"


def test_misuse_and_mismatch_are_explained(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    with pytest.raises(BatchSizeError, match="next_batch_size"):
        bso.report_epoch(1.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="default_batch_size: stored 64 vs now 128"):
        BatchSizeOptimizer(tmp_path / "bso.db", "job", SIZES, 128, max_power_w=100.0)
    with pytest.raises(ConfigError, match="beta=1.0"):
        _bso(tmp_path, beta=1.0)
    with pytest.raises(ConfigError, match="num_exploration=0"):
        _bso(tmp_path, num_exploration=0)
    with pytest.raises(ConfigError, match="default_batch_size=48"):
        BatchSizeOptimizer(tmp_path / "other.db", "job", SIZES, 48)
    (tmp_path / "junk.db").write_text("this is not sqlite " * 100)
    with pytest.raises(ConfigError, match="junk.db"):
        BatchSizeOptimizer(tmp_path / "junk.db", "job", SIZES, 64)


def test_runs_never_reported_expire(tmp_path: Path) -> None:
    bso = _bso(tmp_path, stale_run_s=3600.0)
    assert bso.next_batch_size() == 64  # its process dies: never reported
    con = sqlite3.connect(tmp_path / "bso.db")
    with con:
        con.execute("UPDATE runs SET started_s = started_s - 7200")
    again = _bso(tmp_path, stale_run_s=3600.0)
    assert again.next_batch_size() == 32  # the failed start ends neither direction
    rows = con.execute("SELECT status, reason FROM runs ORDER BY run_id").fetchall()
    assert rows == [("failed", "not_reported"), ("running", None)]


def _start_run(args: tuple) -> int:
    path, job = args
    bso = BatchSizeOptimizer(Path(path), job, SIZES, 64)
    return bso.next_batch_size()
