"""The names client and server share: the server's routes, a job's phases, the plain answer.

Part of :mod:`perseus.wire` (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from perseus.config.enums import ConfigChoice


class Route:
    """The server's paths (``{job_id}`` and ``{rank}`` filled with :meth:`str.format`)."""

    HEALTHZ = "/healthz"
    JOBS = "/jobs"
    JOB = "/jobs/{job_id}"
    SUMMARY = "/jobs/{job_id}/summary"
    RANKS = "/jobs/{job_id}/ranks"
    RANK_FINISH = "/jobs/{job_id}/ranks/{rank}/finish"
    SCHEDULE = "/jobs/{job_id}/schedule"
    STEPS = "/jobs/{job_id}/steps"
    ITERATION_TIME = "/jobs/{job_id}/iteration_time"
    # Read-only live views (perseus.server.live.routes): Prometheus's scrape, the live page's
    # data (whether a token is needed, the job list, one job), a tracker's iterations, the page.
    METRICS = "/metrics"
    LIVE_AUTH = "/live/auth"
    LIVE_JOBS = "/live/jobs"
    LIVE_JOB = "/live/job"
    LIVE_STEPS = "/live/jobs/{job_id}/steps"
    UI_ROOT = "/ui"
    UI = "/ui/"
    UI_FILE = "/ui/{name}"


class Phase(ConfigChoice):
    """Where a job is (see :mod:`perseus.server.phases.table` and ``docs/design.md``).

    ``baseline`` -> ``profiling`` -> ``planning`` -> ``running`` -> ``watching``; ``failed``
    means max speed for good.
    """

    baseline = "baseline"
    profiling = "profiling"
    planning = "planning"
    running = "running"
    watching = "watching"
    failed = "failed"

    @property
    def wants_instructions(self) -> bool:
        """The server uses the ranks' per-instruction records (times, clocks) in this phase."""
        return self in (Phase.baseline, Phase.profiling)

    @property
    def report_ready(self) -> bool:
        """The job measured its plan (or gave up): training is no longer needed for the report."""
        return self in (Phase.watching, Phase.failed)


@dataclass(frozen=True)
class Ack:
    """A plain acknowledgement."""

    ok: bool = True
    detail: Dict[str, str] = field(default_factory=dict)
