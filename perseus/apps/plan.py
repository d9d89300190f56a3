r"""``perseus-plan``: profile CSV -> every Pareto-optimal frequency plan, and the one to run.

Usage::

    perseus-plan planner.profile=profile.csv parallelism.num_microbatches=12 \\
        planner.p2p_power_w=83.64 energy=slowdown energy.max_slowdown=0.05 hydra.run.dir=out

Writes into Hydra's run directory (``hydra.run.dir=...`` moves it), through
:mod:`perseus.formats.plan_outputs`:

* ``frontier.csv``: one row per frontier plan (re-simulated): plan_id, iteration_time_s, energy_j,
  slowdown and saving against the all-max plan, is_allmax, is_chosen, plan_file;
* ``plans/<plan_id>.json``: every frontier plan (``perseus-plan/1``, plan 0 is the fastest);
* ``plan.json``: the plan the energy policy chose;
* ``summary.json``: ``allmax``, ``chosen``, ``least_energy``, ``solver``, ``solve_time_s``,
  savings and the inputs, and a ``note`` when no plan saves energy without slowdown (why,
  e.g. lowtime's time quantization, and which setting would pick the next plan);
* ``frontier.png``, ``timeline.png`` (``planner.plots=false`` skips them);
* with ``planner.export_reference=true``, ``reference/freqs_pipeline_%05d.py`` per plan (the
  reference system's format; the number is the plan_id).

:func:`run_plan` is the same pipeline as a function (the server and ``perseus-train`` reuse it).
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from perseus.apps.common import hydra_app
from perseus.config import PerseusConfig
from perseus.errors import ConfigError
from perseus.formats import plan_outputs

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint
    from perseus.planner.problem import PlanningProblem

logger = logging.getLogger("perseus.formats.plan_json")

PROGRESS_PERIOD_S = 2.0


def load_problem(cfg: PerseusConfig) -> PlanningProblem:
    """Build the PlanningProblem of ``cfg.planner`` and ``cfg.parallelism``.

    Raises:
        ConfigError: ``planner.profile`` not set. ProfileError: a bad profile CSV.
    """
    from perseus.formats.profile_csv import read_profile_csv
    from perseus.planner.problem import PlanningProblem

    if not cfg.planner.profile:
        raise ConfigError(
            "planner.profile is not set: pass the profile CSV to plan from, e.g. "
            "perseus-plan planner.profile=path/to/profile.csv"
        )
    profile = read_profile_csv(Path(cfg.planner.profile).expanduser())
    if cfg.planner.min_frequency_mhz is not None:
        profile = profile.restrict(cfg.planner.min_frequency_mhz)
    if profile.num_stages != cfg.parallelism.pp:
        logger.info(
            "planning for the profile's %d stages (parallelism.pp=%d is not used by perseus-plan)",
            profile.num_stages,
            cfg.parallelism.pp,
        )
    return PlanningProblem(
        profile,
        cfg.parallelism.num_microbatches,
        cfg.planner.p2p_power_w,
        schedule=cfg.parallelism.schedule,
        num_model_chunks=cfg.parallelism.num_model_chunks,
    )


def solver_options(name: str, cfg: PerseusConfig) -> Dict[str, Any]:
    """The ``planner.*`` settings the named solver's constructor accepts (e.g. time_unit_s)."""
    from perseus.planner.solvers import get_solver

    offered = {"time_unit_s": cfg.planner.time_unit_s}
    params = inspect.signature(type(get_solver(name)).__init__).parameters
    return {key: value for key, value in offered.items() if key in params}


class ProgressLog:
    """A solver progress callback that logs at most every ``period_s`` seconds."""

    def __init__(self, period_s: float = PROGRESS_PERIOD_S) -> None:
        """Start the clock."""
        self.period_s = period_s
        self._start_s = time.perf_counter()
        self._last_s = -float("inf")

    def __call__(self, message: str, fraction: float) -> None:
        """Log ``message`` with the fraction done and the elapsed time."""
        now_s = time.perf_counter()
        if fraction < 1.0 and now_s - self._last_s < self.period_s:
            return
        self._last_s = now_s
        logger.info("%s (%.0f %%, %.1f s)", message, 100 * fraction, now_s - self._start_s)


def run_plan(
    cfg: PerseusConfig,
    out_dir: Path,
    progress: Optional[Callable[[str, float], None]] = None,
) -> Dict[str, Any]:
    """Plan from ``cfg.planner.profile`` and write every output into ``out_dir``.

    Args:
        cfg: The whole configuration (planner, parallelism, energy are read).
        out_dir: Output directory (created if needed).
        progress: Solver progress callback; default logs every few seconds.

    Returns:
        The summary also written to ``summary.json``.

    Raises:
        ConfigError, ProfileError, SolverError: with what to fix.
    """
    from perseus.planner import plan_frontier
    from perseus.planner.policies import choose

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problem = load_problem(cfg)
    name = cfg.planner.solver
    options = solver_options(name, cfg)
    logger.info(
        "planning %d stages x %d microbatches (%s) with solver %r %s",
        problem.num_stages,
        problem.num_microbatches,
        problem.schedule,
        name,
        options or "",
    )
    start_s = time.perf_counter()
    frontier = plan_frontier(problem, name, progress or ProgressLog(), **options)
    solve_time_s = time.perf_counter() - start_s
    chosen = choose(frontier, cfg.energy)
    note = None
    if chosen.is_allmax and cfg.energy.policy == "no_slowdown":
        note = _hint_nearest_saving(frontier, name, options.get("time_unit_s"))
    files = write_plans(frontier, chosen, cfg, out_dir)
    if cfg.planner.plots:
        files.update(write_plots(problem, frontier, chosen, out_dir))
    summary = make_summary(cfg, frontier, chosen, name, solve_time_s, files)
    if note:
        summary["note"] = note
    plan_outputs.write_summary(out_dir, summary)
    logger.info(
        "chosen plan %d (%s): %.4f s, %.1f J per iteration; all-max %.4f s, %.1f J; "
        "saves %.2f %% energy at %+.2f %% time. Outputs in %s",
        chosen.plan_id,
        cfg.energy.policy,
        chosen.iteration_time_s,
        chosen.energy_j,
        frontier.allmax.iteration_time_s,
        frontier.allmax.energy_j,
        100 * summary["chosen"]["saving"],
        100 * summary["chosen"]["slowdown"],
        out_dir,
    )
    return summary


def _hint_nearest_saving(
    frontier: Frontier, solver: str = "lp", time_unit_s: Optional[float] = None
) -> Optional[str]:
    """When no plan saves energy without slowdown, say why and what the next plan would give.

    Args:
        frontier: The frontier.
        solver: The solver's name; ``lowtime``'s time quantization gets its own explanation.
        time_unit_s: lowtime's time quantum (``planner.time_unit_s``).

    Returns:
        The logged explanation (also stored in summary.json as ``note``), or None.
    """
    cheaper = [p for p in frontier.points if p.energy_j < frontier.allmax.energy_j]
    if not cheaper:
        return None
    nearest = min(cheaper, key=lambda p: p.iteration_time_s)
    slowdown = nearest.iteration_time_s / frontier.allmax.iteration_time_s - 1.0
    note = (
        f"no plan saves energy without any slowdown; plan {nearest.plan_id} is "
        f"{100 * slowdown:.3f} % slower and saves {100 * frontier.saving(nearest):.1f} % "
        f"(energy=slowdown energy.max_slowdown={slowdown * (1 + 1e-3):.4g} would choose it)"
    )
    if solver == "lowtime":
        note += (
            f". This is how the lowtime method works: it rounds every instruction's time down "
            f"to a multiple of planner.time_unit_s={time_unit_s} s, so the plans it believes "
            f"as fast as the all-max plan are a little slower when re-simulated with the "
            f"measured times, and energy=no_slowdown keeps the all-max plan. "
            f"planner.solver=lp plans with the measured times and has no such loss"
        )
    logger.info("%s", note)
    return note


def write_plans(
    frontier: Frontier, chosen: FrontierPoint, cfg: PerseusConfig, out_dir: Path
) -> Dict[str, str]:
    """frontier.csv, plans/<plan_id>.json, plan.json and (optionally) the reference .py files."""
    return plan_outputs.write_frontier_outputs(
        out_dir,
        frontier,
        chosen,
        plan_extra={"policy": str(cfg.energy.policy), "solver": cfg.planner.solver},
        export_reference=cfg.planner.export_reference,
    )


def write_plots(
    problem: PlanningProblem, frontier: Frontier, chosen: FrontierPoint, out_dir: Path
) -> Dict[str, str]:
    """frontier.png and timeline.png (of the chosen plan)."""
    from perseus.planner.plots import plot_frontier, plot_timeline

    plot_frontier(frontier, out_dir / "frontier.png", chosen=chosen)
    plot_timeline(problem, chosen.freqs, out_dir / "timeline.png")
    return {"frontier_plot": "frontier.png", "timeline_plot": "timeline.png"}


def _point(frontier: Frontier, point: FrontierPoint) -> Dict[str, Any]:
    allmax = frontier.allmax
    return {
        "plan_id": point.plan_id,
        "iteration_time_s": point.iteration_time_s,
        "energy_j": point.energy_j,
        "saving": frontier.saving(point),
        "energy_saved_j": allmax.energy_j - point.energy_j,
        "slowdown": point.iteration_time_s / allmax.iteration_time_s - 1.0,
    }


def make_summary(
    cfg: PerseusConfig,
    frontier: Frontier,
    chosen: FrontierPoint,
    solver: str,
    solve_time_s: float,
    files: Dict[str, str],
) -> Dict[str, Any]:
    """The summary.json content."""
    problem = frontier.problem
    least = min(frontier.points, key=lambda p: p.energy_j)
    return {
        "allmax": _point(frontier, frontier.allmax),
        "chosen": _point(frontier, chosen),
        "least_energy": _point(frontier, least),
        "policy": str(cfg.energy.policy),
        "solver": solver,
        "solve_time_s": solve_time_s,
        "num_plans": len(frontier.points),
        "profile": str(cfg.planner.profile),
        "num_stages": problem.num_stages,
        "num_microbatches": problem.num_microbatches,
        "schedule": problem.schedule,
        "p2p_power_w": list(problem.p2p_power_w),
        "files": files,
    }


@hydra_app("perseus_plan", prog="perseus-plan")
def main(cfg: PerseusConfig, out_dir: Path) -> None:
    """Entry point of the ``perseus-plan`` console script."""
    run_plan(cfg, out_dir)


if __name__ == "__main__":
    main()
