"""How a rank builds its online source: the job, the server, the stage exchange and the client.

``runtime.mode=online`` (:func:`build_online_source`, called by ``sources.build_source``): the job's
spec from the configuration (:mod:`perseus.runtime.online.job_spec`, also the launcher's check),
where the server is and which job this launch is (configured, or found through the job's own
``torch.distributed`` store, the server started by global rank 0:
:mod:`perseus.runtime.launch.rendezvous`), the ranks' agreement that the job runs online, the
stage's exchange and, for the stage leader, the server client.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING, Optional

from perseus.records import RankInfo
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.exchange import torch_stage_exchange
from perseus.runtime.online.job_spec import job_spec_from_config
from perseus.runtime.online.reports import gpu_label
from perseus.runtime.online.source import OnlineSource

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.runtime.launch.rendezvous import Launch


def build_online_source(
    cfg: PerseusConfig,
    rank: RankInfo,
    gpu: GPU,
    launch: Launch,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    job_id: Optional[str] = None,
) -> OnlineSource:
    """The source ``runtime.mode=online`` uses (called by ``sources.build_source``).

    Collective when the job runs ``torch.distributed`` with more than one rank (and
    ``server.combine_stage`` is on): every rank must build its source at the same point (the
    adapters build it at the first training step), so that each stage's ranks share one
    exchange and only the stage leader talks to the server.

    Args:
        cfg: The configuration.
        rank: This rank's place in the job.
        gpu: This rank's GPU (its supported clocks and power limit are registered).
        launch: The process's launch (its server and job id, the ranks' agreement).
        url: Overrides ``server.url`` / ``PERSEUS_SERVER_URL``.
        token: Overrides ``server.token`` / ``PERSEUS_SERVER_TOKEN``.
        job_id: Overrides ``server.job_id`` / ``PERSEUS_JOB_ID``.

    Without a URL, the launch's own server is found (or, on global rank 0, started) through
    the job's ``torch.distributed`` store (:mod:`perseus.runtime.launch.rendezvous`).

    Raises:
        ConfigError: an unsupported schedule.
        RendezvousError: no server for this launch, or a rank gave up (every rank falls back).
    """
    spec = job_spec_from_config(cfg, rank)  # an unsupported schedule: before any server
    if url or token or job_id:
        server = dataclasses.replace(
            cfg.server,
            url=url or cfg.server.url,
            token=token or cfg.server.token,
            job_id=job_id or cfg.server.job_id,
        )
        cfg = dataclasses.replace(cfg, server=server)
    # The server and job id, once every rank decided alike to run online (the exchange below
    # is collective).
    found = launch.join(cfg, rank)
    spec = dataclasses.replace(spec, job_id=found.job_id)
    clocks = [int(c) for c in gpu.supported_sm_clocks_mhz()]
    power_limit_w = gpu.power_limit_mw() / 1000.0
    exchange = None
    if cfg.server.combine_stage:
        exchange = torch_stage_exchange(
            rank.rank,
            rank.stage,
            rank.dp_rank,
            rank.tp_rank,
            clocks,
            power_limit_w,
            timeout_s=max(60.0, 4 * cfg.server.request_timeout_s),
        )
    client = None
    if exchange is None or exchange.index == 0:
        client = ServerClient(
            found.url,
            token=found.token,
            timeout_s=cfg.server.request_timeout_s,
            max_retries=cfg.server.max_retries,
            backoff_s=cfg.server.retry_backoff_s,
        )
    return OnlineSource(
        client,
        spec,
        rank,
        clocks,
        power_limit_w=power_limit_w,
        exchange=exchange,
        prefetch_steps=cfg.server.prefetch_steps,
        endpoint=found,
        gpu=gpu_label(socket.gethostname(), gpu.index),
    )
