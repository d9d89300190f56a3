"""The bounds that both the configuration and the coordination server's wire check.

Each is stated once, here: :mod:`perseus.config.validation` checks the configuration keys of
the same names against them, and :mod:`perseus.wire` turns them into the
:class:`~perseus.config.checked.Bound` annotations the server validates and the client checks, so
perseus-train refuses before step 1 whatever the server would refuse.
"""

from __future__ import annotations

from typing import Dict

from perseus.config.numbers import Range

# Job ids (``server.job_id``, the wire's ``job_id``) and solver names (``planner.solver``).
JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
SOLVER_NAME_PATTERN = r"^[a-z0-9_]{1,32}$"

# Weight of energy in ``eta * E + (1 - eta) * P_max * T``.
ETA_RANGE = (0.0, 1.0)
MAX_POWER_W = 10_000.0
MAX_MHZ = 100_000

MHZ = Range(gt=0, le=MAX_MHZ, integer=True, optional=True, unit="MHz")
# GPU power while blocked on pipeline communication (``planner.p2p_power_w``, each value).
P2P_POWER_W = Range(ge=0.0, le=MAX_POWER_W, unit="W")
# A GPU's power (a measured power, a power limit).
POWER_W = Range(gt=0.0, le=MAX_POWER_W, unit="W")


def _count(low: int, high: int) -> Range:
    return Range(ge=low, le=high, integer=True)


# ``energy.<key>``: the energy policy's numbers.
ENERGY_SETTINGS: Dict[str, Range] = {
    "max_slowdown": Range(ge=0.0, le=100.0, optional=True),
    "iteration_time_s": Range(gt=0.0, le=1e6, optional=True, unit="s"),
    "eta": Range(ge=ETA_RANGE[0], le=ETA_RANGE[1]),
}

# ``energy.power_limit.<key>``: the power-limit optimizer's numbers (perseus.power_limit checks
# them too, for a config built in code).
POWER_LIMIT_SETTINGS: Dict[str, Range] = {
    "step_w": Range(gt=0.0, le=MAX_POWER_W, unit="W"),
    "warmup_steps": _count(0, 1_000_000),
    "profile_steps": _count(1, 1_000_000),
    "warmup_s": Range(ge=0.0, le=3600.0, unit="s"),
    "target_error": Range(gt=0.0, le=0.5),
    "repeats": _count(1, 10_000),
    "max_candidates": _count(1, 1000),
    "max_slowdown": Range(ge=0.0, le=100.0),
}

# ``profiler.<key>``: the online profiler's numbers.
PROFILER_SETTINGS: Dict[str, Range] = {
    "energy_rise_patience": _count(1, 1000),
    "warmup_instructions": _count(0, 1000),
    "min_window_s": Range(ge=0.0, le=3600.0, unit="s"),
    "max_iterations": _count(1, 100_000),
    "max_iterations_fraction": Range(gt=0.0, le=1.0, optional=True),
    "job_iterations": Range(ge=1, le=10**12, integer=True, optional=True),
    "max_minutes": Range(gt=0.0, le=10_080.0, optional=True, unit="min"),
    "frequency_step": _count(1, 1000),
    "min_frequency_mhz": MHZ,
    "baseline_steps": _count(1, 10_000),
    "settle_steps": _count(0, 10_000),
    "measure_steps": _count(1, 10_000),
}
