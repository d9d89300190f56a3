"""Energy policies: which frontier point to run (config group ``energy``).

* ``no_slowdown``: least energy with ``T <= T_allmax`` (relative tolerance 1e-6 for float noise).
* ``slowdown``: least energy with ``T <= (1 + energy.max_slowdown) * T_allmax``.
* ``deadline``: least energy with ``T <= energy.iteration_time_s``; if no plan is that fast, the
  fastest plan, with a warning.
* ``min_energy``: least energy, whatever the time.
* ``max_speed``: the all-max-frequency plan.
* ``zeus_cost``: least ``eta * E + (1 - eta) * P_max * T``. ``P_max`` is the highest average power
  of any profiled instruction (energy / time over every stage, instruction and frequency) times
  the number of stages: the power the whole pipeline could draw at most. It converts time into
  joules, so ``eta`` weighs energy against time on one scale (Zeus' cost metric).

:func:`best_for_iteration_time` answers "the iteration must take ``T'`` anyway" (a straggler
elsewhere): the least-energy plan no slower than ``T'``; when even the fastest plan is slower,
the fastest plan.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from perseus.config.schema import EnergyConfig
from perseus.errors import ConfigError
from perseus.planner.frontier import Frontier, FrontierPoint

logger = logging.getLogger(__name__)

NO_SLOWDOWN_RTOL = 1e-6


def choose(frontier: Frontier, energy: EnergyConfig) -> FrontierPoint:
    """The frontier point the energy policy asks for.

    Raises:
        ConfigError: unknown policy, a missing parameter, or ``power_limit`` (not a pipeline
            policy).
    """
    policy = energy.policy
    t_allmax = frontier.allmax.iteration_time_s
    if policy == "no_slowdown":
        return _least_energy_within(frontier, t_allmax * (1 + NO_SLOWDOWN_RTOL))
    if policy == "slowdown":
        _check_slowdown(energy)
        assert energy.max_slowdown is not None
        limit = t_allmax * (1 + energy.max_slowdown) * (1 + NO_SLOWDOWN_RTOL)
        return _least_energy_within(frontier, limit)
    if policy == "deadline":
        _check_deadline(energy)
        assert energy.iteration_time_s is not None
        return best_for_iteration_time(frontier, energy.iteration_time_s)
    if policy == "min_energy":
        return min(frontier.points, key=lambda p: (p.energy_j, p.iteration_time_s))
    if policy == "max_speed":
        return frontier.allmax
    if policy == "zeus_cost":
        return _zeus_cost(frontier, energy.eta)
    raise ConfigError(_unknown(policy))


def policy_deadline(energy: EnergyConfig, t_allmax_s: float) -> Optional[float]:
    """The iteration-time budget ``energy``'s policy plans for; None when it has none.

    ``no_slowdown``: ``T_allmax``; ``slowdown``: ``(1 + max_slowdown) T_allmax``;
    ``deadline``: ``energy.iteration_time_s`` (at least the fastest time is planned anyway);
    ``max_speed``: ``T_allmax``; ``min_energy`` and ``zeus_cost``: None (they weigh the whole
    frontier).

    Raises:
        ConfigError: a missing or negative parameter, or an unknown policy.
    """
    policy = energy.policy
    if policy in ("no_slowdown", "max_speed"):
        return t_allmax_s
    if policy == "slowdown":
        _check_slowdown(energy)
        return t_allmax_s * (1 + float(energy.max_slowdown or 0.0))
    if policy == "deadline":
        _check_deadline(energy)
        return float(energy.iteration_time_s or 0.0)
    if policy in ("min_energy", "zeus_cost"):
        return None
    raise ConfigError(_unknown(policy))


def _check_slowdown(energy: EnergyConfig) -> None:
    if energy.max_slowdown is None or not energy.max_slowdown >= 0:
        raise ConfigError(
            f"energy.max_slowdown={energy.max_slowdown!r}: energy=slowdown needs a "
            "fraction >= 0, e.g. energy.max_slowdown=0.05 for 5 %"
        )


def _check_deadline(energy: EnergyConfig) -> None:
    if energy.iteration_time_s is None or not energy.iteration_time_s > 0:
        raise ConfigError(
            f"energy.iteration_time_s={energy.iteration_time_s!r}: energy=deadline needs "
            "a target iteration time in seconds > 0"
        )


def _unknown(policy: str) -> str:
    return (
        f"energy={policy!r} does not choose a pipeline plan; use no_slowdown, slowdown, "
        "deadline, min_energy, max_speed or zeus_cost"
    )


def best_for_iteration_time(frontier: Frontier, iteration_time_s: float) -> FrontierPoint:
    """Least-energy plan with ``T <= iteration_time_s``; the fastest plan if none is.

    Used when the iteration time is imposed from outside (another pipeline is slower), and by
    the ``deadline`` policy.
    """
    fitting = [p for p in frontier.points if p.iteration_time_s <= iteration_time_s * (1 + 1e-9)]
    if fitting:
        return min(fitting, key=lambda p: (p.energy_j, p.iteration_time_s))
    fastest = min(frontier.points, key=lambda p: (p.iteration_time_s, p.energy_j))
    logger.warning(
        "no plan reaches an iteration time of %.6f s; the fastest plan takes %.6f s and is "
        "used instead (raise energy.iteration_time_s or add faster frequencies to the profile)",
        iteration_time_s,
        fastest.iteration_time_s,
    )
    return fastest


def max_pipeline_power_w(frontier: Frontier) -> float:
    """``P_max`` of ``zeus_cost``: highest instruction power in the profile x stages."""
    problem = frontier.problem
    valid = np.isfinite(problem.opt_time)
    power = np.where(valid, problem.opt_energy / np.where(valid, problem.opt_time, 1.0), 0.0)
    return float(power.max()) * problem.num_stages


def _zeus_cost(frontier: Frontier, eta: float) -> FrontierPoint:
    if not 0.0 <= eta <= 1.0:
        raise ConfigError(f"energy.eta={eta!r}: must be in [0, 1] (1 = energy only)")
    p_max = max_pipeline_power_w(frontier)
    return min(
        frontier.points,
        key=lambda p: eta * p.energy_j + (1 - eta) * p_max * p.iteration_time_s,
    )


def _least_energy_within(frontier: Frontier, limit_s: float) -> FrontierPoint:
    fitting = [p for p in frontier.points if p.iteration_time_s <= limit_s]
    if not fitting:  # cannot happen: the all-max plan always fits its own time
        return frontier.allmax
    return min(fitting, key=lambda p: (p.energy_j, p.iteration_time_s))
