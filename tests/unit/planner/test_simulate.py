from __future__ import annotations

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.formats.profile.table import Profile
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate, simulate_choices


def _profile() -> Profile:
    rows = []
    for s in range(2):
        rows += [
            (s, "forward", 1000, 1.0, 10.0),
            (s, "forward", 500, 1.5, 7.0),
            (s, "backward", 1000, 2.0, 20.0),
            (s, "backward", 500, 3.0, 15.0),
        ]
    return Profile.from_rows(rows, source="tiny")


def test_allmax_hand_computed() -> None:
    problem = PlanningProblem(_profile(), 2, p2p_power_w=5.0)
    res = simulate(problem, problem.allmax_freqs())
    # stage 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; stage 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]
    assert res.start_s == [[0, 1, 4, 7], [1, 2, 4, 5]]
    assert res.end_s == [[1, 2, 6, 9], [2, 4, 5, 7]]
    assert res.iteration_time_s == 9.0
    # 4 forwards x 10 J + 4 backwards x 20 J + 5 W x (2 x 9 s - 12 s busy)
    assert res.energy_j == pytest.approx(120.0 + 5.0 * 6.0)


def test_slow_plan_hand_computed() -> None:
    problem = PlanningProblem(_profile(), 2, p2p_power_w=[5.0, 1.0])
    # Stage 0 forwards at 500 MHz: F0 [0,1.5] F1 [1.5,3]; stage 1 F0 [1.5,2.5] B0 [2.5,4.5]
    # F1 [4.5,5.5] B1 [5.5,7.5]; stage 0 B0 [4.5,6.5] B1 [7.5,9.5].
    freqs = [[500, 500, 1000, 1000], [1000, 1000, 1000, 1000]]
    res = simulate(problem, freqs)
    assert res.iteration_time_s == pytest.approx(9.5)
    busy0, busy1 = 3.0 + 4.0, 2.0 + 4.0
    energy = 2 * 7.0 + 2 * 20.0 + 2 * 10.0 + 2 * 20.0
    assert res.energy_j == pytest.approx(energy + 5.0 * (9.5 - busy0) + 1.0 * (9.5 - busy1))


def test_batch_matches_single() -> None:
    problem = PlanningProblem(_profile(), 3, p2p_power_w=3.0)
    rng = np.random.default_rng(0)
    choices = rng.integers(0, 2, size=(50, problem.num_nodes))
    times, energies = simulate_choices(problem, choices)
    for row in range(0, 50, 7):
        res = simulate(problem, problem.choices_to_freqs(choices[row]))
        assert times[row] == pytest.approx(res.iteration_time_s)
        assert energies[row] == pytest.approx(res.energy_j)


def test_gpipe_single_stage() -> None:
    rows = [(0, "forward", 1000, 1.0, 1.0), (0, "backward", 1000, 2.0, 2.0)]
    problem = PlanningProblem(Profile.from_rows(rows), 4, p2p_power_w=100.0, schedule="gpipe")
    res = simulate(problem, problem.allmax_freqs())
    assert res.iteration_time_s == 12.0
    assert res.energy_j == pytest.approx(12.0)  # never blocked


def test_bad_plan_shape_and_frequency() -> None:
    problem = PlanningProblem(_profile(), 2, p2p_power_w=5.0)
    with pytest.raises(ConfigError, match="has 1 stages"):
        simulate(problem, [[1000] * 4])
    with pytest.raises(ConfigError, match="stage 1 of the plan has 3 instructions"):
        simulate(problem, [[1000] * 4, [1000] * 3])
    with pytest.raises(ConfigError, match="777 MHz was not profiled"):
        simulate(problem, [[1000] * 4, [1000, 777, 1000, 1000]])
