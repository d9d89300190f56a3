"""The stdlib client and the online source's fail-safe behaviour."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List

import pytest

from perseus.errors import ConfigError, ServerError
from perseus.runtime.client import ServerClient, ServerUnavailable
from perseus.runtime.online import OnlineSource, build_online_source, job_id_from_env
from perseus.runtime.types import InstructionRecord, RankInfo, StepRecord
from perseus.server.process import free_port
from perseus.wire import JobSpec


class _Flaky(BaseHTTPRequestHandler):
    failures_left = 0
    seen: List[str] = []

    def _answer(self) -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            self.send_response(503)
            self.end_headers()
            return
        if "bad" in self.path:
            body = json.dumps({"detail": "no such thing"}).encode()
            self.send_response(404)
        else:
            body = json.dumps({"ok": True, "auth": self.headers.get("Authorization")}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Flaky.seen = []
    _Flaky.failures_left = 0
    yield server
    server.shutdown()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_retries_5xx_with_backoff_then_succeeds(flaky) -> None:
    _Flaky.failures_left = 2
    client = ServerClient(_url(flaky), token="tok", max_retries=3, backoff_s=0.01)
    assert client.get("/x", a=1) == {"ok": True, "auth": "Bearer tok"}
    assert _Flaky.seen == ["GET /x?a=1"] * 3


def test_gives_up_after_bounded_retries(flaky) -> None:
    _Flaky.failures_left = 10
    client = ServerClient(_url(flaky), max_retries=2, backoff_s=0.01)
    with pytest.raises(ServerUnavailable, match="3 attempt"):
        client.post("/x", {"a": 1})
    assert len(_Flaky.seen) == 3


def test_4xx_is_not_retried_and_explained(flaky) -> None:
    client = ServerClient(_url(flaky), max_retries=3, backoff_s=0.01)
    with pytest.raises(ServerError, match="404: no such thing"):
        client.get("/bad")
    assert len(_Flaky.seen) == 1


def test_dead_server_costs_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attempt has the timeout and the waits between them are bounded: the call's cost is
    at most 3 x 0.2 s + 0.05 s + 0.1 s, whatever the machine's speed (no wall clock read)."""
    import http.client

    client = ServerClient(
        f"http://127.0.0.1:{free_port()}", timeout_s=0.2, max_retries=2, backoff_s=0.05
    )
    timeouts: List[float] = []
    waits: List[float] = []

    class Recording(http.client.HTTPConnection):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            timeouts.append(self.timeout)

    monkeypatch.setattr("perseus.runtime.client.http.client.HTTPConnection", Recording)
    monkeypatch.setattr("perseus.runtime.client.time.sleep", waits.append)
    with pytest.raises(ServerUnavailable, match="3 attempt"):
        client.get("/healthz")
    assert timeouts == [0.2, 0.2, 0.2]
    assert waits == [0.05, 0.1]


class _Counting(BaseHTTPRequestHandler):
    """Answers every request; counts the connections (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    connections = 0
    close_after_first = False

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1

    def do_GET(self) -> None:
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if type(self).close_after_first:
            self.close_connection = True  # like a server's idle timeout: no answer said so

    def log_message(self, *args: object) -> None:
        pass


def test_connections_are_kept_alive_and_a_closed_one_is_replaced() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _Counting.connections = 0
        client = ServerClient(_url(server), max_retries=0)
        for _ in range(20):
            assert client.get("/x") == {}
        assert _Counting.connections == 1
        # The server drops the connection after each answer: every next request finds it closed
        # and goes through on a new one, without using up the (zero) retries.
        _Counting.close_after_first = True
        for _ in range(3):
            assert client.get("/x") == {}
    finally:
        _Counting.close_after_first = False
        server.shutdown()


class _CutOff(BaseHTTPRequestHandler):
    """Promises a longer body than it sends, like a server killed while answering."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"step": 1')
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_answer_cut_off_is_retried_then_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutOff)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ServerClient(_url(server), max_retries=1, backoff_s=0.0)
        with pytest.raises(ServerUnavailable, match="IncompleteRead"):
            client.get("/jobs/j/schedule", rank=0, step=1)
    finally:
        server.shutdown()


def test_bad_url_is_rejected() -> None:
    with pytest.raises(ServerError, match="http"):
        ServerClient("ftp://x")


def test_online_source_without_server_runs_at_default_clocks(caplog) -> None:
    client = ServerClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.1, max_retries=0)
    spec = JobSpec(job_id="j", num_stages=1, num_microbatches=1)
    with caplog.at_level(logging.WARNING):
        source = OnlineSource(client, spec, RankInfo(), [1410, 1395])
        for step in range(3):
            source.begin_step(step)
            assert source.frequency_mhz(step, 0, "forward", 0) is None
            record = StepRecord(
                step, 0, 0.0, 1.0, 1.0, [InstructionRecord(0, "forward", 0, None, 0.1, 0.2)]
            )
            source.end_step(record)
        source.close(timeout_s=1.0)
    assert source.offline and not source.failed  # it would go on once the server answers
    warnings = [r for r in caplog.records if "default GPU clocks" in r.getMessage()]
    assert len(warnings) == 1


def test_job_id_is_shared_by_a_launch(monkeypatch) -> None:
    monkeypatch.delenv("PERSEUS_JOB_ID", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    a = job_id_from_env()
    assert a == job_id_from_env() and a.startswith("job-")
    monkeypatch.setenv("MASTER_PORT", "29501")
    assert job_id_from_env() != a
    monkeypatch.setenv("PERSEUS_JOB_ID", "mine")
    assert job_id_from_env() == "mine"
    assert job_id_from_env("cfg") == "cfg"


def test_build_online_source_needs_a_url(monkeypatch) -> None:
    from perseus.config import PerseusConfig

    monkeypatch.delenv("PERSEUS_SERVER_URL", raising=False)
    with pytest.raises(ConfigError, match="server.url"):
        build_online_source(PerseusConfig(), RankInfo(), object())  # type: ignore[arg-type]
