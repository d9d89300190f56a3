"""The FastAPI application of the coordination server.

Endpoints (JSON; every one but ``GET /healthz`` needs ``Authorization: Bearer <token>`` when the
server has a token; OpenAPI at ``/openapi.json``; paths and bodies are those of
:mod:`perseus.wire`):

* ``GET  /healthz`` — liveness.
* ``POST /jobs`` — register a job (every rank may; identical specs are idempotent).
* ``GET  /jobs/{job_id}`` and ``GET /jobs/{job_id}/summary`` — status and measured results.
* ``POST /jobs/{job_id}/ranks`` — a rank joins; ``POST /jobs/{job_id}/ranks/{rank}/finish``.
* ``GET  /jobs/{job_id}/schedule?rank=R&step=N`` — the frequencies of one iteration.
* ``POST /jobs/{job_id}/steps`` — a rank's measurements of one iteration.
* ``PUT  /jobs/{job_id}/iteration_time`` / ``DELETE`` — impose or clear an iteration time.

Handlers are plain ``def`` functions (FastAPI runs them in its thread pool) and planning runs in
a separate worker thread, so the event loop never blocks. Malformed requests get 4xx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from perseus.config import ServerConfig
from perseus.errors import ServerError
from perseus.server.job_phases import Job
from perseus.server.planning import safe_job_dir
from perseus.server.summary import job_status, job_summary, write_summary
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

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_JOBS = 1024
JobIdParam = PathParam(pattern=JOB_ID_PATTERN)


class JobRegistry:
    """Every job the server knows, by id."""

    def __init__(self, cfg: ServerConfig, dump_dir: Path) -> None:
        self.cfg = cfg
        self.dump_dir = dump_dir
        self.jobs: Dict[str, Job] = {}
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="perseus-plan")

    def create(self, spec: JobSpec) -> JobCreated:
        """Register ``spec``; the same id with a different spec is a conflict."""
        job_id = spec.job_id or secrets.token_hex(8)
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None:
                if dataclasses.replace(job.spec, job_id=None) != dataclasses.replace(
                    spec, job_id=None
                ):
                    raise HTTPException(
                        409,
                        f"job {job_id} already exists with another spec; "
                        "use a new job id (server.job_id)",
                    )
                return JobCreated(job_id=job_id, created=False)
            if len(self.jobs) >= MAX_JOBS:
                raise HTTPException(429, f"the server holds {MAX_JOBS} jobs; start another one")
            job_dir = safe_job_dir(self.dump_dir, job_id)
            self.jobs[job_id] = Job(
                job_id,
                spec,
                job_dir,
                self.executor.submit,
                rank_timeout_s=self.cfg.rank_timeout_s,
                drift_threshold=self.cfg.drift_threshold,
                drift_patience=self.cfg.drift_patience,
                on_plan_measured=write_summary,
            )
            return JobCreated(job_id=job_id, created=True)

    def get(self, job_id: str) -> Job:
        """The job, or 404."""
        job = self.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}; register it with POST /jobs first")
        return job

    def check_liveness(self) -> None:
        """Mark silent ranks of every job dead."""
        for job in list(self.jobs.values()):
            job.check_liveness()

    def close(self) -> None:
        """Stop the planning workers."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def create_app(cfg: ServerConfig, dump_dir: Path) -> FastAPI:
    """Build the application serving ``cfg`` and dumping jobs under ``dump_dir``."""
    registry = JobRegistry(cfg, Path(dump_dir))
    app = FastAPI(
        title="Perseus coordination server",
        version="1",
        lifespan=_lifespan(registry, cfg.rank_timeout_s),
    )
    app.state.registry = registry
    auth = _auth_dependency(cfg.token)
    _install_error_handlers(app)
    _install_body_limit(app)

    @app.get(Route.HEALTHZ)
    def healthz() -> Dict[str, str]:
        return {"status": "ok"}

    @app.post(Route.JOBS, dependencies=[auth])
    def create_job(spec: JobSpec) -> JobCreated:
        return registry.create(spec)

    @app.get(Route.JOB, dependencies=[auth])
    def get_job_status(job_id: str = JobIdParam) -> Dict[str, Any]:
        return job_status(registry.get(job_id))

    @app.get(Route.SUMMARY, dependencies=[auth])
    def get_job_summary(job_id: str = JobIdParam) -> Dict[str, Any]:
        return job_summary(registry.get(job_id))

    @app.post(Route.RANKS, dependencies=[auth])
    def register_rank(reg: RankRegistration, job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).register_rank(reg)
        return Ack()

    @app.post(Route.RANK_FINISH, dependencies=[auth])
    def finish_rank(job_id: str = JobIdParam, rank: int = PathParam(ge=0, lt=MAX_RANKS)) -> Ack:
        registry.get(job_id).finish_rank(rank)
        return Ack()

    @app.get(Route.SCHEDULE, dependencies=[auth])
    def schedule(
        job_id: str = JobIdParam,
        rank: int = Query(ge=0, lt=MAX_RANKS),
        step: int = Query(ge=0, le=MAX_STEP),
    ) -> Schedule:
        phase, freqs = registry.get(job_id).schedule(rank, step)
        return Schedule(step=step, phase=phase, frequencies_mhz=freqs)

    @app.post(Route.STEPS, dependencies=[auth])
    def report_step(report: StepReport, job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).report(report)
        return Ack()

    @app.put(Route.ITERATION_TIME, dependencies=[auth])
    def impose(body: IterationTime, job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).impose_iteration_time(body.iteration_time_s)
        return Ack()

    @app.delete(Route.ITERATION_TIME, dependencies=[auth])
    def clear_imposed(job_id: str = JobIdParam) -> Ack:
        registry.get(job_id).impose_iteration_time(None)
        return Ack()

    return app


def _auth_dependency(token: Optional[str]) -> Any:
    def check(request: Request) -> None:
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
        errors = [
            {
                "loc": [str(x) for x in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in exc.errors()[:20]
        ]
        return JSONResponse({"detail": errors}, 422)

    @app.exception_handler(KeyError)
    def _not_found(request: Request, exc: KeyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "not found"}, 404)

    @app.exception_handler(ServerError)
    def _conflict(request: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)


def _install_body_limit(app: FastAPI) -> None:
    @app.middleware("http")
    async def limit(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"body larger than {MAX_BODY_BYTES} bytes"}, 413)
        return await call_next(request)


def _lifespan(registry: JobRegistry, timeout_s: float) -> Any:
    """Start the liveness checker with the server; stop it and the planners at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(max(0.05, min(1.0, timeout_s / 4))):
                registry.check_liveness()

        threading.Thread(target=loop, name="perseus-liveness", daemon=True).start()
        try:
            yield
        finally:
            stop.set()
            registry.close()

    return lifespan
