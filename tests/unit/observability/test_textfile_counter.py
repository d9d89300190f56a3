"""A job without a server publishes its snapshot as files; a counter's updates become energy."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perseus.observability.counter import CounterTrack
from perseus.observability.optimizers import batch_size_snapshot, power_limit_snapshot, publish
from perseus.observability.textfile import (
    SNAPSHOT_SUFFIX,
    TEXTFILE_SUFFIX,
    TextfilePublisher,
    file_stem,
    read_snapshot_file,
)
from tests.unit.observability.test_snapshot_metrics import WEIRD, optimizer_job, pipeline


@dataclass
class Update:
    time_s: float
    energy_mj: float


def test_the_publisher_writes_the_textfile_and_the_snapshot(tmp_path: Path) -> None:
    publisher = TextfilePublisher(tmp_path, WEIRD, lambda: optimizer_job(), start=False)
    assert publisher.publish()
    assert publisher.textfile.name.endswith(TEXTFILE_SUFFIX)
    assert publisher.jsonfile.name.endswith(SNAPSHOT_SUFFIX)
    assert read_snapshot_file(publisher.jsonfile) == optimizer_job()
    text = publisher.textfile.read_text(encoding="utf-8")
    names = {s.labels["job_id"] for f in text_string_to_metric_families(text) for s in f.samples}
    assert names == {WEIRD}
    assert publisher.jsonfile.stat().st_mode & 0o777 == 0o644  # another user's server reads it
    publisher.close()  # the last snapshot once more, retired
    assert read_snapshot_file(publisher.jsonfile).retired


def test_file_names_are_safe_and_distinct() -> None:
    assert "/" not in file_stem("a/b") and "\n" not in file_stem(WEIRD)
    assert file_stem("a/b") != file_stem("a_b")


def test_a_directory_that_cannot_be_written_costs_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    publisher = TextfilePublisher(blocker / "metrics", "job", lambda: pipeline(), start=False)
    with caplog.at_level(logging.WARNING):
        assert not publisher.publish()
        assert not publisher.publish()
        publisher.close()
    warned = [r for r in caplog.records if "metrics textfile" in r.getMessage()]
    assert len(warned) == 1
    assert "make it writable" in warned[0].getMessage()


def test_without_prometheus_client_the_snapshot_is_still_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    publisher = TextfilePublisher(tmp_path, "job", lambda: pipeline(), start=False)
    with caplog.at_level(logging.WARNING):
        assert publisher.publish() and publisher.publish()
    assert publisher.jsonfile.is_file() and not publisher.textfile.exists()
    warned = [r.getMessage() for r in caplog.records if "metrics textfile" in r.getMessage()]
    assert len(warned) == 1 and "perseus-energy[metrics]" in warned[0]


def test_a_source_that_fails_skips_that_write(tmp_path: Path) -> None:
    def broken() -> None:
        raise RuntimeError("mid-change")

    publisher = TextfilePublisher(tmp_path, "job", broken, start=False)
    assert not publisher.publish() and not publisher.warned


def test_the_counter_counts_energy_and_power_across_a_reset() -> None:
    track = CounterTrack()
    track.add([Update(0.0, 1000.0), Update(0.5, 51000.0)], now_s=10.0, history_s=60.0)
    assert track.energy_j == pytest.approx(50.0) and track.power_w is None  # < 1 s seen
    track.add([Update(1.0, 101000.0)], now_s=11.0, history_s=60.0)
    assert track.power_w == pytest.approx(100.0)
    assert list(track.samples) == [(11.0, pytest.approx(100.0))]
    # The counter went back (a driver reload): it continues, never subtracts.
    track.add([Update(1.5, 500.0), Update(2.0, 20500.0)], now_s=12.0, history_s=60.0)
    assert track.energy_j == pytest.approx(120.0)
    track.add([Update(2.0, 20500.0)], now_s=12.5, history_s=60.0)  # seen already
    assert track.energy_j == pytest.approx(120.0)
    track.add([], now_s=100.0, history_s=60.0)  # the history forgets old samples
    assert list(track.samples) == []


REPORT = {
    "state": "done",
    "chosen_power_limit_w": 332.0,
    "failure": None,
    "saving": {
        "energy_saving": 0.2016,
        "energy_saving_ci95": [0.1867, 0.2165],
        "energy_saving_measurable": True,
        "slowdown": 0.0877,
        "slowdown_ci95": [0.0666, 0.1088],
        "interval": "3 pairs of windows",
    },
    "measurements": [
        {"power_limit_w": 482.0, "time_per_step_s": 0.145, "energy_per_step_j": 59.0,
         "zeus_cost_j": 64.4, "num_windows": 3},
        {"power_limit_w": 332.0, "time_per_step_s": 0.158, "energy_per_step_j": 47.1,
         "zeus_cost_j": 61.6, "num_windows": 3},
    ],
}  # fmt: skip


def test_the_power_limit_optimizer_snapshot() -> None:
    snap = power_limit_snapshot("pl", REPORT)
    assert snap.kind == "power_limit" and snap.phase == "done"
    assert snap.optimizer is not None
    assert [(c.label, c.chosen, c.cost) for c in snap.optimizer.choices] == [
        ("482 W", False, 64.4),
        ("332 W", True, 61.6),
    ]
    assert snap.energy_saving is not None
    assert (snap.energy_saving.value, snap.energy_saving.lower) == (0.2016, 0.1867)
    assert [(a.arm, a.energy_j) for a in snap.arms] == [("baseline", 59.0), ("plan", 47.1)]


@dataclass
class Run:
    batch_size: int
    status: str
    time_s: float
    energy_j: float


def test_the_batch_size_optimizer_snapshot() -> None:
    runs = [
        Run(64, "reached", 10.0, 100.0),
        Run(64, "failed", 20.0, 200.0),
        Run(128, "running", 0, 0),
    ]
    summary = {"stage": "bandit", "mean_cost": {64: 150.0}, "best_batch_size": 64}
    snap = batch_size_snapshot("nightly", summary, runs)
    assert snap.optimizer is not None
    first, second = snap.optimizer.choices
    assert (first.label, first.runs, first.cost, first.chosen) == ("batch 64", 2, 150.0, True)
    assert first.time_s == pytest.approx(15.0)
    assert (second.batch_size, second.time_s, second.chosen) == (128, None, False)


def test_publish_takes_an_optimizer_only(tmp_path: Path) -> None:
    with (
        pytest.raises(TypeError, match="PowerLimitOptimizer or a RecurringJob"),
        publish(object(), tmp_path),
    ):
        pass
