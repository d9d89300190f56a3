"""Starting the coordination server as a child process, from any process (no server imports).

:func:`start_server_process` runs ``python -m perseus.server.process`` and returns once it
serves, with its bound URL (port 0 = any free port, chosen by the child itself: no race) and
token::

    handle = start_server_process(ServerConfig(host="127.0.0.1"), dump_dir, port=0,
                                  token=new_token())
    handle.url, handle.token      # e.g. http://127.0.0.1:39211, a random token
    ...
    handle.stop()

The child binds its socket, restores the jobs its dump directory's state file holds, and then
writes one line of JSON (``{"url": ...}`` or ``{"error": ...}``) to a pipe the parent reads:
the ready handshake. Every start-up problem (a dump directory that is a file, a port in use, a
host that is not this machine's, the server's dependencies missing) is one line in the
parent's :class:`~perseus.errors.ServerError`.

This module is the parent's side only: it imports nothing of the server, so a training process
(the job's global rank 0 in zero-configuration mode, see :mod:`perseus.runtime.launch.rendezvous`)
can start the server with only the core dependencies installed. The child's side is
:mod:`perseus.server.process`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

from perseus.config.schema import ServerConfig
from perseus.errors import ConfigError, ServerError
from perseus.runtime.launch.endpoint import TOKEN_ENV

# Set in the child's environment: the server exits when the process that started it is gone
# (a training rank killed by its launcher never runs its exit closers).
PARENT_PID_ENV = "PERSEUS_SERVER_PARENT_PID"
SERVER_MODULE = "perseus.server.process"
# Import names the server process needs beyond the core (the ``server`` extra).
SERVER_IMPORTS = ("fastapi", "uvicorn", "pydantic", "numpy", "scipy", "networkx", "lowtime")


def missing_server_modules() -> List[str]:
    """The server's dependencies this interpreter lacks (looked up, never imported)."""
    missing = []
    for name in SERVER_IMPORTS:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


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


def new_token() -> str:
    """A random token for a server reachable beyond this machine."""
    return secrets.token_urlsafe(24)


def prepare_dump_dir(dump_dir: Path) -> Path:
    """Create ``dump_dir`` (and parents).

    Raises:
        ConfigError: one line when it is a file or cannot be created.
    """
    dump_dir = Path(dump_dir)
    if dump_dir.exists() and not dump_dir.is_dir():
        raise ConfigError(
            f"server.dump_dir={dump_dir} is a file, not a directory; point server.dump_dir at "
            "a directory (it is created if missing)"
        )
    try:
        dump_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"server.dump_dir={dump_dir} cannot be created ({exc.strerror or exc}); choose a "
            "writable directory"
        ) from None
    if not os.access(dump_dir, os.W_OK):
        raise ConfigError(f"server.dump_dir={dump_dir} is not writable; choose another one")
    return dump_dir


@dataclasses.dataclass
class ServerHandle:
    """A server process this process started.

    Attributes:
        url: Base URL, e.g. ``http://127.0.0.1:7787``.
        process: The child process.
        log_path: Where its output goes.
        token: The token clients must send (``None``: none).
    """

    url: str
    process: subprocess.Popen
    log_path: Path
    token: Optional[str] = None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout_s``); idempotent."""
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

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.url.rsplit(":", 1)[1])


def start_server_process(
    cfg: ServerConfig,
    dump_dir: Path,
    *,
    port: Optional[int] = None,
    token: Optional[str] = None,
    log_path: Optional[Path] = None,
    timeout_s: Optional[float] = None,
    exit_with_parent: bool = False,
) -> ServerHandle:
    """Start a server process on this machine; returns once it serves.

    Args:
        cfg: The server's configuration (``host``, budgets, workers; ``url`` is ignored).
        dump_dir: Job directories and the state file (a restart on the same directory goes on
            with the jobs it holds).
        port: Port to listen on (0: any free port; ``None``: ``cfg.port``, any free port when
            that is unset).
        token: Token clients must send (``None``: ``cfg.token``); travels in the environment,
            never on the command line.
        log_path: The child's output (default ``<dump_dir>/perseus-server-output.log``, appended).
        timeout_s: Longest wait for the ready handshake (default ``cfg.start_timeout_s``).
        exit_with_parent: The server exits by itself once this process is gone, also when this
            process is killed before it can stop it.

    Raises:
        ConfigError: the configuration would expose the server without a token.
        ServerError: the server could not start (its one-line reason), its dependencies are
            missing, or it did not get ready.
    """
    missing = missing_server_modules()
    if missing:
        raise ServerError(
            f"the Perseus coordination server needs {', '.join(missing)}, which this Python "
            f"({sys.executable}) lacks: install them with `pip install 'perseus-energy[server]'`"
        )
    token = token if token is not None else cfg.token
    if port is None:
        port = cfg.port or 0
    child_cfg = dataclasses.replace(cfg, port=int(port), token=None, url=None)
    check_exposure(dataclasses.replace(child_cfg, token=token))
    dump_dir = prepare_dump_dir(Path(dump_dir))
    log_path = Path(log_path) if log_path else dump_dir / "perseus-server-output.log"
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    env.pop(PARENT_PID_ENV, None)
    if exit_with_parent:
        env[PARENT_PID_ENV] = str(os.getpid())
    if token:
        env[TOKEN_ENV] = token
    read_fd, write_fd = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        SERVER_MODULE,
        json.dumps(dataclasses.asdict(child_cfg), allow_nan=False),
        str(dump_dir),
        str(write_fd),
    ]
    try:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
            )
    finally:
        os.close(write_fd)
    try:
        answer = _read_ready(read_fd, proc, timeout_s or cfg.start_timeout_s, log_path)
    finally:
        os.close(read_fd)
    # Its starter stops it (the launcher, a launch's rank 0); it also exits by itself when the
    # process that started it is gone (exit_with_parent).
    return ServerHandle(str(answer["url"]), proc, log_path, token or None)


def start_local_server(cfg: ServerConfig, dump_dir: Path) -> ServerHandle:
    """A server for this node's ranks, on ``cfg.port`` when set (an error when it is taken).

    Else on any free port, which the server binds itself: jobs sharing a node never collide.
    """
    return start_server_process(cfg, dump_dir, port=cfg.port or 0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _read_ready(fd: int, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            _kill(proc)
            raise ServerError(
                f"the Perseus server did not get ready within {timeout_s:g} s "
                f"(server.start_timeout_s); see {log_path}"
            )
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the child closed the pipe without a word: it died
            proc.wait(10)
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            raise ServerError(
                f"the Perseus server exited with code {proc.returncode} before it served: "
                f"{tail[0][:500]} (log: {log_path})"
            )
        data += chunk
    answer = json.loads(data.split(b"\n", 1)[0])
    if "error" in answer:
        proc.wait(10)
        raise ServerError(f"the Perseus server could not start: {answer['error']}")
    return answer


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
