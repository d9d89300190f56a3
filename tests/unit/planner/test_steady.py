"""Steady-state patterns: the cyclic problem's period and energy, and spliced plans."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time, simulate_choices
from perseus.planner.solvers.lp.layout import steady_pair
from perseus.planner.solvers.lp.solver import LPSolver
from perseus.planner.solvers.lp.steady.cycle import (
    allmax_period_s,
    cycle_period_s,
    relaxed_durations_s,
    solve_cycle,
)
from perseus.planner.solvers.lp.steady.splice import applies, find_pattern, splice

from ._profiles import synthetic_profile


def _allmax_time(problem: PlanningProblem) -> float:
    return iteration_time(problem, problem.opt_time[problem.node_group, problem.allmax_choices()])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_allmax_period_is_what_each_microbatch_adds(seed: int) -> None:
    profile = synthetic_profile(4, seed=seed)
    times = [_allmax_time(PlanningProblem(profile, m, p2p_power_w=60.0)) for m in (40, 41)]
    period = allmax_period_s(PlanningProblem(profile, 40, p2p_power_w=60.0))
    assert period == pytest.approx(times[1] - times[0], rel=1e-9)


def test_a_plan_repeating_a_pattern_falls_behind_by_its_cycle_period() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=4), 60, p2p_power_w=60.0)
    rng = np.random.default_rng(0)
    pattern = np.array([[rng.choice(problem.candidates[g]) for _ in range(2)] for g in range(6)])
    period = cycle_period_s(problem, pattern)
    times = []
    for num_mb in (60, 80):
        p = PlanningProblem(problem.profile, num_mb, p2p_power_w=60.0)
        pair = steady_pair(p)
        plan = p.allmax_choices()
        inside = pair >= 0
        plan[inside] = pattern[p.node_group[inside], pair[inside] % 2]
        times.append(simulate_choices(p, plan[None])[0][0])
    # 20 more pairs take 20 periods once the pattern's slowest cycle dominates.
    assert (times[1] - times[0]) / 20 == pytest.approx(period, rel=1e-6)


def test_the_cyclic_milp_is_exact_on_one_pair() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=3), 30, p2p_power_w=60.0)
    period = allmax_period_s(problem) * 1.05
    start = problem.max_option[:, None]
    best = solve_cycle(problem, period, start, np.ones(start.shape, dtype=bool))
    assert best is not None
    # Exhaustive over every option of the 4 groups.
    cands = [problem.candidates[g] for g in range(4)]
    lowest = np.inf
    for combo in np.array(np.meshgrid(*cands, indexing="ij")).reshape(4, -1).T:
        choices = combo[:, None]
        if cycle_period_s(problem, choices) <= period * (1 + 1e-9):
            energy = problem.opt_effective[np.arange(4), combo].sum()
            lowest = min(lowest, energy)
    assert best.energy_j == pytest.approx(lowest, rel=1e-9)
    # The relaxation's durations never beat the fastest options, and keep the period.
    durations = relaxed_durations_s(problem, period)
    assert np.all(durations >= problem.opt_time[np.arange(4), problem.max_option] - 1e-12)


@pytest.fixture(scope="module")
def long_problem() -> PlanningProblem:
    return PlanningProblem(synthetic_profile(3, seed=5), 28, p2p_power_w=60.0)


def test_the_pattern_keeps_its_period_and_spliced_plans_meet_the_deadline(
    long_problem: PlanningProblem,
) -> None:
    problem = long_problem
    assert applies(problem)
    period = allmax_period_s(problem)
    pattern = find_pattern(problem, period)
    assert pattern is not None
    assert cycle_period_s(problem, pattern.choices) <= period * (1 + 1e-9)
    assert pattern.saved_per_pair_j >= 0.0
    deadline = _allmax_time(problem)
    plans = splice(problem, problem.allmax_choices(), pattern, deadline)
    assert plans
    times, energies = simulate_choices(problem, np.vstack(plans))
    assert np.all(times <= deadline * (1 + 1e-9))
    allmax_j = simulate_choices(problem, problem.allmax_choices()[None])[1][0]
    assert energies.min() < allmax_j


def test_the_solver_with_the_pattern_is_never_worse(long_problem: PlanningProblem) -> None:
    problem = long_problem
    deadline = _allmax_time(problem)
    best = []
    for steady in (False, True):
        plans = LPSolver(deadlines_s=[deadline], steady_pattern=steady).solve_choices(problem)
        times, energies = simulate_choices(problem, np.vstack(plans))
        best.append(energies[times <= deadline * (1 + 1e-9)].min())
    assert best[1] <= best[0] * (1 + 1e-12)


def test_short_or_other_schedules_get_no_pattern() -> None:
    assert not applies(PlanningProblem(synthetic_profile(3, seed=5), 12, p2p_power_w=60.0))
