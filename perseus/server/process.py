"""Running the server: in this process (:func:`serve`) or as a separate local process.

Training ranks never host the server: when no ``server.url`` is configured, the launcher calls
:func:`start_local_server`, which starts ``python -m perseus.server.process`` as a child
process on a free loopback port, waits until ``/healthz`` answers, and terminates it on
:meth:`ServerHandle.stop` or at interpreter exit.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import List, Optional

from perseus import process_exit
from perseus.config import ServerConfig
from perseus.errors import ConfigError, ServerError

TOKEN_ENV = "PERSEUS_SERVER_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(cfg: ServerConfig) -> None:
    """Refuse to bind a non-loopback host without a token (unless explicitly allowed).

    Raises:
        ConfigError: naming the host and the two ways out.
    """
    if not is_loopback(cfg.host) and not cfg.token and not cfg.allow_insecure:
        raise ConfigError(
            f"server.host={cfg.host!r} exposes the server beyond this machine without a token; "
            "set server.token=<secret> (ranks send it as a Bearer token), or "
            "server.allow_insecure=true on a trusted network"
        )


def serve(cfg: ServerConfig, dump_dir: Path) -> None:
    """Run the server in this process until interrupted."""
    import uvicorn

    from perseus.server.app import create_app

    check_exposure(cfg)
    dump_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(cfg, dump_dir)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_busy(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


@dataclasses.dataclass
class ServerHandle:
    """A server process this process started.

    Attributes:
        url: Base URL, e.g. ``http://127.0.0.1:7787``.
        process: The child process.
        log_path: Where its output goes.
    """

    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout_s``); idempotent."""
        process_exit.cancel(self.stop)
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)

    @property
    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.process.poll() is None


def start_local_server(cfg: ServerConfig, dump_dir: Path) -> ServerHandle:
    """Start a server process on this machine and wait until it answers.

    Uses ``cfg.port`` when free, any free port otherwise. The token (if any) travels in the
    environment, not on the command line.

    Raises:
        ConfigError: the configuration would expose the server without a token.
        ServerError: the process exited or did not answer within ``cfg.start_timeout_s``.
    """
    check_exposure(cfg)
    port = cfg.port if cfg.port and not _port_busy(cfg.host, cfg.port) else free_port(cfg.host)
    child_cfg = dataclasses.replace(cfg, port=port, token=None, url=None)
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    log_path = dump_dir / f"perseus-server-{port}.log"
    env = dict(os.environ)
    if cfg.token:
        env[TOKEN_ENV] = cfg.token
    cmd = [
        sys.executable,
        "-m",
        "perseus.server.process",
        json.dumps(dataclasses.asdict(child_cfg)),
        str(dump_dir),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        )
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "") else cfg.host
    handle = ServerHandle(f"http://{host}:{port}", proc, log_path)
    process_exit.at_exit(handle.stop)
    _wait_healthy(handle, cfg.start_timeout_s)
    return handle


def _wait_healthy(handle: ServerHandle, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not handle.alive:
            tail = handle.log_path.read_text(errors="replace")[-2000:]
            raise ServerError(
                f"the Perseus server exited with code "
                f"{handle.process.returncode}; its log ({handle.log_path}):\n{tail}"
            )
        try:
            with urllib.request.urlopen(handle.url + "/healthz", timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    handle.stop()
    raise ServerError(
        f"the Perseus server at {handle.url} did not answer /healthz within "
        f"{timeout_s} s (server.start_timeout_s); see {handle.log_path}"
    )


def main(argv: Optional[List[str]] = None) -> None:
    """Child-process entry point: ``python -m perseus.server.process CONFIG_JSON DUMP_DIR``."""
    args = sys.argv[1:] if argv is None else argv
    cfg = ServerConfig(**json.loads(args[0]))
    cfg.token = os.environ.get(TOKEN_ENV) or None
    serve(cfg, Path(args[1]))


if __name__ == "__main__":
    main()
