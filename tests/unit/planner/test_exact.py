from __future__ import annotations

import numpy as np
import pytest

from perseus.planner import plan_frontier
from perseus.planner.policies import best_for_iteration_time
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp.milp.program import solve_milp

from ._profiles import synthetic_profile

CASES = [(2, 3, 0, "1f1b"), (3, 2, 1, "1f1b"), (2, 3, 2, "gpipe"), (3, 2, 3, "1f1b")]


@pytest.mark.parametrize(("num_stages", "num_mb", "seed", "schedule"), CASES)
def test_lp_frontier_close_to_exact(num_stages: int, num_mb: int, seed: int, schedule: str) -> None:
    profile = synthetic_profile(num_stages, freqs_mhz=(1400, 1100, 800), seed=seed)
    problem = PlanningProblem(profile, num_mb, p2p_power_w=70.0, schedule=schedule)
    exact = plan_frontier(problem, solver="exact", max_plans=600_000)
    fast = plan_frontier(problem, solver="lp")
    assert len(exact) >= 3
    gaps = []
    for point in exact.points:
        if point.is_allmax:  # kept even when dominated; not an optimum
            continue
        mine = best_for_iteration_time(fast, point.iteration_time_s)
        assert mine.iteration_time_s <= point.iteration_time_s * (1 + 1e-9)
        gaps.append(mine.energy_j / point.energy_j - 1)
        # exact is exact: nothing the fast solver finds beats it
        best_exact = best_for_iteration_time(exact, mine.iteration_time_s)
        assert best_exact.energy_j <= mine.energy_j * (1 + 1e-9)
    print(f"gap to exact: worst {max(gaps):.4f}, mean {np.mean(gaps):.4f}")
    # Three coarse frequencies make rounding hard: a few deadlines miss by up to ~2.5 %.
    assert max(gaps) < 0.03, gaps
    assert np.mean(gaps) < 0.005, gaps
    # both frontiers span all-max to minimum energy
    assert fast.allmax.energy_j == pytest.approx(exact.allmax.energy_j)
    assert min(p.energy_j for p in fast.points) <= min(p.energy_j for p in exact.points) * 1.005


@pytest.mark.parametrize("seed", [0, 1])
def test_lp_frontier_close_to_milp_with_fine_frequencies(seed: int) -> None:
    freqs = tuple(range(1410, 900, -60))  # 9 frequencies, like a real clock table
    problem = PlanningProblem(synthetic_profile(2, freqs_mhz=freqs, seed=seed), 3, 70.0)
    fast = plan_frontier(problem)
    lo = fast.allmax.iteration_time_s
    hi = max(p.iteration_time_s for p in fast.points)
    gaps = []
    for deadline in np.linspace(lo, hi, 6):
        choices = solve_milp(problem, float(deadline), mip_rel_gap=1e-7)
        assert choices is not None
        t, e = simulate_choices(problem, choices[None, :])
        mine = best_for_iteration_time(fast, float(deadline))
        # the MILP's plan is the least-energy one meeting the deadline: never beaten
        assert t[0] <= deadline * (1 + 1e-9)
        assert mine.energy_j >= e[0] - 1e-6
        gaps.append(mine.energy_j / e[0] - 1)
    print(f"gap to MILP: worst {max(gaps):.4f}, mean {np.mean(gaps):.4f}")
    assert max(gaps) < 0.015, gaps
    assert np.mean(gaps) < 0.005, gaps


def test_milp_matches_enumeration() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    exact = plan_frontier(problem, solver="exact")
    for point in exact.points[:: max(1, len(exact) // 5)]:
        choices = solve_milp(problem, point.iteration_time_s, mip_rel_gap=1e-9)
        assert choices is not None
        t, e = simulate_choices(problem, choices[None, :])
        assert t[0] <= point.iteration_time_s * (1 + 1e-9)
        # Both are the least energy with T <= the point's time: the same energy.
        assert e[0] == pytest.approx(point.energy_j, rel=1e-7)


def test_milp_accepts_a_starting_plan() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=5), 3, p2p_power_w=50.0)
    fast = plan_frontier(problem)
    point = fast.points[len(fast) // 2]
    start = problem.freqs_to_choices(point.freqs)
    choices = solve_milp(problem, point.iteration_time_s, start=start, time_limit_s=5.0)
    assert choices is not None
    t, e = simulate_choices(problem, choices[None, :])
    assert t[0] <= point.iteration_time_s * (1 + 1e-9)
    assert e[0] <= point.energy_j + 1e-6


def test_milp_infeasible_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    assert solve_milp(problem, 1e-3) is None
    assert np.all(problem.allmax_choices() >= 0)
