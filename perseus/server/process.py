"""Running the server: in this process (:func:`serve`), or the child side of a server process.

``python -m perseus.server.process CONFIG_JSON DUMP_DIR [READY_FD]`` is the child that
:func:`perseus.runtime.launch.spawn.start_server_process` starts (the parent's side lives in
the runtime so that a training process can start a server without importing the server; its
names are re-exported here). The child binds its socket, restores the jobs its dump
directory's state file holds, and then writes one line of JSON (``{"url": ...}`` or
``{"error": ...}``) to the ready pipe. Every start-up problem is one line, in the parent's
:class:`ServerError` and in ``perseus-server``'s exit message.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable, List, Optional

from perseus import process_exit
from perseus.config.schema import DEFAULT_SERVER_PORT, ServerConfig
from perseus.errors import ConfigError, ServerError
from perseus.runtime.launch.spawn import (
    PARENT_PID_ENV,
    TOKEN_ENV,
    ServerHandle,
    check_exposure,
    free_port,
    is_loopback,
    new_token,
    prepare_dump_dir,
    start_local_server,
    start_server_process,
)

__all__ = [
    "TOKEN_ENV",
    "ServerError",
    "ServerHandle",
    "bind_socket",
    "check_exposure",
    "free_port",
    "is_loopback",
    "main",
    "new_token",
    "prepare_dump_dir",
    "serve",
    "start_local_server",
    "start_server_process",
    "url_of",
]
# Seconds an idle kept-alive connection stays open (ranks talk every iteration).
KEEP_ALIVE_S = 120


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port).

    Raises:
        ConfigError: one line naming the host or port and what to do.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"server.host={host!r} is not an address or name of this machine ({exc.strerror}); "
            "use an IP address such as 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"server.port={port} is already in use on {host}: stop what listens there, or "
                "choose another server.port"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(
                f"server.host={host!r} is not an address of this machine; use one of its "
                "addresses, 127.0.0.1 or 0.0.0.0"
            ) from None
        if exc.errno == errno.EACCES:
            raise ConfigError(
                f"server.port={port} needs privileges this process does not have; choose a "
                "port >= 1024"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    """The URL clients use for a socket bound on ``host``."""
    port = int(sock.getsockname()[1])
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def serve(
    cfg: ServerConfig,
    dump_dir: Path,
    *,
    sock: Optional[socket.socket] = None,
    on_ready: Optional[Callable[[str], None]] = None,
) -> None:
    """Run the server in this process until interrupted.

    Args:
        cfg: The server's configuration (``host``, ``port``, budgets, workers).
        dump_dir: Job directories and the state file.
        sock: A socket already bound (else ``cfg.host:cfg.port`` is bound here, ``cfg.port``
            unset: :data:`~perseus.config.schema.DEFAULT_SERVER_PORT`).
        on_ready: Called with the server's URL once it restored its jobs and serves.

    Raises:
        ConfigError: an unsafe exposure, or a start-up problem (one line).
    """
    from perseus.server.workers import limit_blas_threads

    check_exposure(cfg)
    limit_blas_threads(cfg.blas_threads)  # before numpy is imported in this process
    dump_dir = prepare_dump_dir(dump_dir)
    port = DEFAULT_SERVER_PORT if cfg.port is None else cfg.port
    sock = sock or bind_socket(cfg.host, port)
    url = url_of(sock, cfg.host)

    import uvicorn

    from perseus.server.app import create_app

    app = create_app(cfg, dump_dir, on_ready=None if on_ready is None else lambda: on_ready(url))
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=2048,
    )
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: Optional[List[str]] = None) -> None:
    """Child entry point: ``python -m perseus.server.process CONFIG_JSON DUMP_DIR [READY_FD]``."""
    args = sys.argv[1:] if argv is None else argv
    cfg = ServerConfig(**json.loads(args[0]))
    cfg.token = os.environ.get(TOKEN_ENV) or None
    ready_fd = int(args[2]) if len(args) > 2 else None

    def tell(message: dict) -> None:
        if ready_fd is None:
            return
        try:
            os.write(ready_fd, (json.dumps(message) + "\n").encode())
            os.close(ready_fd)
        except OSError:
            pass

    parent = os.environ.get(PARENT_PID_ENV)
    if parent and parent.isdigit():
        process_exit.exit_with_parent(int(parent))
    try:
        serve(cfg, Path(args[1]), on_ready=lambda url: tell({"url": url}))
    except ConfigError as exc:
        sys.stderr.write(f"perseus-server: error: {exc}\n")
        tell({"error": str(exc)})
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
