"""Build ``report.json`` of a ``perseus-train`` run.

With the coordination server (``runtime.mode=online``) the figures come from the job's summary:
max speed and the chosen plan measured beside each other in the same run (in blocks), the
saving and the slowdown with their 95 % intervals (``energy_saving_ci95``, ``slowdown_ci95``,
``energy_saving_measurable``: false when the saving's interval contains 0, and then
``energy_saving`` is ``null``: no measurable saving, never a number), and the plan's prediction
(re-simulated with the measured profile). Without it they come from what every rank
measured (``steps-rank*.json``): the iteration time of a step is the slowest rank's, its energy
the sum over ranks, averaged over the measured steps (after ``train.warmup_steps``).

Schema::

    {"baseline": {"iteration_time_s", "energy_j"},
     "plan": {"iteration_time_s", "energy_j", "predicted_iteration_time_s", "predicted_energy_j",
              "predicted_energy_error"},
     "energy_saving": <fraction or null>, "energy_saving_ci95": [low, high],
     "energy_saving_measurable": <bool>, "slowdown": <fraction>, "slowdown_ci95": [low, high],
     "profiling_iterations": <n>, "profiling_stopped_by": <"target" | a budget key | ...>,
     "profiling_uncertain_rows": [[stage, instruction, MHz], ...],
     "profiling_cost": {"iterations", "time_s", "extra_time_s", "extra_time_se_s", "energy_j",
                        "energy_se_j", "extra_energy_j", "extra_energy_se_j",
                        "extra_energy_ci95_j", "reference", ...},
     "payback": {"measurable", "iterations", "iterations_ci95", "saving_j", "saving_ci95_j",
                 "reason"}, ...}

``profiling_cost`` is what profiling took above max speed; ``payback`` after how many plan
iterations the measured saving repays its energy (``iterations`` ``null`` and a ``reason`` when
the saving's interval contains 0: not measurable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from perseus.config.schema import PerseusConfig
from perseus.formats.atomic_file import write_json_atomic


def _figures(section: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(section, dict):
        return None
    time_s, energy_j = section.get("iteration_time_s"), section.get("energy_j")
    if time_s is None or energy_j is None:
        return None
    return dict(section)


def report_from_summary(summary: Dict[str, Any]) -> Dict[str, Any]:
    """The report of an online run from the server's job summary.

    The summary holds the measured ``baseline`` and ``plan`` (means over measured iterations)
    and the plan's ``predicted`` figures (re-simulated with the measured profile).
    """
    baseline = _figures(summary.get("baseline"))
    plan = _figures(summary.get("plan"))
    predicted = summary.get("predicted") or {}
    if plan is not None and predicted:
        plan["predicted_iteration_time_s"] = predicted.get("iteration_time_s")
        plan["predicted_energy_j"] = predicted.get("energy_j")
    report: Dict[str, Any] = {"baseline": baseline, "plan": plan}
    savings = summary.get("savings")
    if isinstance(savings, dict):
        report["energy_saving"] = savings.get("energy_fraction")
        report["energy_saving_ci95"] = savings.get("energy_saving_ci95")
        report["energy_saving_measurable"] = bool(savings.get("energy_saving_measurable"))
        report["slowdown"] = savings.get("slowdown_fraction")
        report["slowdown_ci95"] = savings.get("slowdown_ci95")
        report["block_steps"] = savings.get("block_steps")
        report["num_block_pairs"] = savings.get("num_block_pairs")
    if predicted:
        report["predicted"] = {
            "plan_id": predicted.get("plan_id"),
            "energy_saving": predicted.get("energy_saving_fraction"),
            # From the profile rows' standard errors (rows both plans use equally cancel).
            "energy_saving_ci95": predicted.get("energy_saving_ci95"),
            "slowdown": predicted.get("slowdown_fraction"),
            "solve_time_s": predicted.get("solve_time_s"),
            "frontier_points": predicted.get("frontier_points"),
        }
        # The plan's predicted saving against max speed predicted from the same profile, the
        # figure comparable with the measured energy_saving: a profile's error common to every
        # row (real counters: several percent) cancels in it. Against the measured baseline it
        # would not, and an A/A run would "predict" that error as a saving.
        report["predicted_energy_saving"] = predicted.get("energy_saving_fraction")
        if plan is not None and plan["energy_j"] and predicted.get("energy_j") is not None:
            # How far the profile's absolute energy is off (predicted / measured - 1).
            plan["predicted_energy_error"] = predicted["energy_j"] / plan["energy_j"] - 1.0
    profiling = summary.get("profiling") or {}
    if profiling:
        report["profiling_iterations"] = profiling.get("iterations")
        report["profiling_stopped_by"] = profiling.get("stopped_by")
        report["profiling_uncertain_rows"] = profiling.get("uncertain_rows")
        report["profiling_cost"] = profiling.get("cost")
    if summary.get("payback") is not None:
        report["payback"] = summary["payback"]
    for key in ("job_id", "phase", "failure"):
        if summary.get(key) is not None:
            report[key] = summary[key]
    return report


def measured_from_steps(out_dir: Path, warmup_steps: int) -> Optional[Dict[str, Optional[float]]]:
    """Average iteration time (max over ranks) and energy (sum over ranks) per step."""
    per_rank: List[Dict[int, Dict[str, Any]]] = []
    for path in sorted(out_dir.glob("steps-rank*.json")):
        steps = json.loads(path.read_text())["steps"]
        per_rank.append({s["step"]: s for s in steps if s["step"] >= warmup_steps})
    if not per_rank:
        return None
    common = sorted(set.intersection(*(set(r) for r in per_rank)))
    common = [s for s in common if all(r[s]["iteration_time_s"] is not None for r in per_rank)]
    if not common:
        return None
    times = [max(r[s]["iteration_time_s"] for r in per_rank) for s in common]
    # A step's energy is known once a counter update after its end arrived: the last steps of a
    # run may have none. The energy is the mean over the steps every rank has one for.
    energies: List[float] = []
    for s in common:
        values = [r[s]["energy_j"] for r in per_rank]
        if all(v is not None for v in values):
            energies.append(sum(values))
    return {
        "iteration_time_s": sum(times) / len(times),
        "energy_j": sum(energies) / len(energies) if energies else None,
        "num_steps": float(len(common)),
        "num_energy_steps": float(len(energies)),
    }


def report_from_steps(cfg: PerseusConfig, out_dir: Path) -> Dict[str, Any]:
    """The report of a run without the server (measure / max_speed / plan modes)."""
    measured = measured_from_steps(out_dir, cfg.train.warmup_steps)
    report: Dict[str, Any] = {"mode": cfg.runtime.mode, "baseline": None, "plan": None}
    if measured is None:
        return report
    if cfg.runtime.mode == "plan" and cfg.runtime.plan:
        section: Dict[str, Any] = dict(measured)
        predicted = _plan_prediction(Path(cfg.runtime.plan))
        if predicted:
            section["predicted_iteration_time_s"] = predicted.get("iteration_time_s")
            section["predicted_energy_j"] = predicted.get("energy_j")
        report["plan"] = section
    else:
        report["baseline"] = measured
    return report


def _plan_prediction(path: Path) -> Optional[Dict[str, Any]]:
    if path.suffix != ".json" or not path.is_file():
        return None
    predicted = json.loads(path.read_text()).get("predicted")
    return predicted if isinstance(predicted, dict) else None


def write_report(report: Dict[str, Any], out_dir: Path) -> Path:
    """Write ``report.json`` into ``out_dir`` (strict JSON: a NaN or infinity is refused)."""
    return write_json_atomic(out_dir / "report.json", report, indent=2, sort_keys=True)


def apply_power_limit(report: Dict[str, Any], section: Dict[str, Any]) -> Dict[str, Any]:
    """Fill baseline (highest power limit) and plan (chosen limit) from the power-limit table.

    The saving and slowdown are the optimizer's (``section["saving"]``): with their 95 %
    intervals where the limits were confirmed in three or more rounds (``energy_saving_ci95``,
    ``slowdown_ci95``, ``energy_saving_measurable``), else the point values and
    ``saving_interval`` saying why there is no interval. When the highest limit stayed (the
    search's pick saved nothing measurable, or it scored best), the saving is 0 and
    ``saving_interval`` says why (the figures of the limit it was weighed against stay in
    ``power_limit.saving``).
    """
    rows = section.get("measurements") or []
    chosen_w = section.get("chosen_power_limit_w")
    chosen = [r for r in rows if r.get("power_limit_w") == chosen_w]
    report["power_limit"] = section
    if not rows or not chosen:
        return report
    top = max(rows, key=lambda r: r["power_limit_w"])
    report["baseline"] = {
        "iteration_time_s": top["time_per_step_s"],
        "energy_j": top["energy_per_step_j"],
        "power_limit_w": top["power_limit_w"],
    }
    report["plan"] = {
        "iteration_time_s": chosen[0]["time_per_step_s"],
        "energy_j": chosen[0]["energy_per_step_j"],
        "power_limit_w": chosen_w,
    }
    saving = section.get("saving") or {}
    compared_w = saving.get("power_limit_w", chosen_w)
    # the highest limit stayed: the saving is of the limit it was weighed against
    if compared_w != chosen_w:
        report["energy_saving"] = report["slowdown"] = 0.0
        report["energy_saving_ci95"] = report["slowdown_ci95"] = None
        report["energy_saving_measurable"] = False
        report["saving_interval"] = section.get("decision") or "no measurable saving"
        return report
    report["energy_saving"] = saving.get(
        "energy_saving", 1.0 - report["plan"]["energy_j"] / report["baseline"]["energy_j"]
    )
    report["slowdown"] = saving.get(
        "slowdown",
        report["plan"]["iteration_time_s"] / report["baseline"]["iteration_time_s"] - 1.0,
    )
    report["energy_saving_ci95"] = saving.get("energy_saving_ci95")
    report["slowdown_ci95"] = saving.get("slowdown_ci95")
    report["energy_saving_measurable"] = bool(saving.get("energy_saving_measurable"))
    report["saving_interval"] = saving.get("interval", "one measurement window each: no interval")
    return report
