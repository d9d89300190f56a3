from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
APP = Path(__file__).parent / "hydra_app" / "recurring_job.py"


def _multirun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            str(APP),
            "-m",
            "hydra/sweeper=perseus_batch_size",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
            f"hydra.sweeper.db_path={tmp_path / 'bso.db'}",
            "hydra.sweeper.batch_sizes=[16,32,64,128,256]",
            "hydra.sweeper.default_batch_size=64",
            "hydra.sweeper.num_pruning_rounds=1",
            "hydra.sweeper.max_power_w=100",
            *overrides,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )


def _runs(tmp_path: Path) -> list:
    con = sqlite3.connect(tmp_path / "bso.db")
    return con.execute(
        "SELECT batch_size, phase, status, cost, reason FROM runs ORDER BY run_id"
    ).fetchall()


@pytest.mark.parametrize("report", ["epochs", "return"])
def test_sweeper_runs_the_job_choosing_batch_sizes(tmp_path: Path, report: str) -> None:
    out = _multirun(
        tmp_path, "hydra.sweeper.num_runs=7", "hydra.sweeper.max_epochs=6", f"report={report}"
    )
    assert out.returncode == 0, out.stderr
    runs = _runs(tmp_path)
    # pruning: 64, down 32, 16, up 128, 256 (never converges); then the bandit
    assert [r[0] for r in runs[:5]] == [64, 32, 16, 128, 256]
    assert [r[2] for r in runs[:5]] == ["reached"] * 4 + ["failed"]
    assert [r[1] for r in runs] == ["pruning"] * 5 + ["bandit"] * 2
    assert {r[0] for r in runs[5:]} <= {16, 32, 64, 128}
    # cost per epoch 0.5 * 100 J + 0.5 * 100 W * 1 s = 100; 128 converges in 3 epochs
    assert runs[3][3] == pytest.approx(300.0)
    if report == "epochs":  # the job applied the sweeper's max_epochs=6 (beta would stop at 7)
        assert runs[4][3:] == (pytest.approx(600.0), "target_missed")
    else:  # returned totals: 10 s, 1000 J
        assert runs[4][3] == pytest.approx(1000.0)
    # the job saw its batch size as an override
    assert (tmp_path / "multirun" / "0" / ".hydra" / "overrides.yaml").read_text().count(
        "batch_size=64"
    ) == 1
    # a second multirun continues the same search from the database
    again = _multirun(tmp_path, "hydra.sweeper.num_runs=2", f"report={report}")
    assert again.returncode == 0, again.stderr
    assert len(_runs(tmp_path)) == 9


def test_sweeper_rejects_other_sweeps(tmp_path: Path) -> None:
    out = _multirun(tmp_path, "report=epochs,return")
    assert out.returncode != 0
    assert "drop the sweep override" in out.stderr
