"""The lp solver's cost model: which stages it expects, and the probe that steers it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perseus.planner.cases import case_problem
from perseus.planner.solvers.lp import cost
from perseus.planner.solvers.lp.effort import effort_settings
from perseus.planner.solvers.lp.hull import group_hulls
from perseus.planner.solvers.lp.model import HullLP
from perseus.planner.solvers.lp.rounding import Rounder
from perseus.planner.solvers.lp.solver import time_range

SHAPE = cost.SolveShape(
    num_nodes=1536,
    lp_size=1536,
    num_deadlines=100,
    sweeps=True,
    num_refine=1,
    exact=True,
    fill_gaps=True,
    polish_windows=63,
    steady=True,
)
CLOSE = cost.Probe(rounding_loss=0.0005, long_classes=60)
FAR = cost.Probe(rounding_loss=0.009, long_classes=600)


def stages(shape: cost.SolveShape, probe: cost.Probe, effort: str = "balanced") -> dict:
    settings = effort_settings(effort)
    return dict(cost.solve_stages(shape, settings, probe, 0.0015, 400, 400))


def test_a_plan_close_to_the_bound_gets_no_search() -> None:
    close = stages(SHAPE, CLOSE)
    assert list(close) == list(cost.STAGES)
    assert close["LP sweep"] > 0 and close["refinement"] > 0 and close["gap filling"] > 0
    assert close["polish"] == close["steady pattern"] == close["seam polish"] == 0.0
    far = stages(SHAPE, FAR)
    assert far["steady pattern"] > 0 and far["splice"] > 0 and far["seam polish"] > 0
    assert far["polish"] == 0.0  # 1,536 instructions: only the spliced plan's seams
    assert far["refinement"] > close["refinement"]  # more classes to decide one by one


def test_the_sweep_expects_half_its_grid_and_a_policy_all_of_its_deadlines() -> None:
    frontier = stages(SHAPE, CLOSE)["LP sweep"]
    policy = dataclasses.replace(SHAPE, num_deadlines=50, sweeps=False, fill_gaps=False)
    assert stages(policy, CLOSE)["LP sweep"] == pytest.approx(frontier)
    assert stages(policy, CLOSE)["gap filling"] == 0.0


def test_small_problems_polish_the_plain_plan_and_thorough_reoptimises() -> None:
    small = dataclasses.replace(SHAPE, num_nodes=192, lp_size=192, polish_windows=7, steady=False)
    balanced = stages(small, FAR)
    assert balanced["polish"] > 0 and balanced["steady pattern"] == 0
    assert balanced["re-optimisation"] == 0.0
    assert stages(small, FAR, "thorough")["re-optimisation"] > 0
    assert stages(small, CLOSE, "thorough")["polish"] == 0.0
    assert stages(small, FAR, "fast")["polish"] == 0.0  # fast solves no MILP


def test_the_seams_windows_grow_faster_with_the_loss_than_the_plain_plans() -> None:
    # 8 x 24: small enough to polish the plain plan, long enough to splice a pattern.
    shape = dataclasses.replace(SHAPE, num_nodes=384, lp_size=384, polish_windows=15)
    low, high = (cost.Probe(rounding_loss=loss, long_classes=60) for loss in (0.0035, 0.009))
    at_low, at_high = stages(shape, low), stages(shape, high)
    assert at_low["polish"] > 0 and at_low["seam polish"] > 0
    polish_growth = at_high["polish"] - at_low["polish"]
    assert 0 < polish_growth < at_high["seam polish"] - at_low["seam polish"]
    no_polish = dataclasses.replace(effort_settings("balanced"), polish_nodes=0)
    unpolished = dict(cost.solve_stages(shape, no_polish, high, 0.0015, 400, 400))
    assert unpolished["polish"] == unpolished["seam polish"] == 0.0 < unpolished["splice"]


def test_the_refinements_own_solves_grow_as_the_lp_does() -> None:
    nothing_long = cost.Probe(rounding_loss=0.0, long_classes=0)  # no trials: its own solves
    small = dataclasses.replace(SHAPE, num_nodes=192, lp_size=192)
    grown = stages(SHAPE, nothing_long)["refinement"] / stages(small, nothing_long)["refinement"]
    assert grown == pytest.approx(8**cost.LP_EXPONENT)  # 8 times the size: more than 8 times
    # A shared-clock layout's LP is what the refinement solves, whatever the instructions.
    shared = dataclasses.replace(SHAPE, num_nodes=20_000, exact=False)
    assert stages(shared, nothing_long)["refinement"] == stages(SHAPE, nothing_long)["refinement"]


def test_the_probe_leaves_the_sweeps_model_alone() -> None:
    problem = case_problem("bloom+a100_sxm_bf16", 12)
    hulls = group_hulls(problem)
    deadline = time_range(problem)[1]
    alone = HullLP(problem, hulls).solve(deadline * 1.05)
    model = HullLP(problem, hulls)
    probe = cost.probe(problem, model, Rounder(problem, hulls), deadline)
    assert 0.0 <= probe.rounding_loss < 0.01 and probe.long_classes >= 0
    after = model.solve(deadline * 1.05)
    np.testing.assert_array_equal(after.durations_s, alone.durations_s)
    assert after.energy_j == alone.energy_j
