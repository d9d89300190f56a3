"""Bad input against a real server process: bodies too large for memory, jobs past the budget."""

from __future__ import annotations

import http.client
import socket
import sys
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient, ServerRefused
from perseus.server.process import ServerHandle, start_server_process

pytestmark = [pytest.mark.integration, pytest.mark.one_worker]


def test_a_256_mb_chunked_body_leaves_the_servers_memory_alone(server: ServerHandle) -> None:
    pid = server.process.pid
    before = _rss_mb(pid)
    status, text = _chunked_post(server.url, "/jobs", 256)
    assert status in (413, None)
    if status == 413:
        assert "server.max_body_mb" in text
    assert ServerClient(server.url).get("/healthz") == {"status": "ok"}
    grown = _rss_mb(pid) - before
    print(f"\nRSS before {before:.0f} MB, after a 256 MB chunked POST +{grown:.1f} MB")
    assert grown < 32


def test_many_and_huge_jobs_stay_within_the_state_budget(server: ServerHandle) -> None:
    pid = server.process.pid
    client = ServerClient(server.url, max_retries=0)
    before = _rss_mb(pid)
    refused = {422: 0, 429: 0}
    for i in range(300):
        body = {"job_id": f"many-{i}", "num_stages": 8, "num_microbatches": 32}
        if i % 3 == 0:
            body.update(num_stages=512, num_microbatches=4096)  # never admitted
        try:
            client.post("/jobs", body)
        except ServerRefused as exc:
            refused[exc.status] += 1
    grown = _rss_mb(pid) - before
    print(f"\nRSS before {before:.0f} MB, after 300 job registrations +{grown:.1f} MB ({refused})")
    assert refused[422] == 100 and refused[429] > 0
    assert grown < 64 + 32  # the state budget, plus allocator slack


# -- memory of a real server process ---------------------------------------------------------
def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    cfg = ServerConfig(max_state_mb=64, max_job_state_mb=32)
    handle = start_server_process(cfg, tmp_path_factory.mktemp("rss"), port=0)
    yield handle
    handle.stop()


def _chunked_post(url: str, path: str, total_mb: int) -> Tuple[Optional[int], str]:
    """POST ``total_mb`` of chunked body; the answer (None: the server closed first)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b" " * (1024 * 1024)
    try:
        for _ in range(total_mb):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass  # the server answered 413 and closed: it read no more
    try:
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    except (http.client.HTTPException, OSError):
        return None, ""
    finally:
        conn.close()
