"""perseus-plan's outputs: the plan files and the plots, written at the same time.

Once the frontier is known, the plots are drawn on a worker thread while this thread writes
the plan files (:mod:`perseus.formats.plan.outputs`); both are done before
:func:`write_outputs` returns, and an error in either is raised there (the plots' after the
plans are written). While the solver runs -- HiGHS lets go of the interpreter while it solves
-- :func:`warm_up` imports matplotlib and pandas on a worker thread, so that their import
(about 0.8 s) is not on the command's critical path.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from perseus.config.schema import PerseusConfig
from perseus.formats.plan import outputs as plan_outputs

if TYPE_CHECKING:
    from perseus.apps.plan.progress import ProgressLog
    from perseus.planner.frontier import Frontier, FrontierPoint
    from perseus.planner.problem import PlanningProblem

logger = logging.getLogger("perseus.plan")

#: Larger plans get no timeline.png (drawing 20,000 boxes takes seconds).
MAX_TIMELINE_NODES = 20_000

Timings = Dict[str, float]


def _import_plotting() -> None:
    """Import what the outputs need (matplotlib's figure and Agg canvas, pandas)."""
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401
    import pandas  # noqa: F401


def warm_up() -> concurrent.futures.Future:
    """Start importing the plotting libraries on a worker thread (see the module docstring).

    Returns:
        The import's future; an import error is left for the plots themselves to raise.
    """
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="perseus-plan-warm-up")
    future = pool.submit(_import_plotting)
    pool.shutdown(wait=False)
    return future


def write_outputs(
    problem: PlanningProblem,
    frontier: Frontier,
    chosen: FrontierPoint,
    cfg: PerseusConfig,
    out_dir: Path,
    log: Optional[ProgressLog] = None,
) -> Tuple[Dict[str, str], Timings]:
    """Every plan file and (``planner.plots``) the plots; see the module docstring.

    Returns:
        What was written (names relative to ``out_dir``, as summary.json's ``files``) and the
        seconds each part took (``write``, ``plots``).

    Raises:
        The first error of writing the plans, else of drawing the plots.
    """
    timings: Timings = {}

    def draw() -> Tuple[Dict[str, str], float]:
        began = time.perf_counter()
        files = write_plots(problem, frontier, chosen, out_dir, log)
        return files, time.perf_counter() - began

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="perseus-plan-plots") as pool:
        plotted = pool.submit(draw) if cfg.planner.plots else None
        began = time.perf_counter()
        try:
            files = write_plans(frontier, chosen, cfg, out_dir, log)
        finally:
            timings["write"] = time.perf_counter() - began
        if plotted is not None:
            plot_files, timings["plots"] = plotted.result()
            files.update(plot_files)
    return files, timings


def write_plans(
    frontier: Frontier,
    chosen: FrontierPoint,
    cfg: PerseusConfig,
    out_dir: Path,
    log: Optional[ProgressLog] = None,
) -> Dict[str, str]:
    """frontier.csv, plans/<plan_id>.json, plan.json and (optionally) the reference .py files."""

    def written(done: int, total: int) -> None:
        if log is not None:
            log.outputs("write", done / total, f"writing the plans and plots: plan {done}/{total}")

    return plan_outputs.write_frontier_outputs(
        out_dir,
        frontier,
        chosen,
        plan_extra={"policy": str(cfg.energy.policy), "solver": cfg.planner.solver},
        export_reference=cfg.planner.export_reference,
        on_plan=written,
    )


def write_plots(
    problem: PlanningProblem,
    frontier: Frontier,
    chosen: FrontierPoint,
    out_dir: Path,
    log: Optional[ProgressLog] = None,
) -> Dict[str, str]:
    """frontier.png and (up to ``MAX_TIMELINE_NODES`` instructions) timeline.png."""
    from perseus.planner.limits import FRONTIER_PLOT_S, plotting_seconds
    from perseus.planner.plots import plot_frontier, plot_timeline

    if log is not None:
        log.outputs("plots", 0.0, "writing the plans and plots: frontier.png")
    plot_frontier(frontier, out_dir / "frontier.png", chosen=chosen)
    files = {"frontier_plot": "frontier.png"}
    if problem.num_nodes > MAX_TIMELINE_NODES:
        logger.info(
            "no timeline.png: %d instructions are too many boxes to draw (at most %d)",
            problem.num_nodes,
            MAX_TIMELINE_NODES,
        )
        return files
    if log is not None:
        share = FRONTIER_PLOT_S / plotting_seconds(problem.num_nodes, problem.num_stages)
        log.outputs("plots", share, "writing the plans and plots: timeline.png")
    plot_timeline(problem, chosen.freqs, out_dir / "timeline.png")
    files["timeline_plot"] = "timeline.png"
    if log is not None:
        log.outputs("plots", 1.0, "writing the plans and plots: plots drawn")
    return files
