"""Shared clocks in the 1F1B steady state: the periodic LP against the exact one."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest

from perseus.config.schema import EnergyConfig
from perseus.planner import plan_frontier, plan_policy
from perseus.planner.policies import choose
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import iteration_time, simulate, simulate_choices
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.layout import (
    identity_layout,
    periodic_layout,
    steady_pair,
)
from perseus.planner.solvers.lp.model import HullLP

from ._profiles import synthetic_profile

# (stages, microbatches, seed): several shapes, each with a steady state to compress.
SHAPES = [(2, 16, 0), (3, 20, 1), (4, 24, 2), (4, 40, 3), (6, 36, 4)]


def allmax(problem: PlanningProblem) -> Tuple[float, float]:
    t, e = simulate_choices(problem, problem.allmax_choices()[None, :])
    return float(t[0]), float(e[0])


def test_steady_pairs_follow_the_1f1b_order() -> None:
    problem = PlanningProblem(synthetic_profile(4), 10, 50.0)
    pair = steady_pair(problem)
    for s, order in enumerate(problem.order):
        warmup = 4 - s - 1
        lo = problem.dag.offsets[s]
        for i, (name, mb) in enumerate(order):
            expect = mb - warmup if name == "forward" else mb
            inside = warmup <= i < len(order) - warmup
            assert pair[lo + i] == (expect if inside else -1)


def test_periodic_layout_shares_only_the_interior() -> None:
    problem = PlanningProblem(synthetic_profile(4, seed=1), 24, 50.0)
    layout = periodic_layout(problem, margin=4)
    assert layout.periodic and not layout.is_identity
    # 8 shared classes (4 stages x forward/backward), everything else explicit.
    shared = np.flatnonzero(layout.class_count > 1)
    assert len(shared) == 8
    assert layout.class_count.sum() == problem.num_nodes
    assert np.array_equal(layout.class_group[shared], np.arange(8))
    # Too short a steady state: the identity.
    assert periodic_layout(PlanningProblem(synthetic_profile(4), 10, 50.0), 4).is_identity
    gpipe = PlanningProblem(synthetic_profile(4), 24, 50.0, schedule="gpipe")
    assert periodic_layout(gpipe, 4).is_identity


@pytest.mark.parametrize("stages,microbatches,seed", SHAPES)
def test_periodic_lp_agrees_with_the_exact_lp(stages: int, microbatches: int, seed: int) -> None:
    problem = PlanningProblem(synthetic_profile(stages, seed=seed), microbatches, 60.0)
    hulls = group_hulls(problem)
    exact = HullLP(problem, hulls, layout=identity_layout(problem))
    shared = HullLP(problem, hulls, layout=periodic_layout(problem, max(4, 2 * stages)))
    assert shared.num_rows < exact.num_rows
    t_allmax, _ = allmax(problem)
    for factor in (1.0, 1.01, 1.05, 1.2):
        deadline = t_allmax * factor
        a, b = exact.solve(deadline), shared.solve(deadline)
        # Sharing restricts the LP (never below the exact optimum) and costs nothing here.
        assert b.energy_j >= a.energy_j * (1 - 1e-9)
        assert b.energy_j <= a.energy_j * (1 + 1e-5)
        # The periodic LP's schedule is a real one: its durations meet the deadline.
        assert iteration_time(problem, b.durations_s) <= deadline * (1 + 1e-9)
        assert np.all(b.finish_s <= deadline * (1 + 1e-9))


@pytest.mark.parametrize("stages,microbatches,seed", SHAPES[:3])
def test_structured_and_exact_paths_agree(stages: int, microbatches: int, seed: int) -> None:
    problem = PlanningProblem(synthetic_profile(stages, seed=seed), microbatches, 60.0)
    policy = EnergyConfig(policy="no_slowdown")
    exact = plan_frontier(problem, max_exact_nodes=10**9)
    shared = plan_frontier(problem, max_exact_nodes=0)
    for frontier in (exact, shared):
        # Every point is the exact re-simulation of its plan.
        for point in frontier.points:
            sim = simulate(problem, point.freqs)
            assert sim.iteration_time_s == pytest.approx(point.iteration_time_s, rel=1e-12)
            assert sim.energy_j == pytest.approx(point.energy_j, rel=1e-12)
    saving_exact = exact.saving(choose(exact, policy))
    saving_shared = shared.saving(choose(shared, policy))
    assert saving_exact > 0.005
    assert abs(saving_exact - saving_shared) < 0.003
    # Least energy of the whole frontier agrees as well.
    least = [min(p.energy_j for p in f.points) for f in (exact, shared)]
    assert least[1] == pytest.approx(least[0], rel=0.003)


def reference_run(problem: PlanningProblem, freqs: List[List[int]]) -> Tuple[float, float]:
    """Iteration time and energy by an event-by-event run of the 1F1B order (no DAG code)."""
    profile = problem.profile
    done: Dict[Tuple[int, str, int], float] = {}
    free = [0.0] * problem.num_stages
    busy = [0.0] * problem.num_stages
    energy = 0.0
    position = [0] * problem.num_stages
    last = problem.num_stages - 1
    remaining = sum(len(o) for o in problem.order)
    while remaining:
        for s, order in enumerate(problem.order):
            while position[s] < len(order):
                name, mb = order[position[s]]
                dep = (s - 1, name, mb) if name == "forward" else (s + 1, name, mb)
                if name == "backward" and s == last:
                    dep = (s, "forward", mb)
                if (name == "forward" and s == 0) or dep in done:
                    ready = done.get(dep, 0.0)
                else:
                    break
                m = profile.lookup(s, name, freqs[s][position[s]])
                start = max(free[s], ready)
                free[s] = done[(s, name, mb)] = start + m.time_s
                busy[s] += m.time_s
                energy += m.energy_j
                position[s] += 1
                remaining -= 1
    total = max(free)
    blocking = sum(p * (total - b) for p, b in zip(problem.p2p_power_w, busy))
    return total, energy + blocking


def test_large_case_is_resimulated_exactly() -> None:
    # 8 stages x 1,024 microbatches (16,384 instructions) through the structured path.
    problem = PlanningProblem(synthetic_profile(8, seed=7), 1024, 70.0)
    frontier = plan_policy(problem, EnergyConfig(policy="no_slowdown"))
    chosen = choose(frontier, EnergyConfig(policy="no_slowdown"))
    t_allmax, e_allmax = allmax(problem)
    assert frontier.allmax.iteration_time_s == t_allmax
    assert chosen.iteration_time_s <= t_allmax * (1 + 1e-9)
    assert chosen.energy_j < e_allmax * 0.99
    for point in frontier.points:
        # The plan covers every instruction of every microbatch ...
        assert [len(f) for f in point.freqs] == [len(o) for o in problem.order]
        # ... and its time and energy are those of an independent event-by-event run.
        total_s, energy_j = reference_run(problem, point.freqs)
        assert total_s == pytest.approx(point.iteration_time_s, rel=1e-9)
        assert energy_j == pytest.approx(point.energy_j, rel=1e-9)
