"""perseus-plan's progress line against a fake clock, and in a real run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import pytest

from perseus.apps.plan import run_plan
from perseus.apps.plan.progress import ProgressLog, phase
from perseus.config.schema import EnergyConfig, PerseusConfig
from perseus.planner.cases import blocking_power_w, profile_path

LINE = re.compile(r"\((\d+) %, (\d+\.\d) s(?:, about (\d+) s left)?\)$")


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == "perseus.plan"]


def test_phases_ignore_numbers() -> None:
    assert phase("LP sweep: deadline 3/48") == phase("LP sweep: deadline 40/48") == "LP sweep"
    assert phase("refining T <= 15.67 s: round 1") == "refining T <= # s"
    assert phase("gap filling round 1: walk 1/2") == phase("gap filling round 2: walk 2/2")
    assert phase("gap filling round 1: walk 1/2") != phase("refining T <= 15.67 s")


def test_the_line_weighs_the_solve_against_the_outputs(caplog) -> None:
    clock = FakeClock()
    log = ProgressLog(setup_s=0.0, write_s=1.0, plots_s=1.0, period_s=2.0, clock=clock)
    with caplog.at_level("INFO", logger="perseus.plan"):
        log.stage("setup", "building the problem")
        clock.now_s += 1.0
        log.expect([("LP sweep", 4.0), ("search", 4.0)])
        assert log.estimate_s == pytest.approx(10.0)  # solve 8 s, writing and plots 2 s
        log("LP sweep: deadline 1/10", 0.25)  # a new phase: logged at once
        clock.now_s += 1.0
        log("LP sweep: deadline 2/10", 0.3)  # the same phase within 2 s: not logged
        clock.now_s += 1.5
        log("LP sweep: deadline 5/10", 0.5)  # 2.5 s later: logged
        log("search", 1.0)
        log.outputs("write", 0.5, "writing the plans and plots: plan 1/2")
        log.outputs("plots", 1.0, "writing the plans and plots: plots drawn")
        log.finish()
    text = lines(caplog)
    assert text[0] == "building the problem (0 %, 0.0 s)"
    assert text[1].startswith("estimated about 10.0 s: solving 8.0 s (LP sweep 4.0, search 4.0)")
    assert text[2] == "LP sweep: deadline 1/10 (20 %, 1.0 s, about 4 s left)"
    assert text[3] == "LP sweep: deadline 5/10 (40 %, 3.5 s, about 5 s left)"
    assert text[4].startswith("search (80 %, 3.5 s")
    # The outputs run together: half the plans are a quarter of them (the plots' line, in the
    # same phase within 2 s, is not logged); finishing logs nothing more.
    assert text[5].startswith("writing the plans and plots: plan 1/2 (85 %")
    assert len(text) == 6
    assert log.meter.fraction() == 1.0


def test_a_solver_without_a_forecast_still_moves_the_line(caplog) -> None:
    clock = FakeClock()
    log = ProgressLog(write_s=1.0, clock=clock)
    with caplog.at_level("INFO", logger="perseus.plan"):
        log("lowtime: step 3", 0.5)
    assert log.estimate_s is None
    assert lines(caplog) == ["lowtime: step 3 (25 %, 0.0 s)"]


def test_a_run_reports_every_stage_and_reaches_100_only_at_the_end(tmp_path: Path, caplog) -> None:
    cfg = PerseusConfig()
    name = "bloom+a100_sxm_bf16"
    cfg.planner.profile = str(profile_path(name))
    cfg.planner.p2p_power_w = blocking_power_w(name)
    cfg.parallelism.num_microbatches = 12
    cfg.energy = EnergyConfig(policy="no_slowdown")
    with caplog.at_level("INFO", logger="perseus.plan"):
        summary = run_plan(cfg, tmp_path)
    text = lines(caplog)
    shown = [(m, LINE.search(m)) for m in text]
    percents = [int(found.group(1)) for _, found in shown if found]
    assert percents[0] == 0 and all(p < 100 for p in percents[:-1])
    estimate = [m for m in text if m.startswith("estimated about")]
    assert len(estimate) == 1 and "LP sweep" in estimate[0]
    assert any(m.startswith("LP sweep") for m in text)
    assert any(m.startswith("writing") for m in text)
    assert text[-1].startswith("chosen plan")
    timings = summary["timings_s"]
    assert set(timings) == {"setup", "solve", "write", "plots", "total"}
    assert timings["total"] >= timings["solve"] > 0 and summary["estimate_s"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["timings_s"] == timings
    for name in ("frontier.png", "timeline.png", "plan.json", "frontier.csv"):
        assert (tmp_path / name).stat().st_size > 0
