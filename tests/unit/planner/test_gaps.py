"""Frontier density: gap detection, the gap-filling moves, and the 0.5 % spacing on real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.formats.profile.table import read_profile_csv
from perseus.planner import plan_frontier
from perseus.planner.frontier import MAX_GAP_REL, build_frontier, density_gaps, max_gap_rel
from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp import LPSolver, gaps
from perseus.planner.solvers.lp.gaps import between_options, gap_deadlines, relink
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.model import HullLP
from perseus.planner.solvers.lp.rounding import Rounder

from ._profiles import synthetic_profile

DATA = Path(__file__).resolve().parents[3] / "perseus" / "data" / "sosp24"


def test_density_gaps_cover_fastest_to_least_energy_only() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=3), 2, p2p_power_w=60.0)
    rng = np.random.default_rng(1)
    plans = [
        np.array([rng.choice(problem.candidates[g]) for g in problem.node_group])
        for _ in range(300)
    ]
    frontier = build_frontier(problem, plans)
    t_fastest = frontier.points[0].iteration_time_s
    least = min(frontier.points, key=lambda p: p.energy_j)
    inside = [
        p.iteration_time_s for p in frontier.points if p.iteration_time_s <= least.iteration_time_s
    ]
    steps = [b / a - 1 for a, b in zip(inside, inside[1:])]
    assert max_gap_rel(frontier) == pytest.approx(max(steps))
    for threshold in (0.0, 0.01, 0.05):
        gaps = density_gaps(frontier, threshold)
        assert len(gaps) == sum(step > threshold for step in steps)
        for a, b in gaps:
            assert t_fastest <= a.iteration_time_s < b.iteration_time_s
            assert b.iteration_time_s <= least.iteration_time_s


def test_gap_deadlines_split_below_the_limit() -> None:
    deadlines = gap_deadlines(10.0, 10.3, 0.005)
    points = [10.0, *deadlines, 10.3]
    assert all(b / a - 1 < 0.005 for a, b in zip(points, points[1:]))
    assert gap_deadlines(10.0, 10.001, 0.005) == []


def test_relink_and_between_options() -> None:
    problem = PlanningProblem(synthetic_profile(2, seed=4), 3, p2p_power_w=60.0)
    fast = problem.allmax_choices()
    slow = np.array([problem.candidates[g][-1] for g in problem.node_group])
    slow[0] = fast[0]
    diff = np.flatnonzero(fast != slow)
    rows = relink(fast, slow, diff, np.arange(len(diff), dtype=float))
    assert rows.shape == (len(diff), problem.num_nodes)
    thin = relink(fast, slow, diff, np.arange(len(diff), dtype=float), max_plans=3)
    assert len(thin) == 3 and np.array_equal(thin[-1], slow) and np.array_equal(thin[0], rows[0])
    # row k switched the k+1 most eager nodes (highest preference first) to the slow plan
    assert np.array_equal(rows[-1], slow)
    assert (rows[0] != fast).sum() == 1 and rows[0][diff[-1]] == slow[diff[-1]]
    allowed = between_options(problem, fast, slow)
    assert allowed[0].tolist() == [fast[0]]  # agreeing nodes are fixed
    for v in diff:
        assert fast[v] in allowed[v] and slow[v] in allowed[v]


def test_gap_filling_makes_a_published_frontier_dense() -> None:
    # GPT-3 on A100, 8 stages x 12 microbatches: rounding the LP inside the flat end of the
    # curve leaves a step over 0.5 %; the gap filling closes it with Pareto-optimal plans.
    # Every limit is a count (MILPs, branch-and-bound nodes), so the result is the same on
    # any machine.
    problem = PlanningProblem(read_profile_csv(DATA / "gpt3-175b+a100_sxm_bf16.csv"), 12, 83.64)
    plans = LPSolver(max_gap_rel=0.0, polish_nodes=0, reoptimize_sweeps=0).solve_choices(problem)
    sparse = build_frontier(problem, plans)
    assert max_gap_rel(sparse) > MAX_GAP_REL
    hulls = group_hulls(problem)
    model, rounder = HullLP(problem, hulls), Rounder(problem, hulls)
    added = gaps.fill_gaps(
        problem,
        sparse,
        model.solve,
        lambda solution: list(rounder.from_solutions([solution])),
    )
    dense = build_frontier(problem, plans + added)
    assert max_gap_rel(dense) <= MAX_GAP_REL
    # Filling only adds plans: no frontier point got worse.
    assert min(p.energy_j for p in dense.points) <= min(p.energy_j for p in sparse.points)
    assert dense.allmax.energy_j == sparse.allmax.energy_j


def test_prove_empty_accepts_true_gaps_only() -> None:
    # Every plan enumerated: consecutive frontier points hold nothing between them, and
    # skipping a point leaves a step that is not empty.
    problem = PlanningProblem(synthetic_profile(2, seed=5), 2, p2p_power_w=50.0)
    exact = plan_frontier(problem, solver="exact")
    # Leave out the all-max plan: it is kept even when a faster plan dominates it.
    points = [p for p in exact.points if not p.is_allmax]
    assert len(points) >= 5
    for a, b in zip(points[1:4], points[2:5]):
        assert gaps.prove_empty(problem, a, b) is not None
    a, c = points[1], points[3]
    assert gaps.prove_empty(problem, a, c) is None
