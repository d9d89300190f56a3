"""The profile perseus-plan plans with: which of its stages, and the planning problem.

Offline the profile is the job: perseus-plan plans every stage of it unless
``parallelism.pp`` on its command line (or ``planner.stages``) asks for a subset; the first
and last stage and evenly spaced ones between (:func:`perseus.planner.derived.planned_stages`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Sequence

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError

if TYPE_CHECKING:
    from perseus.formats.profile.table import Profile
    from perseus.planner.problem import PlanningProblem

logger = logging.getLogger("perseus.plan")


@dataclass
class PlannedProfile:
    """The profile perseus-plan plans with.

    Attributes:
        profile: Restricted to ``planner.min_frequency_mhz``, stages selected and renumbered.
        stages: The source profile's stages, in pipeline order.
        p2p_power_w: ``planner.p2p_power_w`` for those stages.
        num_profile_stages: Stages of the source profile.
    """

    profile: Profile
    stages: List[int]
    p2p_power_w: Any
    num_profile_stages: int


def planned_profile(cfg: PerseusConfig, subset_by_pp: bool = True) -> PlannedProfile:
    """Load ``planner.profile`` and keep the stages to plan (see ``planner.stages``).

    Args:
        cfg: The configuration.
        subset_by_pp: Plan ``parallelism.pp`` of the profile's stages when it has more
            (perseus-plan: only when ``parallelism.pp`` is on the command line); otherwise
            every stage unless ``planner.stages`` picks some.

    Raises:
        ConfigError: ``planner.profile`` not set, or bad ``planner.stages``. ProfileError: a
            bad profile CSV.
    """
    from perseus.formats.profile.table import read_profile_csv
    from perseus.planner.derived import planned_stages, select_stages

    if not cfg.planner.profile:
        raise ConfigError(
            "planner.profile is not set: pass the profile CSV to plan from, e.g. "
            "perseus-plan planner.profile=path/to/profile.csv"
        )
    profile = read_profile_csv(Path(cfg.planner.profile).expanduser())
    if cfg.planner.min_frequency_mhz is not None:
        profile = profile.restrict(cfg.planner.min_frequency_mhz)
    num_profile = profile.num_stages
    pp = cfg.parallelism.pp if subset_by_pp else num_profile
    stages = planned_stages(num_profile, pp, cfg.planner.stages)
    if stages != list(range(num_profile)):
        logger.info(
            "planning %d of the profile's %d stages: %s (%s)",
            len(stages),
            num_profile,
            stages,
            subset_reason(cfg),
        )
        profile = select_stages(profile, stages)
    elif num_profile != cfg.parallelism.pp:
        how = f"parallelism.pp={pp}" if subset_by_pp else "parallelism.pp not given"
        logger.info("planning the profile's %d stages (%s)", num_profile, how)
    p2p = cfg.planner.p2p_power_w
    # One value per profile stage: keep the planned stages' values.
    if isinstance(p2p, Sequence) and not isinstance(p2p, str) and len(p2p) == num_profile:
        p2p = [p2p[s] for s in stages]
    return PlannedProfile(profile, stages, p2p, num_profile)


def subset_reason(cfg: PerseusConfig) -> str:
    """The setting that picked a subset of the profile's stages."""
    if cfg.planner.stages is not None:
        return "planner.stages"
    return f"parallelism.pp={cfg.parallelism.pp}"


def pp_on_command_line(overrides: Sequence[str]) -> bool:
    """Whether Hydra's ``overrides`` set ``parallelism.pp`` (``+``/``++`` prefixes too)."""
    return any(o.lstrip("+~").split("=", 1)[0].strip() == "parallelism.pp" for o in overrides)


def load_problem(cfg: PerseusConfig) -> PlanningProblem:
    """Build the PlanningProblem of ``cfg.planner`` and ``cfg.parallelism``.

    Raises:
        ConfigError: ``planner.profile`` not set, or bad ``planner.stages``. ProfileError: a
            bad profile CSV.
    """
    return build_problem(cfg, planned_profile(cfg))


def build_problem(cfg: PerseusConfig, planned: PlannedProfile) -> PlanningProblem:
    """The PlanningProblem of a planned profile and ``cfg.parallelism``."""
    from perseus.planner.problem import PlanningProblem

    return PlanningProblem(
        planned.profile,
        cfg.parallelism.num_microbatches,
        planned.p2p_power_w,
        schedule=cfg.parallelism.schedule,
        num_model_chunks=cfg.parallelism.num_model_chunks,
    )
