"""The work meter: the fraction follows the expected work left, stage by stage."""

from __future__ import annotations

import re
from typing import List, Tuple

import pytest

from perseus.errors import SolverError
from perseus.planner import plan_frontier
from perseus.planner.problem import PlanningProblem
from perseus.planner.progress import WorkMeter, announce, time_left_s
from perseus.planner.solvers.lp.cost import STAGES

from ._profiles import synthetic_profile


def test_fraction_is_the_expected_work_done() -> None:
    seen: List[Tuple[str, float]] = []
    meter = WorkMeter([("a", 1.0), ("b", 3.0), ("c", 4.0)], lambda m, f: seen.append((m, f)))
    assert meter.fraction() == 0.0 and meter.left_s() == 8.0
    meter.update("a", 0.5, "half of a")
    assert seen[-1] == ("half of a", pytest.approx(0.5 / 8))
    meter.update("b", 0.5, "half of b")  # starting b finishes a
    assert meter.fraction() == pytest.approx(2.5 / 8)
    meter.update("b", 0.25, "less")  # never goes back
    assert meter.fraction() == pytest.approx(2.5 / 8)
    meter.finish("c")
    assert meter.fraction() == 1.0 and meter.left_s() == 0.0


def test_a_stage_that_never_starts_leaves_the_total() -> None:
    meter = WorkMeter([("sweep", 2.0), ("search", 6.0), ("gaps", 2.0)])
    meter.finish("sweep")
    assert meter.fraction() == pytest.approx(0.2)
    meter.update("gaps", 0.0, "gaps")  # the search was not worth it
    assert meter.stage("search").dropped
    assert meter.fraction() == pytest.approx(0.5)  # 2 of the 4 s still expected


def test_never_one_while_work_is_left_and_resizing() -> None:
    meter = WorkMeter([("sweep", 1.0), ("gaps", 1e-9)])
    meter.update("sweep", 1.0, "swept")
    meter.update("gaps", 0.0, "gaps")
    assert meter.fraction() < 1.0
    meter.resize("gaps", 3.0)  # the sweep left gaps: the fraction goes back honestly
    assert meter.fraction() == pytest.approx(0.25)
    meter.reporter("gaps", part=1, parts=2)("second half", 0.5)
    assert meter.stage("gaps").done == pytest.approx(0.75)
    assert meter.fraction() == pytest.approx((1 + 2.25) / 4)


def test_bad_stages_are_refused() -> None:
    with pytest.raises(SolverError, match="distinct stages"):
        WorkMeter([("a", 1.0), ("a", 2.0)])
    with pytest.raises(SolverError, match="negative"):
        WorkMeter([("a", -1.0)])
    with pytest.raises(SolverError, match="no stage 'z'"):
        WorkMeter([("a", 1.0)]).update("z", 0.5, "z")


def test_time_left_scales_the_forecast_by_the_pace() -> None:
    assert time_left_s(3.0, 0.0) is None
    assert time_left_s(3.0, 0.25) == pytest.approx(9.0)
    assert time_left_s(3.0, 1.0) == 0.0


class Recorder:
    """A progress callback that wants the forecast (as perseus-plan's does)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, float]] = []
        self.forecast: List[List[Tuple[str, float]]] = []

    def __call__(self, message: str, fraction: float) -> None:
        self.calls.append((message, fraction))

    def expect(self, stages: List[Tuple[str, float]]) -> None:
        self.forecast.append(stages)


def test_announce_only_to_callbacks_that_ask() -> None:
    meter = WorkMeter([("a", 1.0)])
    announce(lambda m, f: None, meter.stages)  # a plain callable: nothing to call
    recorder = Recorder()
    announce(recorder, meter.stages)
    assert recorder.forecast == [[("a", 1.0)]]


def test_the_lp_solver_forecasts_and_reports_every_stage_it_runs() -> None:
    recorder = Recorder()
    plan_frontier(PlanningProblem(synthetic_profile(3), 6, 40.0), progress=recorder)
    ((forecast,),) = [recorder.forecast]
    assert [name for name, _ in forecast] == list(STAGES)
    assert all(seconds >= 0 for _, seconds in forecast) and forecast[0][1] > 0
    fractions = [f for _, f in recorder.calls]
    assert fractions[-1] == 1.0
    # Nothing reads 100 % before the solver's last report, and the sweep's lines count up.
    assert all(f < 1.0 for f in fractions[:-1])
    sweep = [(m, f) for m, f in recorder.calls if m.startswith("LP sweep")]
    shares = [f for _, f in sweep]
    assert shares == sorted(shares) and 0 < shares[0] < shares[-1] < 1
    # The forecast is of the work after it (the LP was built before): the first line after
    # it is the share of the sweep's first deadline in the forecast, nothing done before.
    expected = int(re.search(r"deadline 1/(\d+)", sweep[0][0]).group(1))
    total_s = sum(seconds for _, seconds in forecast)
    assert sweep[0][1] == pytest.approx(forecast[0][1] / expected / total_s)
    assert any(m.startswith("refining") for m, _ in recorder.calls)
