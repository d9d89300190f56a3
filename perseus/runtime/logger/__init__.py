"""Experiment trackers (the ``logger`` config group): a job's figures where its users look.

``logger=mlflow``, ``logger=tensorboard`` or ``logger=wandb`` (offline), for ``perseus-train``
and a user's own script alike (the same key through ``PERSEUS_CONFIG`` or ``configure()``):
global rank 0 starts a :class:`~perseus.runtime.logger.tracker.Tracker` with its hooks
(:func:`start_tracker`), which logs every iteration's time, energy (once the sampler covers
it), the clock of every stage and the phase, and at the end the report's figures. Online, the
iterations are the job's own as its server combined them (every stage); otherwise the rank's.

* :mod:`~perseus.runtime.logger.feeds`: where the rows come from;
* :mod:`~perseus.runtime.logger.backends`: MLflow, TensorBoard, W&B;
* :mod:`~perseus.runtime.logger.tracker`: the thread, and the report's figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from perseus.config.schema import LoggerBackend
from perseus.runtime.logger.feeds import RankFeed, ServerFeed
from perseus.runtime.logger.tracker import Tracker, power_limit_figures, summary_figures

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

# The power-limit optimizer's table, written by perseus-train's rank 0 into the run directory.
POWER_LIMIT_JSON = "power_limit.json"
RUNS_DIR = "perseus-runs"


def start_tracker(cfg: PerseusConfig, hooks: Any) -> Optional[Tracker]:
    """Global rank 0's tracker of ``cfg.logger`` for ``hooks`` (``None``: ``logger=none``).

    Cheap on the calling (training) thread: the backend's package is imported and its run
    opened by the tracker's own thread.
    """
    if str(cfg.logger.backend) == LoggerBackend.none:
        return None
    from perseus.runtime.logger.backends import open_backend
    from perseus.runtime.online.client import ServerClient
    from perseus.wire import Route

    endpoint = getattr(getattr(hooks, "source", None), "endpoint", None)
    job_id = endpoint.job_id if endpoint is not None else _local_job_id(cfg)
    backend = str(cfg.logger.backend)
    directory = _directory(cfg, backend, job_id, endpoint)
    run_name = cfg.logger.run_name or job_id
    params = _params(cfg, job_id)
    feed: Any
    final: Callable[[], Dict[str, float]]
    if endpoint is not None:
        client = ServerClient(endpoint.url, token=endpoint.token, timeout_s=5.0, max_retries=1)
        feed = ServerFeed(client.get, job_id)

        def final() -> Dict[str, float]:
            return summary_figures(client.get(Route.SUMMARY.format(job_id=job_id)))

    else:
        phase = _local_phase(cfg)
        feed = RankFeed(lambda: hooks.steps, lambda: phase)
        table = Path(cfg.output_dir) / POWER_LIMIT_JSON if cfg.output_dir else None

        def final() -> Dict[str, float]:
            if table is not None and table.is_file():
                return power_limit_figures(json.loads(table.read_text()))
            return {}

    return Tracker(
        lambda: open_backend(cfg.logger, directory, run_name, params),
        feed,
        final,
        interval_s=cfg.logger.interval_s,
        name=backend,
    )


def _directory(cfg: PerseusConfig, backend: str, job_id: str, endpoint: Any) -> Path:
    """``logger.dir``, else ``<run directory>/<backend>``, else ``perseus-runs/<job>/<backend>``."""
    if cfg.logger.dir:
        return Path(cfg.logger.dir)
    if cfg.output_dir:
        return Path(cfg.output_dir) / backend
    if endpoint is not None and endpoint.dump_dir:
        return Path(endpoint.dump_dir) / backend
    return Path(RUNS_DIR) / job_id / backend


def _local_job_id(cfg: PerseusConfig) -> str:
    """A job id without a server: ``server.job_id``, ``PERSEUS_JOB_ID``, torchrun's run id."""
    from perseus.runtime.launch.endpoint import explicit_job_id

    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return explicit_job_id(cfg) or (run_id if run_id and run_id != "none" else "perseus")


def _local_phase(cfg: PerseusConfig) -> str:
    return "power_limit" if str(cfg.energy.policy) == "power_limit" else str(cfg.runtime.mode)


def _params(cfg: PerseusConfig, job_id: str) -> Dict[str, str]:
    par = cfg.parallelism
    return {
        "job_id": job_id,
        "runtime_mode": str(cfg.runtime.mode),
        "energy_policy": str(cfg.energy.policy),
        "framework": str(cfg.framework.name),
        "model": str(cfg.model.name),
        "pp": str(par.pp),
        "dp": str(par.dp),
        "tp": str(par.tp),
        "num_microbatches": str(par.num_microbatches),
        "gpu_backend": str(cfg.gpu.backend),
    }
