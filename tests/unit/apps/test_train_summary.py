"""perseus-train's last line: every saving with its 95 % interval, or no number at all."""

from __future__ import annotations

from pathlib import Path

from perseus.apps.train import summary_line
from perseus.launcher.report import report_from_summary

RUN = Path("/runs/x")


def _summary(savings: dict, predicted: dict) -> dict:
    return {
        "phase": "watching",
        "baseline": {"iteration_time_s": 2.0, "energy_j": 1000.0},
        "plan": {"iteration_time_s": 2.01, "energy_j": 900.0},
        "savings": savings,
        "predicted": predicted,
    }


def test_the_line_gives_the_measured_and_the_predicted_saving_with_their_intervals() -> None:
    savings = {
        "energy_fraction": 0.1,
        "energy_saving_ci95": [0.09, 0.11],
        "energy_saving_measurable": True,
        "slowdown_fraction": 0.005,
        "slowdown_ci95": [-0.001, 0.011],
    }
    predicted = {
        "iteration_time_s": 2.0,
        "energy_j": 905.0,
        "energy_saving_fraction": 0.094,
        "energy_saving_ci95": [0.088, 0.1],
    }
    line = summary_line(report_from_summary(_summary(savings, predicted)), RUN)
    assert line == (
        "perseus-train: measured energy saving 10.0 % (95 % interval 9.0 to 11.0 %), iteration "
        "time +0.5 % (95 % interval -0.1 to +1.1 %) (predicted "
        "saving 9.4 %, 95 % interval 8.8 to 10.0 %); report: /runs/x/report.json"
    )


def test_a_saving_the_noise_cannot_support_is_said_without_a_number() -> None:
    savings = {
        "energy_fraction": None,
        "energy_saving_ci95": [-0.012, 0.009],
        "energy_saving_measurable": False,
        "slowdown_fraction": 0.001,
        "slowdown_ci95": [-0.002, 0.004],
    }
    line = summary_line(report_from_summary(_summary(savings, {})), RUN)
    assert "no measurable energy saving (95 % interval -1.2 to 0.9 %)" in line
    assert "None" not in line and "nan" not in line and "predicted" not in line


def test_the_line_gives_the_profiling_cost_and_its_payback() -> None:
    """What profiling cost above max speed and after how many plan iterations the measured
    saving repays it; not measurable when the saving's interval contains 0."""
    savings = {
        "energy_fraction": 0.1,
        "energy_saving_ci95": [0.08, 0.12],
        "energy_saving_measurable": True,
        "slowdown_fraction": 0.005,
        "slowdown_ci95": [-0.001, 0.011],
    }
    summary = _summary(savings, {})
    summary["profiling"] = {
        "iterations": 40,
        "stopped_by": "profiler.max_iterations",
        "uncertain_rows": [[0, "forward", 1200]],
        "cost": {
            "iterations": 40,
            "time_s": 84.0,
            "extra_time_s": 4.0,
            "extra_energy_j": 2000.0,
            "extra_energy_se_j": 100.0,
            "extra_energy_ci95_j": [1804.0, 2196.0],
        },
    }
    summary["payback"] = {
        "measurable": True,
        "iterations": 20.0,
        "iterations_ci95": [15.0, 27.5],
        "reason": None,
    }
    report = report_from_summary(summary)
    assert report["profiling_uncertain_rows"] == [[0, "forward", 1200]]
    assert report["profiling_stopped_by"] == "profiler.max_iterations"
    line = summary_line(report, RUN)
    assert (
        "profiling 40 iterations, 84.0 s, +4.0 s over max speed, +2000 J +/- 100 J over max "
        "speed; repaid after 20 iterations of the plan (95 % interval 15 to 28); report:"
    ) in line
    summary["payback"] = {"measurable": False, "reason": "no saving"}
    assert "payback not measurable (no saving)" in summary_line(report_from_summary(summary), RUN)
