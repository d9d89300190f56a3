"""Checks made before any rank starts, so a job that cannot run fails at once with the fix.

Everything a rank would find out in its first seconds is found here first, each problem as one
line naming the key and the fix, and nothing is started (no server, no rank). In order (the
quick checks first):

* the model description;
* ``model.dataset``: there, a readable ``.npy`` array of integer token ids that fit the model;
* ``runtime.mode=plan``: the plan file parses and fits the job (stages, microbatches, and the
  schedule's order when ``runtime.strict``);
* the GPU backend: every GPU this node's ranks will drive is opened the way a rank opens it
  (:func:`perseus.gpu.factory.build_gpu`, in dry-run mode: nothing is changed), so
  ``gpu=nvml`` without NVML, a GPU index that does not exist or a bad emulated device profile
  stop here;
* ``gpu.state_dir``: a writable directory;
* ``runtime.mode=online``: the job spec the ranks will register is within the server's bounds,
  the solver exists, and a configured ``server.url`` answers (with the token accepted);
* ``logger`` and ``metrics.textfile_dir``: the tracker's package (``mlflow``, ``tensorboard``,
  ``wandb``) and ``prometheus_client`` are installed (their extras named otherwise); a
  directory that cannot be written is only warned about by the rank, never an error;
* the framework's own checks (:mod:`perseus.train.frameworks`: parallelism limits, the
  partition, CUDA for Megatron-core, the framework importable), then those of the ranks'
  environment (``check_launch``: Merak's interpreter).

Every rank makes the framework's checks again (a rank can be started without the launcher),
except ``check_launch``, made here only. What the GPU itself can do (lock clocks, set power
limits) is tried by each rank's start-up check (:mod:`perseus.gpu.preflight`) when it opens
its GPU: that needs the GPU's guard, which the launcher never takes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Optional, Tuple

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError, PlanError
from perseus.models.zoo import ModelDescription, describe
from perseus.schedule import ORDER_SCHEDULES
from perseus.train import frameworks

logger = logging.getLogger(__name__)

SERVER_PROBE_TIMEOUT_S = 5.0


def check_job(cfg: PerseusConfig, num_local_ranks: Optional[int] = None) -> None:
    """Raise a :class:`~perseus.errors.PerseusError` when this job cannot run here.

    Args:
        cfg: The validated configuration.
        num_local_ranks: Ranks this node starts (default: from ``train.nproc_per_node`` or
            ``pp * dp * tp`` over ``train.nnodes``).

    Raises:
        ConfigError, PlanError, GPUError, ProfileError, ServerError: the first problem found,
            naming the key and the fix.
    """
    description = describe(cfg.model)
    if cfg.model.dataset:
        check_dataset(cfg, description)
    if cfg.runtime.mode == "plan":
        check_plan(cfg)
    check_gpus(cfg, num_local_ranks or local_ranks(cfg))
    if cfg.gpu.state_dir:
        check_state_dir(Path(cfg.gpu.state_dir).expanduser())
    if cfg.runtime.mode == "online":
        check_online(cfg)
    check_observability(cfg)
    frameworks.check(cfg)  # last: it imports the framework (seconds)


def local_ranks(cfg: PerseusConfig) -> int:
    """How many ranks this node starts (as :func:`~perseus.launcher.rank_processes.plan_launch`)."""
    par, train = cfg.parallelism, cfg.train
    return train.nproc_per_node or -(-(par.pp * par.dp * par.tp) // max(1, train.nnodes or 1))


def check_dataset(cfg: PerseusConfig, description: ModelDescription) -> None:
    """``model.dataset`` exists, is a ``.npy`` of integer ids and fits the model.

    The check is :func:`perseus.models.data.open_token_file`, which every rank makes too.
    """
    from perseus.models.data import open_token_file

    assert cfg.model.dataset is not None
    open_token_file(cfg.model.dataset, description)


def check_gpus(cfg: PerseusConfig, num_local_ranks: int) -> None:
    """Open every GPU this node's ranks will drive, as they will (dry run: nothing changes).

    The backend is the factory's choice (``gpu=auto`` resolved there); the emulated device is
    the same for every rank, so it is built once.
    """
    from perseus.gpu.factory import build_gpu, resolve_backend

    backend = resolve_backend(cfg.gpu)
    probe = dataclasses.replace(cfg.gpu, backend=backend, dry_run=True)
    count = num_local_ranks if backend == "nvml" else 1
    for index in range(count):
        gpu = build_gpu(probe, index, num_pipeline_stages=cfg.parallelism.pp)
        try:
            gpu.supported_sm_clocks_mhz()
        finally:
            gpu.close()


def check_plan(cfg: PerseusConfig) -> None:
    """``runtime.plan`` parses and fits the job (stages, microbatches, schedule order).

    The order is each stage's under ``parallelism.schedule``; without ``runtime.strict`` an
    order that differs is a warning (the ranks fall back to per-microbatch clocks).
    """
    from perseus.formats.plan.document import check_plan_for_job, load_plan

    if not cfg.runtime.plan:
        raise ConfigError("runtime.mode=plan needs runtime.plan=<path of a plan JSON>")
    par = cfg.parallelism
    plan = load_plan(Path(cfg.runtime.plan).expanduser())
    source = cfg.runtime.plan
    check_plan_for_job(
        plan, num_stages=par.pp, num_microbatches=par.num_microbatches, source=source
    )
    try:
        check_plan_for_job(
            plan,
            num_stages=par.pp,
            num_microbatches=par.num_microbatches,
            source=source,
            schedule=par.schedule,
            num_model_chunks=par.num_model_chunks,
        )
    except PlanError as exc:
        if cfg.runtime.strict:
            raise
        logger.warning("%s (runtime.strict=false: the ranks will fall back)", exc)


def check_online(cfg: PerseusConfig) -> None:
    """What the ranks will send the coordination server is within its bounds, and it answers.

    The job spec is built exactly as every rank builds it and checked as the server checks it
    at registration (:func:`perseus.server.limits.job_problems`: solver, world size, and the
    job's server state against ``server.max_job_state_mb`` when the job starts its own server);
    a configured ``server.url`` must answer ``/healthz`` and accept ``server.token``.
    """
    from perseus.records import RankInfo
    from perseus.runtime.online.job_spec import job_spec_from_config
    from perseus.server.limits import job_problems

    par = cfg.parallelism
    rank = RankInfo(
        stage=0,
        num_stages=par.pp,
        num_model_chunks=par.num_model_chunks,
        schedule=par.schedule,
        order=_order_sized_like(cfg) if par.schedule in ORDER_SCHEDULES else None,
    )
    spec = job_spec_from_config(cfg, rank)
    own_server = not cfg.server.url
    problems = job_problems(spec, cfg.server.max_job_state_mb if own_server else None)
    if problems:
        raise ConfigError("; ".join(problems))
    if cfg.server.url:
        check_server(cfg)


def _order_sized_like(cfg: PerseusConfig) -> Tuple[str, ...]:
    """A stand-in for an engine's order, as long as a split-backward one, for the size checks.

    The engine says its order only once it runs (the ranks send it); what the server must hold
    for the job grows with its length: every microbatch's forward and both backward halves on
    every chunk of every rank.
    """
    from perseus.pipeline_order import PipelineOrder

    par = cfg.parallelism
    ranks = []
    for s in range(par.pp):
        stages = [c * par.pp + s for c in range(par.num_model_chunks)]
        actions = [
            (kind, m, p)
            for kind in ("forward", "backward_input", "backward_weight")
            for p in (stages if kind == "forward" else stages[::-1])
            for m in range(par.num_microbatches)
        ]
        ranks.append(actions)
    return tuple(PipelineOrder.of(par.schedule, ranks).ranks)


def check_server(cfg: PerseusConfig) -> None:
    """``server.url`` answers, and accepts ``server.token`` (one attempt, a few seconds)."""
    from perseus.errors import ServerError
    from perseus.runtime.online.client import ServerClient, ServerRefused
    from perseus.wire import Route

    assert cfg.server.url is not None
    client = ServerClient(
        cfg.server.url,
        token=cfg.server.token,
        timeout_s=min(cfg.server.request_timeout_s, SERVER_PROBE_TIMEOUT_S),
        max_retries=0,
    )
    try:
        client.get(Route.HEALTHZ)
    except ServerError as exc:
        raise ServerError(
            f"server.url={cfg.server.url!r} does not answer ({exc}); start perseus-server there, "
            "fix server.url, or leave it unset to start one with the job"
        ) from None
    try:
        client.get(Route.JOB.format(job_id="perseus-preflight"))
    except ServerRefused as exc:
        if exc.status in (401, 403):
            raise ServerError(
                f"server.url={cfg.server.url!r} refuses server.token ({exc}); pass the token "
                "the server was started with"
            ) from None
    finally:
        client.close()


# The package each experiment tracker needs, by ``logger.backend``.
TRACKER_PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}


def check_observability(cfg: PerseusConfig) -> None:
    """The packages ``logger`` and ``metrics.textfile_dir`` need are installed (no import)."""
    from importlib.util import find_spec

    backend = str(cfg.logger.backend)
    package = TRACKER_PACKAGES.get(backend)
    if package is not None and find_spec(package) is None:
        raise ConfigError(
            f"logger={backend} needs the package {package!r}, which is not installed: "
            f"`pip install 'perseus-energy[{backend}]'`, or set logger=none"
        )
    if cfg.metrics.textfile_dir and find_spec("prometheus_client") is None:
        raise ConfigError(
            "metrics.textfile_dir needs the package 'prometheus_client', which is not "
            "installed: `pip install 'perseus-energy[metrics]'`, or unset metrics.textfile_dir"
        )


def check_state_dir(path: Path) -> None:
    """``gpu.state_dir`` is (or can be made) a directory this process can write."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"gpu.state_dir={str(path)!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"gpu.state_dir={str(path)!r} cannot be created ({exc.strerror or exc})"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"gpu.state_dir={str(path)!r} is not writable by this user")
