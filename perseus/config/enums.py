"""The configuration's keys with a fixed set of values, as enums (see :mod:`perseus.config.schema`).

OmegaConf and Hydra look enum values up by member name, so every member is named as its value:
YAML files and command-line overrides take the plain value (``energy=slowdown``,
``runtime.mode=plan``) and a bad value fails with the choices listed.
"""

from __future__ import annotations

from enum import Enum


class ConfigChoice(str, Enum):
    """A value out of a fixed set (configuration keys, and the wire's job phases).

    Members are named as their values, so OmegaConf and Hydra accept the plain value in YAML and
    on the command line (``energy=slowdown``, ``runtime.mode=plan``). A member is a ``str``: it
    compares equal to its value, prints as it and serializes to JSON as it.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class EnergyPolicy(ConfigChoice):
    """``energy.policy``: which frontier plan runs (``power_limit``: the power-limit optimizer)."""

    no_slowdown = "no_slowdown"
    slowdown = "slowdown"
    deadline = "deadline"
    min_energy = "min_energy"
    max_speed = "max_speed"
    zeus_cost = "zeus_cost"
    power_limit = "power_limit"


# The policies that choose a pipeline frequency plan (all but power_limit).
PIPELINE_POLICIES = tuple(p for p in EnergyPolicy if p is not EnergyPolicy.power_limit)


class Framework(ConfigChoice):
    """``framework.name``: the training framework (see :mod:`perseus.train.frameworks`)."""

    deepspeed = "deepspeed"
    megatron = "megatron"
    merak = "merak"
    torch = "torch"
    torch_pipelining = "torch_pipelining"


class GPUBackend(ConfigChoice):
    """``gpu.backend``: a real NVIDIA GPU, the emulated device, or whichever is usable."""

    auto = "auto"
    nvml = "nvml"
    emulated = "emulated"


class EmulatedCounter(ConfigChoice):
    """``gpu.emulated.counter``: how the emulated GPU's energy counter and power readings behave.

    ``realistic``: like the recorded H100 (:mod:`perseus.gpu.emulated.readings`): a counter updated
    every 100 ms that takes ~3 ms (up to ~35 ms) to read, an instant power field that lags, idle
    power, a power limit enforced on a ~1 s average. ``ideal``: a strictly periodic counter
    (20 ms by default) that is free to read and exact at its updates.
    """

    realistic = "realistic"
    ideal = "ideal"


class GPUOnUnsupported(ConfigChoice):
    """``gpu.on_unsupported``: what a start-up check that finds the GPU lacking does."""

    error = "error"
    measure_only = "measure_only"


class ProfilerMode(ConfigChoice):
    """``profiler.mode``: several clocks per iteration (fast) or one per kind (sweep)."""

    fast = "fast"
    sweep = "sweep"


class RuntimeMode(ConfigChoice):
    """``runtime.mode``: where each instruction's clock comes from."""

    measure = "measure"
    max_speed = "max_speed"
    plan = "plan"
    online = "online"


class PlannerScope(ConfigChoice):
    """``planner.scope``: every Pareto-optimal plan, only the energy policy's, or by estimate."""

    auto = "auto"
    frontier = "frontier"
    policy = "policy"


class PlannerEffort(ConfigChoice):
    """``planner.effort``: how hard the ``lp`` solver searches (see its effort levels)."""

    fast = "fast"
    balanced = "balanced"
    thorough = "thorough"


class PowerLimitSelector(ConfigChoice):
    """``energy.power_limit.selector``: which measured power limit to keep."""

    zeus_cost = "zeus_cost"
    energy = "energy"
    time = "time"
    max_slowdown = "max_slowdown"


class LoggerBackend(ConfigChoice):
    """``logger.backend``: the experiment tracker a job's figures go to (``none``: off)."""

    none = "none"
    mlflow = "mlflow"
    tensorboard = "tensorboard"
    wandb = "wandb"
