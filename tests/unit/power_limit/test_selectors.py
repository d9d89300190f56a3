from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus.errors import ConfigError
from perseus.power_limit.selectors import (
    PowerLimitMeasurement,
    select_power_limit,
    table_rows,
    zeus_cost_j,
)


def _m(limit_w: int, time_s: float, energy_j: float) -> PowerLimitMeasurement:
    return PowerLimitMeasurement(
        power_limit_mw=limit_w * 1000,
        time_per_step_s=time_s,
        energy_per_step_j=energy_j,
        num_steps=10,
    )


TABLE = [
    _m(300, 1.00, 300.0),
    _m(250, 1.02, 250.0),
    _m(200, 1.10, 215.0),
    _m(150, 1.40, 205.0),
    _m(100, 2.00, 210.0),
]


def test_each_selector_picks_its_best() -> None:
    assert select_power_limit(TABLE, "time", max_power_w=300).power_limit_mw == 300_000
    assert select_power_limit(TABLE, "energy", max_power_w=300).power_limit_mw == 150_000
    # zeus cost, eta=0.5, P_max=300: 300: 300, 250: 278, 200: 272.5, 150: 312.5, 100: 405
    assert select_power_limit(TABLE, "zeus_cost", max_power_w=300).power_limit_mw == 200_000
    # eta=1 is energy, eta=0 is time
    assert select_power_limit(TABLE, "zeus_cost", eta=1.0, max_power_w=300) == TABLE[3]
    assert select_power_limit(TABLE, "zeus_cost", eta=0.0, max_power_w=300) == TABLE[0]
    assert select_power_limit(TABLE, "max_slowdown", max_power_w=300, max_slowdown=0.05) == TABLE[1]
    assert select_power_limit(TABLE, "max_slowdown", max_power_w=300, max_slowdown=0.1) == TABLE[2]
    assert (
        select_power_limit(TABLE, "max_slowdown", max_power_w=300, max_slowdown=0.0) == (TABLE[0])
    )


def test_ties_go_to_the_higher_limit() -> None:
    table = [_m(200, 1.0, 100.0), _m(300, 1.0, 100.0), _m(250, 1.0, 100.0)]
    for selector in ("time", "energy", "zeus_cost", "max_slowdown"):
        assert select_power_limit(table, selector, max_power_w=300).power_limit_mw == 300_000


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"selector": "fastest"}, "selector='fastest'"),
        ({"selector": "zeus_cost", "eta": 1.5}, "energy.eta=1.5"),
        ({"selector": "max_slowdown", "max_slowdown": -0.1}, "max_slowdown=-0.1"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        select_power_limit(TABLE, max_power_w=300, **kwargs)


def test_empty_table_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no power limit"):
        select_power_limit([], "time", max_power_w=300)


def test_table_rows_in_watts_with_cost() -> None:
    rows = table_rows(list(reversed(TABLE)), eta=0.5, max_power_w=300)
    assert [r["power_limit_w"] for r in rows] == [300.0, 250.0, 200.0, 150.0, 100.0]
    assert rows[2]["zeus_cost_j"] == pytest.approx(0.5 * 215 + 0.5 * 300 * 1.1)


@given(
    st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(1.0, 1000.0)), min_size=1, max_size=12),
    st.floats(0.0, 1.0),
    st.floats(0.0, 0.5),
)
def test_choice_is_the_exhaustive_optimum(rows: list, eta: float, max_slowdown: float) -> None:
    table = [_m(100 + 10 * i, t, e) for i, (t, e) in enumerate(rows)]
    p_max = 100 + 10 * (len(rows) - 1)
    cost = select_power_limit(table, "zeus_cost", eta=eta, max_power_w=p_max)
    best_cost = min(
        zeus_cost_j(m.time_per_step_s, m.energy_per_step_j, eta=eta, max_power_w=p_max)
        for m in table
    )
    assert zeus_cost_j(
        cost.time_per_step_s, cost.energy_per_step_j, eta=eta, max_power_w=p_max
    ) == pytest.approx(best_cost)
    fastest = min(m.time_per_step_s for m in table)
    chosen = select_power_limit(table, "max_slowdown", max_power_w=p_max, max_slowdown=max_slowdown)
    assert chosen.time_per_step_s <= fastest * (1 + max_slowdown) * (1 + 1e-9)
    feasible = [m for m in table if m.time_per_step_s <= fastest * (1 + max_slowdown)]
    assert chosen.energy_per_step_j <= min(m.energy_per_step_j for m in feasible)


def test_float_noise_ties_go_to_the_higher_limit() -> None:
    table = [_m(400, 0.1 + 0.2, 90.0), _m(325, 0.3, 90.0 * (1 - 1e-13))]
    assert table[0].time_per_step_s != table[1].time_per_step_s
    for selector in ("time", "energy"):
        assert select_power_limit(table, selector, max_power_w=400).power_limit_mw == 400_000
