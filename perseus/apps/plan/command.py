r"""The ``perseus-plan`` command: profile CSV -> every Pareto-optimal plan, and the one to run.

Usage::

    perseus-plan planner.profile=profile.csv parallelism.num_microbatches=12 \\
        planner.p2p_power_w=83.64 energy=slowdown energy.max_slowdown=0.05 hydra.run.dir=out

Writes into Hydra's run directory (``hydra.run.dir=...`` moves it), through
:mod:`perseus.formats.plan.outputs`:

* ``frontier.csv``: one row per frontier plan (re-simulated): plan_id, iteration_time_s, energy_j,
  slowdown and saving against the all-max plan, is_allmax, is_chosen, plan_file;
* ``plans/<plan_id>.json``: every frontier plan (``perseus-plan/1``, plan 0 is the fastest);
* ``plan.json``: the plan the energy policy chose;
* ``summary.json``: ``allmax``, ``chosen``, ``least_energy``, ``solver``, ``solve_time_s``,
  savings and the inputs, the estimate (``estimate_s``) and each phase's seconds
  (``timings_s``), and a ``note`` when no plan saves energy without slowdown (why, e.g.
  lowtime's time quantization, and which setting would pick the next plan);
* ``frontier.png``, ``timeline.png`` (``planner.plots=false`` skips them);
* with ``planner.export_reference=true``, ``reference/freqs_pipeline_%05d.py`` per plan (the
  reference system's format; the number is the plan_id).

:func:`run_plan` is the same pipeline as a function. Offline the profile is the job: every
stage of it is planned unless ``parallelism.pp`` on the command line (or ``planner.stages``)
asks for a subset (:mod:`perseus.apps.plan.stages`), and the result line says so.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from perseus.apps.common import hydra_app
from perseus.apps.plan.outputs import MAX_TIMELINE_NODES, warm_up, write_outputs
from perseus.apps.plan.progress import ProgressLog
from perseus.apps.plan.stages import (
    build_problem,
    planned_profile,
    pp_on_command_line,
    subset_reason,
)
from perseus.config.schema import PerseusConfig
from perseus.formats.plan import outputs as plan_outputs

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint

logger = logging.getLogger("perseus.plan")


def plan_scope(cfg: PerseusConfig, num_stages: int) -> str:
    """``frontier`` or ``policy`` for ``planner.scope`` and what this machine can do.

    Raises:
        ConfigError: the work is estimated to exceed ``planner.max_solve_s`` or the free
            memory (the message gives the estimate and what to change).
    """
    from perseus.planner.limits import MAX_AUTO_OUTPUT_BYTES, choose_scope, estimate

    if cfg.planner.solver != "lp":
        return "frontier" if cfg.planner.scope != "policy" else "policy"
    par = cfg.parallelism
    shape = (num_stages, par.num_microbatches, par.schedule, par.num_model_chunks)
    effort = str(cfg.planner.effort)
    frontier = estimate(*shape, scope="frontier", effort=effort)
    policy = estimate(*shape, scope="policy", effort=effort)
    scope = choose_scope(cfg.planner.scope, frontier, policy, cfg.planner.max_solve_s)
    if scope == "policy" and cfg.planner.scope == "auto":
        logger.info(
            "the full frontier of %d instructions would need %s (planner.max_solve_s=%g, "
            "plan files up to %.0f GB); planning only the energy policy's plan (%s); "
            "planner.scope=frontier forces it",
            frontier.num_nodes,
            frontier.describe(),
            cfg.planner.max_solve_s,
            MAX_AUTO_OUTPUT_BYTES / 1e9,
            policy.describe(),
        )
    else:
        work = frontier if scope == "frontier" else policy
        logger.info(
            "planning the %s (up to %.1f GB of memory)",
            "full frontier" if scope == "frontier" else "energy policy's plan",
            work.memory_bytes / 1e9,
        )
    return scope


def solver_options(name: str, cfg: PerseusConfig) -> Dict[str, Any]:
    """The ``planner.*`` settings the named solver's constructor accepts (time_unit_s, effort)."""
    from perseus.planner.solvers import solver_accepts

    offered = {"time_unit_s": cfg.planner.time_unit_s, "effort": str(cfg.planner.effort)}
    return {key: value for key, value in offered.items() if solver_accepts(name, key)}


def run_plan(
    cfg: PerseusConfig,
    out_dir: Path,
    progress: Optional[Callable[[str, float], None]] = None,
    subset_by_pp: bool = True,
) -> Dict[str, Any]:
    """Plan from ``cfg.planner.profile`` and write every output into ``out_dir``.

    Args:
        cfg: The whole configuration (planner, parallelism, energy are read).
        out_dir: Output directory (created if needed).
        progress: Solver progress callback; default: the command's progress line
            (:class:`perseus.apps.plan.progress.ProgressLog`).
        subset_by_pp: See :func:`planned_profile` (perseus-plan passes whether
            ``parallelism.pp`` is on its command line).

    Returns:
        The summary also written to ``summary.json``.

    Raises:
        ConfigError, ProfileError, SolverError: with what to fix.
    """
    from perseus.planner import plan_frontier, plan_policy
    from perseus.planner.limits import writing_seconds
    from perseus.planner.policies import choose

    began = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    planned = planned_profile(cfg, subset_by_pp)
    scope = plan_scope(cfg, planned.profile.num_stages)
    name = cfg.planner.solver
    options = solver_options(name, cfg)
    log = progress_log(cfg, planned.profile.num_stages, scope)
    log.stage("setup", "building the problem")
    problem = build_problem(cfg, planned)
    if cfg.planner.plots:
        warm_up()  # while the solver runs
    logger.info(
        "planning %d stages x %d microbatches (%s, %d instructions) with solver %r%s: %s",
        problem.num_stages,
        problem.num_microbatches,
        problem.schedule,
        problem.num_nodes,
        name,
        f" {options}" if options else "",
        "every Pareto-optimal plan" if scope == "frontier" else "the energy policy's plan",
    )
    setup_s = time.perf_counter() - began
    solver_progress = progress or log
    start_s = time.perf_counter()
    if scope == "frontier":
        frontier = plan_frontier(problem, name, solver_progress, **options)
    else:
        frontier = plan_policy(problem, cfg.energy, name, solver_progress, **options)
    solve_time_s = time.perf_counter() - start_s
    chosen = choose(frontier, cfg.energy)
    note = None
    if chosen.is_allmax and cfg.energy.policy == "no_slowdown":
        note = _hint_nearest_saving(frontier, name, options.get("time_unit_s"))
    log.resize_outputs(writing_seconds(problem.num_nodes, len(frontier)), log.plots_s)
    log.outputs("write", 0.0, f"writing {len(frontier)} plans and the plots")
    files, timings = write_outputs(problem, frontier, chosen, cfg, out_dir, log)
    log.finish()
    summary = make_summary(cfg, frontier, chosen, name, solve_time_s, files)
    summary["scope"] = scope
    summary["profile_stages"] = planned.stages
    summary["profile_num_stages"] = planned.num_profile_stages
    summary["estimate_s"] = log.estimate_s
    summary["timings_s"] = {
        "setup": setup_s,
        "solve": solve_time_s,
        **timings,
        "total": time.perf_counter() - began,
    }
    if name == "lp":
        summary["effort"] = str(cfg.planner.effort)
    if note:
        summary["note"] = note
    plan_outputs.write_summary(out_dir, summary)
    subset = ""
    if planned.stages != list(range(planned.num_profile_stages)):
        subset = (
            f" Planned {len(planned.stages)} of the profile's {planned.num_profile_stages} "
            f"stages, {planned.stages} ({subset_reason(cfg)}): the plan runs in a "
            f"{len(planned.stages)}-stage job."
        )
    logger.info(
        "chosen plan %d (%s): %d stages, %.4f s, %.1f J per iteration; all-max %.4f s, %.1f J; "
        "saves %.2f %% energy at %+.2f %% time.%s Outputs in %s",
        chosen.plan_id,
        cfg.energy.policy,
        problem.num_stages,
        chosen.iteration_time_s,
        chosen.energy_j,
        frontier.allmax.iteration_time_s,
        frontier.allmax.energy_j,
        100 * summary["chosen"]["saving"],
        100 * summary["chosen"]["slowdown"],
        subset,
        out_dir,
    )
    return summary


def progress_log(cfg: PerseusConfig, num_stages: int, scope: str) -> ProgressLog:
    """The command's progress line, with the setup and the outputs' expected seconds."""
    from perseus.planner.limits import (
        BUILD_S_PER_NODE,
        EXPECTED_FRONTIER_PLANS,
        EXPECTED_POLICY_PLANS,
        plotting_seconds,
        writing_seconds,
    )

    par = cfg.parallelism
    num_nodes = 2 * num_stages * par.num_microbatches * par.num_model_chunks
    num_plans = EXPECTED_FRONTIER_PLANS if scope == "frontier" else EXPECTED_POLICY_PLANS
    plots_s = 0.0
    if cfg.planner.plots:
        plots_s = plotting_seconds(num_nodes, num_stages, num_nodes <= MAX_TIMELINE_NODES)
    return ProgressLog(
        setup_s=BUILD_S_PER_NODE * num_nodes,
        write_s=writing_seconds(num_nodes, num_plans),
        plots_s=plots_s,
    )


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
    """Entry point of the ``perseus-plan`` console script.

    Offline the profile is the job: every stage of it is planned unless ``parallelism.pp``
    (or ``planner.stages``) on the command line asks for a subset.
    """
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    run_plan(cfg, out_dir, subset_by_pp=pp_on_command_line(overrides))
