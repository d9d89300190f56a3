"""Multirun summary: ``sweep_summary.csv`` and ``sweep_comparison.png`` in the sweep directory.

:class:`SweepSummaryCallback` is registered in ``perseus_train.yaml`` under ``hydra.callbacks``;
at the end of ``perseus-train -m ...`` it reads every run's ``report.json`` and the overrides Hydra
recorded for it (``.hydra/overrides.yaml``), writes one CSV row per run and a bar chart comparing
energy saving and slowdown across runs.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from hydra.experimental.callback import Callback

logger = logging.getLogger(__name__)

SUMMARY_CSV = "sweep_summary.csv"
COMPARISON_PNG = "sweep_comparison.png"
# Column -> where in report.json (keys, and indexes into lists).
FIGURES: Tuple[Tuple[str, Tuple[Union[str, int], ...]], ...] = (
    ("baseline_iteration_time_s", ("baseline", "iteration_time_s")),
    ("baseline_energy_j", ("baseline", "energy_j")),
    ("plan_iteration_time_s", ("plan", "iteration_time_s")),
    ("plan_energy_j", ("plan", "energy_j")),
    ("predicted_iteration_time_s", ("plan", "predicted_iteration_time_s")),
    ("predicted_energy_j", ("plan", "predicted_energy_j")),
    ("energy_saving", ("energy_saving",)),
    ("energy_saving_ci95_low", ("energy_saving_ci95", 0)),
    ("energy_saving_ci95_high", ("energy_saving_ci95", 1)),
    ("energy_saving_measurable", ("energy_saving_measurable",)),
    ("slowdown", ("slowdown",)),
    ("slowdown_ci95_low", ("slowdown_ci95", 0)),
    ("slowdown_ci95_high", ("slowdown_ci95", 1)),
)


def _dig(report: Dict[str, Any], path: tuple) -> Any:
    value: Any = report
    for key in path:
        if isinstance(key, int):
            value = value[key] if isinstance(value, list) and key < len(value) else None
        elif isinstance(value, dict):
            value = value.get(key)
        else:
            return None
    return value


def collect_rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    """One row per run directory under ``sweep_dir`` (ordered by job number)."""
    import yaml

    rows = []
    run_dirs = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    for run_dir in sorted(run_dirs, key=lambda p: (len(p.name), p.name)):
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
        report_path = run_dir / "report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        row: Dict[str, Any] = {"run": run_dir.name, "overrides": " ".join(overrides)}
        row["status"] = "ok" if report else "no report"
        for column, path in FIGURES:
            row[column] = _dig(report, path)
        rows.append(row)
    return rows


def write_summary(sweep_dir: Path) -> Path:
    """Write ``sweep_summary.csv`` (and the comparison plot when there are figures)."""
    rows = collect_rows(sweep_dir)
    path = sweep_dir / SUMMARY_CSV
    columns = ["run", "overrides", "status"] + [c for c, _ in FIGURES]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if any(
        row["energy_saving"] is not None or row["energy_saving_ci95_low"] is not None
        for row in rows
    ):
        plot_comparison(rows, sweep_dir / COMPARISON_PNG)
    return path


def plot_comparison(rows: List[Dict[str, Any]], path: Path) -> Path:
    """Grouped bars: energy saving and slowdown (percent) per run, with their 95 % intervals.

    A saving that is not measurable (its interval contains 0) is drawn as its interval alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row["overrides"] or row["run"] for row in rows]
    saving = [100 * (row["energy_saving"] or 0.0) for row in rows]
    slowdown = [100 * (row["slowdown"] or 0.0) for row in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(rows)), 3.6))
    for offset, values, name, label in (
        (-0.2, saving, "energy_saving", "energy saving (%)"),
        (0.2, slowdown, "slowdown", "slowdown (%)"),
    ):
        low = [row[f"{name}_ci95_low"] for row in rows]
        high = [row[f"{name}_ci95_high"] for row in rows]
        errors = [
            [max(0.0, v - 100 * lo) if lo is not None else 0.0 for v, lo in zip(values, low)],
            [max(0.0, 100 * hi - v) if hi is not None else 0.0 for v, hi in zip(values, high)],
        ]
        ax.bar([x + offset for x in xs], values, width=0.4, label=label)
        ax.errorbar([x + offset for x in xs], values, yerr=errors, fmt="none", ecolor="black")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel("percent of the max-speed baseline")
    ax.set_title("perseus-train sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class SweepSummaryCallback(Callback):  # type: ignore[misc]
    """Hydra callback writing the sweep summary when a multirun ends."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """Summarize every run of the sweep."""
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        path = write_summary(sweep_dir)
        logger.info("sweep summary: %s", path)
        print(f"perseus-train: sweep summary {path}")
