"""HTTP client of the coordination server, for training ranks.

Standard library only (:mod:`http.client`): it runs inside every training process. Connections
are kept alive and reused (one per thread, so the rank's background threads never share one).
Every request has a timeout; connection failures and 5xx answers are retried a bounded number
of times with exponential backoff, so one call never takes longer than about
``(max_retries + 1) * timeout_s + backoff_s * 2 ** max_retries``. A kept-alive connection the
server closed while it was idle is replaced at once, without counting as an attempt. 4xx
answers are not retried; 413 (a body over the server's ``server.max_body_mb``) is
:class:`RequestTooLarge`, also when the server answered it before the body was sent in full.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, Optional, Tuple

from perseus.errors import NonFiniteError, ServerError
from perseus.formats.strict_json import dumps

logger = logging.getLogger(__name__)

#: ``(method, path, seconds, HTTP status or None for no answer)`` after every attempt.
Observer = Callable[[str, str, float, Optional[int]], None]


class ServerUnavailable(ServerError):
    """The server did not answer (after every retry)."""


class ServerRefused(ServerError):
    """The server answered 4xx: the request itself is wrong (never retried).

    Attributes:
        status: The HTTP status.
        detail: The server's explanation.
    """

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class RequestTooLarge(ServerRefused):
    """The server answered 413: the body is over its ``server.max_body_mb`` (never retried)."""


class ServerClient:
    """Talks to one coordination server.

    Args:
        url: Base URL, e.g. ``http://127.0.0.1:7787``.
        token: Sent as ``Authorization: Bearer <token>`` when set.
        timeout_s: Per-attempt timeout (``server.request_timeout_s``).
        max_retries: Extra attempts after a failure (``server.max_retries``).
        backoff_s: First delay between attempts, doubled each time (``server.retry_backoff_s``).
        observer: Called after every attempt (latency measurements); must not raise.
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        observer: Optional[Observer] = None,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ServerError(
                f"server.url={url!r} is not an http(s) URL such as http://127.0.0.1:7787"
            )
        try:
            port = parsed.port
        except ValueError:
            raise ServerError(f"server.url={url!r}: the port is not a number") from None
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = float(timeout_s)
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = max(0.0, float(backoff_s))
        self.observer = observer
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = port
        self._prefix = parsed.path.rstrip("/")
        self._local = threading.local()

    # -- connections ----------------------------------------------------------------------------
    def _connection(self) -> Tuple[http.client.HTTPConnection, bool]:
        """The calling thread's connection and whether it was used before."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout_s)
        self._local.conn = conn
        return conn, False

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _exchange(
        self, method: str, target: str, data: Optional[bytes], headers: Dict[str, str]
    ) -> Tuple[int, bytes]:
        """One request on this thread's connection (a stale kept-alive one is replaced once)."""
        for fresh_try in (False, True):
            conn, reused = self._connection()
            try:
                _send(conn, method, target, data, headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                stale = isinstance(
                    exc,
                    (
                        http.client.RemoteDisconnected,
                        BrokenPipeError,
                        ConnectionResetError,
                        http.client.CannotSendRequest,
                    ),
                )
                if reused and stale and not fresh_try:
                    continue  # the server closed an idle connection: not a failed attempt
                raise
            if resp.will_close:
                self.close()
            return resp.status, raw
        raise AssertionError("unreachable")  # pragma: no cover

    # -- requests -------------------------------------------------------------------------------
    def request(
        self, method: str, path: str, body: Any = None, query: Optional[Dict[str, Any]] = None
    ) -> Any:
        """One JSON request with retries; returns the decoded answer.

        Raises:
            ServerUnavailable: no answer after every retry (or 5xx every time).
            ServerRefused: the server rejected the request (4xx), with its explanation.
        """
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        try:
            text = None if body is None else dumps(body, what=f"{method} {path}", default=None)
        except NonFiniteError as exc:
            raise ServerError(f"{exc}; the request was not sent") from None
        data = None if text is None else text.encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        last: Optional[BaseException] = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            t0 = time.perf_counter()
            status: Optional[int] = None
            try:
                status, raw = self._exchange(method, target, data, headers)
            # Refused, reset, timed out, or an answer cut off (a server killed while it
            # answered raises http.client.IncompleteRead, not an OSError).
            except (OSError, http.client.HTTPException) as exc:
                last = exc
                continue
            finally:
                if self.observer is not None:
                    self.observer(method, path, time.perf_counter() - t0, status)
            if status >= 500:
                last = ServerError(f"HTTP {status}: {_detail(raw)}")
                continue
            if status == 413:
                detail = _detail(raw)
                raise RequestTooLarge(
                    f"{method} {path}: the request body ({len(data or b'')} bytes) is larger "
                    f"than the server accepts (HTTP 413: {detail})",
                    status,
                    detail,
                )
            if status >= 400:
                detail = _detail(raw)
                raise ServerRefused(
                    f"{method} {path}: the server answered {status}: {detail}", status, detail
                )
            try:
                return json.loads(raw) if raw else None
            except ValueError as exc:
                last = exc
        raise ServerUnavailable(
            f"{method} {path}: no answer from {self.url} after "
            f"{self.max_retries + 1} attempt(s): {last}; check server.url "
            "or that the server is running"
        )

    def get(self, path: str, **query: Any) -> Any:
        """GET ``path`` with query parameters."""
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any = None) -> Any:
        """POST a JSON body."""
        return self.request("POST", path, body if body is not None else {})


def _send(
    conn: http.client.HTTPConnection,
    method: str,
    target: str,
    data: Optional[bytes],
    headers: Dict[str, str],
) -> None:
    """Send one request; a server that stopped reading it may still have answered.

    A server refuses a body it will not read (too large) by answering and closing: the rest of
    the body then fails to send (reset, broken pipe), while the answer already sits in the
    socket. The caller reads it as for any request; without one, reading fails as the send did.
    """
    try:
        conn.request(method, target, body=data, headers=headers)
    except (BrokenPipeError, ConnectionResetError):
        if conn.sock is None:  # never connected: there is nothing to read
            raise


def _detail(raw: bytes) -> str:
    try:
        payload = json.loads(raw or b"{}")
    except ValueError:
        return raw[:200].decode(errors="replace")
    detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
    return json.dumps(detail)[:2000] if not isinstance(detail, str) else detail[:2000]
