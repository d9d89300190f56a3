"""Jump refinement: hulls with a locked tail, pin/unpin, and the refiner on a jumpy profile."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.formats.profile.table import Profile
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp import LPSolver
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.model import HullLP
from perseus.planner.solvers.lp.refine import JumpRefiner, hull_below
from perseus.planner.solvers.lp.rounding import Rounder

FREQS = (1400, 1350, 1300, 1250, 1200, 1150, 1100, 1000)


def jumpy_profile(num_stages: int = 4) -> Profile:
    """GPU-like profile whose backward drops sharply in energy at 1000 MHz (a long hull
    segment skipping 1100-1350); the last stage is 8 % heavier, so the others have slack."""
    rows = []
    for s in range(num_stages):
        weight = 1.08 if s == num_stages - 1 else 1.0
        for name, base_t in (("forward", 1.0), ("backward", 2.0)):
            for f in FREQS:
                t = base_t * weight * (1400 / f) ** 0.5
                power = 60.0 + 240.0 * (f / 1400) ** 2.5
                if name == "backward" and f == 1000:
                    power *= 0.7
                rows.append((s, name, f, t, power * t))
    return Profile.from_rows(rows, source="jumpy")


@pytest.fixture(scope="module")
def problem() -> PlanningProblem:
    return PlanningProblem(jumpy_profile(), 8, 50.0)


def allmax_time(problem: PlanningProblem) -> float:
    t, _ = simulate_choices(problem, problem.allmax_choices()[None, :])
    return float(t[0])


def test_profile_has_a_long_backward_segment(problem: PlanningProblem) -> None:
    hull = group_hulls(problem)[1]
    freqs = problem.opt_freq[1, hull.options].tolist()
    assert freqs[-1] == 1000 and 1100 not in freqs
    assert hull.lengths_s[-1] > 0.05 * hull.time_s[0]


def test_hull_below_keeps_faster_options_and_locks_the_slow_end(
    problem: PlanningProblem,
) -> None:
    hull = group_hulls(problem)[1]
    below = hull_below(problem, 1, float(hull.time_s[-1]))
    freqs = problem.opt_freq[1, below.options].tolist()
    assert freqs[-1] == 1000 and freqs[-2] == 1100  # skipped options are usable again
    assert below.locked_tail == 1
    assert np.all(np.diff(below.time_s) > 0)
    assert np.allclose(below.lengths_s, np.diff(below.time_s))
    # Apart from the locked tail, the hull is convex (slopes increase).
    assert np.all(np.diff(below.slopes[:-1]) > 0)


def test_locked_tail_is_closed_until_pinned(problem: PlanningProblem) -> None:
    hulls = group_hulls(problem)
    below = hull_below(problem, 1, float(hulls[1].time_s[-1]))
    node_hull = problem.node_group.copy()
    node_hull[problem.node_group == 1] = len(hulls)
    model = HullLP(problem, [*hulls, below], node_hull)
    deadline = 10 * allmax_time(problem)  # everything may run slowest
    loose = model.solve(deadline)
    nodes = np.flatnonzero(problem.node_group == 1)
    assert np.allclose(loose.durations_s[nodes], below.time_s[-2])  # 1100, not 1000
    model.pin(nodes[:1], below.time_s[-1:])
    pinned = model.try_solve()
    assert pinned is not None
    assert pinned.durations_s[nodes[0]] == pytest.approx(below.time_s[-1])
    assert pinned.energy_j < loose.energy_j
    model.unpin(nodes[:1])
    again = model.try_solve()
    assert again is not None
    assert again.energy_j == pytest.approx(loose.energy_j)


def test_refiner_plans_meet_the_deadline_and_lp_bound(problem: PlanningProblem) -> None:
    hulls = group_hulls(problem)
    model = HullLP(problem, hulls)
    deadline = allmax_time(problem)
    solution = model.solve(deadline)
    refiner = JumpRefiner(problem, hulls)
    refined = refiner.refine(model, solution)
    assert refined, "the LP should sit inside the long backward segment somewhere"
    assert refiner.trials > 0
    assert any((node_hull != problem.node_group).any() for _, node_hull in refined)
    rounder = Rounder(problem, hulls)
    plans = []
    for lp, node_hull in refined:
        # The refined model restricts the hull LP: never below its bound.
        assert lp.energy_j >= solution.energy_j * (1 - 1e-9)
        plans += list(rounder.from_own_hulls(lp, refiner.hulls, node_hull))
    times, energies = simulate_choices(problem, np.vstack(plans))
    assert np.all(times <= deadline * (1 + 1e-9))
    assert np.all(energies >= solution.energy_j * (1 - 1e-9))


def test_refinement_saves_more_at_no_slowdown(problem: PlanningProblem) -> None:
    deadline = allmax_time(problem) * (1 + 1e-6)

    def best(**options: object) -> float:
        plans = LPSolver(**options).solve_choices(problem)  # type: ignore[arg-type]
        times, energies = simulate_choices(problem, np.vstack(plans))
        return float(energies[times <= deadline].min())

    # Plain rounding loses ~2 pp of the LP's 20.7 % here; refinement wins back ~1 pp.
    assert best(refine_deadlines=1) < best(refine_deadlines=0) * 0.995
