"""Request bodies: the size limit, and every answer delivered to a client still sending.

:class:`RequestBodies` (ASGI middleware) counts a body's bytes as they stream in,
``Content-Length`` or chunked, and answers 413 with a JSON reason once a body passes
``server.max_body_mb``; nothing of such a body is kept.

An answer sent before the request's body has been read must still reach the client. A client
such as ``urllib`` (or the runtime's :class:`~perseus.runtime.online.client.ServerClient`) sends its
whole body before it reads the answer; a server that closes the connection while body bytes it
never read are still arriving makes the kernel reset the connection, and the reset discards the
answer. So before any answer leaves while the body is unread (a 413, a refused path, a job or
rank that does not exist, an endpoint that takes no body), the rest of the body is read and
dropped, then the answer goes out and the connection stays usable. The drain is bounded: at most
:data:`DRAIN_MAX_BYTES` and :data:`DRAIN_S` seconds (on the event loop, never a thread), so a
slow or endless sender holds nothing for long; past either bound the answer goes out with
``Connection: close`` (the client may then see the connection reset instead). A client that
waits for ``100 Continue`` has sent no body yet: it gets the answer at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Dict, MutableMapping

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The most body bytes read and dropped to deliver an early answer.
DRAIN_MAX_BYTES = 256 * 1024 * 1024
#: The longest a request's unread body is drained before its answer goes out anyway.
DRAIN_S = 20.0
_CLOSE = (b"connection", b"close")


class RequestBodies:
    """ASGI middleware: bodies above ``max_bytes`` get 413; early answers wait for the body.

    Args:
        app: The application.
        max_bytes: The largest body accepted.
        drain_max_bytes: At most this many unread body bytes are read to deliver an answer.
        drain_s: For at most this many seconds.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        drain_max_bytes: int = DRAIN_MAX_BYTES,
        drain_s: float = DRAIN_S,
    ) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.drain_max_bytes = int(drain_max_bytes)
        self.drain_s = float(drain_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request: its body counted, and any answer sent once the body is read."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request(self, receive, dict(scope.get("headers") or []))
        length = request.declared_length
        if length is not None and length > self.max_bytes:
            await request.answer_too_large(send)
            return
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if request.refused:  # whatever the app answers to a body it could not read: 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await request.answer_too_large(send)
                return
            if message["type"] == "http.response.start" and not started:
                started = True
                if not await request.drain():
                    message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        try:
            await self.app(scope, request.receive, guarded_send)
        except _BodyTooLarge:
            if not started:
                await request.answer_too_large(send)
        except Exception:
            if request.refused and not started:  # the app wrapped our signal into another error
                await request.answer_too_large(send)
                return
            raise


class _BodyTooLarge(Exception):
    """Raised inside the app's receive(): the body passed the limit."""


class _Request:
    """One request's body as the app and the drain read it."""

    def __init__(self, limits: RequestBodies, receive: Receive, headers: Dict[bytes, bytes]):
        self.limits = limits
        self._receive = receive
        length = headers.get(b"content-length")
        # h11 answers a malformed Content-Length itself (400): here it is digits or absent.
        self.declared_length = int(length) if length is not None and length.isdigit() else None
        self.awaits_continue = headers.get(b"expect", b"").lower() == b"100-continue"
        self.seen = 0
        # Without Content-Length or Transfer-Encoding a request has no body (a GET, mostly).
        self.complete = length is None and b"transfer-encoding" not in headers
        self.asked = False
        self.refused = False

    async def receive(self) -> Message:
        """What the app receives: the body counted, and refused past the limit."""
        message = await self._next()
        if message["type"] == "http.request" and self.seen > self.limits.max_bytes:
            self.refused = True
            raise _BodyTooLarge()
        return message

    async def _next(self) -> Message:
        self.asked = True
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
        elif message["type"] == "http.disconnect":
            self.complete = True  # nothing more will come
        return message

    async def drain(self) -> bool:
        """Read and drop the rest of the body (bounded); False if some of it is left unread."""
        if self.complete:
            return True
        if self.awaits_continue and not self.asked:
            return False  # the client sends nothing before it is told to continue
        budget = self.seen + self.limits.drain_max_bytes
        if self.declared_length is not None and self.declared_length > budget:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.drain_s
        while not self.complete:
            left_s = deadline - loop.time()
            if left_s <= 0 or self.seen > budget:
                return False
            try:
                await asyncio.wait_for(self._next(), left_s)
            except asyncio.TimeoutError:
                return False
        return True

    async def answer_too_large(self, send: Send) -> None:
        """Answer 413 with a JSON reason, after draining what is bounded to drain."""
        await self.drain()
        limit_mb = self.limits.max_bytes / (1024 * 1024)
        detail = (
            f"request body larger than the server's limit of {limit_mb:g} MB "
            f"({self.limits.max_bytes} bytes, server.max_body_mb); send less, or raise "
            "server.max_body_mb on the server"
        )
        body = json.dumps({"detail": detail}, allow_nan=False).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    _CLOSE,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
