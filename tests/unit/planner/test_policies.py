from __future__ import annotations

import logging

import pytest

from perseus.config.schema import EnergyConfig
from perseus.errors import ConfigError
from perseus.formats.profile.table import Profile
from perseus.planner.frontier import Frontier, FrontierPoint
from perseus.planner.policies import (
    best_for_iteration_time,
    choose,
    max_pipeline_power_w,
)
from perseus.planner.problem import PlanningProblem

# (time s, energy J); the all-max plan is the second point
POINTS = [
    (9.9, 1000.0),
    (10.0, 990.0),
    (10.0 * (1 + 5e-7), 900.0),
    (10.0 * (1 + 2e-6), 850.0),
    (10.5, 800.0),
    (11.0, 700.0),
    (13.0, 650.0),
]


def _frontier() -> Frontier:
    rows = [
        (0, "forward", 1000, 1.0, 100.0),
        (0, "backward", 1000, 2.0, 100.0),
        (1, "forward", 1000, 1.0, 400.0),
        (1, "backward", 1000, 2.0, 100.0),
    ]
    problem = PlanningProblem(Profile.from_rows(rows), 2, p2p_power_w=10.0)
    points = [
        FrontierPoint(
            plan_id=i,
            iteration_time_s=t,
            energy_j=e,
            freqs=problem.allmax_freqs(),
            is_allmax=i == 1,
        )
        for i, (t, e) in enumerate(POINTS)
    ]
    return Frontier(problem, points)


def _pick(**kwargs: object) -> int:
    return choose(_frontier(), EnergyConfig(**kwargs)).plan_id  # type: ignore[arg-type]


def test_no_slowdown_uses_relative_tolerance_1e6() -> None:
    assert _pick(policy="no_slowdown") == 2  # 5e-7 slower is float noise, 2e-6 is not


def test_slowdown() -> None:
    assert _pick(policy="slowdown", max_slowdown=0.05) == 4
    assert _pick(policy="slowdown", max_slowdown=0.0) == 2
    assert _pick(policy="slowdown", max_slowdown=1.0) == 6
    with pytest.raises(ConfigError, match="max_slowdown"):
        _pick(policy="slowdown")


def test_deadline_and_infeasible_deadline(caplog: pytest.LogCaptureFixture) -> None:
    assert _pick(policy="deadline", iteration_time_s=11.5) == 5
    with caplog.at_level(logging.WARNING):
        assert _pick(policy="deadline", iteration_time_s=5.0) == 0
    assert "no plan reaches an iteration time of 5.000000 s" in caplog.text
    with pytest.raises(ConfigError, match="iteration_time_s"):
        _pick(policy="deadline")


def test_min_energy_and_max_speed() -> None:
    assert _pick(policy="min_energy") == 6
    assert _pick(policy="max_speed") == 1


def test_zeus_cost() -> None:
    frontier = _frontier()
    # highest instruction power: stage 1 forward 400 J / 1 s, x 2 stages
    assert max_pipeline_power_w(frontier) == 800.0
    # eta=1: energy only; eta=0: time only
    assert _pick(policy="zeus_cost", eta=1.0) == 6
    assert _pick(policy="zeus_cost", eta=0.0) == 0
    # eta=0.5: 0.5 E + 400 T -> 9.9 s: 4460; 10.00002 s (850 J): 4425; 10.5 s: 4600
    assert _pick(policy="zeus_cost", eta=0.5) == 3
    # eta=0.9: 0.9 E + 80 T -> 9.9: 1692; 10.5: 1560; 11: 1510; 13: 1625
    assert _pick(policy="zeus_cost", eta=0.9) == 5
    with pytest.raises(ConfigError, match="eta"):
        _pick(policy="zeus_cost", eta=1.5)


def test_power_limit_is_not_a_pipeline_policy() -> None:
    with pytest.raises(ConfigError, match="does not choose a pipeline plan"):
        _pick(policy="power_limit")


def test_best_for_imposed_iteration_time() -> None:
    frontier = _frontier()
    assert best_for_iteration_time(frontier, 10.7).plan_id == 4
    assert best_for_iteration_time(frontier, 100.0).plan_id == 6
    assert best_for_iteration_time(frontier, 9.9).plan_id == 0
