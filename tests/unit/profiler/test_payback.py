"""The profiling's cost against max speed, and its payback (pure arithmetic)."""

from __future__ import annotations

import math

import pytest

from perseus.profiler.payback import (
    ProfilingCost,
    payback,
    payback_words,
    per_iteration,
    profiling_cost,
)


def _measured(n: int = 40, time_s: float = 0.5, energy_j: float = 300.0) -> ProfilingCost:
    cost = ProfilingCost()
    for step in range(100, 100 + n):
        cost.add_step(step, time_s, None)
    for step in range(100, 100 + n):
        assert cost.add_energy(step, energy_j)
    return cost


def test_the_sums_count_late_energies_once_and_runs_of_consecutive_steps() -> None:
    cost = ProfilingCost()
    cost.add_step(10, 0.5, None)
    cost.add_step(11, 0.5, 300.0)
    cost.add_step(13, 0.5, None)
    assert cost.awaiting == {10, 13}
    assert cost.add_energy(10, 290.0) and not cost.add_energy(10, 290.0)
    assert not cost.add_energy(12, 1.0)  # not a profiling step seen
    assert cost.add_energy(13, 310.0)
    assert (cost.iterations, cost.energy_iterations, cost.energy_j) == (3, 3, 900.0)
    assert cost.energy_runs == 3  # 11; 10 (out of order); 13
    assert ProfilingCost.from_json(cost.to_json()) == cost


def test_max_speed_per_iteration_from_blocks_with_their_spread() -> None:
    ref = per_iteration([(4, 2.0, 1200.0), (4, 2.0, 1240.0), (4, 2.0, 1160.0)], "x")
    assert ref.time_s == pytest.approx(0.5) and ref.time_se_s == pytest.approx(0.0)
    assert ref.energy_j == pytest.approx(300.0)
    assert ref.energy_se_j == pytest.approx(10.0 / math.sqrt(3))
    single = per_iteration([(1, 0.5, None)], "baseline")
    assert single.energy_j is None and math.isinf(single.time_se_s)
    with pytest.raises(ValueError, match="no iterations"):
        per_iteration([], "x")


def test_the_cost_is_the_difference_with_both_errors() -> None:
    """40 iterations at 0.6 s / 280 J against max speed's 0.5 s / 300 J: 4 s longer, 800 J
    less; the error: the counters' ends (one run) and max speed's spread 40 times over."""
    ref = per_iteration([(4, 2.0, 1200.0), (4, 2.0, 1240.0), (4, 2.0, 1160.0)], "plan_measurement")
    cost = profiling_cost(_measured(40, 0.6, 280.0), ref, 0.1)
    assert cost["extra_time_s"] == pytest.approx(4.0)
    assert cost["energy_j"] == pytest.approx(11200.0)
    assert cost["extra_energy_j"] == pytest.approx(-800.0)
    ends = (280.0 / 0.6) * 0.1 / math.sqrt(6.0)
    assert cost["energy_se_j"] == pytest.approx(ends)
    assert cost["extra_energy_se_j"] == pytest.approx(math.hypot(ends, 40 * ref.energy_se_j))
    low, high = cost["extra_energy_ci95_j"]
    assert low < -800.0 < high and cost["reference"] == "plan_measurement"
    # Energies not all in: the others' mean stands for them, the error grows with it.
    part = ProfilingCost()
    for step in range(40):
        part.add_step(step, 0.6, 280.0 if step < 30 else None)
    scaled = profiling_cost(part, ref, 0.1)
    assert scaled["energy_j"] == pytest.approx(11200.0)
    assert scaled["energy_se_j"] == pytest.approx(ends * 40 / 30)


def test_payback_is_cost_over_saving_with_an_interval_or_not_measurable() -> None:
    ref = per_iteration([(4, 2.0, 1200.0), (4, 2.0, 1240.0), (4, 2.0, 1160.0)], "x")
    cost = profiling_cost(_measured(40, 0.6, 330.0), ref, 0.1)  # 1200 J above max speed
    repaid = payback(cost, 0.10, [0.08, 0.12], 300.0)  # saves 30 J (24-36 J) an iteration
    assert repaid["measurable"] and repaid["reason"] is None
    assert repaid["iterations"] == pytest.approx(40.0)
    c_low, c_high = cost["extra_energy_ci95_j"]
    assert repaid["iterations_ci95"] == pytest.approx([c_low / 36.0, c_high / 24.0])
    assert "repaid after 40 iterations" in payback_words(cost, repaid)
    unsure = payback(cost, None, [-0.01, 0.05], 300.0)
    assert not unsure["measurable"] and unsure["iterations"] is None
    assert "contains 0" in unsure["reason"]
    assert "payback not measurable" in payback_words(cost, unsure)
    later = payback(cost, None, None, None)
    assert later["reason"] == "the plan's saving is not measured yet"


def test_a_profiling_that_spent_less_than_max_speed_has_nothing_to_repay() -> None:
    ref = per_iteration([(4, 2.0, 1200.0), (4, 2.0, 1240.0), (4, 2.0, 1160.0)], "x")
    cost = profiling_cost(_measured(40, 0.6, 250.0), ref, 0.1)  # 2000 J below max speed
    repaid = payback(cost, 0.1, [0.08, 0.12], 300.0)
    assert repaid["iterations"] == 0.0 and repaid["iterations_ci95"] == [0.0, 0.0]
    assert "nothing to repay" in payback_words(cost, repaid)
