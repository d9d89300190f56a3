"""Effort levels of the lp solver: what each searches, their settings, their cost model."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.config.enums import PlannerEffort
from perseus.config.schema import PerseusConfig
from perseus.config.validation import validate
from perseus.errors import ConfigError
from perseus.planner import plan_frontier
from perseus.planner.limits import estimate
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time, simulate_choices
from perseus.planner.solvers.lp import effort as effort_module
from perseus.planner.solvers.lp.effort import DEFAULT_EFFORT, EFFORTS, effort_settings
from perseus.planner.solvers.lp.layout import steady_pair
from perseus.planner.solvers.lp.solver import LPSolver
from perseus.planner.solvers.lp.steady.cycle import allmax_period_s
from perseus.planner.solvers.lp.steady.splice import (
    MARGIN_PAIRS,
    applies,
    find_pattern,
    held_nodes,
    splice,
)

from ._profiles import synthetic_profile


@pytest.fixture(scope="module")
def long_problem() -> PlanningProblem:
    # 3 stages x 28 microbatches: the shortest steady state the splice takes at three stages
    # (the levels differ in it), and small enough for the polish and the re-optimisation of
    # every level.
    return PlanningProblem(synthetic_profile(3, seed=5), 28, p2p_power_w=60.0)


def _allmax_time(problem: PlanningProblem) -> float:
    return iteration_time(problem, problem.opt_time[problem.node_group, problem.allmax_choices()])


def _best_at(problem: PlanningProblem, plans: list, deadline_s: float) -> float:
    times, energies = simulate_choices(problem, np.vstack(plans))
    return float(energies[times <= deadline_s * (1 + 1e-9)].min())


def test_the_levels_are_the_config_enum_and_balanced_is_the_default() -> None:
    assert set(EFFORTS) == {e.value for e in PlannerEffort}
    assert DEFAULT_EFFORT == PerseusConfig().planner.effort == "balanced"
    assert LPSolver().effort == "balanced"
    assert LPSolver().settings == effort_settings("balanced")


def test_fast_solves_no_milp_and_thorough_searches_hardest() -> None:
    fast, balanced, thorough = (effort_settings(e) for e in ("fast", "balanced", "thorough"))
    assert fast.polish_nodes == fast.gap_milps == fast.reoptimize_sweeps == 0
    assert not fast.steady_pattern and fast.proof_milp_nodes == 0
    assert balanced.reoptimize_sweeps == 0 and balanced.steady_light and balanced.polish_light
    assert balanced.polish_windows is not None and balanced.polish_passes == 1
    assert balanced.gap_milps == 0 < thorough.gap_milps  # the walks only: the MILPs do not pay
    assert thorough.reoptimize_sweeps > 0 and thorough.polish_windows is None
    assert not (thorough.steady_light or thorough.polish_light or thorough.gap_light)
    assert thorough.polish_passes > balanced.polish_passes


def test_unknown_levels_and_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"planner.effort='slow'.*balanced"):
        LPSolver(effort="slow")
    with pytest.raises(TypeError):
        LPSolver(polish_nodez=3)
    cfg = PerseusConfig()
    cfg.planner.effort = "slow"  # type: ignore[assignment]  # as a dataclass built in code
    with pytest.raises(ConfigError, match="planner.effort='slow': choose one of fast"):
        validate(cfg)


def test_a_single_setting_overrides_its_level() -> None:
    solver = LPSolver(effort="thorough", reoptimize_sweeps=0)
    assert solver.settings.reoptimize_sweeps == 0
    assert solver.settings.polish_passes == effort_settings("thorough").polish_passes


def test_each_level_meets_the_deadline_and_searching_more_never_loses(
    long_problem: PlanningProblem,
) -> None:
    problem = long_problem
    assert applies(problem)  # balanced and thorough splice a pattern into it
    deadline = _allmax_time(problem)
    best = {}
    for level in ("fast", "balanced", "thorough"):
        plans = LPSolver(deadlines_s=[deadline], effort=level, polish_gap=-1.0).solve_choices(
            problem
        )
        best[level] = _best_at(problem, plans, deadline)
    allmax_j = simulate_choices(problem, problem.allmax_choices()[None])[1][0]
    # balanced and thorough start from fast's plans and only add to them.
    assert best["fast"] < allmax_j
    assert best["balanced"] <= best["fast"] * (1 + 1e-12)
    assert best["thorough"] <= best["fast"] * (1 + 1e-12)


def test_the_relaxed_splice_meets_the_deadline(long_problem: PlanningProblem) -> None:
    problem = long_problem
    deadline = _allmax_time(problem)
    pattern = find_pattern(problem, allmax_period_s(problem), bands=(2,), band_sweeps=1)
    assert pattern is not None
    base = problem.allmax_choices()
    plans = splice(problem, base, pattern, deadline, relaxed=True)
    assert plans
    times, energies = simulate_choices(problem, np.vstack(plans))
    assert np.all(times <= deadline * (1 + 1e-9))
    allmax_j = simulate_choices(problem, base[None])[1][0]
    assert energies.min() < allmax_j
    # The held interior keeps phase 0 of the pattern (its first six plans: three schedules,
    # each rounded and slack-filled), or a slower option the slack filling found room for.
    held = np.flatnonzero(held_nodes(problem))
    assert 0 < len(held) < problem.num_nodes
    groups = problem.node_group[held]
    phase0 = pattern.choices[groups, (steady_pair(problem)[held] - MARGIN_PAIRS) % 4]
    for plan in plans[:6]:
        kept = plan[held] == phase0
        slower = problem.opt_time[groups, plan[held]] > problem.opt_time[groups, phase0]
        assert np.all(kept | slower)
        assert kept.mean() > 0.5


def test_the_effort_reaches_the_lp_solver_and_other_solvers_ignore_it(
    long_problem: PlanningProblem, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    real = effort_module.effort_settings

    def spy(effort: str):  # type: ignore[no-untyped-def]
        seen.append(effort)
        return real(effort)

    monkeypatch.setattr("perseus.planner.solvers.lp.solver.effort_settings", spy)
    small = PlanningProblem(synthetic_profile(2, seed=1), 3, p2p_power_w=60.0)
    plan_frontier(small, effort="fast")
    assert seen == ["fast"]
    frontier = plan_frontier(small, "exact", effort="fast")
    assert len(frontier) >= 1 and seen == ["fast"]


def test_the_estimate_follows_the_effort() -> None:
    thorough = estimate(8, 96, effort="thorough").seconds
    balanced = estimate(8, 96, effort="balanced").seconds
    fast = estimate(8, 96, effort="fast").seconds
    assert fast < balanced < thorough
    assert balanced < 60 < thorough
    assert estimate(8, 24, effort="balanced").seconds < estimate(8, 24, effort="thorough").seconds
