"""The energy series: interpolation between updates, cursors, and the update-period estimate."""

from __future__ import annotations

import math
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


# -- temperature and the settled criterion ------------------------------------------------------


def _readings(temps_c, period_s: float = 1.0, start_s: float = 0.0):
    from perseus.records.energy import TemperatureReading

    return [TemperatureReading(start_s + i * period_s, float(c)) for i, c in enumerate(temps_c)]


def _approach(start_c: float, end_c: float, tau_s: float, seconds: int):
    """Whole-degree readings (as NVML gives them) of a first-order approach, one a second."""
    return [round(end_c + (start_c - end_c) * math.exp(-t / tau_s)) for t in range(seconds)]


def test_the_slope_is_fitted_over_the_window_and_needs_it_covered() -> None:
    from perseus.records.energy import temperature_slope_c_per_min

    rising = _readings([40 + 0.1 * i for i in range(120)])  # 6 °C per minute
    assert temperature_slope_c_per_min(rising, 60.0) == pytest.approx(6.0)
    assert temperature_slope_c_per_min(rising[:30], 60.0) is None  # half a window: too young
    assert temperature_slope_c_per_min([], 60.0) is None
    flat = _readings([70] * 61)
    assert temperature_slope_c_per_min(flat, 60.0) == 0.0


def test_a_warming_card_waits_and_a_settled_one_starts() -> None:
    from perseus.records.energy import ThermalCriterion, thermal_verdict

    temps = _approach(35.0, 72.0, 60.0, 900)
    criterion = ThermalCriterion()
    first_ready = next(
        t for t in range(len(temps)) if thermal_verdict(_readings(temps[: t + 1]), criterion).ready
    )
    # Within 0.5 °C/min over the last minute, some four to five time constants in: about a
    # degree left to go, on whole-degree readings.
    assert 200 <= first_ready <= 330
    verdict = thermal_verdict(_readings(temps[: first_ready + 1]), criterion)
    assert verdict.reason == "settled" and verdict.temperature_c is not None
    assert 72.0 - verdict.temperature_c <= 1.5
    early = thermal_verdict(_readings(temps[:120]), criterion)
    assert not early.ready and early.reason == "warming"
    assert early.slope_c_per_min is not None and early.slope_c_per_min > 0.5


def test_a_card_that_never_settles_is_taken_after_the_longest_wait_and_none_waits_for_nothing() -> (
    None
):
    from perseus.records.energy import ThermalCriterion, thermal_verdict

    criterion = ThermalCriterion(max_wait_s=300.0)
    climbing = _readings([40 + i // 10 for i in range(400)])  # 6 °C/min for ever
    assert not thermal_verdict(climbing[:299], criterion).ready
    late = thermal_verdict(climbing[:301], criterion)
    assert late.ready and late.reason == "timeout"
    unknown = thermal_verdict([], criterion)
    assert unknown.ready and unknown.reason == "unknown" and unknown.temperature_c is None


def test_the_temperature_series_keeps_order_and_answers_ranges() -> None:
    from perseus.records.energy import TemperatureReading, TemperatureSeries

    series = TemperatureSeries(max_readings=4)
    assert series.latest is None
    for t in (1.0, 2.0, 2.0, 3.0, 4.0, 5.0):
        series.add(TemperatureReading(t, 40.0 + t))
    assert [r.time_s for r in series.snapshot()] == [3.0, 4.0, 5.0]  # halved once full
    assert series.latest == TemperatureReading(5.0, 45.0)
    assert [r.time_s for r in series.between(3.5, 5.0)] == [4.0, 5.0]


def test_a_watch_keeps_the_last_window_and_comes_back_from_its_state() -> None:
    from perseus.records.energy import ThermalWatch

    watch = ThermalWatch()
    temps = _approach(35.0, 72.0, 60.0, 400)
    for t, c in enumerate(temps):
        watch.add(float(t), float(c))
        watch.add(t + 0.5, float(c))  # within a second of the last one kept: skipped
    kept = watch.readings
    assert kept[-1].time_s - kept[1].time_s <= 60.0 < kept[-1].time_s - kept[0].time_s
    assert watch.since_s == 0.0
    verdict = watch.verdict()
    assert verdict.ready and verdict.reason == "settled"
    again = ThermalWatch.from_state(watch.to_state())
    assert again.readings == kept and again.since_s == 0.0 and again.verdict() == verdict


def test_the_stages_start_together_once_each_has_settled() -> None:
    from perseus.records.energy import ThermalWatch, stages_settled

    settled, warming = ThermalWatch(), ThermalWatch()
    for t in range(90):
        settled.add(float(t), 70.0)
        warming.add(float(t), 40.0 + t / 10.0)
    ready, verdicts = stages_settled({1: warming, 0: settled})
    assert not ready and list(verdicts) == [0, 1]
    assert verdicts[0].reason == "settled" and verdicts[1].reason == "warming"
    assert stages_settled({0: settled})[0] and stages_settled({})[0]
