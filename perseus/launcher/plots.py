"""Plots of a ``perseus-train`` run: ``frontier.png`` and ``timeline.png``.

Both are drawn by :mod:`perseus.planner.plots` from the run's files: the measured profile
(``profile.csv``), the frontier's plans (``plans/*.json``, re-simulated) and the chosen plan
(``plan.json``); the timeline also shows what rank actually ran (``trace-rank*.csv``) for the
last measured iteration of the plan.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from perseus.config.schema import PerseusConfig
from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.plan.document import Plan
from perseus.formats.profile.table import read_profile_csv
from perseus.formats.trace_csv import read_traces

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint

logger = logging.getLogger(__name__)

Interval = Tuple[float, float]


def measured_intervals(out_dir: Path, num_stages: int) -> Optional[List[List[Interval]]]:
    """Start/end of every instruction of the last fully traced iteration, per stage.

    Times are relative to the earliest start in that iteration. ``None`` without traces.
    """
    rows: Dict[int, Dict[int, List[Interval]]] = {}
    for row in read_traces(out_dir):
        interval = (row.start_s, row.end_s)
        rows.setdefault(row.step, {}).setdefault(row.stage, []).append(interval)
    complete = [s for s, stages in rows.items() if len(stages) == num_stages]
    if not complete:
        return None
    last = rows[max(complete)]
    origin = min(start for stage in last.values() for start, _ in stage)
    return [
        [(start - origin, end - origin) for start, end in sorted(last[stage])]
        for stage in range(num_stages)
    ]


def write_plots(cfg: PerseusConfig, out_dir: Path) -> List[Path]:
    """Draw the plots the run's files allow; returns the files written."""
    if not cfg.planner.plots:
        return []
    profile_csv = out_dir / plan_outputs.PROFILE_CSV
    if not (profile_csv.is_file() and (out_dir / plan_outputs.PLAN_JSON).is_file()):
        logger.info("no profile.csv/plan.json in %s: skipping the plots", out_dir)
        return []
    from perseus.planner import plots
    from perseus.planner.frontier import build_frontier
    from perseus.planner.problem import PlanningProblem

    profile = read_profile_csv(profile_csv)
    chosen = plan_outputs.read_chosen_plan(out_dir)
    schedule = chosen.pipeline_order() or chosen.schedule  # an engine's order: in the plan
    problem = PlanningProblem(
        profile, chosen.num_microbatches, cfg.planner.p2p_power_w, schedule=schedule
    )
    chosen_freqs = _freqs(chosen)
    assignments = [chosen_freqs] + [_freqs(p) for p in plan_outputs.read_frontier_plans(out_dir)]
    frontier = build_frontier(problem, assignments)
    written = []
    chosen_point = _point_with(frontier, chosen_freqs)
    frontier_png = out_dir / "frontier.png"
    plots.plot_frontier(frontier, frontier_png, chosen=chosen_point)
    written.append(frontier_png)
    timeline_png = out_dir / "timeline.png"
    measured = measured_intervals(out_dir, chosen.num_stages)
    plots.plot_timeline(problem, chosen_freqs, timeline_png, measured=measured)
    written.append(timeline_png)
    return written


def _freqs(plan: Plan) -> List[List[int]]:
    return [plan.frequencies(s) for s in range(plan.num_stages)]


def _point_with(frontier: Frontier, freqs: List[List[int]]) -> Optional[FrontierPoint]:
    for point in frontier.points:
        if [list(f) for f in point.freqs] == freqs:
            return point
    return None
