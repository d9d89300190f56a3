"""The FastAPI application of the coordination server.

Endpoints (JSON; every one but ``GET /healthz``, ``GET /live/auth`` and the live page's static
files needs ``Authorization: Bearer <token>`` when the server has a token; OpenAPI at
``/openapi.json``; paths and bodies are those of :mod:`perseus.wire`):

* ``GET  /healthz`` — liveness.
* ``POST /jobs`` — register a job (every rank may; identical specs are idempotent).
* ``GET  /jobs/{job_id}`` and ``GET /jobs/{job_id}/summary`` — status and measured results.
* ``POST /jobs/{job_id}/ranks`` — a rank (with the peers it speaks for) joins;
  ``POST /jobs/{job_id}/ranks/{rank}/finish``.
* ``GET  /jobs/{job_id}/schedule?rank=R&step=N`` — the frequencies of one iteration.
* ``POST /jobs/{job_id}/steps`` — a rank's (or a stage's) measurements of one iteration.
* ``PUT  /jobs/{job_id}/iteration_time`` / ``DELETE`` — impose or clear an iteration time.
* ``GET  /metrics``, ``GET /live/...`` and the live page at ``/ui/`` — read-only live views of
  every job (:mod:`perseus.server.live.routes`).

Handlers run on the event loop and only do short work under a job's lock: estimation and
planning run in worker processes, the state reaches disk through a writer thread. One job
therefore never delays another's requests or ``/healthz``, and a rank counts as heard from when
its request is handled, right as it arrives. Malformed requests get 4xx, bodies over
``server.max_body_mb`` (streamed or not) 413, and every answer reaches a client still sending
its body (:mod:`perseus.server.bodies`).
"""

from __future__ import annotations

import contextlib
import hmac
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from perseus.config.schema import ServerConfig
from perseus.errors import ServerError
from perseus.server.bodies import RequestBodies
from perseus.server.jobs.registry import JobRegistry
from perseus.server.limits import MB
from perseus.server.live.routes import LiveJobs, install_live_routes
from perseus.wire import (
    JOB_ID_PATTERN,
    MAX_RANKS,
    MAX_STEP,
    Ack,
    IterationTime,
    JobCreated,
    JobSpec,
    RankRegistration,
    Route,
    Schedule,
    StepReport,
)

JobIdParam = PathParam(pattern=JOB_ID_PATTERN)


def create_app(
    cfg: ServerConfig, dump_dir: Path, *, on_ready: Optional[Callable[[], None]] = None
) -> FastAPI:
    """Build the application serving ``cfg`` and dumping jobs under ``dump_dir``.

    Args:
        cfg: The server's configuration.
        dump_dir: Job directories and the state file (``state.sqlite``) go there.
        on_ready: Called once the server restored its jobs and serves.
    """
    registry = JobRegistry(cfg, Path(dump_dir))
    app = FastAPI(
        title="Perseus coordination server",
        version="1",
        lifespan=_lifespan(registry, cfg.rank_timeout_s, on_ready),
    )
    app.state.registry = registry
    auth = _auth_dependency(cfg.token)
    _install_error_handlers(app)
    app.add_middleware(RequestBodies, max_bytes=int(cfg.max_body_mb * MB))

    @app.get(Route.HEALTHZ)
    async def healthz() -> Dict[str, str]:
        return {"status": "ok"}

    @app.post(Route.JOBS, dependencies=[auth])
    async def create_job(spec: JobSpec) -> JobCreated:
        return registry.create(spec)

    @app.get(Route.JOB, dependencies=[auth])
    async def get_job_status(job_id: str = JobIdParam) -> Dict[str, Any]:
        return registry.get(job_id).status()

    @app.get(Route.SUMMARY, dependencies=[auth])
    async def get_job_summary(job_id: str = JobIdParam) -> Dict[str, Any]:
        return registry.get(job_id).summary()

    @app.post(Route.RANKS, dependencies=[auth])
    async def register_rank(reg: RankRegistration, job_id: str = JobIdParam) -> Ack:
        registry.register_rank(job_id, reg)
        return Ack()

    @app.post(Route.RANK_FINISH, dependencies=[auth])
    async def finish_rank(
        job_id: str = JobIdParam, rank: int = PathParam(ge=0, lt=MAX_RANKS)
    ) -> Ack:
        registry.finish_rank(job_id, rank)
        return Ack()

    @app.get(Route.SCHEDULE, dependencies=[auth])
    async def schedule(
        job_id: str = JobIdParam,
        rank: int = Query(ge=0, lt=MAX_RANKS),
        step: int = Query(ge=0, le=MAX_STEP),
    ) -> Schedule:
        return registry.get(job_id).schedule(rank, step)

    @app.post(Route.STEPS, dependencies=[auth])
    async def report_step(report: StepReport, job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).report(report)
        return Ack()

    @app.put(Route.ITERATION_TIME, dependencies=[auth])
    async def impose(body: IterationTime, job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).impose_iteration_time(body.iteration_time_s)
        return Ack()

    @app.delete(Route.ITERATION_TIME, dependencies=[auth])
    async def clear_imposed(job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).impose_iteration_time(None)
        return Ack()

    live_dir = Path(cfg.live_dir) if cfg.live_dir else None
    install_live_routes(app, LiveJobs(registry, live_dir), auth, bool(cfg.token))
    return app


def _auth_dependency(token: Optional[str]) -> Any:
    # A coroutine: FastAPI runs a plain function dependency on its thread pool, a hand-over to
    # another thread and back for every request (a header check needs none).
    async def check(request: Request) -> None:
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                401,
                "missing or wrong token: send 'Authorization: Bearer <server.token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return Depends(check)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Never echo the input back: it may be bytes, NaN or huge.
        errors = []
        for e in exc.errors()[:20]:
            loc = [str(x) for x in e.get("loc", ())]
            msg = str(e.get("msg", ""))
            if loc == ["body"]:  # not a JSON object at all
                msg += "; send one JSON object with 'Content-Type: application/json'"
            errors.append({"loc": loc, "msg": msg, "type": str(e.get("type", ""))})
        return JSONResponse({"detail": errors}, 422)

    @app.exception_handler(KeyError)
    def _not_found(request: Request, exc: KeyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "not found"}, 404)

    @app.exception_handler(ServerError)
    def _conflict(request: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)


def _lifespan(
    registry: JobRegistry, timeout_s: float, on_ready: Optional[Callable[[], None]]
) -> Any:
    """Restore the kept jobs and start the liveness checker; stop everything at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry.restore()
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(max(0.05, min(1.0, timeout_s / 4))):
                registry.check_liveness()

        threading.Thread(target=loop, name="perseus-liveness", daemon=True).start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            stop.set()
            registry.close()

    return lifespan
