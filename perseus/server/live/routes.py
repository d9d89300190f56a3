"""The server's read-only live routes: ``/metrics``, the live page's JSON, the page itself.

Every data route needs the server's token like the rest of the API (``Authorization: Bearer``,
the header Prometheus's ``authorization`` scrape setting sends); the page's static files carry no
data and are served without it (the page asks for the token and sends it in that header,
never in a URL). Nothing here changes a job: each route takes one snapshot per job it shows
(:meth:`~perseus.server.jobs.job.Job.live_snapshot`, kept until the job changes) and renders
it.

* ``GET /metrics``: every job's metrics (:mod:`perseus.observability.prometheus`), the
  server's jobs and those of ``server.live_dir``.
* ``GET /live/jobs?offset=&limit=&phase=&q=``: one page of the job list (at most
  :data:`MAX_PAGE` jobs, by key), with the number of jobs per phase.
* ``GET /live/job?key=``: one job's snapshot and the detail its view draws.
* ``GET /live/jobs/{job_id}/steps?after=&limit=``: a server job's iterations after ``after``
  with their stage clocks and phase (what a tracker logs per step).
* ``GET /live/auth`` (no token): whether the server needs one (the page asks for it).
* ``GET /ui/``: the live page (``page/``: HTML, CSS and JavaScript shipped in the package).
"""

from __future__ import annotations

import time
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from fastapi import FastAPI, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response

from perseus.errors import ExtraMissingError
from perseus.observability.snapshot import JobDetail, JobSnapshot, to_json
from perseus.server.jobs.registry import JobRegistry
from perseus.server.live.local import LocalJobs
from perseus.wire import JOB_ID_PATTERN, LiveSteps, Route

MAX_PAGE = 200
MAX_STEPS = 2048
# The page's files: name -> content type.
PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "live.js": "text/javascript; charset=utf-8",
    "live.css": "text/css; charset=utf-8",
}
# No script, style or connection but the page's own; no framing; no referrer.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
DATA_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

Entry = Tuple[str, JobSnapshot, Callable[[], JobDetail]]


class LiveJobs:
    """Every job the live views show: the registry's and ``server.live_dir``'s.

    Args:
        registry: The server's jobs.
        live_dir: ``server.live_dir`` (``None``: none).
    """

    def __init__(self, registry: JobRegistry, live_dir: Optional[Path]) -> None:
        self.registry = registry
        self.local = LocalJobs(live_dir, registry.cfg.live_retired_s)

    def entries(self) -> List[Entry]:
        """``(key, snapshot, detail)`` of every job shown, by key."""
        now = time.time()
        out: List[Entry] = [
            (job.job_id, job.live_snapshot(), job.live_detail)
            for job in self.registry.live_jobs(now)
        ]
        out += [(key, snap, JobDetail) for key, snap in self.local.snapshots(now)]
        out.sort(key=lambda e: e[0])
        return out

    def snapshots(self) -> List[JobSnapshot]:
        """Every job's snapshot."""
        return [snap for _, snap, _ in self.entries()]


def install_live_routes(app: FastAPI, jobs: LiveJobs, auth: Any, token_required: bool) -> None:
    """Add the live routes to ``app``.

    Args:
        app: The server's application.
        jobs: The jobs shown.
        auth: The server's token dependency.
        token_required: The server has a token (the page then asks for it).
    """

    @app.get(Route.LIVE_AUTH)
    async def live_auth() -> Dict[str, bool]:
        return {"token_required": token_required}

    @app.get(Route.METRICS, dependencies=[auth])
    async def metrics() -> Response:
        try:
            body = await run_in_threadpool(_exposition, jobs)
        except ExtraMissingError as exc:
            return JSONResponse({"detail": str(exc)}, 501)
        from perseus.observability.prometheus import CONTENT_TYPE

        return Response(body, media_type=CONTENT_TYPE, headers=DATA_HEADERS)

    @app.get(Route.LIVE_JOBS, dependencies=[auth])
    async def live_jobs(
        offset: int = Query(0, ge=0, le=10**9),
        limit: int = Query(50, ge=1, le=MAX_PAGE),
        phase: Optional[str] = Query(None, max_length=64),
        q: Optional[str] = Query(None, max_length=256),
    ) -> JSONResponse:
        page = await run_in_threadpool(_page, jobs, offset, limit, phase, q)
        return JSONResponse(page, headers=DATA_HEADERS)

    @app.get(Route.LIVE_JOB, dependencies=[auth])
    async def live_job(key: str = Query(min_length=1, max_length=4200)) -> JSONResponse:
        found = await run_in_threadpool(_one, jobs, key)
        return JSONResponse(found, headers=DATA_HEADERS)

    @app.get(Route.LIVE_STEPS, dependencies=[auth])
    async def live_steps(
        job_id: str = PathParam(pattern=JOB_ID_PATTERN),
        after: int = Query(-1, ge=-1, le=10**12),
        limit: int = Query(512, ge=1, le=MAX_STEPS),
    ) -> JSONResponse:
        job = jobs.registry.get(job_id)
        with job.lock:
            rows = job.live.steps_after(after, limit)
            phase = str(job.phase)
        answer = LiveSteps(
            job_id=job_id,
            phase=phase,
            steps=[replace(point, clocks_mhz=list(clocks)) for point, clocks in rows],
        )
        return JSONResponse(to_json(answer), headers=DATA_HEADERS)

    @app.get(Route.UI_ROOT, include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse(Route.UI)

    @app.get(Route.UI, include_in_schema=False)
    async def ui_index() -> Response:
        return _page_file("index.html")

    @app.get(Route.UI_FILE, include_in_schema=False)
    async def ui_file(name: str) -> Response:
        if name not in PAGE_FILES:
            raise HTTPException(404, f"no file {name!r} in the live page; open /ui/")
        return _page_file(name)


def _exposition(jobs: LiveJobs) -> bytes:
    from perseus.observability.prometheus import exposition

    return exposition(jobs.snapshots())


def _page(
    jobs: LiveJobs, offset: int, limit: int, phase: Optional[str], q: Optional[str]
) -> Dict[str, Any]:
    """One page of the job list, and the number of jobs per phase (of all jobs)."""
    entries = jobs.entries()
    phases: Dict[str, int] = {}
    for _, snap, _ in entries:
        phases[snap.phase] = phases.get(snap.phase, 0) + 1
    if phase:
        entries = [e for e in entries if e[1].phase == phase]
    if q:
        needle = q.casefold()
        entries = [e for e in entries if needle in e[1].job_id.casefold()]
    shown = entries[offset : offset + limit]
    return {
        "total": len(entries),
        "offset": offset,
        "limit": limit,
        "phases": phases,
        "updated_s": time.time(),
        "jobs": [{"key": key, **to_json(snap)} for key, snap, _ in shown],
    }


def _one(jobs: LiveJobs, key: str) -> Dict[str, Any]:
    job = jobs.registry.jobs.get(key)
    if job is not None:
        return {
            "key": key,
            "job": to_json(job.live_snapshot()),
            "detail": to_json(job.live_detail()),
        }
    for found, snap in jobs.local.snapshots(time.time()):
        if found == key:
            return {"key": key, "job": to_json(snap), "detail": to_json(JobDetail())}
    raise HTTPException(404, "no such job on this server (it ended, or the key is wrong)")


def _page_file(name: str) -> Response:
    data = resources.files("perseus.server.live").joinpath("page", name).read_bytes()
    return Response(data, media_type=PAGE_FILES[name], headers=PAGE_HEADERS)
