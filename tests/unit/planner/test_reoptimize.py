"""Re-optimisation: whole-MILP windows keep the deadline and only ever save energy."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp.milp.program import solve_milp_result
from perseus.planner.solvers.lp.reoptimize import reoptimize

from ._profiles import synthetic_profile


@pytest.fixture(scope="module")
def problem() -> PlanningProblem:
    return PlanningProblem(synthetic_profile(3, seed=7), 6, p2p_power_w=60.0)


def _energy(problem: PlanningProblem, plan: np.ndarray) -> tuple:
    times, energies = simulate_choices(problem, plan[None, :])
    return float(times[0]), float(energies[0])


def test_windows_improve_the_all_max_plan_within_the_deadline(problem: PlanningProblem) -> None:
    allmax = problem.allmax_choices()
    deadline, start_j = _energy(problem, allmax)
    out = reoptimize(problem, [allmax], deadline, window=8, max_nodes=50, sweeps=2)
    assert len(out) == 1
    time_s, energy_j = _energy(problem, out[0])
    assert time_s <= deadline * (1 + 1e-9)
    assert energy_j < start_j * 0.97
    # Windows of eight leave the far ends of the schedule to one another: no better than
    # the whole MILP's optimum.
    exact = solve_milp_result(problem, deadline, mip_rel_gap=1e-9)
    assert exact.optimal
    assert energy_j >= exact.energy_j * (1 - 1e-9)


def test_one_window_over_everything_is_the_milp_optimum(problem: PlanningProblem) -> None:
    allmax = problem.allmax_choices()
    deadline, _ = _energy(problem, allmax)
    out = reoptimize(
        problem, [allmax], deadline, window=problem.num_nodes, max_nodes=100_000, sweeps=1
    )
    exact = solve_milp_result(problem, deadline, mip_rel_gap=1e-9)
    assert _energy(problem, out[0])[1] == pytest.approx(exact.energy_j, rel=1e-6)


def test_nothing_better_returns_nothing(problem: PlanningProblem) -> None:
    allmax = problem.allmax_choices()
    deadline, _ = _energy(problem, allmax)
    exact = solve_milp_result(problem, deadline, mip_rel_gap=1e-9)
    assert exact.choices is not None
    assert reoptimize(problem, [exact.choices], deadline, window=12, sweeps=1) == []
    # No plan meets an impossible deadline: nothing to start from.
    assert reoptimize(problem, [allmax], deadline * 0.5) == []


def test_the_solver_solves_the_gap_tests_bound_once(
    problem: PlanningProblem, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perseus.planner.solvers.lp import search as search_module
    from perseus.planner.solvers.lp.solver import LPSolver

    calls = []
    real = search_module.lp_bound

    def counted(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(search_module, "lp_bound", counted)
    deadline, allmax_j = _energy(problem, problem.allmax_choices())
    # polish_gap=-1: both the polish and the re-optimisation run (each asks the gap test).
    solver = LPSolver(deadlines_s=[deadline], polish_gap=-1.0, reoptimize_sweeps=1)
    plans = solver.solve_choices(problem)
    assert len(calls) == 1
    energies = simulate_choices(problem, np.vstack(plans))[1]
    assert energies.min() < allmax_j
