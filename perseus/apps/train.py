"""``perseus-train``: train a model with an energy policy (Hydra app, config ``perseus_train``).

Examples::

    perseus-train                                   # tiny GPT, 4 stages, DeepSpeed, emulated GPU
    perseus-train model=gpt3-xl parallelism.pp=8 energy=slowdown energy.max_slowdown=0.05
    perseus-train -m energy=no_slowdown,min_energy  # sweep; sweep_summary.csv at the end

See :mod:`perseus.launcher.train_run` for what a run does and writes.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

from perseus.apps.common import hydra_app
from perseus.config.schema import PerseusConfig
from perseus.profiler.payback import payback_words
from perseus.runtime.announce import saving_words

logger = logging.getLogger("perseus.train")


@hydra_app("perseus_train", prog="perseus-train")
def main(cfg: PerseusConfig, out_dir: Path) -> Optional[int]:
    """Run the job and print the headline figures."""
    from perseus.launcher.train_run import run_job

    report = run_job(cfg, out_dir)
    if report:
        print(summary_line(report, out_dir))
    if report.get("phase") == "failed":
        sys.stderr.write(
            f"perseus-train: error: the coordination server could not optimize the job: "
            f"{report.get('failure')}. Training itself completed; see {out_dir / 'report.json'}\n"
        )
        return 1
    return 0


def summary_line(report: dict, out_dir: Path) -> str:
    """A short human summary of ``report.json``: every saving with its 95 % interval.

    A saving whose interval contains 0 reads "no measurable energy saving", never a number. A
    power-limit run whose limits were measured in fewer than three windows each has no
    interval and says so (``saving_interval``). An online run adds what profiling cost above
    max speed and after how many plan iterations the saving repays it (or that it cannot be
    told).
    """
    where = f"report: {out_dir / 'report.json'}"
    power_limit = power_limit_words(report.get("power_limit"))
    if power_limit is not None:
        return f"perseus-train: {power_limit}; {where}"
    said = _predicted_words(report)
    cost, repaid = report.get("profiling_cost"), report.get("payback")
    if cost is not None and repaid is not None:
        where = f"{payback_words(cost, repaid)}; {where}"
    if report.get("energy_saving_ci95") is not None:
        words = saving_words(
            {
                "energy_fraction": report.get("energy_saving"),
                "energy_saving_ci95": report.get("energy_saving_ci95"),
                "energy_saving_measurable": report.get("energy_saving_measurable"),
                "slowdown_fraction": report.get("slowdown"),
                "slowdown_ci95": report.get("slowdown_ci95"),
            }
        )
        return f"perseus-train: {words}{said}; {where}"
    saving, slowdown = report.get("energy_saving"), report.get("slowdown")
    if saving is None or slowdown is None:
        figures = json.dumps({k: report.get(k) for k in ("baseline", "plan")})
        return f"perseus-train: done; {figures}; {where}"
    why = report.get("saving_interval") or "one measurement window each: no interval"
    return (
        f"perseus-train: energy saving {100 * saving:.1f} %, slowdown {100 * slowdown:+.2f} % "
        f"({why}){said}; {where}"
    )


def power_limit_words(section: Optional[dict]) -> Optional[str]:
    """A power-limit run's outcome: the limit, its saving with the intervals, or why none.

    ``None`` for a report without the power-limit search's section.
    """
    if not section or "state" not in section:
        return None
    search = section.get("search") or {}
    if section.get("state") != "done":
        least, most = search.get("steps_needed") or (None, None)
        return (
            f"the power-limit search did not finish in {search.get('steps')} steps (it needs "
            f"{least}-{most} at this step time; raise train.max_steps): no limit was chosen and "
            "the GPUs kept their highest limit"
        )
    chosen = section.get("chosen_power_limit_w")
    top = max(section.get("power_limits_w") or [chosen or 0.0])
    if section.get("failure"):
        return f"power limit {top:g} W (the highest) kept: {section['failure']}"
    saving = section.get("saving") or {}
    pruned = len(search.get("pruned_w") or [])
    how = (
        f"{search.get('num_measured')} limits measured, {pruned} pruned, "
        f"{search.get('steps')} steps of search"
    )
    if not saving:
        return f"power limit {chosen:g} W ({section.get('decision')}; {how})"
    figures = saving_words(
        {
            "energy_fraction": saving.get("energy_saving"),
            "energy_saving_ci95": saving.get("energy_saving_ci95"),
            "energy_saving_measurable": saving.get("energy_saving_measurable"),
            "slowdown_fraction": saving.get("slowdown"),
            "slowdown_ci95": saving.get("slowdown_ci95"),
        }
    )
    if saving.get("energy_saving_ci95") is None:
        figures = (
            f"energy saving {100 * saving['energy_saving']:.1f} %, slowdown "
            f"{100 * saving['slowdown']:+.2f} % ({saving.get('interval')})"
        )
    compared = saving.get("power_limit_w", chosen)
    if compared != chosen:
        return (
            f"power limit {chosen:g} W (the highest) kept: {section.get('decision')}; "
            f"{compared:g} W: {figures} ({how})"
        )
    return f"power limit {chosen:g} W (of {top:g} W): {figures} ({how})"


def _predicted_words(report: dict) -> str:
    """The plan's predicted saving, with the interval the profile's errors give it."""
    prediction = report.get("predicted") or {}
    saving, interval = prediction.get("energy_saving"), prediction.get("energy_saving_ci95")
    if saving is not None and interval is not None:
        low, high = interval
        return (
            f" (predicted saving {100 * saving:.1f} %, 95 % interval {100 * low:.1f} to "
            f"{100 * high:.1f} %)"
        )
    predicted = report.get("predicted_energy_saving")
    return "" if predicted is None else f" (predicted saving {100 * predicted:.1f} %)"


if __name__ == "__main__":
    main()
