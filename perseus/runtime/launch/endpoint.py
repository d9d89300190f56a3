"""Where a launch's job is served: the :class:`Endpoint`, the variables naming it, the job id.

``server.url`` / ``PERSEUS_SERVER_URL``, ``server.token`` / ``PERSEUS_SERVER_TOKEN`` and
``server.job_id`` / ``PERSEUS_JOB_ID`` name a running server and a job; what is not set, the
launch finds for itself (:mod:`perseus.runtime.launch.rendezvous`), with a fresh job id per launch
(:func:`new_job_id`).
"""

from __future__ import annotations

import os
import re
import secrets
from typing import TYPE_CHECKING, NamedTuple, Optional, Tuple

from perseus.runtime.launch import slurm

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

JOB_ID_ENV = "PERSEUS_JOB_ID"
URL_ENV = "PERSEUS_SERVER_URL"
TOKEN_ENV = "PERSEUS_SERVER_TOKEN"
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"


class Endpoint(NamedTuple):
    """Where this launch's job is served (a plain record).

    Attributes:
        url: The server's base URL.
        token: The token ranks send (``None``: none).
        job_id: The job all ranks of this launch register.
        where: The server's location in words (rank 0's start line).
        dump_dir: Where a server this launch started writes the job's files.
    """

    url: str
    token: Optional[str]
    job_id: str
    where: str
    dump_dir: Optional[str] = None


def explicit_job_id(cfg: PerseusConfig) -> Optional[str]:
    """``server.job_id``, else ``PERSEUS_JOB_ID``, else ``None``."""
    return cfg.server.job_id or os.environ.get(JOB_ID_ENV) or None


def launch_job_id(cfg: PerseusConfig, fresh: bool) -> Tuple[Optional[str], bool]:
    """The launch's job id and whether it was given (:func:`explicit_job_id`).

    Where none was given: a fresh one (:func:`new_job_id`) when ``fresh`` (the rank that
    makes it for the launch), else ``None`` (the others learn it from that rank).
    """
    given = explicit_job_id(cfg)
    if given is not None:
        return given, True
    return (new_job_id() if fresh else None), False


def new_job_id() -> str:
    """A fresh job id for this launch, with a random part.

    It starts with the Slurm job (``slurm-<id>``) and the launcher's run id when there are (once
    when they are the same). Matches the server's ``[A-Za-z0-9_-]{1,64}``.
    """
    parts = []
    label = slurm.job_label()
    if label:
        parts.append(f"slurm-{label}")
    run_id = os.environ.get(RUN_ID_ENV, "")
    if run_id and run_id.lower() != "none" and run_id != label:
        parts.append(run_id)
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(parts)).strip("-")[:48]
    return f"{cleaned or 'job'}-{secrets.token_hex(4)}"
