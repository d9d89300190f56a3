"""Proven lower bounds: never above a real plan's energy, exact when the MILP closes."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.errors import SolverError
from perseus.planner import plan_frontier
from perseus.planner.cases import case_problem
from perseus.planner.policies import best_for_iteration_time
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time, simulate_choices
from perseus.planner.solvers.lp.milp.bounds import lp_bound, milp_bound
from perseus.planner.solvers.lp.milp.cuts import PathCut, least_energy_within, path_cuts
from perseus.planner.solvers.lp.milp.model import MILPModel
from perseus.planner.solvers.lp.milp.windows import time_windows, windowed

from ._profiles import synthetic_profile


def _near_fastest(
    problem: PlanningProblem, rng: np.random.Generator, slowed: float, count: int
) -> np.ndarray:
    """Plans near the fastest one: each instruction slowed with probability ``slowed``."""
    fastest = np.array([problem.candidates[g][0] for g in problem.node_group])
    return np.array(
        [
            [
                rng.choice(problem.candidates[g]) if rng.random() < slowed else f
                for g, f in zip(problem.node_group, fastest)
            ]
            for _ in range(count)
        ]
    )


def test_windows_keep_every_plan_meeting_the_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=2), 4, p2p_power_w=70.0)
    plans = _near_fastest(problem, np.random.default_rng(0), 0.3, 2000)
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
        assert part.method == "milp+cuts(stages 1)" and part.plan is None
        assert lp.energy_j * (1 - 1e-9) <= part.energy_j <= best.energy_j * (1 + 1e-9)


def test_least_energy_within_is_the_exhaustive_optimum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        items = [(rng.uniform(1, 3, 4), rng.uniform(0, 10, 4)) for _ in range(3)]
        window = float(rng.uniform(3, 9))
        best = min(
            (
                e0 + e1 + e2
                for (t0, e0) in zip(*items[0])
                for (t1, e1) in zip(*items[1])
                for (t2, e2) in zip(*items[2])
                if t0 + t1 + t2 <= window
            ),
            default=float("inf"),
        )
        assert least_energy_within(items, window) == pytest.approx(best, rel=1e-12)


def test_path_cuts_keep_every_plan_meeting_the_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=4), 4, p2p_power_w=70.0)
    plans = _near_fastest(problem, np.random.default_rng(1), 0.4, 3000)
    times, _ = simulate_choices(problem, plans)
    deadline = float(np.quantile(times, 0.2))
    allowed = windowed(problem, deadline, None)
    cuts = path_cuts(problem, deadline, allowed, max_path_nodes=4)
    assert cuts, "a tight deadline must give cuts the relaxation violates"
    fitting = plans[times <= deadline]
    assert len(fitting) > 100
    effective = problem.opt_effective[problem.node_group[None, :], fitting]
    for cut in cuts:
        assert (effective[:, list(cut.nodes)].sum(axis=1) >= cut.bound_j).all()


def test_cuts_tighten_the_relaxation_and_never_pass_the_optimum() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    exact = plan_frontier(problem, solver="exact")
    fastest = exact.points[0].iteration_time_s
    for deadline in (exact.allmax.iteration_time_s, fastest * 1.02, fastest * 1.1):
        best = best_for_iteration_time(exact, deadline).energy_j
        plain = lp_bound(problem, deadline).energy_j
        cut = lp_bound(problem, deadline, cut_path_nodes=3)
        assert cut.method == "lp+cuts"
        assert plain * (1 - 1e-9) <= cut.energy_j <= best * (1 + 1e-9)


def test_cuts_bite_next_to_the_bottleneck_of_a_published_case() -> None:
    problem = case_problem("gpt3-175b+a40_bf16", 12)
    deadline = iteration_time(
        problem, problem.opt_time[problem.node_group, problem.allmax_choices()]
    )
    plain = lp_bound(problem, deadline).energy_j
    cut = lp_bound(problem, deadline, cut_path_nodes=3).energy_j
    assert cut > plain * (1 + 1e-4)


def test_a_cut_through_a_hull_instruction_is_refused() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    deadline = iteration_time(
        problem, problem.opt_time[problem.node_group, problem.allmax_choices()]
    )
    allowed = windowed(problem, deadline, None)
    model = MILPModel(problem, deadline, allowed, hull_nodes=np.array([0]))
    with pytest.raises(SolverError, match="discrete instructions only"):
        model.add_cuts([PathCut((0, 1), 1.0, 0.0)])
