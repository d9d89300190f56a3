"""Validation of the whole configuration: every problem at once, one line each.

:func:`validate` (and :func:`to_object`, which the apps call on a composed configuration) checks

* every key with a numeric range (:data:`RANGES`): a finite number within it, an integer where
  a count is meant, so ``gpu.emulated.time_scale=nan`` or ``server.request_timeout_s=-1`` fail
  before anything runs, naming the key, the value and the range;
* the enum keys (a dataclass built in code is not checked by OmegaConf);
* the keys that go together: the energy policy's own key, the emulated power-limit range, the
  node rank, the loop length; and the strings other programs read (server URL, token, job id).

Where the coordination server bounds the same value (:mod:`perseus.wire`), both take the range
from :mod:`perseus.config.bounds`, stated once, so a configuration that passes never gets its job
refused by the server (``tests/unit/test_config_bad_input.py`` checks it). This module imports
the configuration; the configuration never imports it. The checks of files and of this machine
(plans, datasets, GPUs) are the launcher's preflight.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from perseus.config.bounds import (
    ENERGY_SETTINGS,
    ETA_RANGE,
    JOB_ID_PATTERN,
    MAX_POWER_W,
    MHZ,
    P2P_POWER_W,
    POWER_LIMIT_SETTINGS,
    PROFILER_SETTINGS,
    SOLVER_NAME_PATTERN,
)
from perseus.config.enums import (
    EmulatedCounter,
    EnergyPolicy,
    Framework,
    GPUBackend,
    GPUOnUnsupported,
    LoggerBackend,
    PlannerEffort,
    PlannerScope,
    PowerLimitSelector,
    ProfilerMode,
    RuntimeMode,
)
from perseus.config.numbers import Range, number_problem, ranges_problems
from perseus.config.schema import EnergyConfig, PerseusConfig
from perseus.errors import ConfigError
from perseus.schedule import ALL_SCHEDULES

__all__ = [
    "ETA_RANGE",
    "JOB_ID_PATTERN",
    "P2P_POWER_W",
    "RANGES",
    "SOLVER_NAME_PATTERN",
    "check_eta",
    "eta_problem",
    "p2p_power_problems",
    "to_object",
    "validate",
]

MAX_STEPS = 10**12  # the wire's largest iteration number
DAY_S = 86_400.0


def _count(low: int = 1, high: int = 1_000_000_000, optional: bool = False) -> Range:
    return Range(ge=low, le=high, integer=True, optional=optional)


def _seconds(
    *, gt: float = 0.0, le: float = DAY_S, optional: bool = False, ge_one: bool = False
) -> Range:
    if ge_one:
        return Range(ge=1.0, le=le, optional=optional, unit="s")
    return Range(gt=gt, le=le, optional=optional, unit="s")


def _watts(optional: bool = False, positive: bool = False) -> Range:
    if positive:
        return Range(gt=0.0, le=MAX_POWER_W, optional=optional, unit="W")
    return Range(ge=0.0, le=MAX_POWER_W, optional=optional, unit="W")


# A TCP port; None: any free one (see ServerConfig.port, TrainConfig.master_port).
PORT = Range(ge=1, le=65535, integer=True, optional=True)
SEED = Range(ge=0, le=2**32 - 1, integer=True)

RANGES: Dict[str, Range] = {
    # model
    "model.num_layers": _count(),
    "model.hidden_size": _count(),
    "model.num_attention_heads": _count(),
    "model.ffn_hidden_size": _count(optional=True),
    "model.seq_length": _count(),
    "model.vocab_size": _count(),
    "model.max_position_embeddings": _count(optional=True),
    "model.kv_channels": _count(optional=True),
    "model.width_factor": _count(),
    "model.base_channels": _count(),
    "model.image_size": _count(),
    "model.num_classes": _count(),
    # parallelism
    "parallelism.pp": _count(),
    "parallelism.dp": _count(),
    "parallelism.tp": _count(),
    "parallelism.num_microbatches": _count(),
    "parallelism.microbatch_size": _count(),
    "parallelism.num_model_chunks": _count(),
    # energy (the server's bounds of the same keys)
    **{f"energy.{key}": allowed for key, allowed in ENERGY_SETTINGS.items()},
    **{f"energy.power_limit.{key}": allowed for key, allowed in POWER_LIMIT_SETTINGS.items()},
    # gpu.emulated
    "gpu.emulated.time_scale": Range(gt=0.0, le=1e6),
    "gpu.emulated.blocking_power_w": _watts(optional=True),
    "gpu.emulated.idle_power_w": _watts(optional=True),
    "gpu.emulated.energy_update_period_s": _seconds(le=10.0, optional=True),
    "gpu.emulated.energy_noise": Range(ge=0.0, le=1.0),
    "gpu.emulated.power_limit_max_w": _watts(optional=True, positive=True),
    "gpu.emulated.power_limit_min_w": _watts(positive=True),
    "gpu.emulated.seed": SEED,
    # profiler (the server's bounds of the same keys)
    **{f"profiler.{key}": allowed for key, allowed in PROFILER_SETTINGS.items()},
    # planner (p2p_power_w, one value or one per stage, is checked with P2P_POWER_W)
    "planner.time_unit_s": _seconds(le=60.0),
    "planner.min_frequency_mhz": MHZ,
    "planner.max_solve_s": _seconds(),
    # server
    "server.port": PORT,
    "server.request_timeout_s": _seconds(),
    "server.max_retries": _count(0, 100),
    "server.retry_backoff_s": Range(ge=0.0, le=3600.0, unit="s"),
    "server.rank_timeout_s": _seconds(),
    "server.drift_threshold": Range(ge=0.0, le=10.0),
    "server.drift_patience": _count(1, 1_000_000),
    "server.start_timeout_s": _seconds(),
    "server.prefetch_steps": _count(1, 1000),
    "server.max_jobs": _count(1, 1_000_000),
    "server.profiler_workers": _count(0, 1024),
    "server.planner_workers": _count(0, 1024),
    "server.blas_threads": _count(1, 1024),
    "server.max_body_mb": Range(gt=0.0, le=1e6, unit="MB"),
    "server.max_job_state_mb": Range(gt=0.0, le=1e9, unit="MB"),
    "server.max_state_mb": Range(gt=0.0, le=1e9, unit="MB"),
    "server.plan_slowdown_tolerance": Range(ge=0.0, le=1.0),
    "server.live_history_s": _seconds(ge_one=True),
    "server.live_retired_s": Range(ge=0.0, le=365 * DAY_S, unit="s"),
    # logger, metrics (their threads' periods)
    "logger.interval_s": _seconds(gt=0.05, le=3600.0),
    "metrics.interval_s": _seconds(gt=0.05, le=3600.0),
    # train
    "train.warmup_steps": _count(0, MAX_STEPS),
    "train.measure_steps": _count(1, MAX_STEPS),
    "train.max_steps": _count(1, MAX_STEPS),
    "train.seed": SEED,
    "train.lr": Range(ge=0.0, le=1e6),
    "train.nnodes": _count(1, 100_000, optional=True),
    "train.node_rank": _count(0, 100_000, optional=True),
    "train.master_port": PORT,
    "train.nproc_per_node": _count(1, 100_000, optional=True),
}


def eta_problem(eta: float, key: str = "energy.eta") -> Optional[str]:
    """Why ``eta`` (weight of energy in ``eta * E + (1 - eta) * P_max * T``) is invalid, or None."""
    problem = number_problem(key, eta, RANGES["energy.eta"])
    return None if problem is None else f"{problem} (1 = energy only)"


def check_eta(eta: float, key: str = "energy.eta") -> float:
    """``eta`` if it is within :data:`ETA_RANGE`.

    Raises:
        ConfigError: naming the key and the range.
    """
    problem = eta_problem(eta, key)
    if problem:
        raise ConfigError(problem)
    return eta


def to_object(cfg: Any) -> PerseusConfig:
    """Turn a composed ``DictConfig`` into a validated :class:`~perseus.config.PerseusConfig`."""
    from omegaconf import OmegaConf

    obj = cfg if isinstance(cfg, PerseusConfig) else OmegaConf.to_object(cfg)
    if not isinstance(obj, PerseusConfig):
        raise ConfigError(
            f"expected a PerseusConfig, got {type(obj).__name__}; compose the config with "
            "the perseus_schema defaults entry"
        )
    validate(obj)
    return obj


def validate(cfg: PerseusConfig) -> None:
    """Check the whole configuration and report every problem at once.

    Every key of :data:`RANGES` must hold a finite number within its range; the enum keys one
    of their choices; and the keys that go together must agree.

    Raises:
        ConfigError: listing each bad key, its value and how to fix it (one line each).
    """
    values = _flat_values(cfg)
    if cfg.profiler.job_iterations == cfg.train.max_steps:
        # Its default, train.max_steps (conf/profiler/default.yaml): a problem is said once.
        values.pop("profiler.job_iterations")
    problems = list(ranges_problems(values, RANGES))
    valid = {key: value for key, value in values.items() if RANGES[key].problem(value) is None}
    if cfg.parallelism.schedule not in ALL_SCHEDULES:
        problems.append(
            f"parallelism.schedule={cfg.parallelism.schedule!r}: choose one of {ALL_SCHEDULES}"
        )
    problems += _energy_problems(cfg.energy)
    problems += _choice_problems(cfg)
    if cfg.energy.policy == "power_limit" and cfg.framework.name != "torch":
        problems.append(
            "energy=power_limit is for jobs without pipeline parallelism: "
            "add framework=torch (or pick a pipeline policy such as energy=no_slowdown)"
        )
    problems += _pair_problems(cfg, valid)
    problems += _runtime_problems(cfg)
    if problems:
        raise ConfigError(_invalid(problems))


def _invalid(problems: List[str]) -> str:
    if len(problems) == 1:
        return f"invalid configuration: {problems[0]}"
    return "invalid configuration:\n  - " + "\n  - ".join(problems)


def _flat_values(cfg: PerseusConfig) -> Dict[str, Any]:
    """``{"group.key": value}`` of the keys :data:`RANGES` names."""
    values: Dict[str, Any] = {}
    for key in RANGES:
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        values[key] = node
    return values


def _pair_problems(cfg: PerseusConfig, valid: Dict[str, Any]) -> List[str]:
    """Keys that must agree with each other (compared only when each is valid on its own)."""
    problems: List[str] = []

    def have(*keys: str) -> bool:
        return all(key in valid for key in keys)

    em, train = cfg.gpu.emulated, cfg.train
    if em.asynchronous and not em.sleep:
        problems.append("gpu.emulated.asynchronous=true needs gpu.emulated.sleep=true")
    if (
        have("gpu.emulated.power_limit_min_w", "gpu.emulated.power_limit_max_w")
        and em.power_limit_max_w is not None
        and em.power_limit_min_w > em.power_limit_max_w
    ):
        problems.append(
            f"gpu.emulated.power_limit_min_w={em.power_limit_min_w} is above "
            f"gpu.emulated.power_limit_max_w={em.power_limit_max_w}: the lowest power limit "
            "must not exceed the highest"
        )
    if have("train.nnodes", "train.node_rank"):
        problems += _node_rank_problems(train.nnodes, train.node_rank)
    fixed_loop = cfg.runtime.mode != "online" and cfg.energy.policy != "power_limit"
    if fixed_loop and have("train.warmup_steps", "train.measure_steps", "train.max_steps"):
        fixed = train.warmup_steps + train.measure_steps
        if fixed > train.max_steps:
            problems.append(
                f"train.max_steps={train.max_steps} stops before train.warmup_steps + "
                f"train.measure_steps = {fixed} iterations: raise train.max_steps"
            )
    return problems


def _node_rank_problems(nnodes: Optional[int], node_rank: Optional[int]) -> List[str]:
    """``train.node_rank`` within ``train.nnodes`` (when both are set)."""
    if nnodes is None or node_rank is None or node_rank < nnodes:
        return []
    return [f"train.node_rank={node_rank}: must be in 0..{nnodes - 1} (train.nnodes={nnodes})"]


def _runtime_problems(cfg: PerseusConfig) -> List[str]:
    """Keys the training processes use that are not plain numbers: planner, server, runtime."""
    problems = p2p_power_problems(cfg.planner.p2p_power_w)
    if not re.fullmatch(SOLVER_NAME_PATTERN, str(cfg.planner.solver)):
        problems.append(
            f"planner.solver={cfg.planner.solver!r}: a solver name such as lp, lowtime or exact"
        )
    server = cfg.server
    if server.url is not None and not _is_http_url(server.url):
        problems.append(
            f"server.url={server.url!r}: give the server's address as http://HOST:PORT "
            "(or https://...), or leave it unset to start one"
        )
    if server.token is not None and not re.fullmatch(r"[!-~]+", server.token):
        problems.append(
            "server.token: must be non-empty printable ASCII without spaces (it is sent in an "
            "HTTP header)"
        )
    if server.job_id is not None and not re.fullmatch(JOB_ID_PATTERN, server.job_id):
        problems.append(f"server.job_id={server.job_id!r}: 1 to 64 letters, digits, '_' or '-'")
    for key, value in (("server.host", server.host), ("train.master_addr", cfg.train.master_addr)):
        if value is not None and not str(value).strip():
            problems.append(f"{key} is empty: give a host name or address")
    if cfg.runtime.mode == "plan" and not cfg.runtime.plan:
        problems.append("runtime.mode=plan needs runtime.plan=<path of a plan JSON>")
    for key, value in (
        ("logger.dir", cfg.logger.dir),
        ("metrics.textfile_dir", cfg.metrics.textfile_dir),
        ("server.live_dir", server.live_dir),
    ):
        if value is not None and not str(value).strip():
            problems.append(f"{key} is empty: give a directory, or leave it unset (null)")
    if not str(cfg.logger.experiment).strip():
        problems.append("logger.experiment is empty: name the experiment (default: perseus)")
    return problems


def p2p_power_problems(
    p2p_power_w: Any, key: str = "planner.p2p_power_w", allowed: Range = P2P_POWER_W
) -> List[str]:
    """Problems of ``planner.p2p_power_w``: one power (W) or a non-empty list, one per stage.

    ``allowed``: the range of each power (the configuration's by default).
    """
    if isinstance(p2p_power_w, (list, tuple)) or _is_list_config(p2p_power_w):
        values = list(p2p_power_w)
        if not values:
            return [f"{key}=[]: give one power in W, or one per pipeline stage"]
        problems = [number_problem(f"{key}[{i}]", v, allowed) for i, v in enumerate(values)]
        return [p for p in problems if p]
    problem = number_problem(key, p2p_power_w, allowed)
    return [problem + " (or a list with one per stage)"] if problem else []


def _is_list_config(value: Any) -> bool:
    return type(value).__name__ == "ListConfig"


def _is_http_url(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port != 0


def _choice_problems(cfg: PerseusConfig) -> List[str]:
    """Enum keys set to a bad string (OmegaConf checks them; a dataclass built in code is not)."""
    problems = []
    for key, value, enum in (
        ("energy", cfg.energy.policy, EnergyPolicy),
        ("energy.power_limit.selector", cfg.energy.power_limit.selector, PowerLimitSelector),
        ("framework", cfg.framework.name, Framework),
        ("gpu", cfg.gpu.backend, GPUBackend),
        ("gpu.on_unsupported", cfg.gpu.on_unsupported, GPUOnUnsupported),
        ("gpu.emulated.counter", cfg.gpu.emulated.counter, EmulatedCounter),
        ("logger", cfg.logger.backend, LoggerBackend),
        ("planner.effort", cfg.planner.effort, PlannerEffort),
        ("planner.scope", cfg.planner.scope, PlannerScope),
        ("profiler.mode", cfg.profiler.mode, ProfilerMode),
        ("runtime.mode", cfg.runtime.mode, RuntimeMode),
    ):
        if value not in {m.value for m in enum}:
            choices = ", ".join(m.value for m in enum)
            problems.append(f"{key}={value!r}: choose one of {choices}")
    return problems


def _energy_problems(energy: EnergyConfig) -> List[str]:
    """The key the energy policy needs (its range is checked with the others)."""
    problems: List[str] = []
    if energy.policy == "slowdown" and energy.max_slowdown is None:
        problems.append(
            "energy=slowdown needs energy.max_slowdown=<fraction >= 0>, e.g. 0.05 for 5 %"
        )
    if energy.policy == "deadline" and energy.iteration_time_s is None:
        problems.append("energy=deadline needs energy.iteration_time_s=<seconds > 0>")
    return problems
