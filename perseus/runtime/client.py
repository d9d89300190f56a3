"""HTTP client of the coordination server, for training ranks.

Standard library only (urllib): it runs inside every training process. Every
request has a timeout; connection failures and 5xx answers are retried a bounded number of times
with exponential backoff, so one call never takes longer than about
``(max_retries + 1) * timeout_s + backoff_s * 2 ** max_retries``. 4xx answers are not retried.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional

from perseus.errors import NonFiniteError, ServerError
from perseus.formats.strict_json import dumps

logger = logging.getLogger(__name__)


class ServerUnavailable(ServerError):
    """The server did not answer (after every retry)."""


class ServerClient:
    """Talks to one coordination server.

    Args:
        url: Base URL, e.g. ``http://127.0.0.1:7787``.
        token: Sent as ``Authorization: Bearer <token>`` when set.
        timeout_s: Per-attempt timeout (``server.request_timeout_s``).
        max_retries: Extra attempts after a failure (``server.max_retries``).
        backoff_s: First delay between attempts, doubled each time (``server.retry_backoff_s``).
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ServerError(
                f"server.url={url!r} is not an http(s) URL such as http://127.0.0.1:7787"
            )
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = float(timeout_s)
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = max(0.0, float(backoff_s))

    def request(
        self, method: str, path: str, body: Any = None, query: Optional[Dict[str, Any]] = None
    ) -> Any:
        """One JSON request with retries; returns the decoded answer.

        Raises:
            ServerUnavailable: no answer after every retry (or 5xx every time).
            ServerError: the server rejected the request (4xx), with its explanation.
        """
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            data = None if body is None else dumps(body, what=f"{method} {path}", default=None)
        except NonFiniteError as exc:
            raise ServerError(f"{exc}; the request was not sent") from None
        payload = None if data is None else data.encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        last: Optional[BaseException] = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=payload, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise ServerError(
                        f"{method} {path}: the server answered {exc.code}: {_detail(exc)}"
                    ) from None
                last = exc
            # URLError, timeouts, resets, bad JSON, and answers cut off (a server killed while
            # it answered raises http.client.IncompleteRead, not an OSError).
            except (OSError, ValueError, http.client.HTTPException) as exc:
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


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)
    detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
    return json.dumps(detail)[:2000] if not isinstance(detail, str) else detail[:2000]
