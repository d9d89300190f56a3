"""The launcher's checks against a real coordination server process."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.config.schema import ServerConfig
from perseus.errors import ServerError
from perseus.launcher.preflight import check_server
from tests.unit.launcher.test_preflight import _cfg

pytestmark = pytest.mark.integration


def test_server_that_refuses_the_token_is_found_before_launch(tmp_path: Path) -> None:
    from perseus.server.process import start_local_server

    handle = start_local_server(ServerConfig(token="right-token"), tmp_path / "server")
    try:
        cfg = _cfg()
        cfg.server.url = handle.url
        cfg.server.token = "wrong-token"
        with pytest.raises(ServerError, match="refuses server.token"):
            check_server(cfg)
        cfg.server.token = "right-token"
        check_server(cfg)
    finally:
        handle.stop()
