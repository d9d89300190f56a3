"""What one request, one job, and all jobs together may cost the server.

* Request bodies: :class:`BodyLimit` counts the bytes as they stream in, ``Content-Length`` or
  chunked, and answers 413 as soon as a body passes ``server.max_body_mb`` (nothing more is
  read or kept).
* Job state: :func:`job_state_bytes` estimates the memory a job's state needs on the server from
  its shape (stages x microbatches: orders, sweeps, plans) and the ranks registered so far
  (never from the capacity it declares but does not use). A job above
  ``server.max_job_state_mb`` can never be served (422); one that does not fit beside the jobs
  already held is turned away until they finish (429, ``server.max_state_mb``).
* The job as a whole: :func:`job_problems` (solver, world size, state), which the server checks
  at registration and perseus-train's preflight checks before any rank starts.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional

from perseus.pipeline_order import PipelineOrder
from perseus.wire import MAX_RANKS, JobSpec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MB = 1024 * 1024
# Fixed cost of any job (its objects, event log, summary) in bytes.
JOB_BYTES = 64 * 1024
# Per position of the job's instruction orders (stages x 2 x microbatches, or the engine's
# order's actions): the orders and
# the encoded sequences, the sweep's assignments per profiling iteration, and the frontier's
# plans (up to FRONTIER_PLANS of them, one clock per position each).
ORDER_BYTES_PER_POSITION = 120
SWEEP_BYTES_PER_POSITION = 8
FRONTIER_PLANS = 256
PLAN_BYTES_PER_POSITION = 40
# Per registered rank: its state, liveness and the step table's share.
RANK_BYTES = 1024


def job_positions(spec: JobSpec) -> int:
    """Instructions per iteration over all stages."""
    order = spec.schedule
    if isinstance(order, PipelineOrder):
        return sum(len(actions) for actions in order.actions)
    return spec.num_stages * 2 * spec.num_microbatches


def job_state_bytes(spec: JobSpec, num_ranks: int = 0) -> int:
    """Estimated server memory of ``spec``'s state with ``num_ranks`` registered ranks."""
    positions = job_positions(spec)
    per_position = (
        ORDER_BYTES_PER_POSITION
        + SWEEP_BYTES_PER_POSITION * spec.profiler.max_iterations
        + PLAN_BYTES_PER_POSITION * FRONTIER_PLANS
    )
    return JOB_BYTES + positions * per_position + RANK_BYTES * num_ranks


def job_problems(spec: JobSpec, max_job_state_mb: Optional[float]) -> List[str]:
    """Why the server cannot serve ``spec`` (one line each, naming the key and the fix).

    Args:
        spec: The job as its ranks register it.
        max_job_state_mb: The server's ``server.max_job_state_mb`` (None: not known, as for a
            server started elsewhere; the state is then not checked).
    """
    from perseus.planner.solvers import available_solvers

    problems: List[str] = []
    solvers = available_solvers()
    if spec.solver not in solvers:
        problems.append(f"planner.solver={spec.solver!r}: unknown solver; choose one of {solvers}")
    world = spec.num_stages * spec.dp * spec.tp
    if world > MAX_RANKS:
        problems.append(
            f"parallelism: {spec.num_stages} stages x dp {spec.dp} x tp {spec.tp} = {world} "
            f"ranks, more than {MAX_RANKS}"
        )
    need = job_state_bytes(spec)
    if max_job_state_mb is not None and need > int(max_job_state_mb * MB):
        problems.append(
            f"the job's {spec.num_stages} stages x {spec.num_microbatches} microbatches "
            f"({job_positions(spec)} instructions per iteration) need about "
            f"{need / MB:.0f} MB of server state, above server.max_job_state_mb="
            f"{max_job_state_mb:g}; use fewer microbatches per iteration, or raise "
            "server.max_job_state_mb on the server"
        )
    return problems


class BodyLimit:
    """ASGI middleware: request bodies above ``max_bytes`` are answered 413, streamed or not.

    Args:
        app: The application.
        max_bytes: The largest body accepted.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request, refusing its body once it passes the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: Dict[bytes, bytes] = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await _too_large(send, self.max_bytes)
            return
        seen = 0
        started = False
        refused = False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:  # whatever the app answers to a body it could not read: 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _too_large(send, self.max_bytes)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _too_large(send, self.max_bytes)
        except Exception:
            if refused and not started:  # the app wrapped our signal into another error
                await _too_large(send, self.max_bytes)
                return
            raise


class _BodyTooLarge(Exception):
    """Raised inside the app's receive(): the body passed the limit."""


async def _too_large(send: Send, max_bytes: int) -> None:
    detail = f"request body larger than {max_bytes} bytes (server.max_body_mb); send less"
    body = json.dumps({"detail": detail}, allow_nan=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
