"""A power-limit run's report and summary line: the saving with its interval, or why none."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from perseus.apps.train import summary_line
from perseus.launcher.report import apply_power_limit

OUT = Path("/run")


def _section(saving: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    row = {"time_per_step_s": 0.1, "energy_per_step_j": 30.0}
    return {
        "chosen_power_limit_w": 200.0,
        "saving": saving,
        "measurements": [
            {**row, "power_limit_w": 300.0},
            {**row, "power_limit_w": 200.0, "time_per_step_s": 0.11, "energy_per_step_j": 27.0},
        ],
    }


def test_three_windows_per_limit_give_the_saving_its_interval() -> None:
    saving = {
        "energy_saving": 0.1,
        "energy_saving_ci95": [0.08, 0.12],
        "energy_saving_measurable": True,
        "slowdown": 0.1,
        "slowdown_ci95": [0.09, 0.11],
        "interval": "95 % interval over 3 paired measurement windows",
    }
    report = apply_power_limit({}, _section(saving))
    assert report["baseline"]["power_limit_w"] == 300.0 and report["plan"]["power_limit_w"] == 200
    assert report["energy_saving_ci95"] == [0.08, 0.12] and report["energy_saving_measurable"]
    line = summary_line(report, OUT)
    assert "measured energy saving 10.0 % (95 % interval 8.0 to 12.0 %)" in line, line


def test_an_interval_that_contains_zero_is_no_measurable_saving() -> None:
    saving = {
        "energy_saving": 0.01,
        "energy_saving_ci95": [-0.02, 0.04],
        "energy_saving_measurable": False,
        "slowdown": 0.0,
        "slowdown_ci95": [-0.01, 0.01],
    }
    line = summary_line(apply_power_limit({}, _section(saving)), OUT)
    assert "no measurable energy saving" in line and "1.0 %" not in line.split("(")[0], line


def test_one_window_per_limit_says_it_has_no_interval() -> None:
    saving = {
        "energy_saving": 0.1,
        "energy_saving_ci95": None,
        "energy_saving_measurable": False,
        "slowdown": 0.1,
        "slowdown_ci95": None,
        "interval": "one measurement window each: no interval",
    }
    report = apply_power_limit({}, _section(saving))
    assert report["energy_saving"] == 0.1 and report["energy_saving_ci95"] is None
    line = summary_line(report, OUT)
    assert "energy saving 10.0 %, slowdown +10.00 % (one measurement window each: no interval)" in (
        line
    )


def test_a_table_without_windows_computes_the_point_values() -> None:
    report = apply_power_limit({}, _section(None))  # a table saved before windows were kept
    assert report["energy_saving"] == 1 - 27.0 / 30.0
    assert report["saving_interval"] == "one measurement window each: no interval"


def _figures(
    saving: float, ci: List[float], slowdown: float, slow_ci: List[float]
) -> Dict[str, Any]:
    """The saving of 200 W as the search gives it."""
    return {
        "power_limit_w": 200.0,
        "energy_saving": saving,
        "energy_saving_ci95": ci,
        "energy_saving_measurable": not ci[0] <= 0.0 <= ci[1],
        "slowdown": slowdown,
        "slowdown_ci95": slow_ci,
        "interval": "95 % interval over 6 paired measurement windows",
    }


def _searched(saving: Optional[Dict[str, Any]], **fields: Any) -> Dict[str, Any]:
    """A section as the search writes it."""
    search = {"steps": 119, "steps_needed": [62, 156], "num_measured": 11, "pruned_w": [1.0] * 5}
    section = {**_section(saving), "state": "done", "power_limits_w": [300.0, 200.0, 100.0]}
    return {**section, "search": search, "failure": None, **fields}


def test_the_chosen_limit_and_its_saving_are_the_last_line() -> None:
    saving = _figures(0.146, [0.143, 0.148], 0.104, [0.101, 0.107])
    line = summary_line(apply_power_limit({}, _searched(saving)), OUT)
    assert line.startswith("perseus-train: power limit 200 W (of 300 W): measured energy saving ")
    assert "14.6 % (95 % interval 14.3 to 14.8 %)" in line
    assert "(11 limits measured, 5 pruned, 119 steps of search)" in line


def test_a_pick_whose_saving_is_not_measurable_leaves_the_highest_limit() -> None:
    saving = _figures(0.01, [-0.02, 0.04], 0.02, [0.0, 0.04])
    why = "200 W scored best but its energy saving is not measurable at 95 %"
    section = _searched(saving, chosen_power_limit_w=300.0, decision=why)
    report = apply_power_limit({}, section)
    # the report's plan is the highest limit, its saving 0: the pick's figures stay in the section
    assert report["plan"]["power_limit_w"] == 300.0 and report["energy_saving"] == 0.0
    assert report["energy_saving_ci95"] is None and report["saving_interval"] == why
    line = summary_line(report, OUT)
    assert line.startswith(f"perseus-train: power limit 300 W (the highest) kept: {why}; 200 W: ")
    assert "200 W: no measurable energy saving (95 % interval -2.0 to 4.0 %)" in line


def test_a_search_cut_short_by_max_steps_says_how_many_it_needed() -> None:
    section = {**_searched(None), "state": "profiling", "chosen_power_limit_w": None}
    line = summary_line(apply_power_limit({}, section), OUT)
    assert "the power-limit search did not finish in 119 steps (it needs 62-156" in line
    assert "raise train.max_steps): no limit was chosen" in line
