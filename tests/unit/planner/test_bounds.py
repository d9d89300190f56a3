"""Proven lower bounds: never above a real plan's energy, exact when the MILP closes."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.planner import plan_frontier
from perseus.planner.policies import best_for_iteration_time
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp.bounds import lp_bound, milp_bound
from perseus.planner.solvers.lp.windows import time_windows, windowed

from ._profiles import synthetic_profile


def test_windows_keep_every_plan_meeting_the_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=2), 4, p2p_power_w=70.0)
    rng = np.random.default_rng(0)
    # Plans near the fastest one (each instruction slowed with probability 0.3).
    fastest = np.array([problem.candidates[g][0] for g in problem.node_group])
    plans = np.array(
        [
            [
                rng.choice(problem.candidates[g]) if rng.random() < 0.3 else f
                for g, f in zip(problem.node_group, fastest)
            ]
            for _ in range(2000)
        ]
    )
    times, _ = simulate_choices(problem, plans)
    deadline = float(times.min()) * 1.03
    allowed = windowed(problem, deadline, None)
    start, finish = time_windows(problem, deadline)
    assert (start >= 0).all() and (finish <= deadline * (1 + 1e-12)).all()
    assert sum(map(len, allowed)) < sum(len(problem.candidates[g]) for g in problem.node_group)
    assert (times <= deadline).sum() > 20
    for plan in plans[times <= deadline]:
        assert all(plan[v] in allowed[v] for v in range(problem.num_nodes))


def test_bounds_never_exceed_a_plan_and_the_milp_is_exact() -> None:
    # 8 instructions x 4 options: the exact solver enumerates every plan.
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    exact = plan_frontier(problem, solver="exact")
    fastest = exact.points[0].iteration_time_s
    for deadline in (exact.allmax.iteration_time_s, fastest * 1.05, fastest * 1.2):
        best = best_for_iteration_time(exact, deadline)
        lp = lp_bound(problem, deadline)
        milp = milp_bound(problem, deadline, time_limit_s=60.0, mip_rel_gap=1e-9)
        assert lp.energy_j <= milp.energy_j * (1 + 1e-9)
        assert milp.energy_j <= best.energy_j * (1 + 1e-9)
        assert milp.optimal and milp.plan is not None
        assert milp.plan_energy_j == pytest.approx(best.energy_j, rel=1e-7)
        # A relaxation with only stage 1 discrete lies in between.
        part = milp_bound(problem, deadline, time_limit_s=60.0, discrete_stages=[1])
        assert part.method == "milp(stages 1)" and part.plan is None
        assert lp.energy_j * (1 - 1e-9) <= part.energy_j <= best.energy_j * (1 + 1e-9)
