from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

from perseus.config.schema import EnergyConfig
from perseus.errors import ConfigError, SolverError
from perseus.formats.profile.table import Profile, read_profile_csv
from perseus.planner import plan_frontier
from perseus.planner.policies import choose
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers import Solver, available_solvers, get_solver, register_solver
from perseus.planner.solvers.base import Progress
from perseus.planner.solvers.lp import LPSolver
from perseus.planner.solvers.lp.hull import group_hulls, lower_hull
from perseus.planner.solvers.lp.model import HullLP, fractional_classes

from ._profiles import synthetic_profile

DATA = Path(__file__).resolve().parents[3] / "perseus" / "data" / "sosp24"


def test_lower_hull() -> None:
    t = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    c = np.array([10.0, 6.0, 5.5, 3.0, 2.9])
    # (3, 5.5) lies above the segment (2, 6) -> (4, 3)
    assert lower_hull(t, c).tolist() == [0, 1, 3, 4]
    assert lower_hull(t[:1], c[:1]).tolist() == [0]


def test_hull_uses_effective_energy() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=1), 2, p2p_power_w=100.0)
    for g, hull in enumerate(group_hulls(problem)):
        assert np.all(np.diff(hull.time_s) > 0)
        assert np.all(np.diff(hull.cost_j) < 0)
        assert np.all(np.diff(hull.slopes) > 0)
        cand_t = problem.opt_time[g, problem.candidates[g]]
        cand_c = problem.opt_effective[g, problem.candidates[g]]
        # every candidate lies on or above the hull
        assert np.all(cand_c >= np.interp(cand_t, hull.time_s, hull.cost_j) - 1e-9)


def test_lp_bound_below_every_plan_meeting_the_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=2), 4, p2p_power_w=70.0)
    model = HullLP(problem, group_hulls(problem))
    rng = np.random.default_rng(0)
    plans = np.array(
        [[rng.choice(problem.candidates[g]) for g in problem.node_group] for _ in range(400)]
    )
    times, energies = simulate_choices(problem, plans)
    for deadline in np.quantile(times, [0.05, 0.3, 0.6, 0.95]):
        bound = model.solve(float(deadline)).energy_j
        assert np.all(energies[times <= deadline] >= bound - 1e-6)


def test_lp_infeasible_deadline() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=1), 2, p2p_power_w=10.0)
    model = HullLP(problem, group_hulls(problem))
    with pytest.raises(SolverError, match="below the fastest possible plan"):
        model.solve(1e-3)


def test_dive_pins_fractional_classes() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=3), 6, p2p_power_w=70.0)
    model = HullLP(problem, group_hulls(problem))
    times, _ = simulate_choices(problem, problem.allmax_choices()[None, :])
    first = model.solve(float(times[0]) * 1.05)
    nodes, lower = fractional_classes(model, first)
    assert len(nodes) > 0
    model.start_dive()
    model.fix(nodes, lower)
    pinned = model.resolve()
    assert pinned is not None
    assert np.allclose(pinned.durations_s[nodes], lower)
    assert pinned.energy_j >= first.energy_j - 1e-6
    again = model.solve(float(times[0]) * 1.05)  # the sweep model is untouched
    assert again.energy_j == pytest.approx(first.energy_j)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved_1f1b"])
def test_lp_solver_plans_meet_their_deadlines(schedule: str) -> None:
    chunks = 2 if schedule == "interleaved_1f1b" else 1
    problem = PlanningProblem(
        synthetic_profile(4, seed=6),
        8,
        p2p_power_w=80.0,
        schedule=schedule,
        num_model_chunks=chunks,
    )
    solver = LPSolver()
    messages: List[float] = []
    plans = solver.solve_choices(problem, progress=lambda msg, frac: messages.append(frac))
    assert messages and messages[-1] == 1.0 and all(0.0 <= f <= 1.0 for f in messages)
    times, energies = simulate_choices(problem, np.array(plans))
    deadlines = [t for t, _ in solver.bounds]
    # deadlines are dense (<= 0.5 % apart) and every plan beats the LP bound of some deadline
    assert all(b / a - 1 <= 0.005 + 1e-12 for a, b in zip(deadlines, deadlines[1:]))
    for deadline, bound in solver.bounds:
        fitting = energies[times <= deadline * (1 + 1e-9)]
        assert len(fitting) and fitting.min() >= bound - 1e-6
    frontier = plan_frontier(problem)
    allmax_t = frontier.allmax.iteration_time_s
    assert frontier.points[0].iteration_time_s <= allmax_t
    assert choose(frontier, EnergyConfig(policy="no_slowdown")).energy_j < frontier.allmax.energy_j


def test_frontier_reaches_minimum_energy() -> None:
    problem = PlanningProblem(synthetic_profile(3, seed=8), 4, p2p_power_w=60.0)
    frontier = plan_frontier(problem)
    slowest = np.array([problem.candidates[g][-1] for g in problem.node_group])
    _, e_slow = simulate_choices(problem, slowest[None, :])
    exact = plan_frontier(problem, solver="exact", max_plans=0, num_deadlines=6)
    least = min(p.energy_j for p in frontier.points)
    assert least <= e_slow[0] + 1e-9
    assert least <= min(p.energy_j for p in exact.points) * 1.01


def test_published_profile_no_slowdown_saving() -> None:
    path = DATA / "bloom+a100_sxm_bf16.csv"
    if not path.exists():
        pytest.skip("published profiles not bundled")
    problem = PlanningProblem(read_profile_csv(path), 12, p2p_power_w=83.64)
    frontier = plan_frontier(problem)
    saving = frontier.saving(choose(frontier, EnergyConfig(policy="no_slowdown")))
    model = HullLP(problem, group_hulls(problem))
    bound = 1 - model.solve(frontier.allmax.iteration_time_s).energy_j / frontier.allmax.energy_j
    assert saving >= 0.105  # the paper's Table 6 figure for this case
    assert bound - saving <= 0.005


def test_registry() -> None:
    assert {"lp", "lowtime", "exact"} <= set(available_solvers())
    with pytest.raises(ConfigError, match="unknown solver"):
        get_solver("simulated-annealing")

    @register_solver("allmax-only")
    class AllMax(Solver):
        def solve(
            self, problem: PlanningProblem, progress: Optional[Progress] = None
        ) -> List[List[List[int]]]:
            return [problem.allmax_freqs()]

    problem = PlanningProblem(synthetic_profile(2, seed=1), 2, p2p_power_w=10.0)
    frontier = plan_frontier(problem, solver="allmax-only")
    assert len(frontier) == 1 and frontier.allmax.plan_id == 0


def test_plans_faster_than_allmax_are_found() -> None:
    # Measurement noise: stage 1's backward is fastest at 1200 MHz, not at the maximum.
    rows = []
    for s in range(2):
        rows += [(s, "forward", 1400, 1.0, 200.0), (s, "forward", 1000, 1.3, 150.0)]
        rows += [(s, "backward", 1400, 2.0, 400.0), (s, "backward", 1000, 2.6, 300.0)]
    rows.append((1, "backward", 1200, 1.9, 420.0))
    problem = PlanningProblem(Profile.from_rows(rows), 4, p2p_power_w=60.0)
    frontier = plan_frontier(problem)
    assert frontier.points[0].iteration_time_s < frontier.allmax.iteration_time_s
    assert not frontier.points[0].is_allmax
