"""The stdlib client and the online source's fail-safe behaviour."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List

import pytest

from perseus.errors import RendezvousError, ServerError
from perseus.records import InstructionRecord, RankInfo, StepRecord
from perseus.runtime.launch.endpoint import new_job_id
from perseus.runtime.online.build import build_online_source
from perseus.runtime.online.client import ServerClient, ServerUnavailable
from perseus.runtime.online.source import OnlineSource
from perseus.server.process import free_port
from perseus.wire import JobSpec
from tests.unit.server.stub_server import send_json


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
            send_json(self, 404, json.dumps({"detail": "no such thing"}).encode())
        else:
            body = json.dumps({"ok": True, "auth": self.headers.get("Authorization")}).encode()
            send_json(self, 200, body)

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

    monkeypatch.setattr("perseus.runtime.online.client.http.client.HTTPConnection", Recording)
    monkeypatch.setattr("perseus.runtime.online.client.time.sleep", waits.append)
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
        send_json(self, 200, b"{}")
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
                step=step,
                stage=0,
                start_s=0.0,
                end_s=1.0,
                energy_j=1.0,
                instructions=[
                    InstructionRecord(
                        position=0,
                        instruction="forward",
                        microbatch=0,
                        frequency_mhz=None,
                        start_s=0.1,
                        end_s=0.2,
                    )
                ],
            )
            source.end_step(record)
        source.close(timeout_s=1.0)
    assert source.offline and not source.failed  # it would go on once the server answers
    warnings = [r for r in caplog.records if "default GPU clocks" in r.getMessage()]
    assert len(warnings) == 1


def test_every_launch_gets_a_fresh_job_id(monkeypatch) -> None:
    # torchrun sets TORCHELASTIC_RUN_ID=none unless told otherwise: never a job id.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    a, b = new_job_id(), new_job_id()
    assert a != b and a.startswith("job-")
    # A meaningful run id names the job, still with a fresh part per launch.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "nightly/bert 7")
    c, d = new_job_id(), new_job_id()
    assert c.startswith("nightly-bert-7-") and c != d
    assert all(len(x) <= 64 and x.replace("-", "").replace("_", "").isalnum() for x in (c, d))


def test_build_online_source_without_a_way_to_share_a_server(monkeypatch) -> None:
    from perseus.config.schema import PerseusConfig
    from perseus.runtime.launch.rendezvous import Launch

    monkeypatch.delenv("PERSEUS_SERVER_URL", raising=False)
    # Two ranks, no torch.distributed: no store to share a server through.
    with pytest.raises(RendezvousError, match="init_process_group") as info:
        build_online_source(PerseusConfig(), RankInfo(world_size=2), _OneClockGPU(), Launch())
    assert "server.url" in str(info.value) and info.value.shared


class _OneClockGPU:
    def supported_sm_clocks_mhz(self) -> list:
        return [1410]
