from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
APPS = Path(__file__).parent / "hydra_app"


def _multirun(
    tmp_path: Path,
    *overrides: str,
    app: str = "recurring_job.py",
    sizes: str = "[16,32,64,128,256]",
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            str(APPS / app),
            "-m",
            "hydra/sweeper=perseus_batch_size",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
            f"hydra.sweeper.db_path={tmp_path / 'bso.db'}",
            f"hydra.sweeper.batch_sizes={sizes}",
            "hydra.sweeper.default_batch_size=64",
            "hydra.sweeper.max_power_w=100",
            *overrides,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def _runs(tmp_path: Path) -> list:
    con = sqlite3.connect(tmp_path / "bso.db")
    return con.execute(
        "SELECT batch_size, phase, status, cost, reason FROM runs WHERE superseded=0"
        " AND generation=(SELECT generation FROM jobs) ORDER BY run_id"
    ).fetchall()


@pytest.mark.parametrize("report", ["epochs", "return"])
def test_sweeper_runs_the_job_choosing_batch_sizes(tmp_path: Path, report: str) -> None:
    out = _multirun(
        tmp_path, "hydra.sweeper.num_runs=7", "hydra.sweeper.max_epochs=5", f"report={report}"
    )
    assert out.returncode == 0, out.stderr
    runs = _runs(tmp_path)
    # pruning: 64 (400), 32 (500) is dearer so up: 128 (300), 256 (never); 32 is then ruled
    # out against 128, which ends the smaller side: 16 is never tried
    assert [r[0] for r in runs[:4]] == [64, 32, 128, 256]
    assert 16 not in [r[0] for r in runs]
    # cost per epoch 0.5 * 100 J + 0.5 * 100 W * 1 s = 100; 128 converges in 3 epochs
    assert runs[2][3] == pytest.approx(300.0)
    if report == "epochs":
        # per epoch: 32 is deferred after 4 epochs (as many as 64's whole run), the job applied
        # the sweeper's max_epochs=5 to 256, and the walk's step back to 32 is recorded as ruled
        # out without a run (a step, not one of the 7 runs)
        assert [r[1] for r in runs] == ["pruning"] * 5 + ["bandit"] * 3
        assert [r[2] for r in runs[:5]] == ["reached", "failed", "reached", "failed", "failed"]
        assert [r[4] for r in runs[:5]] == [None, "deferred", None, "target_missed", "ruled_out"]
        assert runs[1][3] == pytest.approx(400.0) and runs[4][3] is None
        assert runs[3][3] == pytest.approx(500.0)
    else:  # returned totals: 32 converged at 500; 256 took 10 s and 1000 J
        assert [r[1] for r in runs] == ["pruning"] * 4 + ["bandit"] * 3
        assert [r[2] for r in runs[:4]] == ["reached"] * 3 + ["failed"]
        assert runs[3][3] == pytest.approx(1000.0)
    assert {r[0] for r in runs if r[1] == "bandit"} <= {64, 128}
    # the job saw its batch size as an override
    assert (tmp_path / "multirun" / "0" / ".hydra" / "overrides.yaml").read_text().count(
        "batch_size=64"
    ) == 1
    # a second multirun continues the same search from the database
    again = _multirun(tmp_path, "hydra.sweeper.num_runs=2", f"report={report}")
    assert again.returncode == 0, again.stderr
    assert len(_runs(tmp_path)) == len(runs) + 2


def test_an_exhausted_search_stops_the_sweep_and_can_go_on(tmp_path: Path) -> None:
    # every batch size needs 7+ epochs: with max_epochs=6 all of them fail. Runs stop only at
    # the target or the epoch budget here (no posterior-driven stop): the walk's mechanics alone.
    plain = "hydra.sweeper.rule_out_probability=0"
    out = _multirun(
        tmp_path, "hydra.sweeper.num_runs=8", "hydra.sweeper.max_epochs=6", "slow=true", plain
    )
    assert out.returncode != 0
    assert "every batch size tried in pruning round 1 failed" in out.stderr
    assert "hydra.sweeper.retry_failed=true" in out.stderr
    assert len(_runs(tmp_path)) == 5  # the sweep stopped instead of launching more
    # with a larger epoch budget the failed round is retried
    out = _multirun(
        tmp_path,
        "hydra.sweeper.num_runs=3",
        "hydra.sweeper.max_epochs=12",
        "hydra.sweeper.retry_failed=true",
        "slow=true",
        plain,
    )
    assert out.returncode == 0, out.stderr
    assert [r[2] for r in _runs(tmp_path)] == ["reached"] * 3
    # reset starts the search over
    out = _multirun(tmp_path, "hydra.sweeper.num_runs=1", "hydra.sweeper.reset=true")
    assert out.returncode == 0, out.stderr
    assert [(r[0], r[2]) for r in _runs(tmp_path)] == [(64, "reached")]


def test_recurring_job_object_under_the_sweeper(tmp_path: Path) -> None:
    out = _multirun(
        tmp_path,
        "hydra.sweeper.num_runs=6",
        "hydra.sweeper.max_epochs=8",
        app="recurring_loop.py",
        sizes="[32,64,128,256]",
    )
    assert out.returncode == 0, out.stderr
    runs = [r for r in _runs(tmp_path) if r[3] is not None]  # steps never run left out
    # an epoch of 2048 / b steps of equal cost: 64 costs 4 x 32 steps, 32 needs 6 x 64 (more
    # than twice that: stopped by the bound, or earlier: deferred after its first epoch, one
    # of which costs twice one of 64), 128 takes 3 x 16, 256 never converges within
    # max_epochs=8
    assert [r[0] for r in runs[:4]] == [64, 32, 128, 256]
    assert [r[2] for r in runs[:4]] == ["reached", "failed", "reached", "failed"]
    assert runs[1][4] in ("cost_exceeded", "deferred") and runs[3][4] == "target_missed"
    assert [r[0] for r in runs[4:]] == [128, 128]
    con = sqlite3.connect(tmp_path / "bso.db")
    epochs = con.execute("SELECT COUNT(*), SUM(energy_j), SUM(steady_energy_j) FROM epochs")
    count, energy_j, steady_j = epochs.fetchone()
    assert count > 10 and energy_j > 0 and steady_j > 0
    # the power limit was profiled in the first run of each batch size, next to the database
    profiles = json.loads((tmp_path / "bso.db.power_limits.json").read_text())["profiles"]
    assert sorted(p["key"]["batch_size"] for p in profiles) == sorted({r[0] for r in runs})


def test_sweeper_rejects_other_sweeps(tmp_path: Path) -> None:
    out = _multirun(tmp_path, "report=epochs,return")
    assert out.returncode != 0
    assert "drop the sweep override" in out.stderr
