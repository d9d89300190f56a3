from __future__ import annotations

import numpy as np
import pytest

from perseus.formats.plan.document import plan_from_dict
from perseus.planner.frontier import build_frontier, pareto_rows
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate

from ._profiles import synthetic_profile


@pytest.fixture(scope="module")
def problem() -> PlanningProblem:
    return PlanningProblem(synthetic_profile(3, seed=4), 4, p2p_power_w=[60.0, 70.0, 80.0])


def test_pareto_rows_drops_dominated_and_duplicates() -> None:
    times = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 1.5, 2.5])
    energies = np.array([10.0, 10.0, 8.0, 9.0, 8.0, 9.0, 7.0])
    assert pareto_rows(times, energies) == [0, 5, 2, 6]


def test_frontier_is_honest_sorted_and_nondominated(problem: PlanningProblem) -> None:
    rng = np.random.default_rng(1)
    cands = [
        np.array([rng.choice(problem.candidates[g]) for g in problem.node_group])
        for _ in range(300)
    ]
    cands += cands[:50]  # duplicates
    frontier = build_frontier(problem, cands)
    times = [p.iteration_time_s for p in frontier.points]
    energies = [p.energy_j for p in frontier.points if not p.is_allmax]
    assert times == sorted(times)
    assert all(a > b for a, b in zip(energies, energies[1:]))  # strictly better when slower
    assert [p.plan_id for p in frontier.points] == list(range(len(frontier)))
    for point in frontier.points[:: max(1, len(frontier) // 6)]:
        res = simulate(problem, point.freqs)
        assert res.iteration_time_s == pytest.approx(point.iteration_time_s)
        assert res.energy_j == pytest.approx(point.energy_j)
    # no candidate beats the frontier
    for c in cands[::10]:
        res = simulate(problem, problem.choices_to_freqs(c))
        better = [
            p
            for p in frontier.points
            if p.iteration_time_s <= res.iteration_time_s * (1 + 1e-12)
            and p.energy_j <= res.energy_j * (1 + 1e-12)
        ]
        assert better


def test_allmax_always_present(problem: PlanningProblem) -> None:
    frontier = build_frontier(problem, [])
    assert len(frontier) == 1
    assert frontier.allmax.is_allmax
    assert frontier.allmax.freqs == problem.allmax_freqs()
    assert frontier.saving(frontier.allmax) == 0.0


def test_to_plan_and_dataframe(problem: PlanningProblem) -> None:
    rng = np.random.default_rng(2)
    cands = [
        np.array([rng.choice(problem.candidates[g]) for g in problem.node_group]) for _ in range(40)
    ]
    frontier = build_frontier(problem, cands)
    point = frontier.points[-1]
    plan = frontier.to_plan(point)
    assert plan.num_stages == 3 and plan.num_microbatches == 4
    assert plan.predicted_iteration_time_s == point.iteration_time_s
    assert plan.predicted_energy_j == point.energy_j
    assert [(s.instruction, s.microbatch) for s in plan.stages[1]] == problem.order[1]
    again = plan_from_dict(plan.to_dict())
    assert again.frequencies(2) == point.freqs[2]
    df = frontier.to_dataframe()
    assert list(df.columns[:3]) == ["plan_id", "iteration_time_s", "energy_j"]
    assert df["is_allmax"].sum() == 1
    assert len(df) == len(frontier)


def test_frequency_plans_accepted(problem: PlanningProblem) -> None:
    frontier = build_frontier(problem, [problem.allmax_freqs()])
    assert len(frontier) == 1
