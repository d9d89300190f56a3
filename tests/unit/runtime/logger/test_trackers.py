"""The trackers: their feeds, their runs read back with each tool's own reader, their failures.

TensorBoard's event files are read back with TensorBoard's ``EventAccumulator``. The tracker is
driven step by step here (its thread, with real jobs, in tests/e2e/test_trackers.py; MLflow and
W&B, whose imports start processes, in tests/integration/observability/test_tracker_runs.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.config.schema import LoggerBackend, LoggerConfig
from perseus.errors import ExtraMissingError
from perseus.launcher.report import report_from_summary
from perseus.records import InstructionRecord, StepRecord
from perseus.runtime.logger.backends import open_backend, row_scalars
from perseus.runtime.logger.feeds import RankFeed, ServerFeed, StepRow, record_clock_mhz
from perseus.runtime.logger.tracker import Tracker, power_limit_figures, summary_figures

SUMMARY: Dict[str, Any] = {
    "job_id": "j",
    "phase": "watching",
    "baseline": {"iteration_time_s": 0.25, "energy_j": 179.0, "num_steps": 20},
    "plan": {"iteration_time_s": 0.253, "energy_j": 166.7, "num_steps": 20},
    "predicted": {
        "plan_id": 0,
        "iteration_time_s": 0.226,
        "energy_j": 160.0,
        "energy_saving_fraction": 0.0714,
        "energy_saving_ci95": [0.048, 0.094],
        "slowdown_fraction": 0.0,
        "solve_time_s": 0.5,
        "frontier_points": 40,
    },
    "savings": {
        "energy_fraction": 0.072,
        "energy_saving_ci95": [0.046, 0.097],
        "energy_saving_measurable": True,
        "slowdown_fraction": 0.013,
        "slowdown_ci95": [-0.045, 0.07],
        "num_block_pairs": 4,
        "block_steps": 5,
    },
    "profiling": {"iterations": 40},
}


def rows() -> List[StepRow]:
    return [
        StepRow(
            step=0,
            iteration_time_s=0.25,
            energy_j=None,
            clocks_mhz={0: 1410.0, 1: 1410.0},
            phase="baseline",
            arm="baseline",
        ),
        StepRow(
            step=1,
            iteration_time_s=0.26,
            energy_j=170.0,
            clocks_mhz={0: 1300.0},
            phase="profiling",
            arm="profiling",
        ),
        StepRow(
            step=0,
            iteration_time_s=0.25,
            energy_j=180.0,
            clocks_mhz={0: 1410.0, 1: 1410.0},
            phase="baseline",
            arm="baseline",
        ),  # its energy
    ]


def test_the_report_figures_are_report_json_s() -> None:
    report = report_from_summary(SUMMARY)
    figures = summary_figures(SUMMARY)
    assert figures["energy_saving"] == report["energy_saving"]
    assert [figures["energy_saving_ci95_low"], figures["energy_saving_ci95_high"]] == (
        report["energy_saving_ci95"]
    )
    assert figures["slowdown"] == report["slowdown"]
    assert figures["predicted_energy_saving"] == report["predicted_energy_saving"]
    assert figures["plan_energy_j"] == report["plan"]["energy_j"]
    assert figures["baseline_iteration_time_s"] == report["baseline"]["iteration_time_s"]
    assert figures["profiling_iterations"] == report["profiling_iterations"]
    not_measurable = {**SUMMARY, "savings": {**SUMMARY["savings"], "energy_fraction": None}}
    assert "energy_saving" not in summary_figures(not_measurable)  # its interval only
    table = {"chosen_power_limit_w": 332.0, "saving": {"energy_saving": 0.2, "slowdown": 0.08}}
    assert power_limit_figures(table) == {
        "chosen_power_limit_w": 332.0,
        "energy_saving": 0.2,
        "slowdown": 0.08,
    }


def test_a_row_gives_every_scalar_once_and_its_energy_when_it_comes() -> None:
    first = row_scalars(rows()[0], first=True)
    assert ("iteration_time_s", 0.25, 0) in first and ("clock_mhz/stage_1", 1410.0, 0) in first
    assert ("phase_index", 0.0, 0) in first and not any(k == "energy_j" for k, _, _ in first)
    assert row_scalars(rows()[2], first=False) == [("energy_j", 180.0, 0)]


def test_the_server_feed_gives_new_iterations_then_their_late_energies() -> None:
    answers = [
        {"job_id": "j", "phase": "baseline", "steps": [
            {"step": 0, "time_s": 1.0, "iteration_time_s": 0.25, "energy_j": None,
             "arm": "baseline", "clocks_mhz": [1410.0, None]},
            {"step": 1, "time_s": 2.0, "iteration_time_s": 0.26, "energy_j": 180.0,
             "arm": "baseline", "clocks_mhz": [1410.0, 1410.0]},
        ]},
        {"job_id": "j", "phase": "profiling", "steps": [
            {"step": 0, "time_s": 1.0, "iteration_time_s": 0.25, "energy_j": 179.0,
             "arm": "baseline", "clocks_mhz": [1410.0, None]},
            {"step": 1, "time_s": 2.0, "iteration_time_s": 0.26, "energy_j": 180.0,
             "arm": "baseline", "clocks_mhz": [1410.0, 1410.0]},
        ]},
    ]  # fmt: skip
    asked: List[Dict[str, Any]] = []

    def get(path: str, **params: Any) -> Any:
        asked.append({"path": path, **params})
        return answers.pop(0)

    feed = ServerFeed(get, "j")
    first = feed.poll()
    assert [(r.step, r.energy_j, r.clocks_mhz) for r in first] == [
        (0, None, {0: 1410.0}),
        (1, 180.0, {0: 1410.0, 1: 1410.0}),
    ]
    second = feed.poll()
    assert [(r.step, r.energy_j) for r in second] == [(0, 179.0)]  # only the energy that came
    assert asked[0]["path"] == "/live/jobs/j/steps" and asked[1]["after"] == -1


def record(step: int, energy_j: Any) -> StepRecord:
    record = StepRecord(
        step=step,
        stage=1,
        start_s=0.0,
        end_s=0.3,
        instructions=[
            InstructionRecord(
                position=0,
                instruction="forward",
                microbatch=0,
                frequency_mhz=1410,
                start_s=0.0,
                end_s=0.1,
            ),
            InstructionRecord(
                position=1,
                instruction="backward",
                microbatch=0,
                frequency_mhz=1000,
                start_s=0.1,
                end_s=0.2,
            ),
        ],
    )
    record.energy_j = energy_j
    return record


def test_the_rank_feed_reads_the_hooks_records() -> None:
    kept = [record(0, None), record(1, 12.0)]
    feed = RankFeed(lambda: kept, lambda: "plan")
    first = feed.poll()
    assert [(r.step, r.energy_j, r.phase, r.clocks_mhz) for r in first] == [
        (0, None, "plan", {1: pytest.approx(1205.0)}),
        (1, 12.0, "plan", {1: pytest.approx(1205.0)}),
    ]
    kept[0].energy_j = 11.0
    assert [(r.step, r.energy_j) for r in feed.poll()] == [(0, 11.0)]
    assert feed.poll() == []
    assert record_clock_mhz(StepRecord(step=0, stage=0, start_s=0, end_s=1)) is None


class ListFeed:
    def __init__(self, batches: List[List[StepRow]]) -> None:
        self.batches = batches

    def poll(self) -> List[StepRow]:
        return self.batches.pop(0) if self.batches else []


def drive(tracker: Tracker, looks: int) -> None:
    assert tracker.open()
    for _ in range(looks):
        assert tracker.look()
    tracker.finish()


def test_tensorboard_events_read_back_with_tensorboard_s_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = LoggerConfig(backend=LoggerBackend.tensorboard)
    directory = tmp_path / "tb"
    tracker = Tracker(
        lambda: open_backend(cfg, directory, "job-1", {}),
        ListFeed([rows()]),
        lambda: summary_figures(SUMMARY),
        name="tensorboard",
        start=False,
    )
    drive(tracker, 1)
    events = EventAccumulator(str(directory))
    events.Reload()

    def scalars(tag: str) -> List[Any]:
        return [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]

    assert scalars("iteration_time_s") == [(0, 0.25), (1, 0.26)]
    assert sorted(scalars("energy_j"), key=lambda x: x[0]) == [(0, 180.0), (1, 170.0)]
    assert scalars("phase_index") == [(0, 0.0), (1, 1.0)]
    assert scalars("report/slowdown") == [(1, 0.013)]


def test_a_tracker_that_cannot_write_costs_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for backend in (LoggerBackend.tensorboard,):
        cfg = LoggerConfig(backend=backend)
        tracker = Tracker(
            lambda cfg=cfg: open_backend(cfg, blocker / "runs", "job", {}),
            ListFeed([rows()]),
            dict,
            name=str(backend),
            start=False,
        )
        with caplog.at_level(logging.WARNING):
            assert not tracker.open()
        assert tracker.failure is not None
    warned = [r.getMessage() for r in caplog.records if "Perseus tracker" in r.getMessage()]
    assert len(warned) == 1 and "the training goes on" in warned[0]


def test_a_backend_that_fails_later_stops_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        where = "nowhere"

        def log(self, scalars: Any) -> None:
            raise OSError("disk full")

        def phase(self, phase: str, step: int) -> None:
            pass

    tracker = Tracker(Broken, ListFeed([rows(), rows()]), dict, name="x", start=False)
    with caplog.at_level(logging.WARNING):
        assert tracker.open()
        assert not tracker.look()
    assert "disk full" in (tracker.failure or "")
    assert sum("Perseus tracker" in r.getMessage() for r in caplog.records) == 1


def test_a_missing_package_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    monkeypatch.setitem(sys.modules, "mlflow.entities", None)
    with pytest.raises(ExtraMissingError, match=r"perseus-energy\[mlflow\]"):
        open_backend(LoggerConfig(backend=LoggerBackend.mlflow), Path("x"), "j", {})
