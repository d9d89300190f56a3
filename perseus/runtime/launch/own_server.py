"""Global rank 0's own coordination server for a launch: where it listens, where its files go.

When no server is configured, global rank 0 starts one as a child process
(:mod:`perseus.runtime.launch.spawn`; nothing of the server is imported here) with a random
token, on any free port (``server.port`` when set): on loopback when every rank runs on its
node, else on its address towards ``MASTER_ADDR`` (or the Slurm step's first node: where the
other nodes reach it), never without the token. Its files go to
``server.dump_dir``, else ``perseus-runs/`` under ``output_dir`` (or the working directory); it
stops when rank 0 exits. :mod:`perseus.runtime.launch.rendezvous` shares what it answers.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Tuple

from perseus.errors import RendezvousError
from perseus.runtime.launch import slurm
from perseus.runtime.launch.endpoint import TOKEN_ENV, URL_ENV, Endpoint

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.runtime.launch.spawn import ServerHandle

RUNS_DIR = "perseus-runs"


def single_node(world_size: int) -> bool:
    """Whether every rank of the launch runs on this machine (from the launchers' variables).

    torchrun's and the deepspeed launcher's first, then the Slurm step's (ranks started by
    ``srun`` itself), then whether ``MASTER_ADDR`` is this machine.
    """
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):  # torchrun, the deepspeed launcher
        local = os.environ.get(key)
        if local and local.isdigit():
            return int(local) >= world_size
    cross = os.environ.get("CROSS_SIZE")
    if cross and cross.isdigit():
        return int(cross) <= 1
    step = slurm.step()
    if step is not None:
        return step.num_nodes <= 1
    return _is_loopback(os.environ.get("MASTER_ADDR", "127.0.0.1"))


def master_addr() -> str:
    """``MASTER_ADDR``, else the Slurm step's first node, else ``""``."""
    step = slurm.step()
    return os.environ.get("MASTER_ADDR") or (step.head_node if step is not None else "")


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        addresses = [str(info[4][0]) for info in socket.getaddrinfo(host, None)]
    except OSError:
        return False
    return all(a.startswith("127.") or a == "::1" for a in addresses)


def address_towards(host: str) -> str:
    """The address of this machine's interface that routes to ``host`` (no packet is sent)."""
    try:
        family = socket.getaddrinfo(host, None)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, 9))
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise RendezvousError(
            f"cannot tell which address of this machine the other nodes reach (towards "
            f"MASTER_ADDR={host}: {exc}); start `perseus-server` yourself and set "
            f"{URL_ENV} (and {TOKEN_ENV}) on every node",
            shared=True,
        ) from None


def start_launch_server(
    cfg: PerseusConfig, world_size: int, job_id: str
) -> Tuple[Endpoint, ServerHandle, float]:
    """Start the launch's server for ``job_id`` (global rank 0).

    Returns:
        Where the job is served, the server's handle (stopping it is the caller's) and the
        seconds its start took.

    Raises:
        RendezvousError: no address the other nodes reach, or the server did not start
            (``shared``: every rank gets the same answer).
    """
    from perseus.runtime.launch.spawn import start_server_process

    url_host: Optional[str] = None
    if single_node(world_size):
        host, reach = "127.0.0.1", "loopback, this node only"
    else:
        master = master_addr()
        if not master:
            raise RendezvousError(
                "several nodes but no MASTER_ADDR to find the address the other nodes reach; "
                f"start `perseus-server` yourself and set {URL_ENV} (and {TOKEN_ENV})",
                shared=True,
            )
        host = address_towards(master)
        reach = f"on {host} for the other nodes, token required"
        if _is_loopback(host):
            # MASTER_ADDR names this machine, resolved to loopback here: listen on every
            # interface (with the token) and hand out the name the other nodes know it by.
            host, url_host = "0.0.0.0", master
            reach = f"on all interfaces as {master} for the other nodes, token required"
    explicit_dump = cfg.server.dump_dir
    base = Path(cfg.output_dir) if cfg.output_dir else Path.cwd()
    dump_dir = Path(explicit_dump) if explicit_dump else base / RUNS_DIR
    server_cfg = dataclasses.replace(
        cfg.server,
        host=host,
        # A server of its own per launch: nothing to restore on a restart.
        persist=cfg.server.persist if explicit_dump else False,
    )
    t0 = time.perf_counter()
    try:
        handle = start_server_process(
            server_cfg,
            dump_dir,
            port=cfg.server.port or 0,  # any free port unless one is configured
            token=secrets.token_urlsafe(24),
            log_path=dump_dir / f"{job_id}-server.log",
            exit_with_parent=True,
        )
    except Exception as exc:
        raise RendezvousError(
            f"global rank 0 could not start the coordination server: {exc}", shared=True
        ) from None
    start_s = time.perf_counter() - t0
    url = handle.url if url_host is None else f"http://{url_host}:{handle.port}"
    port = f"server.port={cfg.server.port}" if cfg.server.port else "a free port"
    where = f"server {url} started by global rank 0 ({reach}, {port}); files in {dump_dir / job_id}"
    return (
        Endpoint(
            url=url, token=handle.token, job_id=job_id, where=where, dump_dir=str(dump_dir / job_id)
        ),
        handle,
        start_s,
    )
