"""Multirun summary from run directories (report.json + Hydra's overrides.yaml)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from omegaconf import OmegaConf

from perseus.launcher.multirun_summary import SweepSummaryCallback, collect_rows


def _run(sweep: Path, num: int, overrides: list, report: dict) -> None:
    run = sweep / str(num)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    if report:
        (run / "report.json").write_text(json.dumps(report))


def test_summary_csv_and_plot(tmp_path: Path) -> None:
    base = {"iteration_time_s": 1.0, "energy_j": 100.0}
    plan = {"iteration_time_s": 1.005, "energy_j": 90.0, "predicted_energy_j": 91.0}
    _run(
        tmp_path,
        0,
        ["energy=no_slowdown"],
        {"baseline": base, "plan": plan, "energy_saving": 0.1, "slowdown": 0.005},
    )
    _run(
        tmp_path,
        1,
        ["energy=min_energy"],
        {"baseline": base, "plan": plan, "energy_saving": 0.2, "slowdown": 0.3},
    )
    _run(tmp_path, 10, ["energy=max_speed"], {})  # a failed run still gets a row
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    SweepSummaryCallback().on_multirun_end(config)
    with (tmp_path / "sweep_summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run"] for r in rows] == ["0", "1", "10"]
    assert rows[0]["overrides"] == "energy=no_slowdown"
    assert float(rows[1]["energy_saving"]) == 0.2
    assert float(rows[0]["predicted_energy_j"]) == 91.0
    assert rows[2]["status"] == "no report" and rows[2]["energy_saving"] == ""
    png = tmp_path / "sweep_comparison.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_runs_gives_empty_summary(tmp_path: Path) -> None:
    assert collect_rows(tmp_path) == []
