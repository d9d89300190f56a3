"""perseus-train -m: two runs of a sweep and the summary the callback writes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.e2e.test_train_e2e import PNG, SMALL, run_train

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sweep_writes_summary_and_comparison(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_train(
        ["-m", *SMALL, "energy=no_slowdown,min_energy", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
        timeout_s=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (sweep_dir / "sweep_summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["overrides"].split()[-1] for r in rows] == ["energy=no_slowdown", "energy=min_energy"]
    assert all(r["status"] == "ok" for r in rows)
    savings = [float(r["energy_saving"]) for r in rows]
    slowdowns = [float(r["slowdown"]) for r in rows]
    assert all(s > 0 for s in savings)
    # Least energy trades time for energy: more saving and a clearly longer iteration.
    assert savings[1] > savings[0] and slowdowns[1] > slowdowns[0]
    assert (sweep_dir / "sweep_comparison.png").read_bytes()[:8] == PNG
    for run in ("0", "1"):
        assert (sweep_dir / run / "report.json").is_file()
