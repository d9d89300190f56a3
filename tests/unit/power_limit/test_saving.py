"""The choice among confirmed limits and its saving: kept only when its gain is measurable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest

from perseus.power_limit.saving import decide, saving_of
from perseus.power_limit.selectors import (
    CONFIRM,
    SEARCH,
    Criterion,
    MeasuredWindow,
    PowerLimitMeasurement,
)
from perseus.power_limit.store import ProfileKey, load_profile, save_profile

TOP_MW = 300_000


def _row(limit_mw: int, energies_j: Sequence[float], time_s: float = 1.0) -> PowerLimitMeasurement:
    """A limit confirmed in one round per energy (plus its descent window)."""
    windows = [_window(0, time_s, energies_j[0] * 0.97, SEARCH)]
    windows += [_window(k + 1, time_s, e, CONFIRM) for k, e in enumerate(energies_j)]
    return PowerLimitMeasurement.of_windows(limit_mw, windows)


def _window(round_index: int, time_s: float, energy_j: float, phase: str) -> MeasuredWindow:
    return MeasuredWindow(
        pass_index=round_index, time_s=time_s, energy_j=energy_j, num_steps=1, phase=phase
    )


def test_means_and_pairs_use_the_confirmation_windows_only() -> None:
    top = _row(TOP_MW, [100.0, 101.0, 99.0, 100.0])
    low = _row(200_000, [90.0, 91.5, 88.5, 90.0], time_s=1.1)
    assert top.energy_per_step_j == pytest.approx(100.0) and top.num_steps == 4
    saving = saving_of(top, low)
    assert saving["num_pairs"] == 4 and saving["power_limit_w"] == 200.0
    assert saving["energy_saving"] == pytest.approx(0.1)
    assert saving["slowdown"] == pytest.approx(0.1)
    low_ci, high_ci = saving["energy_saving_ci95"]
    assert low_ci < 0.1 < high_ci and saving["energy_saving_measurable"]


def test_a_measurable_saving_is_kept() -> None:
    table = [_row(TOP_MW, [100.0, 101.0, 99.0]), _row(200_000, [90.0, 91.0, 89.0])]
    decision = decide(table, Criterion("energy"), TOP_MW)
    assert decision.chosen.power_limit_mw == 200_000 == decision.compared.power_limit_mw
    assert "measurable energy saving" in decision.reason


def test_an_unmeasurable_saving_keeps_the_highest_limit() -> None:
    # 1 % less energy on average, but the rounds scatter by +-5 %
    table = [_row(TOP_MW, [100.0, 95.0, 105.0]), _row(200_000, [104.0, 91.0, 102.0])]
    decision = decide(table, Criterion("energy"), TOP_MW)
    assert decision.compared.power_limit_mw == 200_000 and decision.unmeasurable
    assert decision.chosen.power_limit_mw == TOP_MW
    assert decision.saving is not None and not decision.saving["energy_saving_measurable"]
    assert "not measurable at 95 %" in decision.reason and "(300 W)" in decision.reason


def test_the_time_selector_needs_a_measurable_speed_up() -> None:
    table = [
        _row(TOP_MW, [100.0, 100.0, 100.0], time_s=1.0),
        _row(200_000, [90.0, 90.0, 90.0], time_s=1.0),
    ]
    # equal times: the tie goes to the highest limit
    assert decide(table, Criterion("time"), TOP_MW).chosen.power_limit_mw == TOP_MW


def test_the_highest_limit_scoring_best_gives_the_saving_of_the_best_other() -> None:
    table = [
        _row(TOP_MW, [100.0, 101.0, 99.0], time_s=1.0),
        _row(250_000, [95.0, 96.0, 94.0], time_s=1.2),
        _row(200_000, [90.0, 91.0, 89.0], time_s=1.5),
    ]
    # zeus cost, eta 0.5, P_max 300 W: 200 J + 150 J at the top, 195 J + 180 J at 250 W
    decision = decide(table, Criterion("zeus_cost", max_power_w=300.0), TOP_MW)
    assert decision.chosen.power_limit_mw == TOP_MW and not decision.unmeasurable
    assert decision.compared.power_limit_mw == 250_000
    assert decision.saving is not None and decision.saving["power_limit_w"] == 250.0
    assert decision.saving["energy_saving"] == pytest.approx(0.05)
    assert decision.reason == "the highest limit (300 W) scored best; of the others 250 W did"


def test_fewer_than_three_rounds_choose_on_the_means_and_say_there_is_no_interval() -> None:
    table = [_row(TOP_MW, [100.0, 101.0]), _row(200_000, [90.0, 91.0])]
    decision = decide(table, Criterion("energy"), TOP_MW)
    assert decision.chosen.power_limit_mw == 200_000
    assert decision.saving is not None and decision.saving["energy_saving_ci95"] is None
    assert "too few for an interval" in decision.reason


def test_unconfirmed_limits_are_not_chosen_over_confirmed_ones() -> None:
    pruned_guess = PowerLimitMeasurement.of_windows(100_000, [_window(0, 1.5, 50.0, SEARCH)])
    table = [_row(TOP_MW, [100.0, 101.0, 99.0]), _row(200_000, [90.0, 91.0, 89.0]), pruned_guess]
    assert decide(table, Criterion("energy"), TOP_MW).chosen.power_limit_mw == 200_000


def test_a_table_saved_before_windows_had_a_phase_pairs_every_pass() -> None:
    row = {
        "power_limit_mw": 200_000,
        "time_per_step_s": 1.0,
        "energy_per_step_j": 90.0,
        "num_steps": 3,
        "windows": [
            {"pass_index": k, "time_s": 1.0, "energy_j": 90.0, "num_steps": 1} for k in range(3)
        ],
    }
    legacy = PowerLimitMeasurement.from_dict(row)
    assert legacy.confirmed and all(w.phase == CONFIRM for w in legacy.windows)


def test_a_saved_search_answers_only_what_it_searched_for(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    key = ProfileKey(job_id="job", gpu_name="GPU", num_gpus=1, power_limits_mw=[TOP_MW, 200_000])
    table = [_row(TOP_MW, [100.0, 101.0, 99.0]), _row(200_000, [90.0, 91.0, 89.0])]
    zeus = {"selector": "zeus_cost", "eta": 0.5, "max_slowdown": 0.1}
    save_profile(path, key, table, zeus)
    assert load_profile(path, key, zeus) == table
    assert load_profile(path, key, {**zeus, "selector": "energy"}) is None
    assert load_profile(path, key, {**zeus, "eta": 0.7}) is None
    # a table without what it searched for (every limit measured alike) answers any selector
    entry = json.loads(path.read_text())
    del entry["profiles"][0]["searched_for"]
    path.write_text(json.dumps(entry))
    assert load_profile(path, key, {**zeus, "selector": "energy"}) == table
