"""A stub coordination server for tests of the online source, and JSON answers (test support).

:func:`stub_server` answers what a rank's :class:`~perseus.runtime.online.source.OnlineSource` asks
of job ``j`` with the wire models (the job created, each step's schedule from the test's
``schedule(step)``, an ``Ack`` for everything else) and records every request, so that a test can
check what the rank sent. :func:`send_json` is how every stub handler answers.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Tuple
from urllib.parse import parse_qs, urlparse

from perseus.wire import Ack, JobCreated, Route, Schedule, to_json

JOB_ID = "j"


@dataclass
class StubServer:
    """Where the stub listens, and what it was sent (appended by its request threads)."""

    url: str = ""
    # "GET /jobs/j/schedule", "POST /jobs/j/steps", ... in the order they came.
    seen: List[str] = field(default_factory=list)
    bodies: List[Tuple[str, bytes]] = field(default_factory=list)

    def posted(self, route_end: str) -> List[Dict[str, Any]]:
        """The JSON bodies sent to paths ending in ``route_end`` (e.g. ``/steps``)."""
        return [json.loads(body or b"{}") for path, body in self.bodies if path.endswith(route_end)]


def send_json(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    """Answer ``handler``'s request with ``status`` and the JSON ``body``."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def stub_server(schedule: Callable[[int], Schedule]) -> Iterator[StubServer]:
    """Serve on a free loopback port until the block ends; ``schedule(step)`` answers steps."""
    stub = StubServer()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            url = urlparse(self.path)
            stub.seen.append(f"{self.command} {url.path}")
            length = int(self.headers.get("Content-Length") or 0)
            stub.bodies.append((url.path, self.rfile.read(length)))
            reply: object = Ack()
            if url.path == Route.JOBS:
                reply = JobCreated(job_id=JOB_ID, created=True)
            if url.path.endswith("/schedule"):
                reply = schedule(int(parse_qs(url.query)["step"][0]))
            send_json(self, 200, json.dumps(to_json(reply)).encode())

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
