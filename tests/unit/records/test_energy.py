"""The energy series: interpolation between updates, cursors, and the update-period estimate."""

from __future__ import annotations

import random

import pytest

from perseus.records.energy import EnergySeries, EnergyUpdate, estimate_update_period


def _series(points):
    series = EnergySeries()
    for t, e in points:
        series.add(EnergyUpdate(t, e))
    return series


def test_energy_between_updates_is_exact_and_interpolated_inside() -> None:
    series = _series([(0.0, 0.0), (0.1, 50_000.0), (0.2, 60_000.0)])
    assert series.energy_j_between(0.0, 0.2) == pytest.approx(60.0)
    assert series.energy_j_between(0.0, 0.1) == pytest.approx(50.0)
    # Halfway through the second interval: half of its 10 J.
    assert series.energy_mj_at(0.15) == pytest.approx(55_000.0)
    assert series.energy_j_between(0.05, 0.15) == pytest.approx(30.0)


def test_not_covered_yet_is_none() -> None:
    series = _series([(1.0, 10.0), (1.1, 20.0)])
    assert series.energy_j_between(1.0, 1.2) is None
    assert series.energy_j_between(0.9, 1.05) is None
    assert series.covers(1.1) and not series.covers(1.11)
    assert EnergySeries().energy_mj_at(0.0) is None


def test_window_sums_telescope() -> None:
    rng = random.Random(3)
    t, e, points = 0.0, 0.0, []
    for _ in range(50):
        t += rng.uniform(0.09, 0.11)
        e += rng.uniform(40_000, 70_000)
        points.append((t, e))
    series = _series(points)
    cuts = sorted(rng.uniform(points[0][0], points[-1][0]) for _ in range(30))
    parts = [series.energy_j_between(a, b) for a, b in zip(cuts, cuts[1:])]
    assert sum(parts) == pytest.approx(series.energy_j_between(cuts[0], cuts[-1]))


def test_out_of_order_updates_are_ignored_and_cursors_count_everything() -> None:
    series = EnergySeries(max_updates=4)
    for i in range(10):
        series.add(EnergyUpdate(float(i), float(i * 100)))
    series.add(EnergyUpdate(3.0, 1.0))  # older than the last: ignored
    updates, cursor = series.since(0)
    assert cursor == 10
    assert [u.time_s for u in updates] == [float(i) for i in range(10 - len(updates), 10)]
    assert series.since(cursor) == ([], 10)
    assert [u.time_s for u in series.updates_between(7.5, 9.0)] == [8.0, 9.0]


def test_update_period_with_jitter_and_a_missed_update() -> None:
    rng = random.Random(0)
    t, updates = 0.0, []
    for i in range(60):
        t += rng.uniform(0.0904, 0.1087) * (2 if i == 30 else 1)  # one update missed
        updates.append(EnergyUpdate(t, float(i), time_error_s=0.0015))
    period = estimate_update_period(updates)
    assert period is not None
    assert 0.095 < period.median_s < 0.105
    assert period.min_s >= 0.0904 and period.max_s <= 0.1087
    assert period.num_intervals == 58
    assert estimate_update_period(updates[:4]) is None
