"""Starting a server: port 0 and the ready handshake, one line for every start-up problem, and
a configuration that only has the keys the server reads."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from perseus.apps.common import register_configs
from perseus.apps.server import SCHEMA_NAME, ServerAppConfig, to_server_config
from perseus.config.schema import ServerConfig
from perseus.errors import ConfigError, ServerError
from perseus.runtime.online.client import ServerClient
from perseus.server.process import new_token, start_server_process

pytestmark = pytest.mark.integration


def test_port_zero_gives_the_bound_url_and_the_token_guards_it(tmp_path: Path) -> None:
    token = new_token()
    handle = start_server_process(ServerConfig(), tmp_path, port=0, token=token)
    try:
        assert handle.url.startswith("http://127.0.0.1:") and handle.port > 0
        assert handle.token == token
        assert ServerClient(handle.url).get("/healthz") == {"status": "ok"}
        with pytest.raises(ServerError, match="401"):
            ServerClient(handle.url).get("/jobs/x")
        with pytest.raises(ServerError, match="404"):  # authorized: the job is unknown
            ServerClient(handle.url, token=token).get("/jobs/x")
    finally:
        handle.stop()
    assert not handle.alive


def test_every_start_up_problem_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match="is a file, not a directory") as info:
        start_server_process(ServerConfig(), a_file, port=0)
    assert "\n" not in str(info.value)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=f"server.port={port} is already in use") as info:
            start_server_process(ServerConfig(), tmp_path / "d", port=port)
        assert "\n" not in str(info.value)
    cfg = ServerConfig(host="10.254.254.254", allow_insecure=True)
    with pytest.raises(ServerError, match="is not an address of this machine") as info:
        start_server_process(cfg, tmp_path / "d", port=0)
    assert "\n" not in str(info.value)
    cfg = ServerConfig(host="no-such-host.invalid", allow_insecure=True)
    with pytest.raises(ServerError, match="is not an address or name of this machine"):
        start_server_process(cfg, tmp_path / "d", port=0)


def test_perseus_server_says_one_line_and_exits_2(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "perseus.apps.server", f"server.dump_dir={a_file}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is a file, not a directory" in lines[0], proc.stderr


def _compose(*overrides: str):
    register_configs({SCHEMA_NAME: ServerAppConfig})
    with initialize_config_module("perseus.conf", version_base="1.3"):
        return compose("perseus_server", overrides=list(overrides))


def test_the_server_reads_only_the_server_group() -> None:
    cfg = to_server_config(_compose("server.profiler_workers=2", "server.max_state_mb=100"))
    assert cfg.server.profiler_workers == 2 and cfg.server.max_state_mb == 100
    with pytest.raises(ConfigCompositionException, match="planner"):
        _compose("planner.solver=lowtime")  # a job's setting, not the server's
    with pytest.raises(ConfigError, match="server.blas_threads=0"):
        to_server_config(_compose("server.blas_threads=0"))
