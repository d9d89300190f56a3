"""Running the server: in this process (:func:`serve`) or as a separate process.

:func:`start_server_process` starts ``python -m perseus.server.process`` as a child process
and returns once it serves, with its bound URL (port 0 = any free port, chosen by the child
itself: no race) and token::

    handle = start_server_process(ServerConfig(host="127.0.0.1"), dump_dir, port=0,
                                  token=new_token())
    handle.url, handle.token      # e.g. http://127.0.0.1:39211, a random token
    ...
    handle.stop()

The child binds its socket, restores the jobs its dump directory's state file holds, and then
writes one line of JSON (``{"url": ...}`` or ``{"error": ...}``) to a pipe the parent reads:
the ready handshake. Every start-up problem (a dump directory that is a file, a port in use, a
host that is not this machine's) is one line, in the parent's :class:`ServerError` and in
``perseus-server``'s exit message. Training ranks never host the server.
"""

from __future__ import annotations

import dataclasses
import errno
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
from typing import Any, Callable, List, Optional

from perseus import process_exit
from perseus.config import ServerConfig
from perseus.errors import ConfigError, ServerError

TOKEN_ENV = "PERSEUS_SERVER_TOKEN"
# Seconds an idle kept-alive connection stays open (ranks talk every iteration).
KEEP_ALIVE_S = 120


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
        sock: A socket already bound (else ``cfg.host:cfg.port`` is bound here).
        on_ready: Called with the server's URL once it restored its jobs and serves.

    Raises:
        ConfigError: an unsafe exposure, or a start-up problem (one line).
    """
    from perseus.server.workers import limit_blas_threads

    check_exposure(cfg)
    limit_blas_threads(cfg.blas_threads)  # before numpy is imported in this process
    dump_dir = prepare_dump_dir(dump_dir)
    sock = sock or bind_socket(cfg.host, cfg.port)
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
) -> ServerHandle:
    """Start a server process on this machine; returns once it serves.

    Args:
        cfg: The server's configuration (``host``, budgets, workers; ``url`` is ignored).
        dump_dir: Job directories and the state file (a restart on the same directory goes on
            with the jobs it holds).
        port: Port to listen on (0: any free port; ``None``: ``cfg.port``).
        token: Token clients must send (``None``: ``cfg.token``); travels in the environment,
            never on the command line.
        log_path: The child's output (default ``<dump_dir>/perseus-server-output.log``, appended).
        timeout_s: Longest wait for the ready handshake (default ``cfg.start_timeout_s``).

    Raises:
        ConfigError: the configuration would expose the server without a token.
        ServerError: the server could not start (its one-line reason), or did not get ready.
    """
    token = token if token is not None else cfg.token
    child_cfg = dataclasses.replace(
        cfg, port=cfg.port if port is None else int(port), token=None, url=None
    )
    check_exposure(dataclasses.replace(child_cfg, token=token))
    dump_dir = prepare_dump_dir(Path(dump_dir))
    log_path = Path(log_path) if log_path else dump_dir / "perseus-server-output.log"
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    read_fd, write_fd = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "perseus.server.process",
        json.dumps(dataclasses.asdict(child_cfg)),
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
    handle = ServerHandle(str(answer["url"]), proc, log_path, token or None)
    process_exit.at_exit(handle.stop)
    return handle


def start_local_server(cfg: ServerConfig, dump_dir: Path) -> ServerHandle:
    """A server for this node's ranks: ``cfg.port`` when free, any free port otherwise."""
    port = cfg.port if cfg.port and not _port_busy(cfg.host, cfg.port) else 0
    return start_server_process(cfg, dump_dir, port=port)


def _port_busy(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


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

    try:
        serve(cfg, Path(args[1]), on_ready=lambda url: tell({"url": url}))
    except ConfigError as exc:
        sys.stderr.write(f"perseus-server: error: {exc}\n")
        tell({"error": str(exc)})
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
