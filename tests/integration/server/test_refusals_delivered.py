"""Every refusal reaches the client, over real sockets, whatever the body and however it is sent.

A real ``perseus-server`` process (16 MB ``server.max_body_mb``) answers 413 with a JSON reason to
a body over the limit, with ``Content-Length`` or chunked, and 404/422 to a refused path whose
body it never reads: ``urllib`` (which sends the whole body before it reads) and the runtime's
client receive these answers instead of a reset connection. The bounds of the drain are
checked on uvicorn serving :class:`RequestBodies` with short bounds.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import RequestTooLarge, ServerClient, ServerRefused
from perseus.server.bodies import RequestBodies
from perseus.server.process import ServerHandle, bind_socket, start_server_process

pytestmark = [pytest.mark.integration, pytest.mark.one_worker]

MB = 1024 * 1024
# The refused paths of the garbage round: no such route (404), a rank that cannot be (422).
REFUSED = [("/jobs/../../etc/passwd/ranks", 404), ("/jobs/-1/ranks/-1/finish", 422)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = start_server_process(ServerConfig(), tmp_path_factory.mktemp("refusals"), port=0)
    yield handle
    handle.stop()


def _urlopen(request: urllib.request.Request) -> Tuple[int, Dict[str, Any]]:
    """The status and JSON body urllib receives (an OSError here: no answer came)."""
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, data: Any) -> urllib.request.Request:
    return urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})


def _chunks(total_mb: int) -> Iterator[bytes]:
    for _ in range(total_mb):
        yield b" " * MB


def test_urllib_receives_413_for_a_20_mb_body_with_content_length(server: ServerHandle) -> None:
    body = json.dumps("x" * (20 * MB)).encode()
    status, answer = _urlopen(_post(server.url + "/jobs", body))
    assert status == 413
    assert "16 MB" in answer["detail"] and "server.max_body_mb" in answer["detail"]


def test_urllib_receives_413_for_a_64_mb_chunked_body(server: ServerHandle) -> None:
    request = _post(server.url + "/jobs", _chunks(64))  # an iterable: sent chunked
    status, answer = _urlopen(request)
    assert status == 413 and "server.max_body_mb" in answer["detail"]


@pytest.mark.parametrize(("path", "status"), REFUSED)
@pytest.mark.parametrize("size_mb", [2, 12])
def test_urllib_receives_the_4xx_of_a_refused_path_whose_body_is_never_read(
    server: ServerHandle, path: str, status: int, size_mb: int
) -> None:
    body = json.dumps("x" * (size_mb * MB)).encode()  # under the limit: refused for its path
    got, answer = _urlopen(_post(server.url + path, body))
    assert got == status and answer["detail"]


def test_the_clients_413_is_one_error_and_never_retried(server: ServerHandle) -> None:
    attempts: List[Optional[int]] = []
    client = ServerClient(
        server.url,
        max_retries=3,
        backoff_s=0.01,
        observer=lambda method, path, seconds, status: attempts.append(status),
    )
    with pytest.raises(RequestTooLarge) as refused:
        client.post("/jobs", {"job_id": "big", "note": "x" * (20 * MB)})
    assert attempts == [413]
    message = str(refused.value)
    assert message.startswith("POST /jobs: the request body (") and "larger than" in message
    assert "server.max_body_mb" in message and refused.value.status == 413
    assert client.get("/healthz") == {"status": "ok"}  # and the client goes on


def test_a_drained_refusal_keeps_the_connection(server: ServerHandle) -> None:
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", "/jobs/nope/ranks/0/finish", body=b"x" * (2 * MB))
        first = conn.getresponse()
        assert first.status == 404 and not first.will_close
        first.read()
        conn.request("GET", "/healthz")  # the same connection: the body did not linger
        assert conn.getresponse().status == 200
    finally:
        conn.close()


# -- the drain's bounds, on uvicorn serving RequestBodies alone -------------------------------
async def _refuse_unread(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    """An app that answers 404 without reading the body (as a router does for a bad path)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        return
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b'{"detail": "no such path"}'})


@contextmanager
def _serving(app: Any) -> Iterator[Tuple[str, int]]:
    import uvicorn

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise AssertionError("uvicorn did not start")
            threading.Event().wait(0.01)
        yield "127.0.0.1", int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def _answer(sock: socket.socket) -> Tuple[int, bytes]:
    """Status line and headers of the answer on ``sock`` (read until the headers end)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    return int(head.split(b" ", 2)[1]), head.lower()


def test_a_slow_sender_gets_its_answer_once_the_drain_gives_up() -> None:
    app = RequestBodies(_refuse_unread, max_bytes=MB, drain_s=0.5)
    with _serving(app) as (host, port), socket.create_connection((host, port), 60) as sock:
        # Declares 512 KB, sends 10 bytes, then nothing: the drain stops after drain_s.
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 524288\r\n\r\n0123456789")
        status, head = _answer(sock)
    assert status == 404 and b"connection: close" in head


def test_a_client_awaiting_100_continue_is_refused_before_it_sends() -> None:
    app = RequestBodies(_refuse_unread, max_bytes=MB)
    with _serving(app) as (host, port), socket.create_connection((host, port), 60) as sock:
        sock.sendall(
            b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
            b"Content-Length: 1000000000\r\n\r\n"
        )
        status, head = _answer(sock)
    assert status == 413 and b"100 continue" not in head


def test_the_client_reads_a_413_sent_before_its_body_was_taken() -> None:
    """A server that will not drain 20 MB answers and closes: the client still reads it."""
    app = RequestBodies(_refuse_unread, max_bytes=MB, drain_max_bytes=4096)
    with _serving(app) as (host, port):
        client = ServerClient(f"http://{host}:{port}", max_retries=2, backoff_s=0.01)
        with pytest.raises(RequestTooLarge, match="HTTP 413"):
            client.post("/x", {"note": "x" * (20 * MB)})
        with pytest.raises(ServerRefused, match="404: no such path"):
            client.post("/x", {"note": "small"})
