from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Dict

import pytest

from perseus.batch_size import BatchSizeOptimizer
from perseus.errors import BatchSizeError, ConfigError

SIZES = [32, 64, 128, 256]


def _bso(path: Path, **kwargs) -> BatchSizeOptimizer:  # type: ignore[no-untyped-def]
    args = dict(eta=0.5, beta=2.0, max_epochs=10, max_power_w=100.0, num_pruning_rounds=1)
    args.update(kwargs)
    return BatchSizeOptimizer(path / "bso.db", "job", SIZES, 64, **args)


# epochs to reach the target per batch size (None: never); every epoch costs 1 s and 100 J
EPOCHS: Dict[int, object] = {32: 6, 64: 4, 128: 3, 256: None}


def _run_once(bso: BatchSizeOptimizer) -> dict:
    batch_size = bso.next_batch_size()
    epochs = EPOCHS[batch_size]
    for epoch in range(1, bso.max_epochs + 1):
        metric = 0.0 if epochs is None else epoch / epochs  # type: ignore[operator]
        bso.report_epoch(metric, 1.0, 100.0)
        if bso.should_stop():
            break
    return bso.report_run()


def test_cost_is_zeus_cost(tmp_path: Path) -> None:
    bso = _bso(tmp_path, eta=0.3, max_power_w=250.0)
    assert bso.cost_j(2.0, 100.0) == pytest.approx(0.3 * 100 + 0.7 * 250 * 2)


def test_pruning_then_bandit_over_runs(tmp_path: Path) -> None:
    bso = _bso(tmp_path)
    first = [_run_once(bso) for _ in range(4)]
    # down from 64 (64, 32), then up (128, 256: never converges -> stop)
    assert [r["batch_size"] for r in first] == [64, 32, 128, 256]
    assert [r["status"] for r in first] == ["reached", "reached", "reached", "failed"]
    # per epoch cost 0.5*100 + 0.5*100*1 = 100; 128 reached in 3 epochs = 300
    assert first[2]["cost"] == pytest.approx(300.0)
    # 256 is stopped when its cost passes beta x best (2 x 300) -> after 7 epochs
    assert first[3]["reason"] == "cost_exceeded" and first[3]["cost"] == pytest.approx(700.0)
    assert all(r["phase"] == "pruning" for r in first)
    later = [_run_once(bso) for _ in range(12)]
    assert {r["phase"] for r in later} == {"bandit"}
    assert {r["batch_size"] for r in later} <= {32, 64, 128}
    assert later[-1]["batch_size"] == 128
    assert bso.best_batch_size() == 128
    summary = bso.summary()
    assert summary["stage"] == "bandit" and summary["arms"] == [32, 64, 128]
    assert summary["mean_cost"][128] == pytest.approx(300.0)


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
    assert [r[0] for r in con.execute("SELECT batch_size FROM runs ORDER BY run_id")] == [
        64,
        32,
        128,
    ]
    assert con.execute("SELECT COUNT(*) FROM epochs").fetchone()[0] == 4 + 6 + 3


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
        BatchSizeOptimizer(
            tmp_path / "bso.db", "job", SIZES, 128, num_pruning_rounds=1, max_power_w=100.0
        )
    with pytest.raises(ConfigError, match="beta=1.0"):
        _bso(tmp_path, beta=1.0)
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
    assert again.next_batch_size() == 32
    rows = con.execute("SELECT status, reason FROM runs ORDER BY run_id").fetchall()
    assert rows == [("failed", "not_reported"), ("running", None)]


def _start_run(args: tuple) -> int:
    path, job = args
    bso = BatchSizeOptimizer(Path(path), job, SIZES, 64, num_pruning_rounds=1)
    return bso.next_batch_size()


def test_concurrent_runs_continue_one_walk(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    BatchSizeOptimizer(Path(path), "job", SIZES, 64, num_pruning_rounds=1).close()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.map(_start_run, [(path, "job")] * 4)
    # four simultaneous starts take four different steps of the walk, none twice
    assert sorted(got) == [32, 64, 128, 256]
