"""MLflow and W&B runs written by the tracker, read back with each tool's own reader.

Both libraries start processes when imported or initialised (MLflow asks ``uname``; W&B starts
its service), hence the integration tier. The tracker is driven step by step, as in
tests/unit/runtime/logger/test_trackers.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List

import pytest

from perseus.config.schema import LoggerBackend, LoggerConfig
from perseus.runtime.logger.backends import open_backend
from perseus.runtime.logger.tracker import Tracker, summary_figures
from tests.unit.runtime.logger.test_trackers import SUMMARY, ListFeed, drive, rows

pytestmark = pytest.mark.integration


def test_mlflow_run_read_back_with_mlflow_s_client(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cfg = LoggerConfig(backend=LoggerBackend.mlflow, experiment="perseus-test")
    directory = tmp_path / "mlflow"
    tracker = Tracker(
        lambda: open_backend(cfg, directory, "job-1", {"job_id": "job-1", "pp": "2"}),
        ListFeed([rows()[:2], rows()[2:]]),
        lambda: summary_figures(SUMMARY),
        name="mlflow",
        start=False,
    )
    drive(tracker, 2)
    assert tracker.failure is None
    client = MlflowClient(directory.resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("perseus-test").experiment_id])
    assert run.info.run_name == "job-1" and run.info.status == "FINISHED"
    assert run.data.params["pp"] == "2" and run.data.tags["perseus.phase"] == "profiling"

    def history(key: str) -> List[Any]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    assert history("iteration_time_s") == [(0, 0.25), (1, 0.26)]
    assert sorted(history("energy_j")) == [(0, 180.0), (1, 170.0)]
    assert history("clock_mhz/stage_1") == [(0, 1410.0)]
    assert history("report/energy_saving") == [(1, 0.072)]
    assert history("report/energy_saving_ci95_low") == [(1, 0.046)]


def test_an_mlflow_directory_that_cannot_be_written_costs_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = LoggerConfig(backend=LoggerBackend.mlflow)
    tracker = Tracker(
        lambda: open_backend(cfg, blocker / "runs", "job", {}),
        ListFeed([rows()]),
        dict,
        name="mlflow",
        start=False,
    )
    with caplog.at_level(logging.WARNING):
        assert not tracker.open()
    warned = [r.getMessage() for r in caplog.records if "Perseus tracker" in r.getMessage()]
    assert len(warned) == 1 and "logger=mlflow" in warned[0]


def test_a_wandb_offline_run_is_written(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    cfg = LoggerConfig(backend=LoggerBackend.wandb, experiment="perseus-test")
    directory = tmp_path / "wandb-runs"
    tracker = Tracker(
        lambda: open_backend(cfg, directory, "job-1", {"job_id": "job-1"}),
        ListFeed([rows()]),
        lambda: summary_figures(SUMMARY),
        name="wandb",
        start=False,
    )
    drive(tracker, 1)
    assert tracker.failure is None
    # W&B keeps an offline run in its own binary log (no reader of it ships in Python since
    # wandb 0.2x; `wandb sync` uploads it): the run is there, finished, with its records.
    (run_file,) = directory.glob("wandb/offline-run-*/run-*.wandb")
    assert run_file.stat().st_size > 1000
    debug = next(directory.glob("wandb/offline-run-*/logs/debug.log")).read_text()
    assert "finish" in debug.lower()
